// Builds the configured optimizer (adam | adamw | sgd) over the trainable parameters and sets
// its learning rate each step. Not thread-safe (LibTorch optimizers are not).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "trainer/config/job_spec.h"

namespace trainer::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerSpec& spec,
                                                        std::vector<torch::Tensor> parameters);

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace trainer::train
