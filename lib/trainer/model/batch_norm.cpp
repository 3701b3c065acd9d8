#include "trainer/model/batch_norm.h"

#include <cstdint>

namespace trainer::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor channel_view(const torch::Tensor& t) { return t.view({1, -1, 1, 1}); }

// The dtype the statistics are summed in: float64 on the CPU, as ATen's CPU batch norm
// accumulates them (and cheap there); float32 on a GPU, as cuDNN's and ATen's CUDA batch norm do
// (float64 runs at 1/32 or 1/64 of the float32 rate on most GPUs, the T4 among them).
torch::ScalarType accumulate_type(const torch::Tensor& x) {
  return x.is_cuda() ? torch::kFloat : torch::kDouble;
}

// y = (x - mean) * invstd * weight + bias with mean and the biased variance over every replica's
// batch; statistics in accumulate_type, the rest in float32, the output in x's dtype (bf16 under
// autocast). The global count stays a tensor, so nothing waits for the host (a GPU keeps going).
// Saves what backward needs; returns the global mean, variance and count through the pointers.
struct SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               StatsReducer* reducer, double eps, torch::Tensor* mean_out,
                               torch::Tensor* var_out, torch::Tensor* count_out) {
    const int64_t c = x.size(1);
    const torch::Tensor xf = x.to(torch::kFloat);
    const torch::Tensor xd = x.to(accumulate_type(x));
    torch::Tensor stats =
        torch::cat({xd.sum({0, 2, 3}), xd.square().sum({0, 2, 3}),
                    torch::full({1}, static_cast<double>(x.numel() / c), xd.options())});
    reducer->sum_(stats);
    const torch::Tensor count = stats.slice(0, 2 * c, 2 * c + 1);  // [1], the global count
    const torch::Tensor mean = stats.slice(0, 0, c) / count;
    const torch::Tensor var = (stats.slice(0, c, 2 * c) / count - mean.square()).clamp_min(0);
    const torch::Tensor mean_f = mean.to(torch::kFloat);
    const torch::Tensor invstd_f = (var + eps).rsqrt().to(torch::kFloat);
    const torch::Tensor y =
        (xf - channel_view(mean_f)) * channel_view(invstd_f * weight) + channel_view(bias);
    ctx->save_for_backward({x, weight, mean_f, invstd_f, count});
    // The reducer outlives every graph built while it is installed (the trainer holds it).
    ctx->saved_data["reducer"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(reducer));
    *mean_out = mean;
    *var_out = var;
    *count_out = count;
    return y.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& mean = saved[2];
    const torch::Tensor& invstd = saved[3];
    const torch::Tensor& count = saved[4];
    auto* reducer =
        reinterpret_cast<StatsReducer*>(static_cast<intptr_t>(ctx->saved_data["reducer"].toInt()));
    const int64_t c = x.size(1);
    const torch::Tensor g = grads[0].to(torch::kFloat);
    const torch::Tensor xmu = x.to(torch::kFloat) - channel_view(mean);
    // Sums in accumulate_type, as ATen's batch norm backward accumulates them.
    const auto acc = accumulate_type(x);
    const torch::Tensor sum_dy = g.to(acc).sum({0, 2, 3});
    const torch::Tensor sum_dy_xmu = (g.to(acc) * xmu.to(acc)).sum({0, 2, 3});
    // The parameters' own gradients are this replica's (GradientSync averages them).
    torch::Tensor grad_weight = (sum_dy_xmu * invstd.to(acc)).to(torch::kFloat);
    torch::Tensor grad_bias = sum_dy.to(torch::kFloat);
    torch::Tensor both = torch::cat({sum_dy, sum_dy_xmu});
    reducer->sum_(both);
    const torch::Tensor mean_dy = (both.slice(0, 0, c) / count).to(torch::kFloat);
    const torch::Tensor mean_dy_xmu = (both.slice(0, c, 2 * c) / count).to(torch::kFloat);
    const torch::Tensor grad_x =
        (g - channel_view(mean_dy) - xmu * channel_view(invstd.square() * mean_dy_xmu)) *
        channel_view(invstd * weight);
    return {grad_x.to(x.scalar_type()),
            ctx->needs_input_grad(1) ? grad_weight : torch::Tensor(),
            ctx->needs_input_grad(2) ? grad_bias : torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

BatchNormImpl::BatchNormImpl(int64_t features, double eps, double momentum)
    : eps_(eps), momentum_(momentum) {
  // torch::nn::BatchNorm2d's registration order and initial values.
  weight = register_parameter("weight", torch::ones({features}));
  bias = register_parameter("bias", torch::zeros({features}));
  running_mean = register_buffer("running_mean", torch::zeros({features}));
  running_var = register_buffer("running_var", torch::ones({features}));
  num_batches_tracked =
      register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
}

torch::Tensor BatchNormImpl::forward(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() == 4, "BatchNorm: expected a 4-D input, got ", input.sizes());
  if (!reducer_ || !is_training()) {
    // What torch::nn::BatchNorm2dImpl::forward does (momentum set, so the count is only kept).
    if (is_training()) num_batches_tracked.add_(1);
    return torch::batch_norm(input, weight, bias, running_mean, running_var, is_training(),
                             momentum_, eps_, at::globalContext().userEnabledCuDNN());
  }
  torch::Tensor mean, var, count;
  torch::Tensor y =
      SyncBatchNormFunction::apply(input, weight, bias, reducer_.get(), eps_, &mean, &var, &count);
  // Running statistics as BatchNorm2d keeps them: unbiased variance, momentum, batches seen.
  torch::NoGradGuard no_grad;
  const double m = momentum_;
  const torch::Tensor unbiased =
      torch::where(count > 1, count / (count - 1), torch::ones_like(count));
  running_mean.mul_(1 - m).add_(mean.to(running_mean.scalar_type()), m);
  running_var.mul_(1 - m).add_((var * unbiased).to(running_var.scalar_type()), m);
  num_batches_tracked.add_(1);
  return y;
}

void set_batchnorm_reducer(torch::nn::Module& module,
                           const std::shared_ptr<StatsReducer>& reducer) {
  module.apply([&](torch::nn::Module& m) {
    if (auto* bn = dynamic_cast<BatchNormImpl*>(&m)) bn->set_reducer(reducer);
  });
}

}  // namespace trainer::model
