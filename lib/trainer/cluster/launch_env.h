// Where this process's role comes from besides TF_CONFIG: a SLURM job step (`srun trainer
// --cluster slurm ...`) and torchrun-style launchers (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT: torchrun, Kubeflow's PyTorchJob, hand-written scripts). Each becomes the same
// ClusterSpec TF_CONFIG would give: SLURM through an equivalent TF_CONFIG document (every task's
// host and port are known), torchrun directly (only the master's address is known). Pure
// functions over an environment map, so tests feed fake environments; thread-safe.
//
// distributed.cluster (or --cluster) picks the source:
//   auto      TF_CONFIG when set, else torchrun's variables when RANK and WORLD_SIZE are set,
//             else one local process;
//   tf_config TF_CONFIG only; slurm: SLURM's variables only; torchrun: torchrun's only.
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "trainer/cluster/cluster_spec.h"

namespace trainer::cluster {

using Environment = std::map<std::string, std::string>;

// This process's environment.
Environment process_environment();

// The value of `name` in `env`, "" when unset.
std::string env_value(const Environment& env, const std::string& name);

// The first of `names` that is set (non-empty) in `env`, or ""; its name in *which when given.
std::string first_set(const Environment& env, std::initializer_list<const char*> names,
                      std::string* which = nullptr);

// A non-negative decimal integer of at most 9 digits, or -1 (the launchers' counts and ranks).
long parse_count(const std::string& s);

// SLURM's hostlist syntax: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5 (zero
// padding kept, several bracket groups in one name expanded left to right). Throws ConfigError
// naming `what` and the list when it is malformed or expands to more than 100000 hosts.
std::vector<std::string> expand_hostlist(const std::string& list, const std::string& what);

// SLURM_TASKS_PER_NODE: "2(x3),1" -> 2 2 2 1. Throws ConfigError naming `what`.
std::vector<int> expand_tasks_per_node(const std::string& counts, const std::string& what);

// The TF_CONFIG document of this SLURM task: one `worker` per task (worker 0, SLURM_PROCID 0, is
// the chief), task i on the node block distribution puts it on, at port base + its local index
// there; base is MASTER_PORT when set, else 2222. Reads SLURM_PROCID, SLURM_NTASKS (or
// SLURM_STEP_NUM_TASKS), SLURM_STEP_NODELIST / SLURM_JOB_NODELIST, SLURM_STEP_TASKS_PER_NODE /
// SLURM_TASKS_PER_NODE, and checks SLURM_LOCALID and SLURMD_NODENAME against the plan when set
// (a cyclic distribution is refused). Throws ConfigError ("slurm: ...") naming the variable.
std::string tf_config_from_slurm(const Environment& env);

// The ClusterSpec of a torchrun-style worker: rank RANK of WORLD_SIZE, worker 0 the chief at
// MASTER_ADDR:MASTER_PORT (MASTER_PORT + 1 under torchrun's static rendezvous, whose agent holds
// MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE=True). Throws ConfigError ("torchrun: ...").
ClusterSpec cluster_from_torchrun(const Environment& env);

// The ClusterSpec from `source` (auto | tf_config | slurm | torchrun) and `env`.
ClusterSpec cluster_from(const std::string& source, const Environment& env);

}  // namespace trainer::cluster
