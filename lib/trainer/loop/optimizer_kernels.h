// The optimizers' update as one pass over each parameter's arrays, for LibTorch versions without
// CPU kernels for at::_fused_adam_, _fused_adamw_ and _fused_sgd_ (before 2.4; Debian 12's 1.13):
// LibTorch's per-tensor step walks them eight times (Adam) with a temporary per operation.
// Each element's arithmetic is LibTorch's per-tensor step, operation by operation, in float32
// (the scalars rounded to float as ATen rounds them), except that ATen's `add(other, alpha)` is
// a fused multiply-add on CPUs with FMA and is two roundings here: the same update up to
// rounding, as torch.optim's fused=True is. Elementwise: the bits do not depend on the number of
// threads or on the vector unit. Every tensor must be a float32 CPU tensor with the parameter's
// sizes and strides, non-overlapping and dense (the caller copies a gradient that is not).
// Thread-safe for distinct tensors.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace trainer::train {

struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;  // AdamW: param *= 1 - lr * weight_decay, instead of grad += wd * param
};

// One Adam (AdamW) step of `param` with `grad`; `step` is the step count after this one (1 on the
// first). `max_exp_avg_sq` undefined: no AMSGrad.
void adam_update(const torch::Tensor& param, const torch::Tensor& grad,
                 const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq,
                 const torch::Tensor& max_exp_avg_sq, int64_t step, const AdamHyper& h);

struct SgdHyper {
  double lr = 0.1, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};

// One SGD step. `momentum_buffer` is used when h.momentum != 0; `first`: its first step (the buffer
// becomes the weight-decayed gradient, as LibTorch's and torch.optim's do).
void sgd_update(const torch::Tensor& param, const torch::Tensor& grad,
                const torch::Tensor& momentum_buffer, bool first, const SgdHyper& h);

}  // namespace trainer::train
