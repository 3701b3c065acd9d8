// The training loop of one process: spec -> data -> model -> optimizer/schedule -> resume ->
// epochs (steps, validation, checkpoints) -> export. Used by run_train. Not thread-safe.
#pragma once

#include <optional>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/job_dir.h"
#include "trainer/config/job_spec.h"
#include "trainer/train/checkpoint.h"

namespace trainer::train {

struct TrainSummary {
  int64_t global_step = 0;
  int64_t epochs_done = 0;
  std::optional<double> val_accuracy;  // after the last epoch, if there is validation data
  bool already_complete = false;       // the job dir held a finished run; nothing was trained
};

// The fields that must not change between runs in one job dir, as a fingerprint.
std::string job_identity(const config::JobSpec& spec);

// Trains `spec` in `job_dir`, resuming from `resume` when given.
TrainSummary train_job(const config::JobSpec& spec, const cluster::ClusterSpec& cluster,
                       const cluster::JobDir& job_dir, const std::optional<CheckpointInfo>& resume);

}  // namespace trainer::train
