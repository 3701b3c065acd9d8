#include "trainer/loop/optimizer_kernels.h"

#include "trainer/model/vec4.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <cmath>

namespace trainer::train {

namespace {

using model::vec::load4;
using model::vec::max4;
using model::vec::splat4;
using model::vec::sqrt4;
using model::vec::store4;
using model::vec::Vec4;

// Elements per task: a few hundred KiB of each array, so small parameters stay on one thread.
constexpr int64_t kGrain = 1 << 15;

void check_like(const torch::Tensor& param, const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_cpu() && t.scalar_type() == torch::kFloat && t.sizes() == param.sizes() &&
                  t.strides() == param.strides(),
              "optimizer step: ", what, " must be a float32 CPU tensor with the parameter's sizes ",
              param.sizes(), " and strides ", param.strides(), ", got ", t.scalar_type(), " ",
              t.sizes(), " strides ", t.strides());
}

void check_param(const torch::Tensor& param) {
  TORCH_CHECK(param.is_cpu() && param.scalar_type() == torch::kFloat &&
                  param.is_non_overlapping_and_dense(),
              "optimizer step: expected a dense float32 CPU parameter, got ", param.scalar_type(),
              " ", param.sizes(), " strides ", param.strides());
}

// The scalars as ATen rounds a double Scalar for a float32 tensor.
float f(double v) { return static_cast<float>(v); }

// One element or four of Adam, in LibTorch's per-tensor order of operations:
//   grad = grad + weight_decay * param            (Adam)   | param = param * (1 - lr * wd) (AdamW)
//   exp_avg = exp_avg * beta1 + (1 - beta1) * grad
//   exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
//   [max = maximum(max, exp_avg_sq)]
//   denom = sqrt(exp_avg_sq or max) / sqrt(1 - beta2^step) + eps
//   param = param + (-step_size) * exp_avg / denom,   step_size = lr / (1 - beta1^step)
struct AdamScalars {
  float decay, wd, beta1, c1, beta2, c2, bc2_sqrt, eps, neg_step_size;
  bool l2, decoupled, amsgrad;
};

// The lane operations for one element (float) and four (Vec4), overloaded so that the kernels
// below are written once and inlined for both.
template <class V>
V splat(float x);
template <>
float splat<float>(float x) {
  return x;
}
template <>
Vec4 splat<Vec4>(float x) {
  return splat4(x);
}
float sqrt_(float x) { return std::sqrt(x); }
Vec4 sqrt_(Vec4 x) { return sqrt4(x); }
float max_(float a, float b) { return std::isnan(b) ? b : (a < b ? b : a); }  // as max4
Vec4 max_(Vec4 a, Vec4 b) { return max4(a, b); }

template <class V>
V adam_element(V p, V g, V& m, V& v, V* vmax, const AdamScalars& s) {
  if (s.decoupled) p = p * splat<V>(s.decay);
  if (s.l2) g = g + splat<V>(s.wd) * p;
  m = m * splat<V>(s.beta1) + splat<V>(s.c1) * g;
  v = v * splat<V>(s.beta2) + splat<V>(s.c2) * g * g;
  V second = v;
  if (vmax != nullptr) {
    *vmax = max_(*vmax, v);
    second = *vmax;
  }
  const V denom = sqrt_(second) / splat<V>(s.bc2_sqrt) + splat<V>(s.eps);
  return p + splat<V>(s.neg_step_size) * m / denom;
}

}  // namespace

