// Where this process's role comes from: TF_CONFIG (cluster_spec.h), a SLURM job step (slurm.h:
// `srun trainer --cluster slurm ...`) or a torchrun-style launcher (torchrun.h: RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT). This file holds the environment map the readers share, its small
// helpers, and the dispatch distributed.cluster (or --cluster) asks for:
//   auto      TF_CONFIG when set, else torchrun's variables when RANK and WORLD_SIZE are set,
//             else one local process;
//   tf_config TF_CONFIG only; slurm: SLURM's variables only; torchrun: torchrun's only.
// Pure functions over an environment map, so tests feed fake environments; process_environment()
// and cluster_from_env() read this process's. Thread-safe.
#pragma once

#include <initializer_list>
#include <map>
#include <string>

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

// The integer `name` holds in `env`, in [min, max]. Throws ConfigError starting "`source`: "
// ("slurm: SLURM_PROCID is not set", "torchrun: RANK must be an integer in [0, 1], got '2'").
long require_int(const Environment& env, const std::string& source, const std::string& name,
                 long min, long max);

// The ClusterSpec from `source` (auto | tf_config | slurm | torchrun) and `env`. Throws
// ConfigError (naming distributed.cluster for an unknown source).
ClusterSpec cluster_from(const std::string& source, const Environment& env);

// This process's ClusterSpec from the source distributed.cluster names: cluster_from() over
// process_environment(); TF_CONFIG by default. Throws ConfigError.
ClusterSpec cluster_from_env(const std::string& source = "auto");

}  // namespace trainer::cluster
