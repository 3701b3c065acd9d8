// util/fs: an I/O failure is a data error (exit 3) that names the path; a directory fsync that
// the file system does not support is not a failure.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "trainer/util/error.h"
#include "trainer/util/fs.h"

using namespace trainer;
using Catch::Matchers::Contains;
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
