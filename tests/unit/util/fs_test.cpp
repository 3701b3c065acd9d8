// util/fs: an I/O failure is a data error (exit 3) that names the path; a directory fsync that
// the file system does not support is not a failure; AppendFile writes whole records or none.
#include "common/catch.h"

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "trainer/util/error.h"
#include "trainer/util/fs.h"

using namespace trainer;
using trainer::test::Contains;
namespace fs = std::filesystem;

TEST_CASE("write_file_atomic and fsync_dir: data errors naming the path", "[util][fs]") {
  const fs::path dir =
      fs::temp_directory_path() / ("trainer-fs-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  util::write_file_atomic(dir / "a.txt", "hello");
  CHECK(util::read_file(dir / "a.txt") == "hello");
  CHECK_NOTHROW(util::fsync_dir(dir));
  for (const auto& e : fs::directory_iterator(dir)) {
    CHECK(e.path().filename() == "a.txt");  // no temp file left behind
  }

  const fs::path missing = dir / "no-such-dir" / "b.txt";
  CHECK_THROWS_AS(util::write_file_atomic(missing, "x"), DataError);
  CHECK_THROWS_WITH(util::write_file_atomic(missing, "x"), Contains("no-such-dir"));
  CHECK_THROWS_AS(util::fsync_dir(dir / "no-such-dir"), DataError);
  fs::remove_all(dir);
}

namespace {
std::string dir_for(const char* name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("trainer-fs-test-" + std::string(name) + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}
}  // namespace

TEST_CASE("AppendFile appends whole records and refuses a deleted file", "[util][fs]") {
  const fs::path dir = dir_for("append");
  const fs::path path = dir / "metrics.jsonl";
  {
    util::AppendFile out(path);
    out.append("{\"step\": 1}\n");
    out.append("{\"step\": 2}\n");
  }
  util::AppendFile again(path);  // reopening appends
  again.append("{\"step\": 3}\n");
  CHECK(util::read_file(path) == "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\n");

  // The job dir removed under a running job: records would go to an unlinked inode.
  fs::remove(path);
  CHECK_THROWS_AS(again.append("{\"step\": 4}\n"), DataError);
  CHECK_THROWS_WITH(again.append("{\"step\": 4}\n"),
                    Contains("metrics.jsonl") && Contains("deleted while the job ran"));

  util::AppendFile closed;
  CHECK_NOTHROW(closed.append("ignored"));
  CHECK_THROWS_WITH(util::AppendFile(dir / "no-such-dir" / "m.jsonl"), Contains("no-such-dir"));
  fs::remove_all(dir);
}

TEST_CASE("AppendFile on a full disk: a data error saying so, the file as it was", "[util][fs]") {
  // /dev/full answers every write with ENOSPC.
  util::AppendFile full("/dev/full");
  CHECK_THROWS_AS(full.append("record\n"), DataError);
  CHECK_THROWS_WITH(full.append("record\n"), Contains("/dev/full") && Contains("disk is full"));

  // A write that stops part-way: RLIMIT_FSIZE lets 5 more bytes through, then EFBIG (SIGXFSZ
  // ignored), as a disk that fills mid-record. The partial record is cut off again.
  const fs::path dir = dir_for("partial");
  const fs::path path = dir / "metrics.jsonl";
  util::AppendFile out(path);
  out.append("{\"step\": 1}\n");
  const std::string before = util::read_file(path);
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = before.size() + 5;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string error;
  try {
    out.append("{\"step\": 2, \"loss\": 0.5}\n");
  } catch (const DataError& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  CHECK_THAT(error, Contains("cannot append to") && Contains("metrics.jsonl"));
  CHECK(util::read_file(path) == before);
  out.append("{\"step\": 2}\n");  // space again: the log goes on where it was
  CHECK(util::read_file(path) == before + "{\"step\": 2}\n");
  fs::remove_all(dir);
}

TEST_CASE("require_writable_dir names the directory and the cause", "[util][fs]") {
  const fs::path dir = dir_for("writable");
  CHECK_NOTHROW(util::require_writable_dir(dir));
  CHECK_THROWS_WITH(util::require_writable_dir(dir / "missing"),
                    Contains("missing") && Contains("No such file"));
  util::write_file_atomic(dir / "file", "x");
  CHECK_THROWS_WITH(util::require_writable_dir(dir / "file"), Contains("not a directory"));
  fs::remove_all(dir);
}
