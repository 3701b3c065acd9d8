#include "trainer/model/batch_norm.h"

#include "trainer/model/batch_norm_cl.h"
#include "trainer/model/simd.h"
#include "trainer/util/kernel_switch.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

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

// The NCHW kernels: a channel at a time (its planes, by one thread), in 8-lane vectors
// (model/simd.h), the per-channel entry points compiled for AVX-512, AVX2 and the baseline. A
// plane's sums keep eight float partial sums (element i into partial i % 8), added in double in
// a fixed order; the rest is elementwise: the bits do not depend on the threads or the vector
// unit (nor on the clone: the sums' order is the code's).
using simd::F8;
using simd::load;
using simd::splat;
using simd::store;

// A float vector's or a float's element at p.
template <class V>
TRAINER_INLINE V at_(const float* p) {
  if constexpr (std::is_same_v<V, float>) {
    return *p;
  } else {
    return load<V>(p);
  }
}

// The total of a plane's eight float partial sums, in double, in a fixed order.
TRAINER_INLINE double partial_total(F8 s) {
  double t = 0;
  for (int l = 0; l < 4; ++l) t += static_cast<double>(s[l]) + static_cast<double>(s[l + 4]);
  return t;
}

// Adds the sums of (x - k) and (x - k)^2 over x[0..n) to *sum and *sumsq: float lanes within the
// plane (shifted by k, a value of the channel, so that the squares do not cancel), the plane's
// total added in double.
TRAINER_INLINE void shifted_sums(const float* __restrict x, int64_t n, float k, double* sum,
                                 double* sumsq) {
  const F8 kv = splat<F8>(k);
  F8 s = {}, q = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const F8 a = load<F8>(x + i) - kv;
    s += a;
    q += a * a;
  }
  double ts = partial_total(s), tq = partial_total(q);
  for (; i < n; ++i) {
    const double v = x[i] - k;
    ts += v;
    tq += v * v;
  }
  *sum += ts;
  *sumsq += tq;
}

// y = (x - mean) * scale + bias (+ r), then ReLU: SyncBN's order of operations in float, then the
// residual block's `out += identity` and relu_(), for a vector or one element (the same
// roundings).
template <bool kResidual, bool kRelu, class V>
TRAINER_INLINE V norm(V x, V mean, V scale, V bias, const float* r, int64_t i) {
  V v = (x - mean) * scale + bias;
  if constexpr (kResidual) v = v + at_<V>(r + i);  // r is null without a residual
  if constexpr (kRelu) v = simd::relu(v);
  return v;
}

// One channel's forward: its statistics from its n planes of hw values, then its output.
template <bool kResidual, bool kRelu>
TRAINER_INLINE void normalize_channel(const float* __restrict x, const float* __restrict r,
                                      float* __restrict y, int64_t n, int64_t c, int64_t hw,
                                      int64_t ch, float mean, float scale, float bias) {
  const F8 mv = splat<F8>(mean), sv = splat<F8>(scale), bv = splat<F8>(bias);
  for (int64_t b = 0; b < n; ++b) {
    const int64_t off = (b * c + ch) * hw;
    int64_t i = 0;
    for (; i + 8 <= hw; i += 8) {
      store(y + off + i, norm<kResidual, kRelu>(load<F8>(x + off + i), mv, sv, bv, r, off + i));
    }
    for (; i < hw; ++i) {
      y[off + i] = norm<kResidual, kRelu>(x[off + i], mean, scale, bias, r, off + i);
    }
  }
}

