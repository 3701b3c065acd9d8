#include "trainer/loop/optimizer_kernels.h"

#include "trainer/model/vec4.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <cmath>

namespace trainer::train {

namespace {

using model::vec::load4;
using model::vec::max4;
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

// One lane type for four elements (Vec4) and one (float), so that each kernel's arithmetic is
// written once and is the same in its vector body and its tail. A float scalar in an arithmetic
// expression with a Vec4 is broadcast to every lane (GCC/Clang vector extensions).
template <class V>
V load(const float* p);
template <>
float load<float>(const float* p) {
  return *p;
}
template <>
Vec4 load<Vec4>(const float* p) {
  return load4(p);
}
void store(float* p, float v) { *p = v; }
void store(float* p, Vec4 v) { store4(p, v); }
float sqrt_(float x) { return std::sqrt(x); }
Vec4 sqrt_(Vec4 x) { return sqrt4(x); }
float max_(float a, float b) { return std::isnan(b) ? b : (a < b ? b : a); }  // as max4
Vec4 max_(Vec4 a, Vec4 b) { return max4(a, b); }

// f(i, Vec4{}) for the elements i..i+3 and f(i, 0.0f) for a tail element, over [0, n) in parallel
// tasks of kGrain elements.
template <class F>
void for_each_lane(int64_t n, const F& f) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) f(i, Vec4{});
    for (; i < end; ++i) f(i, 0.0f);
  });
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
  // As LibTorch's Adam computes them, in double; then rounded to float as ATen rounds them.
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  const bool decoupled = h.decoupled && h.weight_decay != 0;
  const bool l2 = !h.decoupled && h.weight_decay != 0;
  const float decay = f(1 - h.lr * h.weight_decay), wd = f(h.weight_decay), beta1 = f(h.beta1),
              c1 = f(1 - h.beta1), beta2 = f(h.beta2), c2 = f(1 - h.beta2),
              bc2_sqrt = f(std::sqrt(bias_correction2)), eps = f(h.eps),
              neg_step_size = f(-(h.lr / bias_correction1));

  float* pp = param.data_ptr<float>();
  const float* gp = grad.data_ptr<float>();
  float* mp = exp_avg.data_ptr<float>();
  float* vp = exp_avg_sq.data_ptr<float>();
  float* xp = amsgrad ? max_exp_avg_sq.data_ptr<float>() : nullptr;
  // LibTorch's per-tensor order of operations, element by element:
  //   grad = grad + weight_decay * param  (Adam)  |  param = param * (1 - lr * wd)  (AdamW)
  //   exp_avg = exp_avg * beta1 + (1 - beta1) * grad
  //   exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
  //   [max = maximum(max, exp_avg_sq)]
  //   denom = sqrt(exp_avg_sq or max) / sqrt(1 - beta2^step) + eps
  //   param = param + (-step_size) * exp_avg / denom,   step_size = lr / (1 - beta1^step)
  for_each_lane(param.numel(), [&](int64_t i, auto lane) {
    using V = decltype(lane);
    V p = load<V>(pp + i), g = load<V>(gp + i), m = load<V>(mp + i), v = load<V>(vp + i);
    if (decoupled) p = p * decay;
    if (l2) g = g + wd * p;
    m = m * beta1 + c1 * g;
    v = v * beta2 + c2 * g * g;
    V second = v;
    if (amsgrad) {
      second = max_(load<V>(xp + i), v);
      store(xp + i, second);
    }
    const V denom = sqrt_(second) / bc2_sqrt + eps;
    store(pp + i, p + neg_step_size * m / denom);
    store(mp + i, m);
    store(vp + i, v);
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
  for_each_lane(param.numel(), [&](int64_t i, auto lane) {
    using V = decltype(lane);
    const V p = load<V>(pp + i);
    V d = load<V>(gp + i);
    if (l2) d = d + wd * p;
    if (momentum) {
      const V buf = first ? d : load<V>(bp + i) * mom + c * d;
      store(bp + i, buf);
      d = h.nesterov ? d + mom * buf : buf;
    }
    store(pp + i, p + neg_lr * d);
  });
}

}  // namespace trainer::train
