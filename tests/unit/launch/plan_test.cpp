// `trainer launch`'s plan: the tasks, ports and local ranks of each cluster shape, the TF_CONFIG
// each task gets (checked with the real parse_tf_config), the options refused before anything
// starts, the CPU slices, each process's environment and which failures are restarted.
#include "common/catch.h"

#include <filesystem>
#include <string>
#include <vector>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/job_dir.h"
#include "trainer/launch/plan.h"
#include "trainer/launch/supervisor.h"
#include "trainer/util/error.h"

using trainer::UsageError;
using trainer::cluster::parse_tf_config;
using trainer::launch::LaunchOptions;
using trainer::launch::plan_launch;
using trainer::launch::run_launch;
using trainer::test::Contains;

TEST_CASE("plan_launch: chief at the base port, then the workers, one TF_CONFIG per task") {
  LaunchOptions o;
  o.workers = 2;
  o.chief = true;
  o.args = {"--config", "c.yaml"};
  const auto tasks = plan_launch(o, {5000, 5001, 5002});
  REQUIRE(tasks.size() == 3);
  const std::vector<std::string> names = {"chief", "worker 0", "worker 1"};
  for (size_t i = 0; i < tasks.size(); ++i) {
    CHECK(tasks[i].name() == names[i]);
    CHECK(tasks[i].address == "127.0.0.1:" + std::to_string(5000 + i));
    const auto spec = parse_tf_config(tasks[i].tf_config);
    CHECK(spec.rank == static_cast<int>(i));
    CHECK(spec.world_size == 3);
    CHECK(spec.is_chief() == (i == 0));
    CHECK(spec.has_chief_task);
    CHECK(spec.chief_address == "127.0.0.1:5000");
    CHECK(spec.own_address == tasks[i].address);
    CHECK(spec.task_type == (i == 0 ? "chief" : "worker"));
    CHECK(spec.task_index == (i == 0 ? 0 : static_cast<int>(i) - 1));
  }
  CHECK(tasks[1].tf_config ==
        R"({"cluster":{"chief":["127.0.0.1:5000"],"worker":["127.0.0.1:5001","127.0.0.1:5002"]},)"
        R"("task":{"index":0,"type":"worker"}})");

  o.chief = false;
  o.workers = 3;
  const auto workers = plan_launch(o, {7000, 7001, 7002});
  REQUIRE(workers.size() == 3);
  for (size_t i = 0; i < workers.size(); ++i) {
    CHECK(workers[i].name() == "worker " + std::to_string(i));
    const auto spec = parse_tf_config(workers[i].tf_config);
    CHECK_FALSE(spec.has_chief_task);
    CHECK(spec.rank == static_cast<int>(i));
    CHECK(spec.is_chief() == (i == 0));
    CHECK(spec.chief_address == "127.0.0.1:7000");
  }
  CHECK_THAT(workers[0].tf_config, !Contains("chief"));

  o.host = "::1";
  o.workers = 1;
  CHECK(plan_launch(o, {7000})[0].address == "[::1]:7000");

  // --evaluator: one more task, outside the training world, listed in every TF_CONFIG.
  o.host = "127.0.0.1";
  o.workers = 2;
  o.evaluator = true;
  const auto with_eval = plan_launch(o, {8000, 8001, 8002});
  REQUIRE(with_eval.size() == 3);
  CHECK(with_eval[2].name() == "evaluator");
  const auto eval = parse_tf_config(with_eval[2].tf_config);
  CHECK(eval.task_type == "evaluator");
  CHECK(eval.rank == -1);
  CHECK_FALSE(eval.is_chief());
  CHECK(parse_tf_config(with_eval[0].tf_config).world_size == 2);  // not a training replica
  CHECK_THAT(with_eval[0].tf_config, Contains(R"("evaluator":["127.0.0.1:8002"])"));
  const trainer::cluster::JobDir job("job", eval);
  CHECK(job.write_dir() == std::filesystem::path("job") / "eval");
  CHECK(job.metrics_file() == std::filesystem::path("job") / "eval" / "metrics.jsonl");
}

TEST_CASE("plan_launch: the training tasks are local ranks 0..N-1 of N, as torchrun numbers them") {
  LaunchOptions o;
  o.args = {"--config", "c.yaml"};
  o.workers = 2;
  o.chief = true;
  o.evaluator = true;
  const auto tasks = plan_launch(o, {5000, 5001, 5002, 5003});
  REQUIRE(tasks.size() == 4);
  for (int i = 0; i < 3; ++i) {
    INFO(tasks[static_cast<size_t>(i)].name());
    CHECK(tasks[static_cast<size_t>(i)].local_rank == i);  // its rank
    CHECK(tasks[static_cast<size_t>(i)].local_world_size == 3);
    CHECK(parse_tf_config(tasks[static_cast<size_t>(i)].tf_config).rank == i);
  }
  CHECK(tasks[3].name() == "evaluator");
  CHECK(tasks[3].local_rank == -1);  // outside the training world: no LOCAL_RANK
  o.chief = false;
  o.evaluator = false;
  const auto workers = plan_launch(o, {6000, 6001});
  CHECK(workers[1].local_rank == 1);
  CHECK(workers[1].local_world_size == 2);
}

