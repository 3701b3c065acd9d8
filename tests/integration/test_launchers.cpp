// The same binary under other launchers: a SLURM job step (`srun trainer --cluster slurm`, its
// variables faked as srun sets them for two tasks on one node) and torchrun-style variables
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) train over real Gloo like a TF_CONFIG cluster.
#include "common/catch.h"

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

std::vector<std::string> srun_env(int procid, int port) {
  return {"SLURM_JOB_ID=77",
          "SLURM_PROCID=" + std::to_string(procid),
          "SLURM_LOCALID=" + std::to_string(procid),
          "SLURM_NTASKS=2",
          "SLURM_JOB_NODELIST=localhost",
          "SLURM_TASKS_PER_NODE=2",
          "SLURMD_NODENAME=localhost",
          "MASTER_PORT=" + std::to_string(port)};
}

void check_trained(const fs::path& dir, const Result& chief, const Result& worker) {
  INFO("chief: " << chief.err);
  INFO("worker: " << worker.err);
  CHECK(chief.code == 0);
  CHECK(worker.code == 0);
  CHECK_THAT(chief.err, Contains("as worker 0 (rank 0 of 2)"));
  CHECK_THAT(worker.err, Contains("as worker 1 (rank 1 of 2)"));
  CHECK(fs::exists(dir / "job" / "model" / "model.safetensors"));
}

}  // namespace

TEST_CASE("inspect --cluster slurm prints the TF_CONFIG the srun task amounts to", "[launchers]") {
  TempDir dir("slurm_inspect");
  make_dataset(dir.path(), "data", 8, 32);  // a full batch of 10 for each of 4 workers
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const Result r = run_trainer(dir.path(), "inspect --config job.yaml --cluster slurm",
                               {"SLURM_PROCID=3", "SLURM_LOCALID=1", "SLURM_NTASKS=4",
                                "SLURM_JOB_NODELIST=gpu[1-2]", "SLURM_TASKS_PER_NODE=2(x2)"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  CHECK(doc["cluster"]["rank"] == 3);
  CHECK(doc["cluster"]["chief_address"] == "gpu1:2222");
  CHECK(doc["cluster"]["tf_config"] ==
        nlohmann::json::parse(R"({"cluster": {"worker": ["gpu1:2222", "gpu1:2223", "gpu2:2222",
                              "gpu2:2223"]}, "task": {"type": "worker", "index": 3}})"));
  CHECK(doc["job"]["distributed"]["cluster"] == "slurm");
  CHECK(doc["runtime"]["local_rank"]["index"] == 1);
  CHECK(doc["runtime"]["local_rank"]["world_size"] == 2);
  CHECK(doc["runtime"]["local_rank"]["source"] == "SLURM_LOCALID=1 of 2 task(s) on this node");

  const Result bad = run_trainer(dir.path(), "inspect --config job.yaml --cluster slurm", {});
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Contains("slurm: SLURM_PROCID is not set"));
}

TEST_CASE("two SLURM tasks train together from srun's variables", "[launchers][multiworker]") {
  TempDir dir("slurm_train");
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const int port = free_port();
  const std::string args = "--config job.yaml --job-dir job --cluster slurm";
  Background chief(dir.path(), args, srun_env(0, port), "s0");
  Background worker(dir.path(), args, srun_env(1, port), "s1");
  const Result c = chief.wait();
  check_trained(dir.path(), c, worker.wait());
}

TEST_CASE("inspect shows the device LOCAL_RANK picks, and refuses bad local ranks", "[launchers]") {
  TempDir dir("local_rank_inspect");
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::vector<std::string> torchrun = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                             "MASTER_PORT=29500"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), torchrun.begin(), torchrun.end());
    return extra;
  };
  const Result r = run_trainer(dir.path(), "inspect --config job.yaml",
                               with({"LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2"}));
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto rt = nlohmann::json::parse(r.out)["runtime"];
  CHECK(rt["local_rank"]["index"] == 1);
  CHECK(rt["local_rank"]["world_size"] == 2);
  CHECK(rt["local_rank"]["source"] == "LOCAL_RANK=1 of LOCAL_WORLD_SIZE=2");
  const bool cpu_only = rt["device"] == "cpu";
  if (cpu_only) {
    CHECK(rt["device_reason"] == "train.device: auto, no CUDA GPU visible to this LibTorch");
  } else {
    CHECK_THAT(rt["device_reason"].get<std::string>(),
               Contains("LOCAL_RANK=1 of LOCAL_WORLD_SIZE=2"));
  }

  const Result bad = run_trainer(dir.path(), "inspect --config job.yaml",
                                 with({"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"}));
  CHECK(bad.code == 2);
  CHECK_THAT(bad.err, Contains("LOCAL_RANK '2' is not below LOCAL_WORLD_SIZE '2'"));
  const Result word =
      run_trainer(dir.path(), "inspect --config job.yaml", with({"LOCAL_RANK=one"}));
  CHECK(word.code == 2);
  CHECK_THAT(word.err, Contains("LOCAL_RANK: expected a non-negative integer"));
  if (cpu_only) {  // cuda:N without a GPU, before anything else starts
    const Result gpu =
        run_trainer(dir.path(), "inspect --config job.yaml --set train.device=cuda:1",
                    with({"LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2"}));
    CHECK(gpu.code == 2);
    CHECK_THAT(gpu.err, Contains("train.device: 'cuda:1' requested"));
  }
}

TEST_CASE("torchrun-style variables train without TF_CONFIG", "[launchers][multiworker]") {
  TempDir dir("torchrun_train");
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string port = std::to_string(free_port());
  auto env = [&](int rank) {
    return std::vector<std::string>{"RANK=" + std::to_string(rank),
                                    "LOCAL_RANK=" + std::to_string(rank), "WORLD_SIZE=2",
                                    "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port};
  };
  Background chief(dir.path(), "--config job.yaml --job-dir job", env(0), "t0");
  Background worker(dir.path(), "--config job.yaml --job-dir job", env(1), "t1");
  const Result c = chief.wait();
  check_trained(dir.path(), c, worker.wait());
}
