// Evaluation of a model over a loader: summed loss, correct counts and the confusion matrix
// (counts, so results from several workers can be added exactly), and the derived accuracy,
// per-class accuracy and mean loss. Shared by per-epoch validation and `trainer evaluate`.
// Also the test-time augmentation forward (`--tta` of evaluate and predict).
// Not thread-safe (uses the model).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/data/loader.h"
#include "trainer/dist/process_group.h"
#include "trainer/loop/runtime.h"
#include "trainer/model/net.h"

namespace trainer::train {

struct EvalCounts {
  int64_t num_examples = 0;
  double loss_sum = 0;                          // sum of per-example cross-entropy
  std::vector<std::vector<int64_t>> confusion;  // [true][predicted]
  int64_t skipped = 0;                          // corrupt examples skipped

  double loss() const;
  double accuracy() const;
  std::vector<double> per_class_accuracy() const;  // NaN-free: 0 for a class with no examples
  nlohmann::json to_json(const std::vector<std::string>& class_names) const;
};

// Test-time augmentation: the views an image is classified in, the softmax averaged over them.
// none = the image; flip = it and its left-right mirror; dihedral = the 8 symmetries of the
// square (rotations by 0, 90, 180, 270 degrees of the image and of its mirror).
enum class Tta { kNone, kFlip, kDihedral };
// "none" | "flip" | "dihedral"; anything else is a UsageError naming `option` and the values.
Tta parse_tta(const std::string& name, const std::string& option = "--tta");
// The views of a model input [B, C, H, W] (H == W for dihedral, else an Error(kInternal)), in a
// fixed order, the input itself first: 1, 2 or 8 of them.
std::vector<torch::Tensor> tta_views(const torch::Tensor& input, Tta tta);
// Log of the class probabilities, [B, classes] float32: kNone: log_softmax of the logits;
// otherwise the log of the mean over tta_views of each view's softmax (computed as
// logsumexp(log_softmax) - log(views), so no probability underflows to log 0). One forward
// (forward_logits, under settings' precision) per view. Call in eval mode without grad.
torch::Tensor tta_log_probabilities(model::Net& net, const torch::Tensor& input,
                                    const ModelSettings& settings, Tta tta);

// Runs the model (eval mode, no grad) over every batch of `loader`'s epoch 0 and returns the
// counts. The model's train/eval mode is restored afterwards (also when it throws). A label
// outside 0..num_classes-1 is a DataError. With `tta` other than kNone, the loss and the
// prediction come from the averaged softmax (tta_log_probabilities); kNone is the plain forward.
EvalCounts evaluate(model::Net& net, data::Loader& loader, int64_t num_classes,
                    const ModelSettings& settings, Tta tta = Tta::kNone);

// Validation on this worker's part, with the counts summed over all workers: each example is
// evaluated once across the cluster, so the result equals a single-worker evaluation.
EvalCounts evaluate_distributed(dist::ProcessGroup& group, model::Net& net, data::Loader& loader,
                                int64_t num_classes, const ModelSettings& settings);

}  // namespace trainer::train
