// A SLURM job step's role (`srun trainer --cluster slurm ...`): SLURM's variables become the
// TF_CONFIG document of an equivalent cluster (every task's host and port are known), which
// parse_tf_config() then reads as any other. Also SLURM's host-list and tasks-per-node syntaxes,
// which local_rank.h reads too. Pure functions over an environment map; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "trainer/cluster/environment.h"

namespace trainer::cluster {

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

}  // namespace trainer::cluster
