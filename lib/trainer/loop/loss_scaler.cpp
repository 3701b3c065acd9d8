#include "trainer/loop/loss_scaler.h"

#include <cmath>
#include <string>

#include "trainer/util/error.h"

namespace trainer::train {

LossScaler::LossScaler(bool enabled, LossScalerOptions options)
    : enabled_(enabled), options_(options), scale_(options.init_scale) {}

torch::Tensor LossScaler::scale_loss(const torch::Tensor& loss) const {
  return enabled_ ? loss * scale_ : loss;
}

bool LossScaler::unscale_and_update(const std::vector<torch::Tensor>& params) {
  if (!enabled_) return true;
  torch::NoGradGuard no_grad;
  // GradScaler's inverse: the reciprocal in double, applied in float (exact for powers of two).
  const double inv = static_cast<double>(static_cast<float>(1.0 / scale_));
  torch::Tensor found;  // any non-finite gradient value, as a bool tensor on the device
  for (const auto& p : params) {
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const torch::Tensor bad = g.isfinite().logical_not().any();
    found = found.defined() ? found.logical_or(bad) : bad;
    g.mul_(inv);
  }
  const bool overflow = found.defined() && found.item<bool>();
  if (overflow) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_;
    return false;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  return true;
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_}, {"growth_tracker", growth_tracker_}};
}

void LossScaler::restore(const nlohmann::json& state, const std::string& origin) {
  if (!enabled_) return;
  if (!state.is_object() || !state.contains("scale") || !state.contains("growth_tracker") ||
      !state.at("scale").is_number() || !state.at("growth_tracker").is_number_integer()) {
    throw DataError(origin +
                    ": loss_scaler: expected {\"scale\": number, \"growth_tracker\": "
                    "integer}, got " +
                    state.dump());
  }
  const double scale = state.at("scale").get<double>();
  const int64_t tracker = state.at("growth_tracker").get<int64_t>();
  if (!(scale > 0) || !std::isfinite(scale) || tracker < 0) {
    throw DataError(origin +
                    ": loss_scaler: expected a positive finite scale and a tracker >= 0, "
                    "got " +
                    state.dump());
  }
  scale_ = scale;
  growth_tracker_ = tracker;
}

}  // namespace trainer::train
