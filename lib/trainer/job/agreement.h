// What all training processes must agree on before and while they train: that every one runs the
// same job (spec, data listing, program version), and that a step which fails on one process
// fails on all of them with the same error kind, naming the task that failed, instead of leaving
// the others waiting for a collective. Every rank must call these in the same order (they are
// collectives). With one process they just run the step.
#pragma once

#include <functional>
#include <string>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/job_dir.h"
#include "trainer/config/job_spec.h"
#include "trainer/data/example.h"
#include "trainer/dist/process_group.h"

namespace trainer::train {

// Runs `step`; if it throws a trainer::Error on any rank, every rank throws an Error of the
// first failing rank's kind, with its message prefixed by that task's name. `what` names the
// step for messages ("listing the data").
void agree(dist::ProcessGroup& group, const cluster::ClusterSpec& cluster, const std::string& what,
           const std::function<void()>& step);

// The one door to what only the chief writes in the job dir (job.yaml, checkpoints, model/,
// the TensorBoard runs): every rank calls it, in the same order (a collective); on the chief
// `write` runs while the job dir is present (JobDir::write_while_present), the others only
// learn how it went (agree()), so a failed write fails every rank with the chief's error.
// `what` names the write for messages ("writing a checkpoint").
void chief_writes(dist::ProcessGroup& group, const cluster::ClusterSpec& cluster,
                  const cluster::JobDir& job_dir, const std::string& what,
                  const std::function<void()>& write);

// The text every rank must share: every job-spec field but logging.*, a digest of the train and
// validation listings, and the program version, one "name=value" line each.
std::string job_description(const config::JobSpec& spec, const data::Listing& train,
                            const data::Listing* validation);

// Compares every rank's job_description() with the chief's (through the rendezvous store, in
// O(1) store operations per rank) and throws ConfigError on every rank when one differs, naming
// the lowest such task and the first line (field) that differs.
void verify_same_job(dist::ProcessGroup& group, const cluster::ClusterSpec& cluster,
                     const std::string& description);

}  // namespace trainer::train
