#include "trainer/cluster/torchrun.h"

#include <string>

#include "trainer/util/address.h"
#include "trainer/util/error.h"

namespace trainer::cluster {

ClusterSpec cluster_from_torchrun(const Environment& env) {
  const long world = require_int(env, "torchrun", "WORLD_SIZE", 1, 65536);
  const long rank = require_int(env, "torchrun", "RANK", 0, world - 1);
  if (world == 1) return ClusterSpec{};
  const std::string master = env_value(env, "MASTER_ADDR");
  if (master.empty()) throw ConfigError("torchrun: MASTER_ADDR is not set");
  // Under torchrun's static rendezvous the agent's own store holds MASTER_PORT.
  const bool agent_store = env_value(env, "TORCHELASTIC_USE_AGENT_STORE") == "True";
  const long port = require_int(env, "torchrun", "MASTER_PORT", 1, agent_store ? 65534 : 65535) +
                    (agent_store ? 1 : 0);
  ClusterSpec spec;
  spec.task_type = "worker";
  spec.task_index = static_cast<int>(rank);
  spec.rank = static_cast<int>(rank);
  spec.world_size = static_cast<int>(world);
  spec.num_workers = static_cast<int>(world);
  spec.chief_address = util::host_port(master, port);
  spec.own_address = rank == 0 ? spec.chief_address : "";  // others: Gloo picks this host
  spec.worker_addresses.push_back(spec.chief_address);
  for (long r = 1; r < world; ++r)
    spec.worker_addresses.push_back("torchrun RANK " + std::to_string(r));
  return spec;
}

}  // namespace trainer::cluster
