// The evaluator task (TensorFlow's SidecarEvaluator): a process outside the training group that
// watches JOB_DIR/checkpoints/, evaluates every new complete checkpoint on the validation split
// and appends one record per checkpoint to JOB_DIR/eval/metrics.jsonl; it ends (0) once the
// exported model of the whole job exists and has been evaluated too. It never reads a checkpoint
// still being written (temp names are not listed, and every file is checked against state.json),
// and a checkpoint deleted under it (checkpoint.keep) is skipped, not an error. Restarted, it
// skips the steps its metrics.jsonl already holds. Single-threaded.
#pragma once

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/job_dir.h"
#include "trainer/config/job_spec.h"

namespace trainer::train {

// Runs the evaluator until the model is evaluated (returns 0) or a stop signal (Interrupted).
// Throws ConfigError when the job has no validation data.
int run_sidecar_evaluator(const config::JobSpec& spec, const cluster::ClusterSpec& cluster,
                          const cluster::JobDir& job_dir);

}  // namespace trainer::train