TRAINER_CLONES void forward_channel(const float* x, const float* r, float* y, int64_t n, int64_t c,
                                    int64_t hw, int64_t ch, double eps, float weight, float bias,
                                    bool relu, ChannelStats* out) {
  const float k = x[ch * hw];  // the channel's first value
  double sum = 0, sumsq = 0;
  for (int64_t b = 0; b < n; ++b) shifted_sums(x + (b * c + ch) * hw, hw, k, &sum, &sumsq);
  const ChannelStats st = channel_stats(sum, sumsq, k, static_cast<double>(n * hw), eps);
  *out = st;
  const float scale = st.invstd * weight;
  const float m = st.mean;
  if (r != nullptr) {
    relu ? normalize_channel<true, true>(x, r, y, n, c, hw, ch, m, scale, bias)
         : normalize_channel<true, false>(x, r, y, n, c, hw, ch, m, scale, bias);
  } else {
    relu ? normalize_channel<false, true>(x, r, y, n, c, hw, ch, m, scale, bias)
         : normalize_channel<false, false>(x, r, y, n, c, hw, ch, m, scale, bias);
  }
}

// Calls f with a null pointer of x's element type: float or c10::BFloat16 (the channels_last
// kernels' two).
template <class F>
void with_element_type(const torch::Tensor& x, F&& f) {
  if (x.scalar_type() == torch::kBFloat16) {
    f(static_cast<c10::BFloat16*>(nullptr));
  } else {
    f(static_cast<float*>(nullptr));
  }
}

// g = dy after the mask, for a vector or one element at offset o; xm = x - mean, y the output.
template <Mask kMask, class V>
TRAINER_INLINE V masked(V dy, V xm, const float* y, int64_t o, V scale, V bias) {
  if constexpr (kMask == Mask::kFromY) return simd::relu_grad(dy, at_<V>(y + o));  // else null
  if constexpr (kMask == Mask::kFromX) return simd::relu_grad(dy, xm * scale + bias);
  return dy;
}

// One channel's forward values the backward uses: mean, scale (invstd * weight: the forward's
// product) and bias for the mask; k = dotp * invstd^2 / count, grad_mean = sum / count, invstd
// and weight for dx.
struct PlaneParams {
  float mean, scale, bias, k, grad_mean, invstd, weight;
};

// Backward, first pass over one channel's planes: g = dy after ReLU's mask, stored to g_out
// (kStore: the residual's gradient); the sums of g and of (x - mean) * g into *sum and *dotp
// (a plane's float partial sums as the forward's, the planes' totals in double).
template <Mask kMask, bool kStore>
TRAINER_INLINE void backward_sums_channel(const float* __restrict dy, const float* __restrict y,
                                          const float* __restrict x, float* __restrict g_out,
                                          int64_t n, int64_t c, int64_t hw, int64_t ch,
                                          const PlaneParams& p, double* sum, double* dotp) {
  const F8 mv = splat<F8>(p.mean), sv = splat<F8>(p.scale), bv = splat<F8>(p.bias);
  for (int64_t b = 0; b < n; ++b) {
    const int64_t off = (b * c + ch) * hw;
    F8 s = {}, d = {};
    int64_t i = 0;
    for (; i + 8 <= hw; i += 8) {
      const int64_t o = off + i;
      const F8 xm = load<F8>(x + o) - mv;
      const F8 g = masked<kMask>(load<F8>(dy + o), xm, y, o, sv, bv);
      if constexpr (kStore) store(g_out + o, g);
      s += g;
      d += xm * g;
    }
    double ts = partial_total(s), td = partial_total(d);
    for (; i < hw; ++i) {
      const int64_t o = off + i;
      const float xm = x[o] - p.mean;
      const float g = masked<kMask>(dy[o], xm, y, o, p.scale, p.bias);
      if constexpr (kStore) g_out[o] = g;
      ts += g;
      td += xm * g;
    }
    *sum += ts;
    *dotp += td;
  }
}

