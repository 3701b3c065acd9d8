// Multi-worker synchronous training with real processes, real TF_CONFIG and real Gloo over
// loopback: the all-reduce averages exactly, only the chief writes, lock-step holds on uneven
// shards, a differing config stops everyone with exit 2, and a lost peer or an absent chief is
// exit 4 within the configured timeouts.
#include "common/catch.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "fixtures.h"
#include "harness.h"
#include "summaries.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

std::string timeouts() {
  return " --set distributed.rendezvous_timeout_s=60 --set distributed.timeout_s=60";
}

}  // namespace

TEST_CASE("2 workers x batch 4 equal 1 worker x batch 8 (the all-reduce averages)",
          "[multiworker]") {
  TempDir dir("equiv");
  make_dataset(dir.path(), "data", 8, 32);  // 40 images
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string common =
      "--config job.yaml --set data.shard_policy=data --set data.shuffle=false "
      "--set model.freeze_batchnorm=true --set train.optimizer.name=sgd "
      "--set train.optimizer.momentum=0 --set train.optimizer.learning_rate=0.005 "
      "--set data.validation.path= --set train.max_steps=4" +
      timeouts();
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
  const auto a = read_f32(dir / "one" / "model" / "model.safetensors");
  const auto b = read_f32(dir / "two" / "model" / "model.safetensors");
  const double worst = largest_relative_difference(a, b);
  INFO("largest relative difference " << worst);
  CHECK(worst <= 1e-5);
}

TEST_CASE("model.sync_batchnorm: 2 workers x batch 4 equal 1 worker x batch 8 with BN training",
          "[multiworker][syncbn]") {
  // ATen's portable kernels in every process of this test (children inherit the variable). The
  // one process's native BatchNorm sums its statistics in float32 vectors as wide as the CPU's
  // (AVX-512 or AVX2), SyncBN in float64: on a 2-core AMD EPYC with AVX2 alone that order
  // difference grew to 1.4e-3 relative (2e-6 absolute) in conv1's smallest weights after 3
  // steps, against 2.4e-6 with the portable kernels (and 0.78 without SyncBN). What this test
  // proves is the arithmetic of the global statistics, so it compares without the CPU's vector
  // width in the way. The convolutions are oneDNN's, which ATEN_CPU_CAPABILITY does not reach:
  // on a 2-core AMD EPYC with AVX-512 (Zen 5, 2026-12-07) its AVX-512 kernels moved the parameters
  // by 2.7e-2 relative (running statistics 1.3e-2), with or without the trainer's own kernels
  // (TRAINER_ATEN_KERNELS=1 gave the same), and capped at AVX2 the test passes as on AVX2
  // machines (LibTorch 1.13 and 2.11; Debian 13's 2.6 still gave 3.4e-4 on that VM, not yet
  // understood); so oneDNN is capped at AVX2 here too (a no-op where the CPU has no more).
  struct PortableKernels {
    PortableKernels() {
      ::setenv("ATEN_CPU_CAPABILITY", "default", 1);
      ::setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
    }
    ~PortableKernels() {
      ::unsetenv("ATEN_CPU_CAPABILITY");
      ::unsetenv("ONEDNN_MAX_CPU_ISA");
    }
  } portable;
  TempDir dir("syncbn");
  make_dataset(dir.path(), "data", 8, 64);  // 40 images
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string common =
      "--config job.yaml --set data.shard_policy=data --set data.shuffle=false "
      "--set data.image_size=64 --set train.optimizer.name=sgd --set train.optimizer.momentum=0 "
      "--set train.optimizer.learning_rate=0.0005 --set data.validation.path= "
      "--set train.max_steps=3" +
      timeouts();
  const Result one =
      run_trainer(dir.path(), common + " --job-dir one --set train.per_replica_batch_size=8");
  INFO(one.err);
  REQUIRE(one.code == 0);
  // Parameters apart from the running statistics (buffers, compared on their own below).
  auto split = [](std::map<std::string, std::vector<float>> all) {
    std::map<std::string, std::vector<float>> stats;
    for (auto it = all.begin(); it != all.end();) {
      if (it->first.find("running_") != std::string::npos) {
        stats.insert(*it);
        it = all.erase(it);
      } else {
        ++it;
      }
    }
    return std::make_pair(all, stats);
  };
  const auto [a_params, a_stats] = split(read_f32(dir / "one" / "model" / "model.safetensors"));
  for (const bool sync : {true, false}) {
    const std::string name = sync ? "sync" : "local";
    const auto two = run_cluster(dir.path(), 2,
                                 common + " --job-dir " + name +
                                     " --set train.per_replica_batch_size=4 "
                                     "--set model.sync_batchnorm=" +
                                     (sync ? "true" : "false"));
    for (const auto& r : two) {
      INFO(r.err);
      REQUIRE(r.code == 0);
      if (sync) CHECK_THAT(r.err, Contains("BN statistics over the global batch"));
    }
    const auto [b_params, b_stats] = split(read_f32(dir / name / "model" / "model.safetensors"));
    const double params = largest_relative_difference(a_params, b_params);
    const double stats = largest_relative_difference(a_stats, b_stats);
    INFO(name << ": largest relative difference: parameters " << params << ", running stats "
              << stats);
    if (sync) {
      // Statistics over the global batch of 8, as one process computes them. The running
      // means of layer 4 (2 x 2 pixels x 8 images per channel, values near 0) carry the
      // summation-order difference of the two processes' sums: measured 6e-5 (absolute ~1e-7).
      CHECK(params <= 1e-5);
      CHECK(stats <= 2e-4);
    } else {
      CHECK(stats > 1e-2);  // each replica's own 4: the test tells the two apart
    }
  }
}

