// SLURM's environment -> the ClusterSpec TF_CONFIG would give: SLURM's host lists and task
// counts, the TF_CONFIG document derived from a fake `srun` environment, and an error naming the
// variable for each bad input.
#include "common/catch.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainer/cluster/environment.h"
#include "trainer/cluster/slurm.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::cluster;
using trainer::test::Contains;
using Strings = std::vector<std::string>;

TEST_CASE("SLURM host lists expand as scontrol show hostnames does", "[cluster][slurm]") {
  CHECK(expand_hostlist("node[01-03,07],gpu5", "L") ==
        Strings{"node01", "node02", "node03", "node07", "gpu5"});
  CHECK(expand_hostlist("a[1-2]-b[3-4]", "L") == Strings{"a1-b3", "a1-b4", "a2-b3", "a2-b4"});
  CHECK(expand_hostlist("localhost", "L") == Strings{"localhost"});
  CHECK(expand_hostlist("n[8-10]", "L") == Strings{"n8", "n9", "n10"});
  CHECK(expand_hostlist("n[098-100]", "L") == Strings{"n098", "n099", "n100"});
  for (const char* bad : {"", "node[", "node[3-1]", "a]b", "n[1-x]", "n[]", "a,,b", "n[1-2"}) {
    INFO(bad);
    CHECK_THROWS_WITH(expand_hostlist(bad, "slurm: SLURM_JOB_NODELIST"),
                      Contains("slurm: SLURM_JOB_NODELIST: expected a SLURM host list"));
  }
  CHECK_THROWS_WITH(expand_hostlist("n[1-999999]", "L"), Contains("more than 100000 hosts"));
}

TEST_CASE("SLURM task counts per node expand", "[cluster][slurm]") {
  CHECK(expand_tasks_per_node("2(x3),1", "T") == std::vector<int>{2, 2, 2, 1});
  CHECK(expand_tasks_per_node("4", "T") == std::vector<int>{4});
  for (const char* bad : {"", "0", "2(x", "2(x0)", "x", "2(x3", "-1", "2(x999999999)"}) {
    INFO(bad);
    CHECK_THROWS_WITH(expand_tasks_per_node(bad, "slurm: SLURM_TASKS_PER_NODE"),
                      Contains("slurm: SLURM_TASKS_PER_NODE: expected task counts"));
  }
}

namespace {
Environment srun_env(const std::string& procid, const std::string& node, const std::string& local) {
  return {{"SLURM_PROCID", procid},           {"SLURM_NTASKS", "4"},
          {"SLURM_JOB_NODELIST", "gpu[1-2]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_LOCALID", local},           {"SLURMD_NODENAME", node}};
}
}  // namespace

TEST_CASE("a fake srun environment gives the expected TF_CONFIG and role", "[cluster][slurm]") {
  const nlohmann::json expected = nlohmann::json::parse(R"({
    "cluster": {"worker": ["gpu1:2222", "gpu1:2223", "gpu2:2222", "gpu2:2223"]},
    "task": {"type": "worker", "index": 3}})");
  CHECK(nlohmann::json::parse(tf_config_from_slurm(srun_env("3", "gpu2", "1"))) == expected);

  const ClusterSpec spec = cluster_from("slurm", srun_env("3", "gpu2", "1"));
  CHECK(spec.rank == 3);
  CHECK(spec.world_size == 4);
  CHECK_FALSE(spec.is_chief());
  CHECK(spec.chief_address == "gpu1:2222");
  CHECK(spec.own_address == "gpu2:2223");
  CHECK(cluster_from("slurm", srun_env("0", "gpu1", "0")).is_chief());

  Environment env = srun_env("1", "gpu1", "1");
  env["MASTER_PORT"] = "29500";
  env["SLURM_STEP_NODELIST"] = "gpu[1-2]";
  CHECK(cluster_from("slurm", env).own_address == "gpu1:29501");
}

TEST_CASE("a bad or inconsistent srun environment names the variable", "[cluster][slurm]") {
  auto fails = [](Environment env, const std::string& message) {
    INFO(message);
    CHECK_THROWS_WITH(cluster_from("slurm", env), Contains("slurm: ") && Contains(message));
  };
  Environment env = srun_env("3", "gpu2", "1");
  env.erase("SLURM_PROCID");
  fails(env, "SLURM_PROCID is not set");
  env = srun_env("3", "gpu2", "1");
  env.erase("SLURM_NTASKS");
  fails(env, "SLURM_NTASKS is not set: run the trainer with srun");
  env = srun_env("3", "gpu2", "1");
  env["SLURM_TASKS_PER_NODE"] = "2,1";
  fails(env, "adds up to 3 task(s) but SLURM_NTASKS is 4");
  env["SLURM_TASKS_PER_NODE"] = "4";
  fails(env, "gives 1 node(s) but SLURM_JOB_NODELIST names 2");
  env = srun_env("4", "gpu2", "1");
  fails(env, "SLURM_PROCID 4 is not below SLURM_NTASKS 4");
  fails(srun_env("1", "gpu2", "0"), "--distribution=block");  // cyclic placement
  env = srun_env("1", "gpu1", "1");
  env["SLURM_DISTRIBUTION"] = "cyclic";
  fails(env, "--distribution=block");
  env = srun_env("1", "gpu1", "1");
  env["MASTER_PORT"] = "65535";
  fails(env, "past port 65535");
  env["MASTER_PORT"] = "http";
  fails(env, "MASTER_PORT must be an integer");
}
