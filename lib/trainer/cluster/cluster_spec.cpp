#include "trainer/cluster/cluster_spec.h"

#include <cstdlib>

#include "trainer/util/error.h"

namespace trainer::cluster {

ClusterSpec cluster_from_env() {
  const char* tf_config = std::getenv("TF_CONFIG");
  if (tf_config == nullptr || std::string(tf_config).empty()) return ClusterSpec{};
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(tf_config);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(std::string("TF_CONFIG: not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) throw ConfigError("TF_CONFIG: expected a JSON object, got " + doc.dump());
  if (!doc.contains("cluster")) return ClusterSpec{};
  // A cluster with a single task of any kind is a single local worker; more is multi-worker.
  const auto& cluster = doc["cluster"];
  size_t tasks = 0;
  if (cluster.is_object()) {
    for (const auto& [type, list] : cluster.items()) tasks += list.is_array() ? list.size() : 1;
  }
  if (tasks <= 1) return ClusterSpec{};
  throw ConfigError("TF_CONFIG: describes a cluster of " + std::to_string(tasks) +
                    " tasks, but multi-worker training is not in this build yet; unset TF_CONFIG "
                    "to train on this machine alone");
}

nlohmann::json to_json(const ClusterSpec& spec) {
  return {{"task_type", spec.task_type}, {"task_index", spec.task_index}, {"rank", spec.rank},
          {"world_size", spec.world_size}, {"is_chief", spec.is_chief},
          {"chief_address", spec.chief_address}};
}

}  // namespace trainer::cluster
