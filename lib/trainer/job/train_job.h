// The training job of one process of a (possibly one-process) synchronous data-parallel job,
// composed from loop/'s parts (Stepper, EpochMeter, evaluate, checkpoints, the model export):
// data plan -> model (the chief's initial weights broadcast) -> optimizer/schedule -> resume ->
// epochs of lock-step steps (micro-batches optional; gradients, BN running statistics and the
// stop vote averaged in the same dist::GradientSync buckets) -> validation summed over workers ->
// checkpoints and export (chief only, through chief_writes()). Each step records its timings, the
// time it waited for input and its page faults in metrics.jsonl. Used by run_train. Not
// thread-safe.
#pragma once

#include <filesystem>
#include <optional>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/job_dir.h"
#include "trainer/config/job_spec.h"
#include "trainer/dist/process_group.h"
#include "trainer/job/data_plan.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/runtime.h"

namespace trainer::train {

struct TrainSummary {
  int64_t global_step = 0;
  int64_t epochs_done = 0;
  std::optional<double> val_accuracy;  // after the last epoch, if there is validation data
  std::optional<std::filesystem::path> model_dir;  // where this rank exported the model (chief)
};

// The fields that must not change between runs in one job dir, as a fingerprint.
std::string job_identity(const config::JobSpec& spec);

// Everything train_job needs besides the spec: who and where this process is, what it reads,
// whom it talks to, and where it resumes from.
struct TrainContext {
  const cluster::ClusterSpec& cluster;
  const cluster::JobDir& job_dir;
  const DataPlan& plan;
  dist::ProcessGroup& group;
  ModelSettings settings;
  ThreadBudget budget;
  std::optional<CheckpointInfo> resume;
  CheckpointPlan checkpoint_plan;  // recorded in every checkpoint's state.json
};

TrainSummary train_job(const config::JobSpec& spec, const TrainContext& context);

}  // namespace trainer::train
