// This process's local rank from each launcher's environment: torchrun's (and `trainer launch`'s)
// LOCAL_RANK / LOCAL_WORLD_SIZE, srun's SLURM_LOCALID with its node's task count, the position
// among the TF_CONFIG training tasks that share its host (mixed hosts), and none; which source
// wins; and a ConfigError naming the variable and its value for each bad value.
#include "common/catch.h"

#include <string>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/environment.h"
#include "trainer/cluster/local_rank.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::cluster;
using trainer::test::Contains;

namespace {

// A cluster on two hosts, interleaved: chief h1:1, workers h2:1 h1:2 h2:2 h1:3 (ranks 0..4).
const std::string kMixed = R"({"cluster": {"chief": ["h1:1"],
  "worker": ["h2:1", "h1:2", "h2:2", "h1:3"], "evaluator": ["h1:9"]}, "task": )";

ClusterSpec mixed(const std::string& type, int index) {
  return parse_tf_config(kMixed + R"({"type": ")" + type + R"(", "index": )" +
                         std::to_string(index) + "}}");
}

// The ConfigError message local_rank throws, or "(no error)".
std::string error_of(const Environment& env, const ClusterSpec& cluster = {}) {
  try {
    local_rank(env, cluster);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("local rank: torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE", "[cluster][local_rank]") {
  const LocalRank r = local_rank({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}, {});
  CHECK(r.index == 1);
  CHECK(r.world_size == 2);
  CHECK(r.source == "LOCAL_RANK=1 of LOCAL_WORLD_SIZE=2");
  // Without LOCAL_WORLD_SIZE the count is unknown (0).
  const LocalRank alone = local_rank({{"LOCAL_RANK", "3"}}, {});
  CHECK(alone.index == 3);
  CHECK(alone.world_size == 0);
  CHECK(alone.source == "LOCAL_RANK=3");
  // It wins over SLURM's variables and the TF_CONFIG position (trainer launch sets both).
  const LocalRank wins = local_rank(
      {{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}, {"SLURM_LOCALID", "2"}}, mixed("worker", 3));
  CHECK(wins.index == 0);
  CHECK(wins.world_size == 4);
  // A torchrun role (RANK, WORLD_SIZE) with its LOCAL_RANK.
  const Environment torchrun = {{"RANK", "3"},        {"WORLD_SIZE", "4"},
                                {"MASTER_ADDR", "m"}, {"MASTER_PORT", "29500"},
                                {"LOCAL_RANK", "1"},  {"LOCAL_WORLD_SIZE", "2"}};
  const LocalRank tr = local_rank(torchrun, cluster_from("auto", torchrun));
  CHECK(tr.index == 1);
  CHECK(tr.world_size == 2);
}

TEST_CASE("local rank: srun's SLURM_LOCALID and its node's task count", "[cluster][local_rank]") {
  const LocalRank even =
      local_rank({{"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}}, {});
  CHECK(even.index == 1);
  CHECK(even.world_size == 2);
  CHECK(even.source == "SLURM_LOCALID=1 of 2 task(s) on this node");
  // The step's count is read before the job's.
  CHECK(local_rank({{"SLURM_LOCALID", "0"},
                    {"SLURM_STEP_TASKS_PER_NODE", "4"},
                    {"SLURM_TASKS_PER_NODE", "8"}},
                   {})
            .world_size == 4);
  // Uneven nodes: this node found by name in the node list.
  const Environment uneven = {{"SLURM_LOCALID", "0"},
                              {"SLURM_TASKS_PER_NODE", "3,1"},
                              {"SLURM_JOB_NODELIST", "gpu[1-2]"},
                              {"SLURMD_NODENAME", "gpu2"}};
  CHECK(local_rank(uneven, {}).world_size == 1);
  Environment first = uneven;
  first["SLURMD_NODENAME"] = "gpu1";
  first["SLURM_LOCALID"] = "2";
  CHECK(local_rank(first, {}).world_size == 3);
  // Uneven and no node name: unknown; SLURM_NTASKS_PER_NODE alone gives it.
  CHECK(local_rank({{"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "3,1"}}, {}).world_size == 0);
  CHECK(local_rank({{"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "4"}}, {}).world_size == 4);
  const LocalRank bare = local_rank({{"SLURM_LOCALID", "5"}}, {});
  CHECK(bare.index == 5);
  CHECK(bare.world_size == 0);
  CHECK(bare.source == "SLURM_LOCALID=5");
  // SLURM_LOCALID wins over the TF_CONFIG position.
  CHECK(local_rank({{"SLURM_LOCALID", "1"}}, mixed("chief", 0)).index == 1);
}

TEST_CASE("local rank: the position among the TF_CONFIG training tasks on the same host",
          "[cluster][local_rank]") {
  // h1: chief (rank 0), worker 1 (rank 2), worker 3 (rank 4); h2: worker 0, worker 2.
  struct Case {
    const char* type;
    int index;
    int local, count;
  };
  for (const Case& c : {Case{"chief", 0, 0, 3}, Case{"worker", 0, 0, 2}, Case{"worker", 1, 1, 3},
                        Case{"worker", 2, 1, 2}, Case{"worker", 3, 2, 3}}) {
    INFO(c.type << " " << c.index);
    const LocalRank r = local_rank({}, mixed(c.type, c.index));
    CHECK(r.index == c.local);
    CHECK(r.world_size == c.count);
  }
  CHECK(local_rank({}, mixed("worker", 3)).source ==
        "worker 3: local index 2 of 3 training task(s) on host 'h1' in TF_CONFIG");
  // AI Platform's `master` is the chief; one task per host: each is local rank 0 of 1.
  const LocalRank master =
      local_rank({}, parse_tf_config(R"({"cluster": {"master": ["a:1"], "worker": ["b:1", "c:1"]},
                              "task": {"type": "worker", "index": 1}})"));
  CHECK(master.index == 0);
  CHECK(master.world_size == 1);
  // IPv6 hosts compare without their brackets and ports.
  const LocalRank v6 =
      local_rank({}, parse_tf_config(R"({"cluster": {"worker": ["[::1]:5", "[::2]:5", "[::1]:6"]},
                              "task": {"type": "worker", "index": 2}})"));
  CHECK(v6.index == 1);
  CHECK(v6.world_size == 2);
  // Hosts are compared as written: localhost and 127.0.0.1 are two hosts.
  const LocalRank written =
      local_rank({}, parse_tf_config(R"({"cluster": {"worker": ["localhost:5", "127.0.0.1:6"]},
                              "task": {"type": "worker", "index": 1}})"));
  CHECK(written.index == 0);
  CHECK(written.world_size == 1);
  // The evaluator is outside the training world: 0.
  const LocalRank eval = local_rank({}, mixed("evaluator", 0));
  CHECK(eval.index == 0);
  CHECK_THAT(eval.source, Contains("not a training task"));
}

TEST_CASE("local rank: none of them set is local rank 0", "[cluster][local_rank]") {
  const LocalRank one = local_rank({}, {});
  CHECK(one.index == 0);
  CHECK(one.world_size == 1);
  CHECK(one.source == "one process: local index 0");
  // torchrun's variables without LOCAL_RANK (a hand-written script): a worker, whose address is
  // unknown, is 0; so is the chief, the one task on its host that is known.
  const Environment torchrun = {
      {"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "m"}, {"MASTER_PORT", "29500"}};
  const LocalRank worker = local_rank(torchrun, cluster_from("auto", torchrun));
  CHECK(worker.index == 0);
  CHECK_THAT(worker.source, Contains("no LOCAL_RANK"));
  Environment chief_env = torchrun;
  chief_env["RANK"] = "0";
  const LocalRank chief = local_rank(chief_env, cluster_from("auto", chief_env));
  CHECK(chief.index == 0);
  CHECK(chief.world_size == 1);
  // Empty values count as unset.
  CHECK(local_rank({{"LOCAL_RANK", ""}, {"SLURM_LOCALID", ""}}, {}).index == 0);
}

TEST_CASE("local rank: bad values are config errors naming the variable and the value",
          "[cluster][local_rank]") {
  for (const char* bad : {"x", "-1", "1.5", " 1", "+1", "1e3", "99999999999"}) {
    INFO(bad);
    CHECK_THAT(error_of({{"LOCAL_RANK", bad}}),
               Contains("LOCAL_RANK: expected a non-negative integer") &&
                   Contains("got '" + std::string(bad) + "'"));
    CHECK_THAT(error_of({{"SLURM_LOCALID", bad}}),
               Contains("SLURM_LOCALID: expected a non-negative integer") &&
                   Contains("got '" + std::string(bad) + "'"));
  }
  CHECK_THAT(error_of({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "0"}}),
             Contains("LOCAL_WORLD_SIZE: expected a positive integer") && Contains("got '0'"));
  CHECK_THAT(error_of({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "two"}}),
             Contains("LOCAL_WORLD_SIZE") && Contains("got 'two'"));
  CHECK(error_of({{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}) ==
        "LOCAL_RANK '2' is not below LOCAL_WORLD_SIZE '2'");
  CHECK(error_of({{"SLURM_LOCALID", "2"}, {"SLURM_TASKS_PER_NODE", "2"}}) ==
        "SLURM_LOCALID '2' is not below this node's task count 2 (SLURM_TASKS_PER_NODE=2)");
  CHECK_THAT(error_of({{"SLURM_LOCALID", "0"}, {"SLURM_NTASKS_PER_NODE", "0"}}),
             Contains("SLURM_NTASKS_PER_NODE: expected a positive integer") && Contains("got '0'"));
  CHECK_THAT(error_of({{"SLURM_LOCALID", "0"}, {"SLURM_TASKS_PER_NODE", "2(x"}}),
             Contains("SLURM_TASKS_PER_NODE") && Contains("2(x"));
}