TEST_CASE("plan_launch: bad options are usage errors naming the option") {
  LaunchOptions o;
  o.args = {"--config", "c.yaml"};
  auto message = [&](LaunchOptions bad, int ports) {
    try {
      plan_launch(bad, std::vector<int>(static_cast<size_t>(ports), 1000));
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  LaunchOptions bad = o;
  bad.workers = 0;
  CHECK_THAT(message(bad, 0), Contains("--workers") && Contains("got 0"));
  bad.workers = 65;
  CHECK_THAT(message(bad, 65), Contains("--workers") && Contains("got 65"));
  bad = o;
  bad.base_port = -1;
  CHECK_THAT(message(bad, 2), Contains("--base-port") && Contains("got -1"));
  bad.base_port = 65535;  // two workers need 65535 and 65536
  CHECK_THAT(message(bad, 2), Contains("--base-port") && Contains("1..65534"));
  bad.base_port = 65534;
  CHECK(message(bad, 2) == "(no error)");
  bad.chief = true;  // now three processes
  CHECK_THAT(message(bad, 3), Contains("--base-port") && Contains("got 65534"));
  bad = o;
  bad.args.clear();
  CHECK_THAT(message(bad, 2), Contains("after `--`"));
  bad.args = {"launch", "--workers", "2"};
  CHECK_THAT(message(bad, 2), Contains("launch"));
  // run_launch validates before starting anything.
  bad.args.clear();
  CHECK_THROWS_AS(run_launch(bad), UsageError);
}

TEST_CASE("split_cpus: contiguous near-equal slices, none when there are too few CPUs") {
  using trainer::launch::split_cpus;
  CHECK(split_cpus({0, 1}, 2) == std::vector<std::vector<int>>{{0}, {1}});
  CHECK(split_cpus({0, 1, 2, 3, 4}, 2) == std::vector<std::vector<int>>{{0, 1, 2}, {3, 4}});
  CHECK(split_cpus({4, 6, 9}, 3) == std::vector<std::vector<int>>{{4}, {6}, {9}});
  // Fewer CPUs than processes: every process keeps the launcher's mask (empty = no pinning).
  CHECK(split_cpus({0, 1}, 3) == std::vector<std::vector<int>>{{}, {}, {}});
  CHECK(split_cpus({0, 1}, 0).empty());
}

TEST_CASE("describe_plan: each task's name and address, in order") {
  LaunchOptions o;
  o.args = {"--config", "c.yaml"};
  o.chief = true;
  o.workers = 1;
  CHECK(trainer::launch::describe_plan(plan_launch(o, {5000, 5001})) ==
        "chief 127.0.0.1:5000, worker 0 127.0.0.1:5001");
  CHECK(trainer::launch::describe_plan({}).empty());
}

TEST_CASE("child_environment: TF_CONFIG and the local rank replaced, the rest kept") {
  LaunchOptions o;
  o.args = {"--config", "c.yaml"};
  o.evaluator = true;
  const auto tasks = plan_launch(o, {5000, 5001, 5002});
  const std::vector<std::string> inherited = {"PATH=/bin",        "TF_CONFIG={}",
                                              "LOCAL_RANK=7",     "LOCAL_WORLD_SIZE=8",
                                              "LOCAL_RANKS=kept", "MY_TF_CONFIG=kept"};
  using trainer::launch::child_environment;
  CHECK(child_environment(inherited, tasks[1]) ==
        std::vector<std::string>{"PATH=/bin", "LOCAL_RANKS=kept", "MY_TF_CONFIG=kept",
                                 "TF_CONFIG=" + tasks[1].tf_config, "LOCAL_RANK=1",
                                 "LOCAL_WORLD_SIZE=2"});
  // The evaluator is outside the training world: no local rank.
  CHECK(child_environment(inherited, tasks[2]) ==
        std::vector<std::string>{"PATH=/bin", "LOCAL_RANKS=kept", "MY_TF_CONFIG=kept",
                                 "TF_CONFIG=" + tasks[2].tf_config});
}

TEST_CASE("decide_restart: only a death or a data or distributed error, while restarts are left") {
  using trainer::launch::decide_restart;
  using trainer::launch::Restart;
  using trainer::launch::restartable;
  for (int code : {3, 4, 129, 134, 137, 139}) {
    INFO(code);
    CHECK(restartable(code));
  }
  for (int code : {0, 1, 2, 5, 127, 128, 130, 143}) {
    INFO(code);
    CHECK_FALSE(restartable(code));
  }
  CHECK(decide_restart(0, false, 0, 3) == Restart::kNo);
  CHECK(decide_restart(4, false, 0, 0) == Restart::kNo);  // --max-restarts 0: nothing to say
  CHECK(decide_restart(4, true, 0, 3) == Restart::kNoAfterSignal);
  CHECK(decide_restart(2, false, 0, 3) == Restart::kNoNotFixable);
  CHECK(decide_restart(143, false, 0, 3) == Restart::kNoNotFixable);
  CHECK(decide_restart(137, false, 2, 3) == Restart::kYes);
  CHECK(decide_restart(137, false, 3, 3) == Restart::kNoRestartsLeft);
}
