// The training step as a user sees it: micro-batches give the plain batch's weights (BN frozen),
// every step records its input wait, page faults and kernel time, the binary runs on the
// allocator it was built with, steady steps take few page faults, inspect shows the effective
// precision and thread budget for this process's CPUs, and `trainer launch` gives each local
// worker its own cores.
#include "common/catch.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "common/cpuinfo.h"
#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

// Restricts this process (and so the trainers it starts) to `n` of its CPUs while alive.
class Affinity {
 public:
  explicit Affinity(int n) {
    sched_getaffinity(0, sizeof saved_, &saved_);
    cpu_set_t set;
    CPU_ZERO(&set);
    int left = n;
    for (int cpu = 0; cpu < CPU_SETSIZE && left > 0; ++cpu) {
      if (CPU_ISSET(cpu, &saved_)) {
        CPU_SET(cpu, &set);
        --left;
      }
    }
    sched_setaffinity(0, sizeof set, &set);
  }
  ~Affinity() { sched_setaffinity(0, sizeof saved_, &saved_); }

 private:
  cpu_set_t saved_;
};

int affinity_cores() {
  cpu_set_t set;
  sched_getaffinity(0, sizeof set, &set);
  return CPU_COUNT(&set);
}

}  // namespace

TEST_CASE("micro-batches of 4 give the weights of the plain batch of 8 when BN is frozen",
          "[step]") {
  TempDir dir("micro");
  make_dataset(dir.path(), "data", 8, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string common =
      "--config job.yaml --set data.shuffle=false --set model.freeze_batchnorm=true "
      "--set train.optimizer.name=sgd --set train.optimizer.momentum=0 "
      "--set train.optimizer.learning_rate=0.005 --set data.validation.path= "
      "--set train.max_steps=3 --set train.per_replica_batch_size=8";
  const Result plain = run_trainer(dir.path(), common + " --job-dir plain");
  INFO(plain.err);
  REQUIRE(plain.code == 0);
  const Result micro =
      run_trainer(dir.path(), common + " --job-dir micro --set train.micro_batch_size=4");
  INFO(micro.err);
  REQUIRE(micro.code == 0);
  CHECK_THAT(micro.err, Contains("8 per replica x 1 replica(s) in micro-batches of 4"));
  const double worst =
      largest_relative_difference(read_f32(dir / "plain" / "model" / "model.safetensors"),
                                  read_f32(dir / "micro" / "model" / "model.safetensors"));
  INFO("largest relative difference " << worst);
  CHECK(worst <= 1e-5);
  // The losses recorded per step are the batch's, however it was split.
  const auto a = read_metrics(dir / "plain" / "metrics.jsonl");
  const auto b = read_metrics(dir / "micro" / "metrics.jsonl");
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].contains("loss")) {
      CHECK(b[i]["loss"].get<double>() == Approx(a[i]["loss"].get<double>()).epsilon(1e-5));
    }
  }
}