// Backward, second pass over one channel's planes: dx = (g - grad_mean - (x - mean) * k) *
// invstd * w, ATen's batch-norm backward formula and order, g from g_in (dy, or the stored g)
// after the mask.
template <Mask kMask>
TRAINER_INLINE void backward_dx_channel(const float* __restrict g_in, const float* __restrict y,
                                        const float* __restrict x, float* __restrict dx, int64_t n,
                                        int64_t c, int64_t hw, int64_t ch, const PlaneParams& p) {
  const F8 mv = splat<F8>(p.mean), sv = splat<F8>(p.scale), bv = splat<F8>(p.bias),
           kv = splat<F8>(p.k), gv = splat<F8>(p.grad_mean), iv = splat<F8>(p.invstd),
           wv = splat<F8>(p.weight);
  for (int64_t b = 0; b < n; ++b) {
    const int64_t off = (b * c + ch) * hw;
    int64_t i = 0;
    for (; i + 8 <= hw; i += 8) {
      const int64_t o = off + i;
      const F8 xm = load<F8>(x + o) - mv;
      const F8 g = masked<kMask>(load<F8>(g_in + o), xm, y, o, sv, bv);
      store(dx + o, (g - gv - xm * kv) * iv * wv);
    }
    for (; i < hw; ++i) {
      const int64_t o = off + i;
      const float xm = x[o] - p.mean;
      const float g = masked<kMask>(g_in[o], xm, y, o, p.scale, p.bias);
      dx[o] = (g - p.grad_mean - xm * p.k) * p.invstd * p.weight;
    }
  }
}

// One channel's backward: the sums (dw, db), then dx (where dx is not null). y null unless the
// mask is read from it; g_out null unless g is stored (kFromY only: otherwise g is dy).
TRAINER_CLONES void backward_channel(const float* dy, const float* y, const float* x, float* g_out,
                                     float* dx, int64_t n, int64_t c, int64_t hw, int64_t ch,
                                     PlaneParams p, Mask mask, float* dw, float* db) {
  double sum = 0, dotp = 0;
  if (mask == Mask::kFromY && g_out != nullptr) {
    backward_sums_channel<Mask::kFromY, true>(dy, y, x, g_out, n, c, hw, ch, p, &sum, &dotp);
  } else if (mask == Mask::kFromY) {
    backward_sums_channel<Mask::kFromY, false>(dy, y, x, g_out, n, c, hw, ch, p, &sum, &dotp);
  } else if (mask == Mask::kFromX) {
    backward_sums_channel<Mask::kFromX, false>(dy, y, x, g_out, n, c, hw, ch, p, &sum, &dotp);
  } else {
    backward_sums_channel<Mask::kNone, false>(dy, y, x, g_out, n, c, hw, ch, p, &sum, &dotp);
  }
  const double is = p.invstd;
  dw[ch] = static_cast<float>(dotp * is);
  db[ch] = static_cast<float>(sum);
  if (dx == nullptr) return;
  const double count = static_cast<double>(n * hw);
  p.k = static_cast<float>(dotp * is * is / count);
  p.grad_mean = static_cast<float>(sum / count);
  // g read where it was stored (no mask left to apply), else dy after the mask.
  if (g_out != nullptr) {
    backward_dx_channel<Mask::kNone>(g_out, y, x, dx, n, c, hw, ch, p);
  } else if (mask == Mask::kFromY) {
    backward_dx_channel<Mask::kFromY>(dy, y, x, dx, n, c, hw, ch, p);
  } else if (mask == Mask::kFromX) {
    backward_dx_channel<Mask::kFromX>(dy, y, x, dx, n, c, hw, ch, p);
  } else {
    backward_dx_channel<Mask::kNone>(dy, y, x, dx, n, c, hw, ch, p);
  }
}

