// describe_exception: the one mapping of exception types to exit kinds and one-line messages,
// used by main() and by the failure report a rank sends its peers.
#include "common/catch.h"

#include <c10/util/Exception.h>

#include <filesystem>
#include <new>
#include <system_error>

#include "trainer/util/error.h"

using namespace trainer;
using trainer::test::Contains;

namespace {

template <class E>
ErrorSummary describe(const E& e) {
  return describe_exception(std::make_exception_ptr(e));
}

}  // namespace

TEST_CASE("describe_exception maps every exception type to a kind and one line", "[util]") {
  const ErrorSummary data = describe(DataError("bad.jpg: truncated"));
  CHECK(data.kind == ErrorKind::kData);
  CHECK(data.message == "bad.jpg: truncated");
  CHECK(describe(PeerFailed(ErrorKind::kConfig, "worker 1 failed: x")).kind == ErrorKind::kConfig);

  const ErrorSummary full = describe(
      std::filesystem::filesystem_error("cannot write", "job/checkpoints/ckpt-1",
                                        std::make_error_code(std::errc::no_space_on_device)));
  CHECK(full.kind == ErrorKind::kData);
  CHECK(exit_code(full.kind) == 3);
  CHECK_THAT(full.message, Contains("job/checkpoints/ckpt-1") && Contains("the disk is full"));

  const ErrorSummary oom = describe(std::bad_alloc());
  CHECK(oom.kind == ErrorKind::kInternal);
  CHECK_THAT(oom.message, Contains("out of memory"));

  try {
    TORCH_CHECK(false, "shape mismatch [2] vs [3]");
  } catch (...) {
    const ErrorSummary torch_error = describe_exception(std::current_exception());
    CHECK(torch_error.kind == ErrorKind::kInternal);
    CHECK_THAT(torch_error.message, Contains("LibTorch") && Contains("shape mismatch"));
    CHECK(torch_error.message.find('\n') == std::string::npos);
    CHECK(torch_error.message.find("Exception raised from") == std::string::npos);
  }

  CHECK(describe(std::runtime_error("boom")).message == "internal error: boom");
  CHECK(describe_exception(std::make_exception_ptr(42)).kind == ErrorKind::kInternal);
  CHECK(std::string(kind_name(ErrorKind::kData)) == "data error");
  CHECK(std::string(kind_name(ErrorKind::kDistributed)) == "distributed error");
}
