// The evaluator task (TensorFlow's SidecarEvaluator), started by trainer launch --evaluator
// beside 2 workers: outside the training group, it evaluates every complete checkpoint on the
// validation split into JOB_DIR/eval/metrics.jsonl, skips those checkpoint.keep deletes under
// it, and ends with the exported model, whose figures equal the chief's own last validation.
#include "common/catch.h"

#include <cmath>

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

TEST_CASE("launch --evaluator evaluates every checkpoint and the final model", "[evaluator]") {
  TempDir dir("evaluator");
  make_dataset(dir.path(), "data", 8, 32);  // 40 train, 20 validation images
  write_text(dir / "job.yaml", R"(model: {arch: resnet18}
data:
  train: {path: data/train}
  validation: {path: data/validation}
  image_size: 32
  num_workers: 1
train: {epochs: 3, per_replica_batch_size: 4, threads: 1, seed: 7}
checkpoint: {every_steps: 2, keep: 1}
logging: {every_steps: 100}
)");
  const Result r =
      run_trainer(dir.path(), "launch --workers 2 --evaluator -- --config job.yaml --job-dir job");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Contains("[evaluator]") && Contains("launch: evaluator exited with code 0"));

  const auto records = read_metrics(dir / "job" / "eval" / "metrics.jsonl");
  REQUIRE(records.size() >= 3);
  int64_t last_step = -1;
  for (size_t i = 0; i + 1 < records.size(); ++i) {
    CHECK(records[i].contains("checkpoint"));
    CHECK(records[i]["step"].get<int64_t>() > last_step);  // each once, in order
    last_step = records[i]["step"].get<int64_t>();
    CHECK(records[i]["num_examples"] == 20);
    CHECK(records[i]["per_class"].size() == 5);
  }
  // 5 steps per epoch x 3: the final checkpoint, then the exported model.
  CHECK(last_step == 15);
  const auto& model = records.back();
  CHECK(model.contains("model"));
  CHECK(model["step"] == 15);

  // The exported model evaluated alone gives what the chief's distributed validation gave.
  double chief_loss = -1, chief_acc = -1;
  for (const auto& rec : read_metrics(dir / "job" / "metrics.jsonl")) {
    if (rec.contains("val_loss")) {
      chief_loss = rec["val_loss"].get<double>();
      chief_acc = rec["val_accuracy"].get<double>();
    }
  }
  CHECK(model["val_accuracy"].get<double>() == chief_acc);
  CHECK(std::abs(model["val_loss"].get<double>() - chief_loss) <= 1e-5 * std::abs(chief_loss));
  CHECK_FALSE(fs::exists(dir / "job" / "workertemp_0"));  // the evaluator did not use it
}

TEST_CASE("an evaluator without validation data is exit 2 naming the field", "[evaluator]") {
  TempDir dir("evaluator_noval");
  make_dataset(dir.path(), "data", 2, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const Result r = run_trainer(
      dir.path(), "--config job.yaml --job-dir job --set data.validation.path=",
      {R"(TF_CONFIG={"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "evaluator", "index": 0}})"});
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Contains("data.validation.path"));
}