TEST_CASE("after a 3-process run only the chief's outputs remain and metrics are written once",
          "[multiworker]") {
  TempDir dir("three");
  make_dataset(dir.path(), "data", 6, 32);  // 30 train, 20 validation
  write_text(dir / "job.yaml", tiny_job_yaml(2));
  const auto results = run_cluster(
      dir.path(), 3,
      "--config job.yaml --job-dir job --set train.per_replica_batch_size=4" + timeouts());
  for (const auto& r : results) {
    INFO(r.err);
    REQUIRE(r.code == 0);
  }
  std::set<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir / "job"))
    entries.insert(e.path().filename().string());
  CHECK(entries == std::set<std::string>{"checkpoints", "job.yaml", "logs", "metrics.jsonl",
                                         "model", "trainer.log"});
  // TensorBoard: one events file per run, the chief's; each step once.
  CHECK(tfevents_under(dir / "job").size() == 2);
  CHECK(summary_steps(dir / "job" / "logs" / "train", "loss") == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(summary_steps(dir / "job" / "logs" / "validation", "epoch_accuracy") ==
        std::vector<int64_t>{2, 4});
  // 30 examples / 3 workers = 10 each, batch 4: 2 lock-step steps per epoch, 2 epochs.
  int64_t steps = 0, vals = 0;
  for (const auto& rec : read_metrics(dir / "job" / "metrics.jsonl")) {
    steps += rec.contains("loss") ? 1 : 0;
    vals += rec.contains("val_accuracy") ? 1 : 0;
    if (rec.contains("val_accuracy")) CHECK(rec["val_accuracy"].get<double>() >= 0);
  }
  CHECK(steps == 4);
  CHECK(vals == 2);
  CHECK_THAT(results[0].err, Contains("3 replica"));
  // Validation is exact: evaluate on the exported model reproduces the distributed result.
  const Result eval = run_trainer(dir.path(), "evaluate --model job/model --config job.yaml");
  REQUIRE(eval.code == 0);
  double last_val = -1;
  for (const auto& rec : read_metrics(dir / "job" / "metrics.jsonl")) {
    if (rec.contains("val_accuracy")) last_val = rec["val_accuracy"];
  }
  CHECK(nlohmann::json::parse(eval.out)["accuracy"].get<double>() ==
        Approx(last_val).margin(1e-12));
  CHECK(nlohmann::json::parse(eval.out)["num_examples"] == 20);
}

