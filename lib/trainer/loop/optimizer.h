// Builds the configured optimizer (adam | adamw | sgd) over the trainable parameters and sets
// its learning rate each step. The optimizers are LibTorch's classes (options, state, save and
// load unchanged) whose step() makes one pass over each parameter's arrays instead of LibTorch's
// per-tensor sequence of element-wise kernels: where LibTorch has CPU kernels for
// at::_fused_adam_, _fused_adamw_ and _fused_sgd_ (2.4 and later) one fused call per parameter
// group, what torch.optim's fused=True runs; before, the trainer's own kernels
// (loop/optimizer_kernels.h). TRAINER_ATEN_KERNELS=1: LibTorch's step, for benchmarks. Not
// thread-safe (LibTorch optimizers are not).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "trainer/config/job_spec.h"

namespace trainer::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerSpec& spec,
                                                        std::vector<torch::Tensor> parameters);

// The trainable parameters of `model` in parameter groups with their own weight decay, as
// torchvision's reference builds them (utils.set_weight_decay): a parameter named "bias" goes to
// the bias group when bias_weight_decay is set (its custom key, BatchNorm biases included), else
// a parameter of a normalization layer goes to the norm group when norm_weight_decay is set,
// else to the main group (weight_decay). Groups in that order (main, norm, bias), empty ones left
// out; with neither field set, one group of every trainable parameter in model order.
struct ParamGroup {
  std::string name;  // main | norm | bias
  std::vector<torch::Tensor> params;
  double weight_decay = 0;
};
std::vector<ParamGroup> weight_decay_groups(const torch::nn::Module& model,
                                            const config::OptimizerSpec& spec);

// The optimizer over those groups (one group: the same optimizer as make_optimizer builds).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerSpec& spec,
                                                        const std::vector<ParamGroup>& groups);

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace trainer::train
