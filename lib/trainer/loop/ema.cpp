#include "trainer/loop/ema.h"

#include <algorithm>

#include "trainer/loop/global_rng.h"
#include "trainer/util/error.h"

namespace trainer::train {

namespace {

std::vector<torch::Tensor> state_tensors(const model::Net& net) {
  std::vector<torch::Tensor> out = net->parameters();
  for (const auto& b : net->buffers()) out.push_back(b);
  return out;
}

model::Net fresh_like(const config::ModelSpec& spec, int64_t num_classes) {
  // make_net initialises from the global CPU generator; leave its state as it was.
  const KeepGlobalRng keep;
  return model::make_net({spec.arch, num_classes, spec.head_hidden});
}

}  // namespace

double adjusted_ema_decay(double decay, int64_t global_batch, int64_t every_steps, int64_t epochs) {
  const double adjust = static_cast<double>(global_batch) * static_cast<double>(every_steps) /
                        static_cast<double>(std::max<int64_t>(epochs, 1));
  const double alpha = std::min(1.0, (1.0 - decay) * adjust);
  return 1.0 - alpha;
}

WeightEma::WeightEma(const model::Net& net, const config::ModelSpec& spec, int64_t num_classes,
                     const ModelSettings& settings, double decay)
    : ema_(fresh_like(spec, num_classes)), decay_(decay) {
  place_model(ema_, settings);
  for (auto& p : ema_->parameters()) p.set_requires_grad(false);
  ema_->eval();
  torch::NoGradGuard no_grad;
  const auto from = state_tensors(net);
  const auto to = state_tensors(ema_);
  for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
}

void WeightEma::update(const model::Net& net) {
  torch::NoGradGuard no_grad;
  const auto from = state_tensors(net);
  const auto to = state_tensors(ema_);
  if (from.size() != to.size()) throw Error(ErrorKind::kInternal, "WeightEma: model mismatch");
  for (size_t i = 0; i < to.size(); ++i) {
    const torch::Tensor current = from[i].detach();
    if (count_ == 0 || !to[i].is_floating_point()) {
      to[i].copy_(current);
    } else {
      to[i].copy_(to[i] * decay_ + current * (1.0 - decay_));
    }
  }
  ++count_;
}

model::StateDict WeightEma::state() const { return model::state_dict(*ema_); }

void WeightEma::restore(const model::StateDict& tensors, int64_t count, const std::string& origin) {
  model::load_state_dict(*ema_, tensors, origin);
  count_ = count;
}

}  // namespace trainer::train
