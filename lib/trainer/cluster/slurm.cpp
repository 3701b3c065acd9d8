#include "trainer/cluster/slurm.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "trainer/util/address.h"
#include "trainer/util/error.h"

namespace trainer::cluster {

namespace {

constexpr size_t kMaxHosts = 100000;

// Splits at commas outside brackets.
std::vector<std::string> split_top(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

void expand_one(const std::string& item, const std::string& bad, std::vector<std::string>& out) {
  const size_t lb = item.find('[');
  if (lb == std::string::npos) {
    if (item.empty() || item.find(']') != std::string::npos) throw ConfigError(bad);
    out.push_back(item);
    return;
  }
  const size_t rb = item.find(']', lb);
  if (rb == std::string::npos || item.find('[', lb + 1) < rb) throw ConfigError(bad);
  const std::string prefix = item.substr(0, lb);
  const std::string body = item.substr(lb + 1, rb - lb - 1);
  const std::string rest = item.substr(rb + 1);
  std::vector<std::string> tails;
  if (rest.empty()) {
    tails.push_back("");
  } else {
    expand_one("x" + rest, bad, tails);  // "x": a non-empty stem, stripped below
    for (auto& t : tails) t.erase(0, 1);
  }
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    const std::string range = body.substr(start, comma - start);
    const size_t dash = range.find('-');
    const std::string lo_s = range.substr(0, dash);
    const std::string hi_s = dash == std::string::npos ? lo_s : range.substr(dash + 1);
    const long lo = parse_count(lo_s), hi = parse_count(hi_s);
    if (lo < 0 || hi < lo) throw ConfigError(bad);
    for (long n = lo; n <= hi; ++n) {
      std::string num = std::to_string(n);
      if (num.size() < lo_s.size()) num.insert(0, lo_s.size() - num.size(), '0');
      for (const auto& t : tails) {
        if (out.size() >= kMaxHosts) throw ConfigError(bad + " (more than 100000 hosts)");
        out.push_back(prefix + num + t);
      }
    }
    start = comma + 1;
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list, const std::string& what) {
  const std::string bad = what + ": expected a SLURM host list such as node[01-04,07],gpu5, got '" +
                          list.substr(0, 200) + "'";
  std::vector<std::string> out;
  for (const std::string& item : split_top(list)) expand_one(item, bad, out);
  return out;
}

std::vector<int> expand_tasks_per_node(const std::string& counts, const std::string& what) {
  const std::string bad =
      what + ": expected task counts such as 2(x3),1, got '" + counts.substr(0, 200) + "'";
  std::vector<int> out;
  for (const std::string& item : split_top(counts)) {
    const size_t paren = item.find("(x");
    const long n = parse_count(item.substr(0, paren));
    long times = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') throw ConfigError(bad);
      times = parse_count(item.substr(paren + 2, item.size() - paren - 3));
    }
    if (n < 1 || times < 1 || out.size() + static_cast<size_t>(times) > kMaxHosts) {
      throw ConfigError(bad);
    }
    out.insert(out.end(), static_cast<size_t>(times), static_cast<int>(n));
  }
  return out;
}

std::string tf_config_from_slurm(const Environment& env) {
  const long procid = require_int(env, "slurm", "SLURM_PROCID", 0, 999999);
  std::string ntasks_var = "SLURM_NTASKS";
  const std::string ntasks_s =
      first_set(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, &ntasks_var);
  if (ntasks_s.empty()) {
    throw ConfigError("slurm: SLURM_NTASKS is not set: run the trainer with srun inside the job");
  }
  const long ntasks = require_int(env, "slurm", ntasks_var, 1, 65536);
  std::string nodes_var;
  const std::string nodelist =
      first_set(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &nodes_var);
  if (nodelist.empty()) throw ConfigError("slurm: SLURM_JOB_NODELIST is not set");
  std::string tpn_var;
  const std::string tpn =
      first_set(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, &tpn_var);
  if (tpn.empty()) throw ConfigError("slurm: SLURM_TASKS_PER_NODE is not set");
  const std::vector<std::string> nodes = expand_hostlist(nodelist, "slurm: " + nodes_var);
  const std::vector<int> counts = expand_tasks_per_node(tpn, "slurm: " + tpn_var);
  if (counts.size() != nodes.size()) {
    throw ConfigError("slurm: " + tpn_var + " '" + tpn + "' gives " +
                      std::to_string(counts.size()) + " node(s) but " + nodes_var + " names " +
                      std::to_string(nodes.size()));
  }
  long total = 0;
  for (int c : counts) total += c;
  if (total != ntasks) {
    throw ConfigError("slurm: " + tpn_var + " '" + tpn + "' adds up to " + std::to_string(total) +
                      " task(s) but " + ntasks_var + " is " + std::to_string(ntasks));
  }
  if (procid >= ntasks) {
    throw ConfigError("slurm: SLURM_PROCID " + std::to_string(procid) + " is not below " +
                      ntasks_var + " " + std::to_string(ntasks));
  }
  const std::string dist = env_value(env, "SLURM_DISTRIBUTION");
  if (dist.rfind("cyclic", 0) == 0 || dist.rfind("plane", 0) == 0) {
    throw ConfigError("slurm: SLURM_DISTRIBUTION is '" + dist +
                      "'; the trainer places tasks by block distribution: run srun with "
                      "--distribution=block");
  }
  const std::string port_s = env_value(env, "MASTER_PORT");
  const long base = port_s.empty() ? 2222 : require_int(env, "slurm", "MASTER_PORT", 1, 65535);
  const int most = *std::max_element(counts.begin(), counts.end());
  if (base + most - 1 > 65535) {
    throw ConfigError("slurm: MASTER_PORT " + std::to_string(base) + " + " +
                      std::to_string(most - 1) + " local tasks is past port 65535");
  }

  nlohmann::json workers = nlohmann::json::array();
  std::string own_node;
  long own_local = -1;
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (int j = 0; j < counts[n]; ++j) {
      if (static_cast<long>(workers.size()) == procid) {
        own_node = nodes[n];
        own_local = j;
      }
      workers.push_back(util::host_port(nodes[n], base + j));
    }
  }
  const std::string node_name = env_value(env, "SLURMD_NODENAME");
  const std::string local_s = env_value(env, "SLURM_LOCALID");
  if ((!node_name.empty() && node_name != own_node) ||
      (!local_s.empty() && parse_count(local_s) != own_local)) {
    throw ConfigError("slurm: task " + std::to_string(procid) + " runs on '" + node_name +
                      "' as local task " + local_s + ", but block distribution over " + nodes_var +
                      " puts it on '" + own_node + "' as local task " + std::to_string(own_local) +
                      ": run srun with --distribution=block");
  }
  const nlohmann::json doc = {{"cluster", {{"worker", workers}}},
                              {"task", {{"type", "worker"}, {"index", procid}}}};
  return doc.dump();
}

}  // namespace trainer::cluster
