#include "trainer/launch/plan.h"

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/util/address.h"
#include "trainer/util/error.h"

namespace trainer::launch {

namespace {

constexpr int kMaxWorkers = 64;

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

int process_count(const LaunchOptions& o) {
  return o.workers + (o.chief ? 1 : 0) + (o.evaluator ? 1 : 0);
}

void validate_options(const LaunchOptions& o) {
  if (o.workers < 1 || o.workers > kMaxWorkers) {
    throw UsageError("--workers: expected 1.." + std::to_string(kMaxWorkers) + ", got " +
                     std::to_string(o.workers));
  }
  const int last_base = 65535 - (process_count(o) - 1);
  if (o.base_port != 0 && (o.base_port < 1 || o.base_port > last_base)) {
    throw UsageError("--base-port: expected 0 (pick free ports) or 1.." +
                     std::to_string(last_base) + " so that " + std::to_string(process_count(o)) +
                     " consecutive ports fit, got " + std::to_string(o.base_port));
  }
  if (o.args.empty()) {
    throw UsageError(
        "launch: no train arguments; put them after `--`, e.g. "
        "trainer launch --workers 2 -- --config job.yaml --job-dir DIR");
  }
  if (o.args.front() == "launch") {
    throw UsageError(
        "launch: the arguments after `--` are run by every process; they cannot "
        "start with `launch` again");
  }
  if (o.host.empty()) throw UsageError("launch: empty host");
  if (!(o.stop_grace_s >= 0)) {
    throw UsageError("launch: stop_grace_s must be >= 0, got " + std::to_string(o.stop_grace_s));
  }
}

std::vector<std::vector<int>> split_cpus(const std::vector<int>& cpus, int processes) {
  std::vector<std::vector<int>> out(static_cast<size_t>(std::max(processes, 0)));
  if (processes <= 0 || cpus.size() < out.size()) return out;
  const size_t base = cpus.size() / out.size(), extra = cpus.size() % out.size();
  size_t next = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t n = base + (i < extra ? 1 : 0);
    out[i].assign(cpus.begin() + static_cast<long>(next),
                  cpus.begin() + static_cast<long>(next + n));
    next += n;
  }
  return out;
}

std::string LaunchTask::name() const {
  return type == "chief" || type == "evaluator" ? type : type + " " + std::to_string(index);
}

std::vector<LaunchTask> plan_launch(const LaunchOptions& options, const std::vector<int>& ports) {
  validate_options(options);
  if (static_cast<int>(ports.size()) != process_count(options)) {
    throw Error(ErrorKind::kInternal, "plan_launch: expected " +
                                          std::to_string(process_count(options)) + " ports, got " +
                                          std::to_string(ports.size()));
  }
  std::vector<LaunchTask> tasks;
  nlohmann::json cluster = nlohmann::json::object();
  size_t next = 0;
  if (options.chief) {
    tasks.push_back({"chief", 0, util::host_port(options.host, ports[next++]), ""});
    cluster["chief"] = nlohmann::json::array({tasks.back().address});
  }
  cluster["worker"] = nlohmann::json::array();
  for (int i = 0; i < options.workers; ++i) {
    tasks.push_back({"worker", i, util::host_port(options.host, ports[next++]), ""});
    cluster["worker"].push_back(tasks.back().address);
  }
  if (options.evaluator) {
    tasks.push_back({"evaluator", 0, util::host_port(options.host, ports[next++]), ""});
    cluster["evaluator"] = nlohmann::json::array({tasks.back().address});
  }
  const int training = options.workers + (options.chief ? 1 : 0);
  for (size_t i = 0; i < tasks.size(); ++i) {
    LaunchTask& t = tasks[i];
    t.tf_config =
        nlohmann::json{{"cluster", cluster}, {"task", {{"type", t.type}, {"index", t.index}}}}
            .dump();
    if (t.type != "evaluator") {  // chief first, then the workers: their rank
      t.local_rank = static_cast<int>(i);
      t.local_world_size = training;
    }
  }
  return tasks;
}

std::string describe_plan(const std::vector<LaunchTask>& tasks) {
  std::string plan;
  for (const auto& t : tasks) plan += (plan.empty() ? "" : ", ") + t.name() + " " + t.address;
  return plan;
}

std::vector<std::string> child_environment(const std::vector<std::string>& inherited,
                                           const LaunchTask& task) {
  std::vector<std::string> env;
  for (const std::string& e : inherited) {
    if (!starts_with(e, "TF_CONFIG=") && !starts_with(e, "LOCAL_RANK=") &&
        !starts_with(e, "LOCAL_WORLD_SIZE=")) {
      env.push_back(e);
    }
  }
  env.push_back("TF_CONFIG=" + task.tf_config);
  if (task.local_rank >= 0) {
    env.push_back("LOCAL_RANK=" + std::to_string(task.local_rank));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(task.local_world_size));
  }
  return env;
}

bool restartable(int code) {
  return code == 3 || code == 4 || (code > 128 && code != 130 && code != 143);
}

Restart decide_restart(int exit_code, bool stopped_by_signal, int restarts_done, int max_restarts) {
  if (exit_code == 0 || max_restarts == 0) return Restart::kNo;
  if (stopped_by_signal) return Restart::kNoAfterSignal;
  if (!restartable(exit_code)) return Restart::kNoNotFixable;
  if (restarts_done >= max_restarts) return Restart::kNoRestartsLeft;
  return Restart::kYes;
}

}  // namespace trainer::launch