// The backward of BN (+ residual) + ReLU for contiguous NCHW float tensors in two passes per
// channel, a channel by one thread (its planes still in the core's cache for the second pass):
// ReLU's mask, the two sums and dx together (ATen: threshold_backward's pass over the whole
// tensor, then batch-norm backward's two). dy contiguous; y the output where a residual was added
// (the mask read from it), or undefined (with relu: the mask recomputed from x); g_out the
// residual's gradient or undefined; dx undefined where the input's gradient is not wanted.
void backward_nchw(const torch::Tensor& dy, const torch::Tensor& y, const torch::Tensor& x,
                   const torch::Tensor& weight, const torch::Tensor& bias,
                   const torch::Tensor& mean, const torch::Tensor& invstd, bool relu,
                   torch::Tensor* g_out, torch::Tensor* dx, torch::Tensor* dw, torch::Tensor* db) {
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  const Mask mask = !relu ? Mask::kNone : y.defined() ? Mask::kFromY : Mask::kFromX;
  const float* dyp = dy.data_ptr<float>();
  const float* yp = mask == Mask::kFromY ? y.data_ptr<float>() : nullptr;
  const float* xp = x.data_ptr<float>();
  // The stored g only where the mask changed it (without ReLU, g is dy: g_out is dy itself).
  float* gp = g_out->defined() && mask == Mask::kFromY ? g_out->data_ptr<float>() : nullptr;
  float* dxp = dx->defined() ? dx->data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  const float* mp = mean.data_ptr<float>();
  const float* ip = invstd.data_ptr<float>();
  float* dwp = dw->data_ptr<float>();
  float* dbp = db->data_ptr<float>();
  at::parallel_for(0, c, 1, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const PlaneParams p{mp[ch], ip[ch] * wp[ch], bp[ch], 0, 0, ip[ch], wp[ch]};
      backward_channel(dyp, yp, xp, gp, dxp, n, c, hw, ch, p, mask, dwp, dbp);
    }
  });
}

