// A torchrun-style worker's role (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: torchrun,
// Kubeflow's PyTorchJob, hand-written scripts), as the ClusterSpec TF_CONFIG would give, built
// directly (only the master's address is known). A pure function over an environment map;
// thread-safe.
#pragma once

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/environment.h"

namespace trainer::cluster {

// The ClusterSpec of a torchrun-style worker: rank RANK of WORLD_SIZE, worker 0 the chief at
// MASTER_ADDR:MASTER_PORT (MASTER_PORT + 1 under torchrun's static rendezvous, whose agent holds
// MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE=True). Throws ConfigError ("torchrun: ...").
ClusterSpec cluster_from_torchrun(const Environment& env);

}  // namespace trainer::cluster
