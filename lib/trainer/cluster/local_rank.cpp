#include "trainer/cluster/local_rank.h"

#include <algorithm>
#include <initializer_list>
#include <vector>

#include "trainer/cluster/slurm.h"
#include "trainer/util/error.h"

namespace trainer::cluster {

namespace {

constexpr int kMaxLocal = 65536;  // as WORLD_SIZE's bound in torchrun.cpp

// The value of `name` as an integer of at least `min` (0: a rank, 1: a count) and at most
// kMaxLocal. Throws ConfigError naming the variable and the value.
int parse_int(const std::string& name, const std::string& value, int min) {
  const long n = parse_count(value);
  if (n < min || n > kMaxLocal) {
    throw ConfigError(name + ": expected " +
                      (min == 0 ? "a non-negative integer" : "a positive integer") + " up to " +
                      std::to_string(kMaxLocal) + ", got '" + value.substr(0, 100) + "'");
  }
  return static_cast<int>(n);
}

// `count`: "LOCAL_WORLD_SIZE '2'", or what gives a count in words.
void check_below(const std::string& rank_name, const std::string& rank_value, int rank,
                 const std::string& count, int count_value) {
  if (rank >= count_value) {
    throw ConfigError(rank_name + " '" + rank_value + "' is not below " + count);
  }
}

// How many tasks SLURM runs on this node: the step's (or job's) tasks per node, read for this
// node (all nodes alike, or this node found by name in the node list), else
// SLURM_NTASKS_PER_NODE; 0 when none of them says.
int slurm_tasks_here(const Environment& env, std::string& what) {
  std::string tpn_var;
  const std::string tpn =
      first_set(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, &tpn_var);
  if (!tpn.empty()) {
    const std::vector<int> counts = expand_tasks_per_node(tpn, "slurm: " + tpn_var);
    what = tpn_var + "=" + tpn;
    if (std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts[0]; })) {
      return counts[0];
    }
    std::string nodes_var;
    const std::string nodelist =
        first_set(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &nodes_var);
    const std::string node = env_value(env, "SLURMD_NODENAME");
    if (!nodelist.empty() && !node.empty()) {
      const std::vector<std::string> nodes = expand_hostlist(nodelist, "slurm: " + nodes_var);
      const auto at = std::find(nodes.begin(), nodes.end(), node);
      if (nodes.size() == counts.size() && at != nodes.end()) {
        return counts[static_cast<size_t>(at - nodes.begin())];
      }
    }
  }
  const std::string per_node = env_value(env, "SLURM_NTASKS_PER_NODE");
  if (!per_node.empty()) {
    what = "SLURM_NTASKS_PER_NODE=" + per_node;
    return parse_int("SLURM_NTASKS_PER_NODE", per_node, 1);
  }
  return 0;
}

// The host of a cluster address, or "" when it is not "host:port" (a torchrun worker's
// placeholder).
std::string host_or_empty(const std::string& address) {
  try {
    return host_of(address);
  } catch (const ConfigError&) {
    return "";
  }
}

}  // namespace

LocalRank local_rank(const Environment& env, const ClusterSpec& cluster) {
  LocalRank out;
  const std::string local_rank_s = env_value(env, "LOCAL_RANK");
  if (!local_rank_s.empty()) {  // torchrun, trainer launch
    out.index = parse_int("LOCAL_RANK", local_rank_s, 0);
    out.world_size = 0;
    out.source = "LOCAL_RANK=" + local_rank_s;
    const std::string size_s = env_value(env, "LOCAL_WORLD_SIZE");
    if (!size_s.empty()) {
      out.world_size = parse_int("LOCAL_WORLD_SIZE", size_s, 1);
      check_below("LOCAL_RANK", local_rank_s, out.index, "LOCAL_WORLD_SIZE '" + size_s + "'",
                  out.world_size);
      out.source += " of LOCAL_WORLD_SIZE=" + size_s;
    }
    return out;
  }
  const std::string slurm_local_s = env_value(env, "SLURM_LOCALID");
  if (!slurm_local_s.empty()) {  // srun
    out.index = parse_int("SLURM_LOCALID", slurm_local_s, 0);
    std::string what;
    out.world_size = slurm_tasks_here(env, what);
    out.source = "SLURM_LOCALID=" + slurm_local_s;
    if (out.world_size > 0) {
      check_below("SLURM_LOCALID", slurm_local_s, out.index,
                  "this node's task count " + std::to_string(out.world_size) + " (" + what + ")",
                  out.world_size);
      out.source += " of " + std::to_string(out.world_size) + " task(s) on this node";
    }
    return out;
  }
  if (cluster.rank < 0) {  // the evaluator: outside the training world
    out.source = cluster.task_type + " (not a training task): local index 0";
    return out;
  }
  const size_t own = static_cast<size_t>(cluster.rank);
  if (cluster.world_size > 1 && own < cluster.worker_addresses.size() &&
      cluster.own_address == cluster.worker_addresses[own]) {  // TF_CONFIG (or SLURM's, derived)
    const std::string host = host_or_empty(cluster.own_address);
    int before = 0, same = 0;
    for (size_t r = 0; r < cluster.worker_addresses.size(); ++r) {
      if (host_or_empty(cluster.worker_addresses[r]) != host) continue;
      if (r < own) ++before;
      ++same;
    }
    out.index = before;
    out.world_size = same;
    out.source = task_name(cluster, cluster.rank) + ": local index " + std::to_string(before) +
                 " of " + std::to_string(same) + " training task(s) on host '" + host +
                 "' in TF_CONFIG";
    return out;
  }
  if (cluster.world_size > 1) {
    out.source = "no LOCAL_RANK, SLURM_LOCALID or own address in the cluster: local index 0";
  }
  return out;  // one process: local index 0
}

}  // namespace trainer::cluster
