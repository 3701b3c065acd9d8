// The exponential moving average of the weights (train.ema), as torchvision's reference keeps it
// (ExponentialMovingAverage over AveragedModel with use_buffers=True): a second network whose
// parameters and floating buffers follow avg = decay * avg + (1 - decay) * current, updated every
// train.ema.every_steps batches of an epoch (batch i with i % every_steps == 0); the first update
// after a reset copies the weights (during the LR warm-up torchvision resets the count after every
// update, so the average starts when the warm-up ends). Integer buffers (BN's
// num_batches_tracked) are copied. The decay is adjusted for the global batch, the update period
// and the epochs as the reference does (adjusted_ema_decay). Every replica holds the same weights
// after each step, so every replica's average is the same without communication. Not
// thread-safe.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "trainer/loop/runtime.h"
#include "trainer/model/net.h"
#include "trainer/model/safetensors.h"

namespace trainer::train {

// torchvision: alpha = min(1, (1 - decay) * global_batch * every_steps / epochs), decay' = 1 -
// alpha.
double adjusted_ema_decay(double decay, int64_t global_batch, int64_t every_steps, int64_t epochs);

class WeightEma {
 public:
  // A network of the same architecture as `net`, placed as `settings` says, holding a copy of
  // `net`'s weights (count 0: the first update copies again). The global CPU generator is left
  // as it was.
  WeightEma(const model::Net& net, const config::ModelSpec& spec, int64_t num_classes,
            const ModelSettings& settings, double decay);

  void update(const model::Net& net);
  void reset_count() { count_ = 0; }
  int64_t count() const { return count_; }
  double decay() const { return decay_; }

  model::Net& net() { return ema_; }
  const model::Net& net() const { return ema_; }

  // For checkpoints: the averaged state dict and the count.
  model::StateDict state() const;
  void restore(const model::StateDict& tensors, int64_t count, const std::string& origin);

 private:
  model::Net ema_;
  double decay_;
  int64_t count_ = 0;
};

}  // namespace trainer::train
