// This process's place among the training processes on its host (its local rank), which picks
// its GPU. Taken, in this order, from LOCAL_RANK (+ LOCAL_WORLD_SIZE), as torchrun and `trainer
// launch` set them; SLURM_LOCALID (+ its node's task count); the task's position among the
// cluster's training tasks (TF_CONFIG's chief + workers, rank order) whose host is written as its
// own; else 0. A pure function over an environment map and a ClusterSpec; thread-safe.
#pragma once

#include <string>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/environment.h"

namespace trainer::cluster {

struct LocalRank {
  int index = 0;       // this process's index among the training processes on its host
  int world_size = 1;  // training processes on this host; 0 = unknown (LOCAL_RANK or
                       // SLURM_LOCALID without a count)
  // Where it came from, in words, for logs and inspect: "LOCAL_RANK=1 of LOCAL_WORLD_SIZE=2".
  std::string source = "one process: local index 0";
};

// The local rank of the process with environment `env` and role `cluster`. Throws ConfigError
// naming the variable and its value for a value that is not a non-negative integer (a count:
// positive), and for a local rank not below its count (LOCAL_RANK >= LOCAL_WORLD_SIZE).
LocalRank local_rank(const Environment& env, const ClusterSpec& cluster);

}  // namespace trainer::cluster