TEST_CASE(
    "every step records input wait, page faults and kernel time, and steady steps fault little",
    "[step]") {
  TempDir dir("usage");
  make_dataset(dir.path(), "data", 8, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const Result r = run_trainer(
      dir.path(),
      "--config job.yaml --job-dir job --set data.validation.path= --set train.max_steps=8 "
      "--set train.per_replica_batch_size=4");
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::vector<double> faults;
  bool epoch_seen = false;
  for (const auto& rec : read_metrics(dir / "job" / "metrics.jsonl")) {
    if (rec.contains("loss")) {
      for (const char* key : {"data_wait_s", "minor_faults", "sys_time_s", "step_time_s"}) {
        INFO(key);
        REQUIRE(rec.contains(key));
        CHECK(rec[key].get<double>() >= 0);
      }
      CHECK(rec["data_wait_s"].get<double>() <= rec["step_time_s"].get<double>());
      faults.push_back(rec["minor_faults"].get<double>());
    } else if (rec.contains("minor_faults_per_step")) {
      epoch_seen = true;
      CHECK(rec.contains("data_wait_share"));
      CHECK(rec.contains("sys_time_per_step_s"));
    }
  }
  CHECK(epoch_seen);
  REQUIRE(faults.size() == 8);
  CHECK_THAT(r.err, Contains("minor page faults") && Contains("waiting for input"));
#if TRAINER_EXPECT_JEMALLOC
  CHECK_THAT(r.err, Contains("memory: jemalloc") && Contains("freed pages stay mapped"));
  // The first step maps the activations; once warm, a step reuses them. (The decode threads'
  // images and the logging still touch a few fresh pages.)
  std::vector<double> steady(faults.begin() + 3, faults.end());
  std::sort(steady.begin(), steady.end());
  INFO("first step " << faults[0] << " faults; steady median " << steady[steady.size() / 2]);
  CHECK(steady[steady.size() / 2] * 10 < faults[0]);
#else
  CHECK_THAT(r.err, Contains("memory: glibc"));
#endif
}

TEST_CASE("inspect shows the effective precision, layout and thread budget of this process",
          "[step]") {
  TempDir dir("runtime");
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const auto flags = trainer::test_support::proc_cpuinfo_flags();
  const bool native = flags.count("avx512_bf16") > 0 || flags.count("amx_bf16") > 0;
  {
    Affinity one(1);
    const Result r = run_trainer(
        dir.path(),
        "inspect --config job.yaml --set train.precision=auto --set train.channels_last=true "
        "--set train.threads=0 --set data.num_workers=auto",
        {"TRAINER_CACHE_DIR=" + (dir / "cache").string()});
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto rt = nlohmann::json::parse(r.out)["runtime"];
    // Where bf16 is native, fp32 and bf16 (channels_last) were timed and the faster one named;
    // elsewhere bf16 is emulated and fp32 the only candidate.
    const auto& choice = rt["format_choice"];
    if (native) {
      REQUIRE(choice["candidates"].size() == 2);
      const auto& c = choice["candidates"];
      CHECK(rt["precision"] ==
            c[c[0]["ms"].get<double>() <= c[1]["ms"].get<double>() ? 0 : 1]["precision"]);
    } else {
      CHECK(rt["precision"] == "fp32");
      CHECK(choice["source"] == "only");
    }
    CHECK(rt["precision_requested"] == "auto");
    CHECK(rt["memory_format"] == "channels_last");
    CHECK(rt["threads"]["cores"] == 1);
    CHECK(rt["threads"]["intra_op"] == 1);
    CHECK(rt["threads"]["decode"] == 1);
    CHECK(rt["cpu"]["native_bf16"] == native);
  }
  const Result all = run_trainer(dir.path(), "inspect --config job.yaml --set train.threads=0");
  REQUIRE(all.code == 0);
  CHECK(nlohmann::json::parse(all.out)["runtime"]["threads"]["cores"] == affinity_cores());

  // channels_last: auto is timed: the layout named is the faster one, and the next start reads
  // the choice from the cache.
  const std::string args =
      "inspect --config job.yaml --set train.precision=fp32 --set train.channels_last=auto";
  const std::vector<std::string> env{"TRAINER_CACHE_DIR=" + (dir / "cache").string()};
  const Result timed = run_trainer(dir.path(), args, env);
  INFO(timed.err);
  REQUIRE(timed.code == 0);
  const auto rt = nlohmann::json::parse(timed.out)["runtime"];
  const auto& c = rt["format_choice"]["candidates"];
  REQUIRE(c.size() == 2);
  CHECK(rt["format_choice"]["source"] == "measured");
  CHECK(rt["memory_format"] ==
        c[c[0]["ms"].get<double>() <= c[1]["ms"].get<double>() ? 0 : 1]["memory_format"]);
  CHECK(rt["memory_format_requested"] == "auto");
  const Result again = run_trainer(dir.path(), args, env);
  REQUIRE(again.code == 0);
  const auto rt2 = nlohmann::json::parse(again.out)["runtime"];
  CHECK(rt2["format_choice"]["source"] == "cached");
  CHECK(rt2["memory_format"] == rt["memory_format"]);
}

TEST_CASE("trainer launch gives each local worker its own cores", "[step][launch]") {
  const int cores = affinity_cores();
  if (cores < 2) {
    WARN("one core only: launch does not pin, nothing to check");
    return;
  }
  TempDir dir("pin");
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const Result r = run_trainer(
      dir.path(),
      "launch --workers 2 -- --config job.yaml --job-dir job --set train.max_steps=1 "
      "--set train.threads=0 --set data.validation.path= --set distributed.timeout_s=60 "
      "--set train.channels_last=auto");
  INFO(r.err);
  REQUIRE(r.code == 0);
  // channels_last: auto is timed by the chief alone; the other worker takes its choice.
  CHECK_THAT(r.err, Contains("[worker 0] ") && Contains("measured in"));
  CHECK_THAT(r.err, Contains("the chief's choice"));
  const int half = cores / 2;  // worker 0 gets the extra one when odd
  CHECK_THAT(r.err, Contains("launch: worker 1 runs on CPU"));
  CHECK_THAT(r.err,
             Contains("[worker 1] ") &&
                 Contains(std::to_string(half) + " core(s) in this process's CPU affinity: " +
                          std::to_string(half) + " intra-op"));
  CHECK_THAT(r.err, Contains("BN statistics averaged in the last bucket"));
}
