// A failure on one rank reaches every rank with its real cause, within seconds: the failing task
// publishes its error in the rendezvous store before it exits; a peer whose collective then fails,
// or that is waiting in one, reads it and exits with that task's kind and message instead of a
// bare "lost the connection" (exit 4) or the collective timeout. Real processes, real TF_CONFIG,
// real Gloo over loopback. And trainer launch --max-restarts: a killed worker restarts the group,
// which resumes from the newest checkpoint and ends bit-identical to a run that never failed.
#include "common/catch.h"

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

// Long timeouts: only the failure report can make the peers stop quickly.
const char* const kSlowTimeouts =
    " --set distributed.rendezvous_timeout_s=120 --set distributed.timeout_s=300";

}  // namespace

TEST_CASE("a worker's corrupt record stops every process with exit 3 naming it", "[failures]") {
  TempDir dir("peer_data_error");
  const Result made = run_trainer(dir.path(),
                                  "make-dataset --out recs --format tfrecord --shards 2 "
                                  "--image-size 32 --per-class 8 --splits train");
  REQUIRE(made.code == 0);
  // Worker 1 reads the second file (shard_policy: file). Damage a record past its first steps.
  const fs::path file = dir / "recs" / "train-00001-of-00002.tfrecord";
  std::string bytes = slurp(file);
  const size_t at = bytes.size() * 3 / 4;
  bytes[at] = static_cast<char>(bytes[at] ^ 0x01);
  write_text(file, bytes);
  write_text(dir / "job.yaml", R"(model: {arch: resnet18}
data:
  train: {format: tfrecord, path: "recs/*.tfrecord"}
  class_names: [cbb, cbsd, cgm, cmd, healthy]
  image_size: 32
  shuffle: false
  shard_policy: file
train: {epochs: 3, per_replica_batch_size: 2, threads: 1}
)");
  const int port = free_port();
  const std::string args = "--config job.yaml --job-dir job" + std::string(kSlowTimeouts);
  Background chief(dir.path(), args, {tf_config(2, false, port, "worker", 0)}, "w0");
  Background worker(dir.path(), args, {tf_config(2, false, port, "worker", 1)}, "w1");
  const Result w = worker.wait();
  const auto worker_done = Clock::now();
  const Result c = chief.wait();
  const double after = seconds_since(worker_done);
  INFO("worker 1: " << w.err);
  INFO("chief: " << c.err);
  CHECK(w.code == 3);
  CHECK_THAT(w.err, Contains("train-00001-of-00002.tfrecord") && Contains("CRC"));
  CHECK(c.code == 3);
  CHECK_THAT(c.err, Contains("worker 1 failed: data error") &&
                        Contains("train-00001-of-00002.tfrecord") && Contains("CRC"));
  CHECK_FALSE(Contains("lost the connection").match(c.err));
  CHECK(after < 10);
}

