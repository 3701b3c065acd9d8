// Evaluation of a model over a loader: summed loss, correct counts and the confusion matrix
// (counts, so results from several workers can be added exactly), and the derived accuracy,
// per-class accuracy and mean loss. Shared by per-epoch validation and `trainer evaluate`.
// Not thread-safe (uses the model).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/data/loader.h"
#include "trainer/dist/process_group.h"
#include "trainer/loop/runtime.h"
#include "trainer/model/resnet.h"

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

// Runs the model (eval mode, no grad) over every batch of `loader`'s epoch 0 and returns the
// counts. The model's train/eval mode is restored afterwards (also when it throws). A label
// outside 0..num_classes-1 is a DataError.
EvalCounts evaluate(model::ResNet& net, data::Loader& loader, int64_t num_classes,
                    const ModelSettings& settings);

// Validation on this worker's part, with the counts summed over all workers: each example is
// evaluated once across the cluster, so the result equals a single-worker evaluation.
EvalCounts evaluate_distributed(dist::ProcessGroup& group, model::ResNet& net, data::Loader& loader,
                                int64_t num_classes, const ModelSettings& settings);

}  // namespace trainer::train
