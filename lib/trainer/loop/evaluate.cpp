#include "trainer/loop/evaluate.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/util/error.h"

namespace trainer::train {

double EvalCounts::loss() const {
  return num_examples > 0 ? loss_sum / static_cast<double>(num_examples) : 0.0;
}

double EvalCounts::accuracy() const {
  int64_t correct = 0;
  for (size_t c = 0; c < confusion.size(); ++c) correct += confusion[c][c];
  return num_examples > 0 ? static_cast<double>(correct) / static_cast<double>(num_examples) : 0.0;
}

std::vector<double> EvalCounts::per_class_accuracy() const {
  std::vector<double> out;
  for (size_t c = 0; c < confusion.size(); ++c) {
    int64_t total = 0;
    for (int64_t n : confusion[c]) total += n;
    out.push_back(total > 0 ? static_cast<double>(confusion[c][c]) / static_cast<double>(total)
                            : 0.0);
  }
  return out;
}

nlohmann::json EvalCounts::to_json(const std::vector<std::string>& class_names) const {
  nlohmann::json per_class = nlohmann::json::object();
  const auto acc = per_class_accuracy();
  for (size_t c = 0; c < acc.size(); ++c) {
    per_class[c < class_names.size() ? class_names[c] : std::to_string(c)] = acc[c];
  }
  return {{"accuracy", accuracy()},
          {"loss", loss()},
          {"num_examples", num_examples},
          {"per_class", per_class},
          {"confusion_matrix", confusion},
          {"class_names", class_names},
          {"skipped", skipped}};
}

Tta parse_tta(const std::string& name, const std::string& option) {
  if (name == "none") return Tta::kNone;
  if (name == "flip") return Tta::kFlip;
  if (name == "dihedral") return Tta::kDihedral;
  throw UsageError(option + ": expected one of none|flip|dihedral, got '" + name + "'");
}

std::vector<torch::Tensor> tta_views(const torch::Tensor& input, Tta tta) {
  if (input.dim() != 4) throw Error(ErrorKind::kInternal, "tta_views: expected [B, C, H, W]");
  if (tta == Tta::kNone) return {input};
  const torch::Tensor mirror = input.flip({3});
  if (tta == Tta::kFlip) return {input, mirror};
  if (input.size(2) != input.size(3)) {
    throw Error(ErrorKind::kInternal, "tta_views: dihedral needs a square input");
  }
  std::vector<torch::Tensor> views = {input};
  for (int64_t k = 1; k < 4; ++k) views.push_back(torch::rot90(input, k, {2, 3}));
  views.push_back(mirror);
  for (int64_t k = 1; k < 4; ++k) views.push_back(torch::rot90(mirror, k, {2, 3}));
  return views;
}

torch::Tensor tta_log_probabilities(model::Net& net, const torch::Tensor& input,
                                    const ModelSettings& settings, Tta tta) {
  const std::vector<torch::Tensor> views = tta_views(input, tta);
  std::vector<torch::Tensor> log_probs;
  log_probs.reserve(views.size());
  for (const torch::Tensor& view : views) {
    // The memory format the model runs in (a flip or rotation of a channels_last tensor is not).
    const torch::Tensor x = view.contiguous(settings.channels_last ? at::MemoryFormat::ChannelsLast
                                                                   : at::MemoryFormat::Contiguous);
    log_probs.push_back(torch::log_softmax(forward_logits(net, x, settings), 1));
  }
  if (log_probs.size() == 1) return log_probs.front();
  return torch::logsumexp(torch::stack(log_probs), 0) -
         std::log(static_cast<double>(log_probs.size()));
}

EvalCounts evaluate(model::Net& net, data::Loader& loader, int64_t num_classes,
                    const ModelSettings& settings, Tta tta) {
  // Restores every module's own train/eval mode on every way out (so BatchNorm layers frozen by
  // set_batchnorm_eval stay frozen, and a DataError from the loader leaves the model as it was).
  struct ModeRestore {
    std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes;
    ~ModeRestore() {
      for (auto& [module, training] : modes) module->train(training);
    }
  } restore;
  for (auto& module : net->modules(/*include_self=*/true)) {
    restore.modes.emplace_back(module, module->is_training());
  }
  net->eval();
  torch::NoGradGuard no_grad;

  EvalCounts counts;
  counts.confusion.assign(static_cast<size_t>(num_classes),
                          std::vector<int64_t>(static_cast<size_t>(num_classes), 0));
  // The sums stay on the model's device and are read once, after the last batch, so a GPU
  // evaluation never waits for the host between batches. The loss is summed in float64 as the
  // host summed it (each batch's float32 sum, then a double addition): the same bits on the CPU.
  const auto on_device = torch::TensorOptions().device(settings.device);
  torch::Tensor loss_sum = torch::zeros({}, on_device.dtype(torch::kFloat64));
  // Counts as float64 (exact to 2^53): they grow by a one-hot product, which neither reads
  // anything back (bincount would: it sizes its output from the largest value) nor adds
  // atomically (index_add_ would, non-deterministically on CUDA).
  torch::Tensor confusion =
      torch::zeros({num_classes, num_classes}, on_device.dtype(torch::kFloat64));
  StepSyncCheck no_sync(settings.device, /*announce=*/false);  // TRAINER_CUDA_SYNC_DEBUG
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    counts.skipped += batch->skipped;
    if (batch->images.size(0) == 0) continue;
    // Labels index the confusion matrix: check them before use.
    const torch::Tensor truth = batch->labels.to(torch::kCPU, torch::kLong).contiguous();
    const auto* t = truth.data_ptr<int64_t>();
    for (int64_t i = 0; i < truth.size(0); ++i) {
      if (t[i] < 0 || t[i] >= num_classes) {
        throw DataError("evaluate: example " +
                        std::to_string(batch->indices.at(static_cast<size_t>(i))) + " has label " +
                        std::to_string(t[i]) + ", expected 0.." + std::to_string(num_classes - 1));
      }
    }
    no_sync.begin_step();
    const torch::Tensor input = prepare_input(batch->images, settings);
    // With TTA the "logits" are the log of the averaged softmax: cross_entropy's log_softmax
    // leaves them as they are (they already sum to one in probability).
    const torch::Tensor logits = tta == Tta::kNone
                                     ? forward_logits(net, input, settings)
                                     : tta_log_probabilities(net, input, settings, tta);
    if (logits.dim() != 2 || logits.size(1) != num_classes) {
      throw Error(ErrorKind::kInternal,
                  "evaluate: the model gives " + std::to_string(logits.size(-1)) +
                      " logits per example, expected " + std::to_string(num_classes) + " classes");
    }
    const torch::Tensor target = truth.to(logits.device(), /*non_blocking=*/true);
    const torch::Tensor losses = torch::nn::functional::cross_entropy(
        logits, target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    loss_sum += losses.sum().to(torch::kFloat64);
    confusion += torch::one_hot(target, num_classes)
                     .to(torch::kFloat64)
                     .t()
                     .mm(torch::one_hot(logits.argmax(1), num_classes).to(torch::kFloat64));
    counts.num_examples += truth.size(0);
    no_sync.end_step();
  }
  counts.loss_sum = loss_sum.item<double>();
  const torch::Tensor cells = confusion.to(torch::kCPU, torch::kLong).contiguous();
  const auto* c = cells.data_ptr<int64_t>();
  for (size_t i = 0; i < counts.confusion.size(); ++i) {
    for (size_t j = 0; j < counts.confusion.size(); ++j) {
      counts.confusion[i][j] = c[i * counts.confusion.size() + j];
    }
  }
  return counts;
}

EvalCounts evaluate_distributed(dist::ProcessGroup& group, model::Net& net, data::Loader& loader,
                                int64_t num_classes, const ModelSettings& settings) {
  EvalCounts counts = evaluate(net, loader, num_classes, settings);
  if (group.world_size() == 1) return counts;
  std::vector<int64_t> flat = {counts.num_examples, counts.skipped};
  for (const auto& row : counts.confusion) flat.insert(flat.end(), row.begin(), row.end());
  flat = group.all_reduce(flat, dist::Reduce::kSum);
  torch::Tensor loss = torch::tensor({counts.loss_sum}, torch::kFloat64);
  group.all_reduce_sum({loss});
  counts.num_examples = flat[0];
  counts.skipped = flat[1];
  size_t k = 2;
  for (auto& row : counts.confusion) {
    for (auto& cell : row) cell = flat[k++];
  }
  counts.loss_sum = loss.item<double>();
  return counts;
}

}  // namespace trainer::train
