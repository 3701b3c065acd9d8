// A failure on one rank reaches every rank with its real cause, within seconds: the failing task
// publishes its error in the rendezvous store before it exits; a peer whose collective then fails,
// or that is waiting in one, reads it and exits with that task's kind and message instead of a
// bare "lost the connection" (exit 4) or the collective timeout. Real processes, real TF_CONFIG,
// real Gloo over loopback.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using Catch::Matchers::Contains;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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
  CHECK_THAT(c.err, Contains("checkpoints"));
  CHECK(w.code == 3);
  CHECK_THAT(w.err, Contains("worker 0 failed: data error") && Contains("checkpoints"));
  CHECK(after < 5);
  // metrics.jsonl, written before the failure, is intact.
  CHECK_FALSE(read_metrics(dir / "job" / "metrics.jsonl").empty());
}
