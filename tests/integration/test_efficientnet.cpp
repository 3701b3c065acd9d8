// EfficientNet end to end: a job with stochastic depth and dropout drawing in training resumes
// bit-identical; 2 workers x batch 4 equal 1 worker x batch 8 (each example draws its own masks,
// model/row_noise.h); the model directory loads into torchvision's own class (strict) and gives
// predict's probabilities (tests/parity/torchvision_predict.py).
#include "common/catch.h"

#include "fixtures.h"
#include "harness.h"
#include "onnx_check.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

std::string weights(const fs::path& job) { return slurp(job / "model" / "model.safetensors"); }

}  // namespace

TEST_CASE("efficientnet_b0 resumes bit-identical and its model is torchvision's",
          "[efficientnet][resume]") {
  TempDir dir("effnet");
  make_dataset(dir.path(), "data", 6, 32);  // 30 images: 3 steps per epoch
  write_text(dir / "job.yaml", tiny_job_yaml(2));
  const std::string common =
      "--config job.yaml --set model.arch=efficientnet_b0 "
      "--set data.augment.horizontal_flip=true --set model.head_hidden=16";
  const Result full = run_trainer(dir.path(), common + " --job-dir full");
  INFO(full.err);
  REQUIRE(full.code == 0);
  CHECK_THAT(full.err, Contains("efficientnet_b0"));

  const Result first = run_trainer(dir.path(), common + " --job-dir split --set train.max_steps=4");
  INFO(first.err);
  REQUIRE(first.code == 0);
  CHECK(weights(dir / "split") != weights(dir / "full"));
  const Result second =
      run_trainer(dir.path(), common + " --job-dir split --set train.threads=2");
  INFO(second.err);
  REQUIRE(second.code == 0);
  CHECK_THAT(second.err, Contains("resumed from"));
  CHECK(weights(dir / "split") == weights(dir / "full"));

  // torchvision.models.efficientnet_b0 loads the model strictly and gives predict's answers.
  const Result pred = run_trainer(dir.path(), "predict --model full/model data/validation");
  INFO(pred.err);
  REQUIRE(pred.code == 0);
  REQUIRE(predicted(pred.out).size() >= 5);
  write_text(dir / "predictions.jsonl", pred.out);
  const std::string script =
      std::string(TRAINER_SOURCE_DIR) + "/tests/parity/torchvision_predict.py";
  const int rc = sh("cd " + quote(dir.path().string()) + " && " + TRAINER_PYTHON + " " +
                    quote(script) +
                    " --model-dir full/model --predictions predictions.jsonl > check.txt 2>&1");
  INFO(slurp(dir / "check.txt"));
  CHECK(rc == 0);
  CHECK_THAT(slurp(dir / "check.txt"), Contains("arch=efficientnet_b0"));
}

TEST_CASE("efficientnet_b0: 2 workers x batch 4 equal 1 worker x batch 8 with its draws on",
          "[multiworker][efficientnet]") {
  // SyncBN so that BatchNorm trains (from scratch, frozen statistics at their initial values
  // would fade EfficientNet's activations to nothing) and still sees the global batch; ATen's
  // portable kernels as in test_multiworker.cpp's SyncBN case (the CPU's vector width changes
  // the order of the one process's BN sums).
  struct PortableKernels {
    PortableKernels() { ::setenv("ATEN_CPU_CAPABILITY", "default", 1); }
    ~PortableKernels() { ::unsetenv("ATEN_CPU_CAPABILITY"); }
  } portable;
  TempDir dir("effequiv");
  make_dataset(dir.path(), "data", 8, 32);  // 40 images
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string common =
      "--config job.yaml --set model.arch=efficientnet_b0 --set data.shard_policy=data "
      "--set data.shuffle=false --set train.optimizer.name=sgd --set train.optimizer.momentum=0 "
      "--set train.optimizer.learning_rate=0.05 --set data.validation.path= "
      "--set train.max_steps=3 --set distributed.rendezvous_timeout_s=60 "
      "--set distributed.timeout_s=60";
  const Result one =
      run_trainer(dir.path(), common + " --job-dir one --set train.per_replica_batch_size=8");
  INFO(one.err);
  REQUIRE(one.code == 0);
  const auto two = run_cluster(dir.path(), 2,
                               common + " --job-dir two --set train.per_replica_batch_size=4 "
                                        "--set model.sync_batchnorm=true");
  for (const auto& r : two) {
    INFO(r.err);
    REQUIRE(r.code == 0);
  }
  const auto a = read_f32(dir / "one" / "model" / "model.safetensors");
  const double worst =
      largest_relative_difference(a, read_f32(dir / "two" / "model" / "model.safetensors"));
  INFO("largest relative difference " << worst);
  CHECK(worst <= 1e-5);
  // The masks matter: another data seed (other masks; the same images in the same order, no
  // augmentation) lands elsewhere, so the agreement above is the per-example draws'.
  const Result reseeded =
      run_trainer(dir.path(), common + " --job-dir reseeded --set train.per_replica_batch_size=8 "
                                       "--set data.seed=4");
  INFO(reseeded.err);
  REQUIRE(reseeded.code == 0);
  CHECK(largest_relative_difference(a, read_f32(dir / "reseeded" / "model" /
                                                "model.safetensors")) > 1e-3);
}
