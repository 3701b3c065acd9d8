// One training step of one replica (torchvision's train_one_epoch body): the model on its device
// and in its memory format, its optimizer (built after the placement), the loss scaler (fp16),
// micro-batches, and the gradient average (dist::GradientSync, with the BN running statistics
// and the stop vote in the same buckets). A batch whose images were all corrupt (on_corrupt:
// skip) still takes part in the collectives, with no gradient, so every replica stays in
// lock-step. Also the model-state lists the loop hands to dist/ (replica_state). Not
// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "trainer/config/job_spec.h"
#include "trainer/data/loader.h"
#include "trainer/dist/grad_sync.h"
#include "trainer/dist/process_group.h"
#include "trainer/loop/loss_scaler.h"
#include "trainer/loop/losses.h"
#include "trainer/loop/mixing.h"
#include "trainer/loop/runtime.h"
#include "trainer/model/net.h"

namespace trainer::train {

// What one step computed on this replica. The sums stay on the model's device until the meter
// reads them (every step on the CPU, every logging.every_steps on a GPU), so a GPU step never
// waits for the host.
struct StepResult {
  int64_t examples = 0;
  torch::Tensor loss_sum;  // float64 [], the loss summed over the examples; undefined: none
  torch::Tensor correct;   // int64 [], top-1 hits; undefined: none
  bool skipped = false;    // fp16: an inf/NaN gradient, the optimizer step was skipped
  double loss_scale = 0;   // fp16: the loss scale this step used (0 = no loss scaling)
};

class Stepper {
 public:
  // `net` is placed on settings.device (place_model) before the optimizer is built.
  // distributed: more than one replica (the group's world size > 1).
  Stepper(const config::JobSpec& spec, const ModelSettings& settings, bool distributed,
          model::Net net);

  model::Net& net() { return net_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  LossScaler& scaler() { return scaler_; }

  // After resume and the initial broadcast: gradients (and, unless BN is frozen, the BN running
  // statistics and the stop vote) travel in the same all-reduce buckets.
  void connect(dist::ProcessGroup& group);

  // `mix_seed` draws the batch's mixup/CutMix (train.mixup_alpha, train.cutmix_alpha; unused
  // when both are 0): a function of the position and the replica, so a resumed job mixes alike.
  // The model's own draws (EfficientNet's stochastic depth and dropout) are per example, from
  // example_noise_seed(data.seed, epoch, example): alike whatever the split into replicas and
  // micro-batches, and after a resume.
  StepResult step(const data::Batch& batch, double lr, uint64_t mix_seed = 0, int64_t epoch = 0);

  // train.class_weights resolved for the data (class_weights() of losses.h); {} = none.
  void set_class_weights(const std::vector<double>& weights);

  // Whether any replica was asked to stop (a signal) during this step: voted in the last
  // gradient bucket, so every replica learns the same answer without another collective (on a
  // GPU the vote is read a step late, on every rank alike).
  bool stop_everywhere() const;

  const dist::GradSyncStats& sync_stats() const { return sync_->last_step(); }

 private:
  const config::JobSpec& spec_;
  const ModelSettings& settings_;
  const bool distributed_;
  model::Net net_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LossScaler scaler_;
  LossOptions loss_;
  MixOptions mix_;
  std::unique_ptr<dist::GradientSync> sync_;
  std::shared_ptr<model::StatsReducer> bn_reducer_;  // model.sync_batchnorm: the group's sum
};

// The seed of example `example`'s draws in the model's random layers in epoch `epoch`.
uint64_t example_noise_seed(int64_t data_seed, int64_t epoch, int64_t example);

// Training mode, with the BatchNorm layers left in eval mode when model.freeze_batchnorm.
void set_train_mode(model::Net& net, const config::ModelSpec& spec);

// torch.nn.utils.clip_grad_norm_ (L2, Python's: no host sync): scales every gradient by
// min(1, max_norm / (total_norm + 1e-6)); returns the total norm (a device scalar).
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

// Parameters and buffers: what the replicas must hold identically.
std::vector<torch::Tensor> replica_state(const model::Net& net);

}  // namespace trainer::train
