// Resume as Keras' BackupAndRestore promises it, but exact: a run stopped after epoch 1 and
// started again ends bit-identical to an uninterrupted one; a damaged checkpoint is skipped; a
// job dir holding another job is refused unless --overwrite; raising --epochs continues.
#include "common/catch.h"

#include "fixtures.h"
#include "harness.h"
#include "summaries.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {
std::string weights(const fs::path& job) { return slurp(job / "model" / "model.safetensors"); }
fs::path newest_checkpoint(const fs::path& job) {
  fs::path best;
  for (const auto& e : fs::directory_iterator(job / "checkpoints")) {
    if (best.empty() || e.path().filename() > best.filename()) best = e.path();
  }
  return best;
}
}  // namespace

TEST_CASE("stopped after epoch 1 and resumed ends bit-identical", "[resume]") {
  TempDir dir("resume");
  make_dataset(dir.path(), "data", 6, 32);  // 30 images: 3 steps per epoch
  write_text(dir / "job.yaml", tiny_job_yaml(2) + "\n");
  // Augmentation on, so the data-order and augmentation state must resume too.
  const std::string common =
      "--config job.yaml --set data.augment.horizontal_flip=true "
      "--set data.augment.random_resized_crop=true";

  const Result full = run_trainer(dir.path(), common + " --job-dir full");
  INFO(full.err);
  REQUIRE(full.code == 0);

  const Result first = run_trainer(dir.path(), common + " --job-dir split --set train.max_steps=3");
  INFO(first.err);
  REQUIRE(first.code == 0);
  CHECK(weights(dir / "split") != weights(dir / "full"));
  // The resume runs as if moved to another machine: other threads, timeouts and queue depth,
  // none of which changes a bit of the results, so it is the same job.
  const Result second = run_trainer(
      dir.path(), common +
                      " --job-dir split --set train.threads=1 --set data.num_workers=3 "
                      "--set data.prefetch_batches=5 --set distributed.timeout_s=60 "
                      "--set distributed.rendezvous_timeout_s=30 --set checkpoint.keep=4");
  INFO(second.err);
  REQUIRE(second.code == 0);
  CHECK_THAT(second.err, Contains("resumed from"));
  CHECK(weights(dir / "split") == weights(dir / "full"));

  // Each step is recorded once even across the restart.
  int64_t step_records = 0;
  for (const auto& rec : read_metrics(dir / "split" / "metrics.jsonl")) {
    step_records += rec.contains("loss") ? 1 : 0;
  }
  CHECK(step_records == 6);
  // So is each TensorBoard point: the first run's file keeps steps 1..3, the resumed run's new
  // file (named to sort after it) holds 4..6, so no curve doubles back.
  CHECK(fs::exists(dir / "split" / "logs" / "train"));
  CHECK(tfevents_under(dir / "split" / "logs" / "train").size() == 2);
  CHECK(summary_steps(dir / "split" / "logs" / "train", "loss") ==
        summary_steps(dir / "full" / "logs" / "train", "loss"));
  CHECK(summary_steps(dir / "split" / "logs" / "train", "loss") ==
        std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(summary_steps(dir / "split" / "logs" / "validation", "epoch_loss") ==
        std::vector<int64_t>{3, 6});

  // One flow, not Catch sections (each would train full and split again).
  // A truncated newest checkpoint is skipped.
  {
    const Result again =
        run_trainer(dir.path(), common + " --job-dir trunc --set train.max_steps=3");
    REQUIRE(again.code == 0);
    const fs::path ckpt = newest_checkpoint(dir / "trunc");
    fs::resize_file(ckpt / "model.safetensors", fs::file_size(ckpt / "model.safetensors") / 2);
    const Result resumed = run_trainer(dir.path(), common + " --job-dir trunc");
    INFO(resumed.err);
    REQUIRE(resumed.code == 0);
    CHECK_THAT(resumed.err, Contains("skipping damaged checkpoint"));
    CHECK(weights(dir / "trunc") == weights(dir / "full"));  // retrained from scratch, same result
  }

  // A different job in the same dir is refused, and nothing is lost.
  const Result other =
      run_trainer(dir.path(), common + " --job-dir full --set train.optimizer.name=sgd");
  CHECK(other.code == 2);
  CHECK_THAT(other.err, Contains("train.optimizer.name"));
  CHECK(weights(dir / "full") == weights(dir / "split"));

  // Raising --epochs continues a finished run; a finished run is left alone.
  const Result done = run_trainer(dir.path(), common + " --job-dir full");
  CHECK(done.code == 0);
  CHECK_THAT(done.err, Contains("nothing to do"));
  const Result more = run_trainer(dir.path(), common + " --job-dir full --epochs 3");
  INFO(more.err);
  CHECK(more.code == 0);
  CHECK_THAT(more.err, Contains("resumed from"));
  CHECK(nlohmann::json::parse(slurp(dir / "full" / "model" / "model.json"))["epochs"] == 3);

  // ... and --overwrite replaces the job.
  const Result forced = run_trainer(
      dir.path(), common + " --job-dir full --set train.optimizer.name=sgd --overwrite");
  INFO(forced.err);
  CHECK(forced.code == 0);
  CHECK_THAT(slurp(dir / "full" / "job.yaml"), Contains("sgd"));
}

TEST_CASE("resuming with another world size: refused mid-epoch, allowed at an epoch boundary",
          "[resume]") {
  TempDir dir("resume_world");
  make_dataset(dir.path(), "data", 6, 32);  // 30 images: 3 steps per epoch with 1 worker
  write_text(dir / "job.yaml", tiny_job_yaml(2) + "\n");
  const std::string one = "--config job.yaml --job-dir job --set data.validation.path=";
  const std::string two = "launch --workers 2 -- " + one;

  // Stopped mid-epoch (step 2 of 3) by 1 worker; state.json records the plan.
  REQUIRE(run_trainer(dir.path(), one + " --set train.max_steps=2").code == 0);
  const auto state = nlohmann::json::parse(slurp(newest_checkpoint(dir / "job") / "state.json"));
  CHECK(state["world_size"] == 1);
  CHECK(state["steps_per_epoch"] == 3);
  CHECK(state["shard_digests"].size() == 1);

  const Result refused = run_trainer(dir.path(), two);
  INFO(refused.err);
  CHECK(refused.code == 2);
  CHECK_THAT(refused.err,
             Contains("middle of epoch 1") && Contains("1 workers wrote it, this run has 2"));
  CHECK(newest_checkpoint(dir / "job").filename() == "ckpt-000000002");  // nothing lost

  // The same worker finishes the epoch; from that boundary 2 workers go on with a new plan.
  REQUIRE(run_trainer(dir.path(), one + " --set train.max_steps=3").code == 0);
  const Result resumed = run_trainer(dir.path(), two);
  INFO(resumed.err);
  CHECK(resumed.code == 0);
  CHECK_THAT(resumed.err, Contains("resuming at the start of epoch 2 with a new data plan") &&
                              Contains("1 workers wrote it, this run has 2"));
  const auto final_state =
      nlohmann::json::parse(slurp(newest_checkpoint(dir / "job") / "state.json"));
  CHECK(final_state["world_size"] == 2);
}
