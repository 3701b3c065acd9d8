#include "trainer/loop/optimizer.h"

#include "trainer/model/batch_norm.h"
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

std::vector<ParamGroup> weight_decay_groups(const torch::nn::Module& model,
                                            const config::OptimizerSpec& spec) {
  const bool norm_set = !spec.norm_weight_decay.empty();
  const bool bias_set = !spec.bias_weight_decay.empty();
  ParamGroup main{"main", {}, spec.weight_decay};
  ParamGroup norm{"norm", {}, norm_set ? std::stod(spec.norm_weight_decay) : spec.weight_decay};
  ParamGroup bias{"bias", {}, bias_set ? std::stod(spec.bias_weight_decay) : spec.weight_decay};
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    const bool is_norm = dynamic_cast<const model::BatchNormImpl*>(item.value().get()) != nullptr;
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      if (!p.value().requires_grad()) continue;
      if (bias_set && p.key() == "bias") {
        bias.params.push_back(p.value());
      } else if (norm_set && is_norm) {
        norm.params.push_back(p.value());
      } else {
        main.params.push_back(p.value());
      }
    }
  }
  std::vector<ParamGroup> out;
  for (ParamGroup* g : {&main, &norm, &bias}) {
    if (!g->params.empty()) out.push_back(std::move(*g));
  }
  return out;
}

namespace {

void set_weight_decay(torch::optim::OptimizerOptions& options, const std::string& name,
                      double weight_decay) {
  if (name == "adam") {
    static_cast<torch::optim::AdamOptions&>(options).weight_decay(weight_decay);
  } else if (name == "adamw") {
    static_cast<torch::optim::AdamWOptions&>(options).weight_decay(weight_decay);
  } else {
    static_cast<torch::optim::SGDOptions&>(options).weight_decay(weight_decay);
  }
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerSpec& spec,
                                                        const std::vector<ParamGroup>& groups) {
  if (groups.empty()) throw Error(ErrorKind::kInternal, "make_optimizer: no parameter groups");
  std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer(spec, groups[0].params);
  if (groups.size() == 1 && groups[0].weight_decay == spec.weight_decay) return optimizer;
  // A copy of the first group's options (add_param_group may move the groups' storage).
  const std::unique_ptr<torch::optim::OptimizerOptions> base =
      optimizer->param_groups()[0].options().clone();
  set_weight_decay(optimizer->param_groups()[0].options(), spec.name, groups[0].weight_decay);
  for (size_t i = 1; i < groups.size(); ++i) {
    std::unique_ptr<torch::optim::OptimizerOptions> options = base->clone();
    set_weight_decay(*options, spec.name, groups[i].weight_decay);
    optimizer->add_param_group(
        torch::optim::OptimizerParamGroup(groups[i].params, std::move(options)));
  }
  return optimizer;
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace trainer::train
