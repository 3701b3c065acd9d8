// Dynamic loss scaling for fp16 training, torch.cuda.amp.GradScaler's rule: the loss is
// multiplied by `scale` before backward so that small fp16 gradients do not flush to zero; once
// the gradients are complete (after the all-reduce, so every replica sees the same values) they
// are divided by it and checked. A step with an inf or NaN gradient is skipped and the scale
// halves; after `growth_interval` good steps in a row it doubles. Disabled (fp32, bf16), every
// call is the identity. The state (scale, good steps in a row) goes into checkpoints, so a
// resumed fp16 run takes the same steps. Not thread-safe; one per Stepper.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace trainer::train {

struct LossScalerOptions {
  double init_scale = 65536.0;     // 2^16, GradScaler's default
  double growth_factor = 2.0;      // after growth_interval good steps in a row
  double backoff_factor = 0.5;     // after a step with inf/NaN gradients
  int64_t growth_interval = 2000;  // good steps in a row before the scale grows
};

class LossScaler {
 public:
  explicit LossScaler(bool enabled, LossScalerOptions options = {});

  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t skipped_steps() const { return skipped_; }  // by this object, since construction

  // loss x scale (a new tensor); `loss` itself when disabled.
  torch::Tensor scale_loss(const torch::Tensor& loss) const;

  // After the step's gradients are complete: divides every defined .grad of `params` by the
  // scale (in place) and updates the scale. Returns false when a gradient holds an inf or NaN:
  // the caller skips the optimizer step. Reads one value from the device (as GradScaler.step
  // does): the only host read of an fp16 step. Disabled: returns true, touches nothing.
  bool unscale_and_update(const std::vector<torch::Tensor>& params);

  // {"scale": s, "growth_tracker": n} (a checkpoint's state.json `loss_scaler`), and back.
  // restore() throws DataError naming `origin` for a scale that is not a positive finite number
  // or a negative tracker.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state, const std::string& origin);

 private:
  bool enabled_;
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace trainer::train
