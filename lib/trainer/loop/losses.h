// The training losses (train.loss) over hard labels or soft targets (mixup/CutMix), with label
// smoothing and class weights as PyTorch's nn.CrossEntropyLoss applies them:
//   cross_entropy: F.cross_entropy(logits, target, weight, label_smoothing), mean reduction (hard
//                  labels: divided by the summed weight of the batch's labels; soft targets: by
//                  the batch size), exactly PyTorch's;
//   focal:         Lin et al.'s focal loss, -sum_c w_c t_c (1 - p_c)^gamma log p_c, mean over the
//                  batch (gamma 0 = weighted cross-entropy over the smoothed targets); 1 - p is
//                  kept above 1e-6 so a gamma below 1 has a finite gradient;
//   bi_tempered:   Amid et al.'s bi-tempered logistic loss (t1 <= 1, t2 >= 1; the tempered
//                  softmax by the reference's fixed-point normalisation, 5 iterations; label
//                  smoothing as the reference smooths: t (1 - e C / (C - 1)) + e / (C - 1)),
//                  mean over the batch; t1 = t2 = 1 is cross-entropy.
// Stateless; thread-safe.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config/job_spec.h"

namespace trainer::train {

struct LossOptions {
  std::string kind = "cross_entropy";  // cross_entropy | focal | bi_tempered
  double label_smoothing = 0;
  torch::Tensor class_weights;  // [C] float32 on the logits' device; undefined = none
  double focal_gamma = 2.0;
  double t1 = 1.0, t2 = 1.0;
};

// `target`: int64 [B] class indices, or float [B, C] probabilities (soft targets).
torch::Tensor training_loss(const torch::Tensor& logits, const torch::Tensor& target,
                            const LossOptions& options);

// Class-weighted cross-entropy over hard labels, summed (not averaged): PyTorch's mean divides
// this by the summed weight of the batch's labels, which the step takes over the whole replica
// batch, so micro-batches give the batch's loss.
torch::Tensor weighted_cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& labels,
                                         const LossOptions& options);

// The reference's tempered softmax (t = 1: softmax), rows of `activations` [B, C].
torch::Tensor tempered_softmax(const torch::Tensor& activations, double t, int num_iters = 5);

// train.class_weights for `num_classes` classes given the training labels' counts: none -> {},
// balanced -> n / (classes x count_c) (scikit-learn's "balanced"; a class with no examples gets
// 0), a list -> the list. Throws ConfigError naming train.class_weights when the list's length
// is not num_classes or balanced is asked without counts.
std::vector<double> class_weights(const std::vector<std::string>& field, int64_t num_classes,
                                  const std::vector<int64_t>& counts);

}  // namespace trainer::train
