// EfficientNet end to end: a job with stochastic depth and dropout drawing in training resumes
// bit-identical; 2 workers x batch 4 and micro-batches equal 1 worker x batch 8 (each example
// draws its own masks, model/row_noise.h); the model directory loads into torchvision's own class
// (strict) and gives predict's probabilities (tests/parity/torchvision_predict.py).
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
      "--set data.augment.horizontal_flip=true";
  const Result full = run_trainer(dir.path(), common + " --job-dir full");
  INFO(full.err);
  REQUIRE(full.code == 0);
  CHECK_THAT(full.err, Contains("efficientnet_b0"));

  const Result first = run_trainer(dir.path(), common + " --job-dir split --set train.max_steps=4");
  INFO(first.err);
  REQUIRE(first.code == 0);
  CHECK(weights(dir / "split") != weights(dir / "full"));
  const Result second = run_trainer(
      dir.path(),
      common + " --job-dir split --set data.num_workers=3 --set data.prefetch_batches=5");
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
  const int rc =
      sh("cd " + quote(dir.path().string()) + " && (" + TRAINER_PYTHON + " " + quote(script) +
         " --model-dir full/model --predictions predictions.jsonl > check.txt 2>&1)");
  INFO(slurp(dir / "check.txt"));
  CHECK(rc == 0);
  CHECK_THAT(slurp(dir / "check.txt"), Contains("arch=efficientnet_b0"));
}

TEST_CASE("efficientnet_b0: 2 workers x batch 4 and micro-batches equal 1 worker x batch 8",
          "[multiworker][efficientnet]") {
  TempDir dir("effequiv");
  make_dataset(dir.path(), "data", 8, 32);  // 40 images
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string base =
      "--config job.yaml --set model.arch=efficientnet_b0 --set data.shard_policy=data "
      "--set data.shuffle=false --set train.optimizer.name=sgd --set train.optimizer.momentum=0 "
      "--set train.optimizer.learning_rate=0.002 --set data.validation.path= "
      "--set distributed.rendezvous_timeout_s=60 --set distributed.timeout_s=60";
  // Fine-tuning as users do, from weights whose BN statistics have seen the data (at their
  // initial values EfficientNet's activations fade to nothing through 16 blocks), with BN
  // frozen: what is left to differ between the splits is stochastic depth and dropout.
  const Result warm = run_trainer(dir.path(), base +
                                                  " --job-dir warm --set train.epochs=4 "
                                                  "--set train.per_replica_batch_size=8");
  INFO(warm.err);
  REQUIRE(warm.code == 0);
  const std::string common = base +
                             " --set train.max_steps=3 --set model.freeze_batchnorm=true "
                             "--set model.pretrained=warm/model/model.safetensors";
  const Result one =
      run_trainer(dir.path(), common + " --job-dir one --set train.per_replica_batch_size=8");
  INFO(one.err);
  REQUIRE(one.code == 0);
  const auto two =
      run_cluster(dir.path(), 2, common + " --job-dir two --set train.per_replica_batch_size=4");
  for (const auto& r : two) {
    INFO(r.err);
    REQUIRE(r.code == 0);
  }
  const Result micro = run_trainer(
      dir.path(),
      common +
          " --job-dir micro --set train.per_replica_batch_size=8 --set train.micro_batch_size=2");
  INFO(micro.err);
  REQUIRE(micro.code == 0);
  const auto a = read_f32(dir / "one" / "model" / "model.safetensors");
  for (const std::string other : {"two", "micro"}) {
    const double worst =
        largest_relative_difference(a, read_f32(dir / other / "model" / "model.safetensors"));
    INFO(other << ": largest relative difference " << worst);
    CHECK(worst <= 1e-5);
  }
  // The masks matter: another data seed (other masks; the same images in the same order, no
  // augmentation) lands elsewhere, so the agreement above is the per-example draws'.
  const Result reseeded =
      run_trainer(dir.path(), common +
                                  " --job-dir reseeded --set train.per_replica_batch_size=8 "
                                  "--set data.seed=4");
  INFO(reseeded.err);
  REQUIRE(reseeded.code == 0);
  CHECK(largest_relative_difference(a, read_f32(dir / "reseeded" / "model" / "model.safetensors")) >
        1e-2);
}