TEST_CASE("the chief's failing checkpoint write stops every worker with its cause", "[failures]") {
  TempDir dir("chief_ckpt_error");
  make_dataset(dir.path(), "data", 16, 48);  // 80 images: 10 steps of 2 x 4 per epoch
  write_text(dir / "job.yaml", tiny_job_yaml(3));
  const int port = free_port();
  const std::string args =
      "--config job.yaml --job-dir job --set data.validation.path= "
      "--set train.per_replica_batch_size=4 --set model.arch=resnet50" +
      std::string(kSlowTimeouts);
  Background chief(dir.path(), args, {tf_config(2, false, port, "worker", 0)}, "w0");
  Background worker(dir.path(), args, {tf_config(2, false, port, "worker", 1)}, "w1");
  for (int i = 0; i < 1200 && !fs::exists(dir / "job" / "metrics.jsonl"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(fs::exists(dir / "job" / "metrics.jsonl"));
  // The first checkpoint (end of epoch 1) cannot be written: checkpoints/ is now a file. Root
  // ignores permissions, so a read-only directory would not do.
  fs::remove_all(dir / "job" / "checkpoints");
  write_text(dir / "job" / "checkpoints", "not a directory\n");
  const Result c = chief.wait();
  const auto chief_done = Clock::now();
  const Result w = worker.wait();
  const double after = seconds_since(chief_done);
  INFO("chief: " << c.err);
  INFO("worker 1: " << w.err);
  CHECK(c.code == 3);
  CHECK_THAT(c.err, Contains("cannot write checkpoint") &&
                        Contains("the checkpoints written before it are kept"));
  CHECK(w.code == 3);
  // The chief's checkpoint write is under agree(), which hands its error to every rank.
  CHECK_THAT(w.err, Contains("worker 0 failed") &&
                        Contains("cannot write checkpoint 'job/checkpoints/ckpt-"));
  CHECK(after < 5);
  // metrics.jsonl, written before the failure, is intact.
  CHECK_FALSE(read_metrics(dir / "job" / "metrics.jsonl").empty());
}

TEST_CASE("launch --max-restarts: a worker killed mid-epoch, and the job ends bit-identical",
          "[failures][launch]") {
  TempDir dir("max_restarts");
  make_dataset(dir.path(), "data", 20, 64);  // 100 images: 12 steps of 2 x 4 per epoch
  write_text(dir / "job.yaml", R"(model: {arch: resnet18}
data:
  train: {path: data/train}
  image_size: 64
  seed: 3
  num_workers: 1
  augment: {horizontal_flip: true}
train:
  epochs: 2
  per_replica_batch_size: 4
  threads: 1
  seed: 7
  optimizer: {name: adam, learning_rate: 0.002}
checkpoint: {every_steps: 3, keep: 2}
logging: {every_steps: 1}
)");
  const Result full =
      run_trainer(dir.path(), "launch --workers 2 -- --config job.yaml --job-dir full");
  INFO(full.err);
  REQUIRE(full.code == 0);

  Background launcher(dir.path(),
                      "launch --workers 2 --max-restarts 1 -- --config job.yaml --job-dir split",
                      {}, "launch");
  // Kill worker 1 once the first mid-epoch checkpoint (step 3) is complete.
  bool checkpointed = false;
  for (int i = 0; i < 2400 && !checkpointed; ++i) {
    checkpointed = fs::exists(dir / "split" / "checkpoints" / "ckpt-000000003" / "state.json");
    if (!checkpointed) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  REQUIRE(checkpointed);
  const pid_t worker = launched_worker(launcher.pid(), 1);
  REQUIRE(worker > 0);
  ::kill(worker, SIGKILL);
  const Result r = launcher.wait();
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Contains("restart 1 of 1: worker 1 failed with exit code 137"));
  CHECK_THAT(r.err, Contains("resumed from split/checkpoints/ckpt-"));
  const std::string a = slurp(dir / "full" / "model" / "model.safetensors");
  const std::string b = slurp(dir / "split" / "model" / "model.safetensors");
  CHECK(a.size() > 1000);
  CHECK(a == b);  // the same weights, bit for bit, as the run that never failed
}

TEST_CASE("launch --max-restarts never retries a config error", "[failures][launch]") {
  TempDir dir("no_restart");
  make_dataset(dir.path(), "data", 2, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const Result r = run_trainer(dir.path(),
                               "launch --workers 2 --max-restarts 3 -- --config job.yaml "
                               "--job-dir job --set train.per_replica_batch_size=0");
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK_THAT(r.err, Contains("not restarting") && Contains("exit code 2") &&
                        Contains("train.per_replica_batch_size"));
  CHECK_FALSE(Contains("restart 1 of").match(r.err));
}

TEST_CASE("a worker given a different data set stops every process with exit 2 naming it",
          "[failures]") {
  // The same job.yaml in two directories whose data/ differ (worker 1 sees fewer images): the
  // spec is the same, the listing is not.
  TempDir dir("other_data");
  for (const auto* side : {"a", "b"}) fs::create_directories(dir / side);
  make_dataset(dir / "a", "data", 4, 32);
  make_dataset(dir / "b", "data", 3, 32);
  const std::string job = (dir / "job").string();
  for (const auto* side : {"a", "b"}) write_text(dir / side / "job.yaml", tiny_job_yaml(1));
  const int port = free_port();
  const std::string args = "--config job.yaml --job-dir " + job + std::string(kSlowTimeouts);
  const auto start = Clock::now();
  Background chief(dir / "a", args, {tf_config(2, false, port, "worker", 0)}, "w0");
  Background worker(dir / "b", args, {tf_config(2, false, port, "worker", 1)}, "w1");
  const Result c = chief.wait();
  const Result w = worker.wait();
  INFO("chief: " << c.err);
  INFO("worker 1: " << w.err);
  for (const Result* r : {&c, &w}) {
    CHECK(r->code == 2);
    CHECK_THAT(r->err, Contains("worker 1") && Contains("data.train"));
  }
  CHECK(seconds_since(start) < 60);
}