// BatchNorm2d in training mode, optionally followed by a residual's addition and ReLU, for a
// CPU input, float32 contiguous NCHW or float32/bfloat16 channels_last: the statistics in one
// pass (the sums of (x - k) and (x - k)^2 for k a value of the channel; NCHW: float lanes within
// a plane, double across planes; channels_last: a float per channel over chunks of 128 rows,
// double across; model/batch_norm_cl.h), and
// y = (x - mean) * (invstd * weight) + bias (+ residual), ReLU'd, in a second (ATen: two passes
// for the statistics, one to normalise, one to add the residual, one for ReLU). The output's
// formula is SyncBatchNormFunction's, rounding step by rounding step: on one replica the two
// differ only by the statistics' last bits (a formula x * scale + shift instead flipped enough
// ReLU masks to move the 1 x 8 vs 2 x 4 SyncBN test's weights by 8 %). Backward: the own kernels
// (NCHW: backward_nchw, ReLU's mask, the sums and dx in two passes per channel; channels_last:
// cl::backward, the mask and the sums in one pass over chunks of rows, dx in a second), against
// ATen's threshold_backward pass and batch-norm backward's two. The statistics are summed in a
// fixed order whatever the threads (NCHW: a channel by one thread; channels_last: fixed chunks of
// rows, then the chunks in order), and the normalisation is elementwise: the result does not depend
// on the number of threads.
struct BatchNormReluFunction : public torch::autograd::Function<BatchNormReluFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& residual, double eps, bool relu,
                               torch::Tensor* mean_out, torch::Tensor* var_out) {
    const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
    torch::Tensor y = torch::empty_like(x);  // x's layout and dtype
    const auto stats = x.options().dtype(torch::kFloat);
    torch::Tensor mean = torch::empty({c}, stats);
    torch::Tensor invstd = torch::empty({c}, stats);
    torch::Tensor var = torch::empty({c}, stats.dtype(torch::kDouble));
    // An empty residual stands for none (autograd's apply takes no undefined tensor).
    const bool has_residual = residual.numel() > 0;
    const float* wp = weight.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* mp = mean.data_ptr<float>();
    float* ip = invstd.data_ptr<float>();
    double* vp = var.data_ptr<double>();
    if (x.is_contiguous()) {  // NCHW, float32 (fused_kernel_applies)
      const float* xp = x.data_ptr<float>();
      const float* rp = has_residual ? residual.data_ptr<float>() : nullptr;
      float* yp = y.data_ptr<float>();
      at::parallel_for(0, c, 1, [&](int64_t begin, int64_t end) {
        for (int64_t ch = begin; ch < end; ++ch) {
          ChannelStats st;
          forward_channel(xp, rp, yp, n, c, hw, ch, eps, wp[ch], bp[ch], relu, &st);
          mp[ch] = st.mean;
          ip[ch] = st.invstd;
          vp[ch] = st.var;
        }
      });
    } else {  // channels_last, float32 or bfloat16: rows of c channels (model/batch_norm_cl.h)
      with_element_type(x, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        cl::forward<T>(x.data_ptr<T>(), has_residual ? residual.data_ptr<T>() : nullptr,
                       y.data_ptr<T>(), n * hw, c, wp, bp, eps, relu, mp, ip, vp);
      });
    }
    // y only for ReLU's mask where a residual was added (a plain BN's output may be changed in
    // place after, as a residual block adds to it); without one the backward recomputes the mask
    // from x, weight and bias (backward_nchw, cl::backward).
    const bool keep_y = relu && has_residual;
    ctx->save_for_backward({x, keep_y ? y : torch::Tensor(), weight, bias, mean, invstd});
    ctx->saved_data["relu"] = relu;
    ctx->saved_data["residual"] = has_residual;
    *mean_out = mean;
    *var_out = var;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& y = saved[1];
    const torch::Tensor& weight = saved[2];
    const torch::Tensor& bias = saved[3];
    const torch::Tensor& mean = saved[4];
    const torch::Tensor& invstd = saved[5];
    const bool relu = ctx->saved_data["relu"].toBool();
    // The residual's gradient is the sum's: ReLU's, as `out += identity` passes it on.
    const bool residual = ctx->saved_data["residual"].toBool() && ctx->needs_input_grad(3);
    torch::Tensor dx, dw, db, g;
    if (x.is_contiguous()) {
      RECORD_FUNCTION(relu ? "trainer::batch_norm_relu_backward" : "trainer::batch_norm_backward",
                      std::vector<c10::IValue>({x}));
      const torch::Tensor dy = grads[0].contiguous();
      if (ctx->needs_input_grad(0)) dx = torch::empty_like(x);
      dw = torch::empty_like(weight);
      db = torch::empty_like(weight);
      if (residual) g = relu ? torch::empty_like(x) : dy;
      torch::Tensor g_out = relu ? g : torch::Tensor();
      backward_nchw(dy, y, x, weight, bias, mean, invstd, relu, &g_out, &dx, &dw, &db);
    } else {  // channels_last (model/batch_norm_cl.h)
      RECORD_FUNCTION(relu ? "trainer::batch_norm_relu_backward" : "trainer::batch_norm_backward",
                      std::vector<c10::IValue>({x}));
      const torch::Tensor dy = grads[0].contiguous(torch::MemoryFormat::ChannelsLast);
      if (ctx->needs_input_grad(0)) dx = torch::empty_like(x);
      dw = torch::empty_like(weight);
      db = torch::empty_like(weight);
      if (residual) g = relu ? torch::empty_like(x) : dy;
      const int64_t rows = x.size(0) * x.size(2) * x.size(3);
      with_element_type(x, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        cl::backward<T>(dy.data_ptr<T>(), y.defined() ? y.data_ptr<T>() : nullptr, x.data_ptr<T>(),
                        residual && relu ? g.data_ptr<T>() : nullptr,
                        dx.defined() ? dx.data_ptr<T>() : nullptr, rows, x.size(1),
                        weight.data_ptr<float>(), bias.data_ptr<float>(), mean.data_ptr<float>(),
                        invstd.data_ptr<float>(), relu, dw.data_ptr<float>(), db.data_ptr<float>());
      });
    }
    return {dx,
            ctx->needs_input_grad(1) ? dw : torch::Tensor(),
            ctx->needs_input_grad(2) ? db : torch::Tensor(),
            residual ? g : torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

// running = (1 - momentum) * running + momentum * batch (in running's dtype), as BatchNorm2d.
void blend_running(torch::Tensor& running, const torch::Tensor& batch, double momentum) {
  running.mul_(1 - momentum).add_(batch.to(running.scalar_type()), momentum);
}

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

bool BatchNormImpl::fused_kernel_applies(const torch::Tensor& input) const {
  // float32 in either layout; bfloat16 (autocast's convolution outputs) in channels_last.
  const bool channels_last = input.is_contiguous(torch::MemoryFormat::ChannelsLast);
  return !util::aten_kernels_only() && is_training() && !reducer_ && input.dim() == 4 &&
         input.is_cpu() &&
         ((input.scalar_type() == torch::kFloat && (input.is_contiguous() || channels_last)) ||
          (input.scalar_type() == torch::kBFloat16 && channels_last && !input.is_contiguous())) &&
         weight.scalar_type() == torch::kFloat && bias.scalar_type() == torch::kFloat &&
         input.size(1) > 0 && input.size(0) * input.size(2) * input.size(3) > 1;
}

torch::Tensor BatchNormImpl::fused_forward(const torch::Tensor& input,
                                           const torch::Tensor& residual, bool relu) {
  // Named for profilers (PyTorch's, scripts/bench/op_profile.sh), as ATen names its operators.
  RECORD_FUNCTION(residual.defined() ? "trainer::batch_norm_add_relu"
                  : relu             ? "trainer::batch_norm_relu"
                                     : "trainer::batch_norm",
                  std::vector<c10::IValue>({input}));
  num_batches_tracked.add_(1);
  torch::Tensor mean, var;
  torch::Tensor y = BatchNormReluFunction::apply(
      input, weight, bias, residual.defined() ? residual : torch::empty({0}, input.options()), eps_,
      relu, &mean, &var);
  // Running statistics as torch.batch_norm keeps them: unbiased variance, momentum.
  torch::NoGradGuard no_grad;
  const double count = static_cast<double>(input.size(0) * input.size(2) * input.size(3));
  blend_running(running_mean, mean, momentum_);
  blend_running(running_var, var * (count / (count - 1)), momentum_);
  return y;
}

torch::Tensor BatchNormImpl::forward(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() == 4, "BatchNorm: expected a 4-D input, got ", input.sizes());
  if (fused_kernel_applies(input)) return fused_forward(input, torch::Tensor(), /*relu=*/false);
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
  const torch::Tensor unbiased =
      torch::where(count > 1, count / (count - 1), torch::ones_like(count));
  blend_running(running_mean, mean, momentum_);
  blend_running(running_var, var * unbiased, momentum_);
  num_batches_tracked.add_(1);
  return y;
}

torch::Tensor BatchNormImpl::forward_relu(const torch::Tensor& input) {
  if (fused_kernel_applies(input)) return fused_forward(input, torch::Tensor(), /*relu=*/true);
  return forward(input).relu_();
}

torch::Tensor BatchNormImpl::forward_add_relu(const torch::Tensor& input,
                                              const torch::Tensor& residual) {
  // The residual in the input's layout (the kernel walks both with the same offsets).
  const auto layout =
      input.is_contiguous() ? torch::MemoryFormat::Contiguous : torch::MemoryFormat::ChannelsLast;
  if (fused_kernel_applies(input) && residual.is_cpu() &&
      residual.scalar_type() == input.scalar_type() && residual.sizes() == input.sizes() &&
      residual.is_contiguous(layout)) {
    return fused_forward(input, residual, /*relu=*/true);
  }
  torch::Tensor out = forward(input);
  out += residual;
  return out.relu_();
}

void set_batchnorm_reducer(torch::nn::Module& module,
                           const std::shared_ptr<StatsReducer>& reducer) {
  module.apply([&](torch::nn::Module& m) {
    if (auto* bn = dynamic_cast<BatchNormImpl*>(&m)) bn->set_reducer(reducer);
  });
}

}  // namespace trainer::model
