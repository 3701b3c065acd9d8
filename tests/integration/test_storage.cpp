// Cloud-storage job dirs and data paths, as the AI Platform tutorial's users write them:
// `--job-dir gs://BUCKET/DIR` trains into the bucket's FUSE mount (Vertex AI's /gcs convention)
// or is refused with exit 2 saying how to mount it, never a local folder named `gs:`.
#include "common/catch.h"

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

TEST_CASE("a gs:// job dir with no bucket mounted: exit 2 saying how to mount it, nothing written",
          "[storage]") {
  TempDir dir("storage_unmounted");
  make_dataset(dir.path(), "data", 2, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string gcs = "TRAINER_GCS_ROOT=" + (dir / "gcs").string();
  fs::create_directories(dir / "gcs" / "my-bucket");  // a local folder is not a mount

  const Result r =
      run_trainer(dir.path(), "--config job.yaml --job-dir gs://my-bucket/run1", {gcs});
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Contains("--job-dir 'gs://my-bucket/run1'") &&
                        Contains("not mounted at " + (dir / "gcs" / "my-bucket").string()) &&
                        Contains("gcsfuse my-bucket"));
  CHECK_FALSE(fs::exists(dir / "gs:"));
  CHECK(fs::is_empty(dir / "gcs" / "my-bucket"));

  const Result s3 = run_trainer(dir.path(), "--config job.yaml --job-dir s3://b/run1", {gcs});
  CHECK(s3.code == 2);
  CHECK_THAT(s3.err, Contains("'s3://b/run1'") && Contains("mount"));
  CHECK_FALSE(fs::exists(dir / "s3:"));

  // The same rule for data paths in the job spec.
  const Result data = run_trainer(
      dir.path(), "--config job.yaml --job-dir job --set data.train.path=hdfs://nn/train", {gcs});
  INFO(data.err);
  CHECK(data.code == 2);
  CHECK_THAT(data.err, Contains("data.train.path 'hdfs://nn/train'"));
  CHECK_FALSE(fs::exists(dir / "hdfs:"));

  const Result predict =
      run_trainer(dir.path(), "predict --model gs://my-bucket/run1/model x.jpg", {gcs});
  CHECK(predict.code == 2);
  CHECK_THAT(predict.err, Contains("--model 'gs://my-bucket/run1/model'"));
}

TEST_CASE("a job dir and data under gs:// train through the bucket's mount", "[storage]") {
  TempDir dir("storage_mounted");
  REQUIRE_TMPFS(dir.path());
  Tmpfs bucket(dir / "gcs" / "my-bucket", 256 << 20);
  make_dataset(dir / "gcs" / "my-bucket", "cassava", 2, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string args =
      "--config job.yaml --job-dir gs://my-bucket/run1 --set data.train.path=gs://my-bucket/"
      "cassava/train --set data.validation.path=gs://my-bucket/cassava/validation";
  const Result r = run_trainer(dir.path(), args, {"TRAINER_GCS_ROOT=" + (dir / "gcs").string()});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const fs::path model = dir / "gcs" / "my-bucket" / "run1" / "model";
  CHECK(fs::exists(model / "model.safetensors"));
  CHECK(fs::exists(model / "model.json"));
  CHECK_THAT(r.out, Contains("model: " + model.string()));
  CHECK_FALSE(fs::exists(dir / "gs:"));
}
