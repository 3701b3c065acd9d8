// Gradient averaging across replicas, overlapped with backward (DDP's Reducer, small). The
// parameters are split into buckets of about bucket_mb, in reverse registration order (the order
// in which backward produces their gradients). An autograd hook on each parameter copies its
// gradient into its bucket's flat buffer; once every gradient of a bucket has arrived, and every
// earlier bucket has been launched, the bucket's all-reduce starts asynchronously, so
// communication runs while backward computes the rest. finish() completes the step.
// A parameter whose gradient never arrives on a rank (unused in this forward) counts as zero
// there; one unused on every rank keeps its .grad untouched, as without distribution.
// Ownership: holds handles to the parameters (not the module) and its buffers; the hooks it
// registers are removed by its destructor. Thread-safety: one backward at a time; the hooks may
// run on autograd's threads; finish() on the thread that ran backward(), after it returned.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "trainer/dist/process_group.h"

namespace trainer::dist {

// What rides along with the gradients, so that a step needs no other collective.
struct GradSyncOptions {
  double bucket_mb = 25;  // gradient all-reduce bucket size
  // Floating-point tensors averaged across replicas in the last bucket to launch (BN running
  // statistics, as MultiWorkerMirroredStrategy aggregates them): read when that bucket launches
  // (after the forward pass that updated them), written back by finish(). Any layout.
  std::vector<torch::Tensor> averaged_buffers;
  // Read when the last bucket launches: this rank's vote to stop (a stop signal). finish() then
  // reports in last_step().stop_votes how many ranks voted, the same number on every rank.
  std::function<bool()> stop_vote;
};

struct GradSyncStats {
  double wait_s = 0;             // in finish(), waiting for the all-reduces (exposed comm time)
  double finish_s = 0;           // all of finish(): launches left, wait, average, copy back
  int buckets = 0;               // all-reduces this step
  int launched_in_backward = 0;  // of them, started by the hooks (overlapped with backward)
  int64_t bytes = 0;             // all-reduced this step
  int stop_votes = 0;            // ranks whose stop_vote said stop this step
};

class GradientSync {
 public:
  // `parameters` in registration order (module->parameters()); those not requiring grad are
  // ignored (finish() refuses to run if one of them later does). Construct after the model has its
  // final device, dtype and memory format: the buffers are laid out then. Every rank must construct
  // it with the same parameter shapes. With world_size 1 it registers nothing and finish() does
  // nothing.
  GradientSync(ProcessGroup& group, std::vector<torch::Tensor> parameters, double bucket_mb = 25);
  GradientSync(ProcessGroup& group, std::vector<torch::Tensor> parameters, GradSyncOptions options);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Call after each backward, before optimizer.step(): launches the buckets not yet launched,
  // waits for all in order, and sets each parameter's .grad to the average over replicas. The
  // .grad is then a view into its bucket (DDP's gradient_as_bucket_view, same layout as the
  // parameter; a copy for bf16 parameters), valid until the next backward writes the bucket:
  // reset the gradients (set them undefined) before the next step's backward. One synced
  // backward per finish(): a second gradient for a parameter before finish() is an error.
  // Throws DistributedError when a peer is lost or times out.
  void finish();

  // Gradient accumulation (micro-batches): while `on`, backward passes only accumulate into
  // .grad locally (DDP's no_sync); the next backward with it off sends .grad + its gradient,
  // i.e. the accumulated sum, and finish() averages that.
  void set_accumulating(bool on);

  const GradSyncStats& last_step() const;
  int num_buckets() const;
  // Indices into the constructor's `parameters` of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_assignment() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainer::dist