void adam_update(const torch::Tensor& param, const torch::Tensor& grad,
                 const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq,
                 const torch::Tensor& max_exp_avg_sq, int64_t step, const AdamHyper& h) {
  // Named for profilers (scripts/bench/op_profile.sh), as ATen names its operators.
  RECORD_FUNCTION("trainer::adam_update", std::vector<c10::IValue>({param}));
  check_param(param);
  check_like(param, grad, "the gradient");
  check_like(param, exp_avg, "exp_avg");
  check_like(param, exp_avg_sq, "exp_avg_sq");
  const bool amsgrad = max_exp_avg_sq.defined();
  if (amsgrad) check_like(param, max_exp_avg_sq, "max_exp_avg_sq");
  TORCH_CHECK(step >= 1, "optimizer step: the step count must be >= 1, got ", step);
  // As LibTorch's Adam computes them, in double.
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  AdamScalars s{};
  s.decoupled = h.decoupled && h.weight_decay != 0;
  s.l2 = !h.decoupled && h.weight_decay != 0;
  s.decay = f(1 - h.lr * h.weight_decay);
  s.wd = f(h.weight_decay);
  s.beta1 = f(h.beta1);
  s.c1 = f(1 - h.beta1);
  s.beta2 = f(h.beta2);
  s.c2 = f(1 - h.beta2);
  s.bc2_sqrt = f(std::sqrt(bias_correction2));
  s.eps = f(h.eps);
  s.neg_step_size = f(-(h.lr / bias_correction1));
  s.amsgrad = amsgrad;

  float* pp = param.data_ptr<float>();
  const float* gp = grad.data_ptr<float>();
  float* mp = exp_avg.data_ptr<float>();
  float* vp = exp_avg_sq.data_ptr<float>();
  float* xp = amsgrad ? max_exp_avg_sq.data_ptr<float>() : nullptr;
  at::parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) {
      Vec4 m = load4(mp + i), v = load4(vp + i), x = amsgrad ? load4(xp + i) : Vec4{};
      const Vec4 p =
          adam_element<Vec4>(load4(pp + i), load4(gp + i), m, v, amsgrad ? &x : nullptr, s);
      store4(pp + i, p);
      store4(mp + i, m);
      store4(vp + i, v);
      if (amsgrad) store4(xp + i, x);
    }
    for (; i < end; ++i) {
      pp[i] = adam_element<float>(pp[i], gp[i], mp[i], vp[i], amsgrad ? xp + i : nullptr, s);
    }
  });
}

void sgd_update(const torch::Tensor& param, const torch::Tensor& grad,
                const torch::Tensor& momentum_buffer, bool first, const SgdHyper& h) {
  RECORD_FUNCTION("trainer::sgd_update", std::vector<c10::IValue>({param}));
  check_param(param);
  check_like(param, grad, "the gradient");
  const bool momentum = h.momentum != 0;
  if (momentum) check_like(param, momentum_buffer, "the momentum buffer");
  const bool l2 = h.weight_decay != 0;
  const float wd = f(h.weight_decay), mom = f(h.momentum), c = f(1 - h.dampening),
              neg_lr = f(-h.lr);
  float* pp = param.data_ptr<float>();
  const float* gp = grad.data_ptr<float>();
  float* bp = momentum ? momentum_buffer.data_ptr<float>() : nullptr;
  // LibTorch's order: d = grad + wd * param; buf = first ? d : buf * momentum + (1 - dampening) *
  // d; d = nesterov ? d + momentum * buf : buf; param = param + (-lr) * d.
  auto element = [&](auto p, auto g, auto* buf) {
    using V = decltype(p);
    V d = g;
    if (l2) d = d + splat<V>(wd) * p;
    if (momentum) {
      *buf = first ? d : *buf * splat<V>(mom) + splat<V>(c) * d;
      d = h.nesterov ? d + splat<V>(mom) * *buf : *buf;
    }
    return p + splat<V>(neg_lr) * d;
  };
  at::parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) {
      Vec4 b = momentum ? load4(bp + i) : Vec4{};
      store4(pp + i, element(load4(pp + i), load4(gp + i), &b));
      if (momentum) store4(bp + i, b);
    }
    for (; i < end; ++i) {
      float b = momentum ? bp[i] : 0.0f;
      pp[i] = element(pp[i], gp[i], &b);
      if (momentum) bp[i] = b;
    }
  });
}

}  // namespace trainer::train
