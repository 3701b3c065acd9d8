#include "trainer/loop/optimizer.h"

#include "trainer/loop/optimizer_kernels.h"
#include "trainer/model/batch_norm.h"
#include "trainer/util/error.h"
#include "trainer/util/kernel_switch.h"
#include "trainer/util/torch_compat.h"

namespace trainer::train {

namespace {
template <typename T>
struct Type {
  using type = T;
};
}  // namespace

namespace {

// The per-parameter state LibTorch's own optimizer keeps (created as it creates it), so
// checkpoints (optimizer.pt) are the same archives whichever step computed them.
template <typename State>
State& state_of(torch::optim::Optimizer& optimizer, const torch::Tensor& p,
                const std::function<std::unique_ptr<State>()>& make, bool* fresh = nullptr) {
  auto& states = optimizer.state();
  const auto key = compat::optimizer_state_key(p);
  auto it = states.find(key);
  if (fresh != nullptr) *fresh = it == states.end();
  if (it == states.end()) it = states.emplace(key, make()).first;
  return static_cast<State&>(*it->second);
}

// `t` in the parameter's own strides: the fused kernels walk parameter, gradient and state as one
// flat array each (a channels_last parameter whose gradient came back contiguous, or whose state
// was loaded contiguous, would otherwise be updated with the wrong elements).
torch::Tensor like_param(const torch::Tensor& p, const torch::Tensor& t) {
  if (t.strides() == p.strides() && t.is_non_overlapping_and_dense()) return t;
  return torch::empty_like(p).copy_(t);
}
torch::Tensor grad_like_param(const torch::Tensor& p) { return like_param(p, p.grad()); }

// Adam and AdamW as LibTorch's classes (options, state, save and load), with step() one pass over
// each parameter's four arrays instead of LibTorch's eight element-wise passes: one call of
// at::_fused_adam_ / at::_fused_adamw_ per parameter group where LibTorch has them (what
// torch.optim.Adam(fused=True) runs), the trainer's own kernel per parameter before
// (loop/optimizer_kernels.h).
template <typename Base, typename Options, typename State, bool kDecoupled>
class FusedAdamT : public Base {
 public:
  using Base::Base;
  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure != nullptr) {
      at::AutoGradMode grad_mode(true);
      loss = closure();
    }
    for (auto& group : this->param_groups()) {
      auto& o = static_cast<Options&>(group.options());
      std::vector<torch::Tensor> params, grads, avgs, sqs, maxes;
      std::vector<int64_t> counts;  // each parameter's step count, this step included
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        TORCH_CHECK(!p.grad().is_sparse(), "fused Adam: sparse gradients are not supported");
        State& st = state_of<State>(*this, p, [&] {
          auto fresh = std::make_unique<State>();
          fresh->step(0);
          fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          if (o.amsgrad())
            fresh->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          return fresh;
        });
        st.step(st.step() + 1);
        st.exp_avg(like_param(p, st.exp_avg()));
        st.exp_avg_sq(like_param(p, st.exp_avg_sq()));
        if (o.amsgrad()) st.max_exp_avg_sq(like_param(p, st.max_exp_avg_sq()));
        params.push_back(p);
        grads.push_back(grad_like_param(p));
        avgs.push_back(st.exp_avg());
        sqs.push_back(st.exp_avg_sq());
        if (o.amsgrad()) maxes.push_back(st.max_exp_avg_sq());
        counts.push_back(st.step());
      }
      if (params.empty()) continue;
      const auto [beta1, beta2] = o.betas();
#if TRAINER_FUSED_OPTIMIZERS
      // torch.optim keeps the step as a float32 tensor on the parameter's device.
      std::vector<torch::Tensor> steps;
      for (size_t i = 0; i < params.size(); ++i) {
        steps.push_back(torch::full({}, static_cast<double>(counts[i]),
                                    params[i].options().dtype(torch::kFloat)));
      }
      if (kDecoupled) {
        at::_fused_adamw_(params, grads, avgs, sqs, maxes, steps, o.lr(), beta1, beta2,
                          o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
      } else {
        at::_fused_adam_(params, grads, avgs, sqs, maxes, steps, o.lr(), beta1, beta2,
                         o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
      }
#else
      AdamHyper h;
      h.lr = o.lr();
      h.beta1 = beta1;
      h.beta2 = beta2;
      h.eps = o.eps();
      h.weight_decay = o.weight_decay();
      h.decoupled = kDecoupled;
      for (size_t i = 0; i < params.size(); ++i) {
        adam_update(params[i], grads[i], avgs[i], sqs[i], o.amsgrad() ? maxes[i] : torch::Tensor(),
                    counts[i], h);
      }
#endif
    }
    return loss;
  }
};

using FusedAdam =
    FusedAdamT<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState, false>;
using FusedAdamW = FusedAdamT<torch::optim::AdamW, torch::optim::AdamWOptions,
                              torch::optim::AdamWParamState, true>;

// SGD (momentum, dampening, Nesterov, weight decay) as LibTorch's class, with step() one pass over
// each parameter's arrays: one call of at::_fused_sgd_ per group and first step where LibTorch
// has it (torch.optim.SGD(fused=True)), the trainer's own kernel per parameter before. The
// momentum buffer starts as the first (weight-decayed) gradient, as LibTorch's and torch.optim's
// do.
class FusedSGD : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure != nullptr) {
      at::AutoGradMode grad_mode(true);
      loss = closure();
    }
    for (auto& group : param_groups()) {
      auto& o = static_cast<torch::optim::SGDOptions&>(group.options());
      const bool momentum = o.momentum() != 0;
      // [0]: parameters with a momentum buffer already; [1]: their first step.
      std::vector<torch::Tensor> params[2], grads[2], bufs[2];
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        TORCH_CHECK(!p.grad().is_sparse(), "fused SGD: sparse gradients are not supported");
        int first = 0;
        if (momentum) {
          bool fresh = false;
          auto& st = state_of<torch::optim::SGDParamState>(
              *this, p,
              [&] {
                auto s = std::make_unique<torch::optim::SGDParamState>();
                s->momentum_buffer(torch::empty_like(p, torch::MemoryFormat::Preserve));
                return s;
              },
              &fresh);
          first = fresh ? 1 : 0;
          st.momentum_buffer(like_param(p, st.momentum_buffer()));
          bufs[first].push_back(st.momentum_buffer());
        }
        params[first].push_back(p);
        grads[first].push_back(grad_like_param(p));
      }
      for (int first = 0; first < 2; ++first) {
        if (params[first].empty()) continue;
#if TRAINER_FUSED_OPTIMIZERS
        at::_fused_sgd_(params[first], grads[first], bufs[first], o.weight_decay(), o.momentum(),
                        o.lr(), o.dampening(), o.nesterov(), /*maximize=*/false,
                        /*is_first_step=*/first == 1);
#else
        SgdHyper h;
        h.lr = o.lr();
        h.momentum = o.momentum();
        h.dampening = o.dampening();
        h.weight_decay = o.weight_decay();
        h.nesterov = o.nesterov();
        for (size_t i = 0; i < params[first].size(); ++i) {
          sgd_update(params[first][i], grads[first][i], momentum ? bufs[first][i] : torch::Tensor(),
                     first == 1, h);
        }
#endif
      }
    }
    return loss;
  }
};

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerSpec& spec,
                                                        std::vector<torch::Tensor> parameters) {
  const double lr = spec.learning_rate;
  // LibTorch's optimizers, stepped in one pass per parameter (ATen's fused kernels where LibTorch
  // has them, the trainer's own before; the same classes, options and saved state either way).
  const bool fused = !util::aten_kernels_only();
  auto make = [&](auto plain, auto fast,
                  auto&& options) -> std::unique_ptr<torch::optim::Optimizer> {
    using Plain = typename decltype(plain)::type;
    using Fast = typename decltype(fast)::type;
    if (fused) return std::make_unique<Fast>(std::move(parameters), options);
    return std::make_unique<Plain>(std::move(parameters), options);
  };
  if (spec.name == "adam") {
    return make(Type<torch::optim::Adam>{}, Type<FusedAdam>{},
                torch::optim::AdamOptions(lr).weight_decay(spec.weight_decay));
  }
  if (spec.name == "adamw") {
    return make(Type<torch::optim::AdamW>{}, Type<FusedAdamW>{},
                torch::optim::AdamWOptions(lr).weight_decay(spec.weight_decay));
  }
  if (spec.name == "sgd") {
    return make(Type<torch::optim::SGD>{}, Type<FusedSGD>{},
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
