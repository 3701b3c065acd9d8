#include "trainer/cluster/environment.h"

#include <algorithm>

#include "trainer/cluster/slurm.h"
#include "trainer/cluster/torchrun.h"
#include "trainer/util/error.h"

extern char** environ;  // NOLINT: POSIX

namespace trainer::cluster {

std::string env_value(const Environment& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

std::string first_set(const Environment& env, std::initializer_list<const char*> names,
                      std::string* which) {
  for (const char* n : names) {
    const std::string v = env_value(env, n);
    if (!v.empty()) {
      if (which != nullptr) *which = n;
      return v;
    }
  }
  return "";
}

long parse_count(const std::string& s) {
  if (s.empty() || s.size() > 9 ||
      !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stol(s);
}

long require_int(const Environment& env, const std::string& source, const std::string& name,
                 long min, long max) {
  const std::string v = env_value(env, name);
  if (v.empty()) throw ConfigError(source + ": " + name + " is not set");
  const long n = parse_count(v);
  if (n < min || n > max) {
    throw ConfigError(source + ": " + name + " must be an integer in [" + std::to_string(min) +
                      ", " + std::to_string(max) + "], got '" + v + "'");
  }
  return n;
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

ClusterSpec cluster_from(const std::string& source, const Environment& env) {
  if (source == "tf_config") return parse_tf_config(env_value(env, "TF_CONFIG"));
  if (source == "slurm") return parse_tf_config(tf_config_from_slurm(env));
  if (source == "torchrun") return cluster_from_torchrun(env);
  if (source != "auto") {
    throw ConfigError("distributed.cluster: expected one of auto|tf_config|slurm|torchrun, got '" +
                      source + "'");
  }
  const std::string tf_config = env_value(env, "TF_CONFIG");
  if (tf_config.find_first_not_of(" \t\r\n") != std::string::npos) {
    return parse_tf_config(tf_config);
  }
  if (!env_value(env, "RANK").empty() && !env_value(env, "WORLD_SIZE").empty()) {
    return cluster_from_torchrun(env);
  }
  return ClusterSpec{};
}

ClusterSpec cluster_from_env(const std::string& source) {
  return cluster_from(source, process_environment());
}

}  // namespace trainer::cluster
