#include "trainer/loop/optimizer.h"

#include "trainer/util/error.h"

namespace trainer::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerSpec& spec,
                                                        std::vector<torch::Tensor> parameters) {
  const double lr = spec.learning_rate;
  if (spec.name == "adam") {
    return std::make_unique<torch::optim::Adam>(
        std::move(parameters), torch::optim::AdamOptions(lr).weight_decay(spec.weight_decay));
  }
  if (spec.name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        std::move(parameters), torch::optim::AdamWOptions(lr).weight_decay(spec.weight_decay));
  }
  if (spec.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(std::move(parameters),
                                               torch::optim::SGDOptions(lr)
                                                   .momentum(spec.momentum)
                                                   .nesterov(spec.nesterov)
                                                   .weight_decay(spec.weight_decay));
  }
  throw ConfigError("train.optimizer.name: expected one of adam|adamw|sgd, got '" + spec.name +
                    "'");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace trainer::train
