// This process's place in the training cluster. Today: TF_CONFIG absent means one local worker
// that is its own chief; the full TF_CONFIG rules (chief/master/worker/evaluator/ps) land with
// multi-worker training. Plain value; thread-safe.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace trainer::cluster {

struct ClusterSpec {
  std::string task_type = "worker";  // chief | worker | evaluator
  int task_index = 0;
  int rank = 0;        // 0 = chief
  int world_size = 1;  // training replicas (chief + workers)
  bool is_chief = true;
  std::string chief_address;  // host:port of the chief ("" when single-process)
};

// The role of this process from the environment (TF_CONFIG). Throws ConfigError.
ClusterSpec cluster_from_env();

// inspect's `cluster` object.
nlohmann::json to_json(const ClusterSpec& spec);

}  // namespace trainer::cluster
