// util/storage: a cloud-storage path resolves to its mounted bucket or is refused (exit 2) with
// how to mount it; it is never a local folder named after the scheme.
#include "common/catch.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/temp_dir.h"
#include "trainer/util/error.h"
#include "trainer/util/storage.h"

using namespace trainer;
using trainer::test::Contains;
namespace fs = std::filesystem;

namespace {

// Sets TRAINER_GCS_ROOT for the scope.
class GcsRoot {
 public:
  explicit GcsRoot(const fs::path& root) { ::setenv("TRAINER_GCS_ROOT", root.c_str(), 1); }
  ~GcsRoot() { ::unsetenv("TRAINER_GCS_ROOT"); }
};

ErrorKind kind_of(const std::string& given) {
  try {
    util::local_path(given, "--job-dir");
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::kInternal;  // did not throw
}

// Mounts a tmpfs at `at` (root only); unmounted at scope exit.
class Mount {
 public:
  explicit Mount(const fs::path& at) : at_(at) {
    fs::create_directories(at);
    ok_ =
        ::geteuid() == 0 &&
        std::system(
            ("mount -t tmpfs -o size=1m trainer-gcs '" + at.string() + "' 2>/dev/null").c_str()) ==
            0;
  }
  ~Mount() {
    if (ok_) std::system(("umount -l '" + at_.string() + "'").c_str());
  }
  bool ok() const { return ok_; }

 private:
  fs::path at_;
  bool ok_ = false;
};

}  // namespace

TEST_CASE("local paths pass through, file:// is a local path", "[util][storage]") {
  CHECK(util::local_path("job", "--job-dir") == "job");
  CHECK(util::local_path("/tmp/a:b/c", "--job-dir") == "/tmp/a:b/c");
  CHECK(util::local_path("./gs:/x", "--job-dir") == "./gs:/x");  // no scheme: a relative path
  CHECK(util::local_path("file:///srv/jobs/run1", "--job-dir") == "/srv/jobs/run1");
  CHECK_THROWS_WITH(util::local_path("file://srv/x", "--job-dir"),
                    Contains("--job-dir 'file://srv/x'") && Contains("file:///ABSOLUTE/PATH"));
}

TEST_CASE("other schemes are refused with how to mount them", "[util][storage]") {
  CHECK(kind_of("s3://bucket/run1") == ErrorKind::kConfig);
  CHECK(kind_of("hdfs://namenode/x") == ErrorKind::kConfig);
  CHECK_THROWS_WITH(
      util::local_path("s3://bucket/run1", "data.train.path"),
      Contains("data.train.path 's3://bucket/run1'") && Contains("'s3://'") && Contains("mount"));
}

TEST_CASE("gs:// without a mounted bucket is refused, also over a plain local folder",
          "[util][storage]") {
  test_support::TempDir dir("storage");
  const GcsRoot root(dir / "gcs");
  CHECK_THROWS_WITH(util::local_path("gs://my-bucket/run1", "--job-dir"),
                    Contains("--job-dir 'gs://my-bucket/run1'") &&
                        Contains("not mounted at " + (dir / "gcs" / "my-bucket").string()) &&
                        Contains("gcsfuse my-bucket"));
  // A folder that merely exists at the mount point is local disk: still refused.
  fs::create_directories(dir / "gcs" / "my-bucket");
  CHECK(kind_of("gs://my-bucket/run1") == ErrorKind::kConfig);
  CHECK(kind_of("gs:///run1") == ErrorKind::kConfig);
  CHECK(kind_of("gs://../x") == ErrorKind::kConfig);
}

TEST_CASE("gs://BUCKET/PATH resolves to the bucket's mount (per bucket, or the whole /gcs)",
          "[util][storage]") {
  test_support::TempDir dir("storage");
  {
    const GcsRoot root(dir / "gcs");
    const Mount bucket(dir / "gcs" / "my-bucket");
    if (!bucket.ok()) {
      WARN("skipped: cannot mount a tmpfs here (needs root)");
      return;
    }
    CHECK(util::local_path("gs://my-bucket/run1/a", "--job-dir") ==
          (dir / "gcs" / "my-bucket" / "run1" / "a").string());
    CHECK(util::local_path("gs://my-bucket", "--job-dir") == (dir / "gcs" / "my-bucket").string());
    CHECK(kind_of("gs://other-bucket/run1") == ErrorKind::kConfig);
  }
  {
    // Vertex AI: one FUSE file system at /gcs with every bucket as a directory in it.
    const GcsRoot root(dir / "vertex");
    const Mount all(dir / "vertex");
    REQUIRE(all.ok());
    fs::create_directories(dir / "vertex" / "b2");
    CHECK(util::local_path("gs://b2/x", "--job-dir") == (dir / "vertex" / "b2" / "x").string());
  }
}