TEST_CASE("uneven shards: the run ends and every worker ran the agreed steps", "[multiworker]") {
  TempDir dir("uneven");
  make_dataset(dir.path(), "data", 5, 32);  // 25 images over 2 workers: 13 and 12
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const auto results = run_cluster(dir.path(), 2,
                                   "--config job.yaml --job-dir job --set data.shard_policy=file "
                                   "--set train.per_replica_batch_size=4 "
                                   "--set data.validation.path=" +
                                       timeouts());
  for (const auto& r : results) {
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.err, Contains("3 steps per epoch"));  // min(13, 12) / 4
  }
  int64_t steps = 0;
  for (const auto& rec : read_metrics(dir / "job" / "metrics.jsonl")) steps += rec.contains("loss");
  CHECK(steps == 3);
}

TEST_CASE("fewer files than workers: auto says it falls back to data, file refuses",
          "[multiworker]") {
  TempDir dir("fewfiles");
  make_dataset(dir.path(), "data", 1, 32, 2);  // 2 training images
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string common = "inspect --config job.yaml --set train.per_replica_batch_size=1";
  const Result autop = run_trainer(dir.path(), common, {tf_config(3, false, 2222, "worker", 0)});
  CHECK(autop.code == 2);
  CHECK_THAT(autop.err, Contains("auto"));
  CHECK_THAT(autop.err, Contains("-> data"));
  const Result filep = run_trainer(dir.path(), common + " --set data.shard_policy=file",
                                   {tf_config(3, false, 2222, "worker", 0)});
  CHECK(filep.code == 2);
  CHECK_THAT(filep.err, Contains("data.shard_policy: file needs at least 3 files"));
  const Result two = run_trainer(dir.path(), common, {tf_config(2, false, 2222, "worker", 1)});
  INFO(two.err);
  REQUIRE(two.code == 0);
  CHECK(nlohmann::json::parse(two.out)["data"]["shard_policy_effective"] == "file");
}

TEST_CASE("a config that differs on one worker stops every process with exit 2", "[multiworker]") {
  TempDir dir("mismatch");
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const auto results = run_cluster(dir.path(), 2, "--config job.yaml --job-dir job" + timeouts(),
                                   {"", "--set data.image_size=40"});
  for (const auto& r : results) {
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Contains("data.image_size"));
    CHECK_THAT(r.err, Contains("worker 1"));
  }
}

TEST_CASE("a worker killed mid-epoch makes the others exit 4 within the timeout", "[multiworker]") {
  TempDir dir("killed");
  make_dataset(dir.path(), "data", 20, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(50));
  const int port = free_port();
  const std::string args =
      "--config job.yaml --job-dir job --set data.validation.path= "
      "--set distributed.rendezvous_timeout_s=60 --set distributed.timeout_s=5";
  Background chief(dir.path(), args, {tf_config(2, false, port, "worker", 0)}, "w0");
  Background worker(dir.path(), args, {tf_config(2, false, port, "worker", 1)}, "w1");
  for (int i = 0; i < 600 && !fs::exists(dir / "job" / "metrics.jsonl"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(worker.pid(), SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  const Result r = chief.wait();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.err);
  CHECK(r.code == 4);
  CHECK(waited < 30);
  CHECK(fs::exists(dir / "job" / "workertemp_1"));  // the failed worker's scratch is kept
}

TEST_CASE("a worker whose chief never comes exits 4 naming the address", "[multiworker]") {
  TempDir dir("nochief");
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  const Result r = run_trainer(
      dir.path(), "--config job.yaml --job-dir job --set distributed.rendezvous_timeout_s=3",
      {tf_config(2, false, port, "worker", 1)});
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.err);
  CHECK(r.code == 4);
  CHECK_THAT(r.err, Contains("127.0.0.1:" + std::to_string(port)));
  CHECK(waited < 20);
}

TEST_CASE("trainer launch trains a chief and 2 workers in lock-step", "[multiworker][launch]") {
  TempDir dir("launch");
  make_dataset(dir.path(), "data", 6, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const Result r = run_trainer(dir.path(),
                               "launch --chief --workers 2 -- --config job.yaml --job-dir job "
                               "--set train.per_replica_batch_size=4" +
                                   timeouts());
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Contains("[chief] "));
  CHECK_THAT(r.err, Contains("[worker 1] "));
  CHECK_THAT(r.out, Contains("[chief] model: job/model"));
  for (const auto& e : fs::directory_iterator(dir / "job")) {
    CHECK(e.path().filename().string().rfind("workertemp_", 0) == std::string::npos);
  }
  CHECK(fs::exists(dir / "job" / "model" / "model.json"));
}
