#include "trainer/loop/losses.h"

#include <cmath>

#include "trainer/util/error.h"

namespace trainer::train {

namespace {

namespace F = torch::nn::functional;

// The smoothed probability targets PyTorch's cross_entropy uses: t (1 - e) + e / C.
torch::Tensor soft_targets(const torch::Tensor& target, int64_t num_classes, double smoothing,
                           const torch::Tensor& like) {
  torch::Tensor t = target.dim() == 1 ? F::one_hot(target, num_classes).to(like.scalar_type())
                                      : target.to(like.scalar_type());
  if (smoothing > 0) t = t * (1.0 - smoothing) + smoothing / static_cast<double>(num_classes);
  return t;
}

torch::Tensor log_t(const torch::Tensor& u, double t) {
  if (t == 1.0) return u.log();
  return (u.pow(1.0 - t) - 1.0) / (1.0 - t);
}

torch::Tensor exp_t(const torch::Tensor& u, double t) {
  if (t == 1.0) return u.exp();
  return (1.0 + (1.0 - t) * u).clamp_min(0.0).pow(1.0 / (1.0 - t));
}

}  // namespace

torch::Tensor tempered_softmax(const torch::Tensor& activations, double t, int num_iters) {
  if (t == 1.0) return activations.softmax(-1);
  const torch::Tensor mu = std::get<0>(activations.max(-1, /*keepdim=*/true));
  const torch::Tensor step0 = activations - mu;
  torch::Tensor normalized = step0;
  for (int i = 0; i < num_iters; ++i) {
    const torch::Tensor partition = exp_t(normalized, t).sum(-1, /*keepdim=*/true);
    normalized = step0 * partition.pow(1.0 - t);
  }
  const torch::Tensor partition = exp_t(normalized, t).sum(-1, /*keepdim=*/true);
  const torch::Tensor constants = -log_t(1.0 / partition, t) + mu;
  return exp_t(activations - constants, t);
}

torch::Tensor training_loss(const torch::Tensor& logits, const torch::Tensor& target,
                            const LossOptions& o) {
  const int64_t classes = logits.size(1);
  if (o.kind == "cross_entropy") {
    auto options = F::CrossEntropyFuncOptions().label_smoothing(o.label_smoothing);
    if (o.class_weights.defined()) options.weight(o.class_weights);
    return F::cross_entropy(logits, target, options);
  }
  // Computed in float32 whatever autocast chose for the logits (as autocast runs cross_entropy).
  const torch::Tensor x = logits.to(torch::kFloat32);
  const bool bi_tempered = o.kind == "bi_tempered";
  torch::Tensor t = soft_targets(target, classes, bi_tempered ? 0.0 : o.label_smoothing, x);
  if (bi_tempered && o.label_smoothing > 0 && classes > 1) {  // the reference's smoothing
    const double c = static_cast<double>(classes);
    t = t * (1.0 - o.label_smoothing * c / (c - 1.0)) + o.label_smoothing / (c - 1.0);
  }
  const torch::Tensor w = o.class_weights.defined()
                              ? o.class_weights.to(x.scalar_type()).view({1, classes})
                              : torch::ones({1, classes}, x.options());
  if (o.kind == "focal") {
    const torch::Tensor logp = x.log_softmax(1);
    const torch::Tensor focus = (1.0 - logp.exp()).clamp_min(1e-6).pow(o.focal_gamma);
    return -(w * t * focus * logp).sum(1).mean();
  }
  if (bi_tempered) {
    const torch::Tensor p = tempered_softmax(x, o.t2);
    const double e = 2.0 - o.t1;
    const torch::Tensor values =
        t * log_t(t + 1e-10, o.t1) - t * log_t(p, o.t1) - t.pow(e) / e + p.pow(e) / e;
    return (w * values).sum(1).mean();
  }
  throw Error(ErrorKind::kInternal, "training_loss: unknown loss '" + o.kind + "'");
}

torch::Tensor weighted_cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& labels,
                                         const LossOptions& o) {
  auto options =
      F::CrossEntropyFuncOptions().label_smoothing(o.label_smoothing).reduction(torch::kSum);
  if (o.class_weights.defined()) options.weight(o.class_weights);
  return F::cross_entropy(logits, labels, options);
}

std::vector<double> class_weights(const std::vector<std::string>& field, int64_t num_classes,
                                  const std::vector<int64_t>& counts) {
  if (field.size() == 1 && field[0] == "none") return {};
  if (field.size() == 1 && field[0] == "balanced") {
    if (static_cast<int64_t>(counts.size()) != num_classes) {
      throw ConfigError(
          "train.class_weights: balanced needs the training labels' counts, which this source "
          "does not list (tfrecord labels are known only when read); give the weights as a list "
          "[w0, w1, ...] instead");
    }
    int64_t n = 0;
    for (const int64_t c : counts) n += c;
    std::vector<double> w;
    for (const int64_t c : counts) {
      w.push_back(c > 0 ? static_cast<double>(n) / (static_cast<double>(num_classes) * c) : 0.0);
    }
    return w;
  }
  if (static_cast<int64_t>(field.size()) != num_classes) {
    throw ConfigError("train.class_weights: expected " + std::to_string(num_classes) +
                      " weights (one per class), got " + std::to_string(field.size()));
  }
  std::vector<double> w;
  for (const auto& s : field) w.push_back(std::stod(s));
  return w;
}

}  // namespace trainer::train
