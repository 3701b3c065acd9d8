// The trainer's own batch-norm (+ residual) (+ ReLU) kernels for channels_last CPU tensors in
// float32 or bfloat16 (model/batch_norm.cpp calls them; the NCHW float kernels live there).
// Tensors are seen as `rows` rows of `c` channels (rows = N * H * W); the statistics, weight,
// bias and gradients of the parameters are float32 (double for the variance), whatever T is.
//
// Each is compiled for AVX-512, AVX2 and the baseline x86-64 (GCC's target_clones, chosen at
// load time) with floating-point contraction off: a vector lane is a channel and its arithmetic
// is IEEE float step by step, so the bits do not depend on the vector unit or the thread count.
// In bfloat16 every value is widened to float, computed as the float kernel does, and rounded to
// nearest-even once per stored tensor (as ATen's bf16 batch norm and elementwise ops round),
// with one more rounding where ATen's three steps would round twice (the normalised value
// before the residual is added).
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace trainer::model {

// One channel's statistics from its shifted sums (of x - k and (x - k)^2, k a value of the
// channel): the float mean and inverse standard deviation the output uses, and the biased
// variance in double for the running statistics. Both layouts' kernels use it.
struct ChannelStats {
  float mean, invstd;
  double var;
};
inline ChannelStats channel_stats(double sum, double sumsq, float k, double count, double eps) {
  const double shifted_mean = sum / count;
  const double var = std::max(0.0, sumsq / count - shifted_mean * shifted_mean);
  return {static_cast<float>(k + shifted_mean), static_cast<float>(1.0 / std::sqrt(var + eps)),
          var};
}

// Where a batch-norm backward's ReLU mask comes from: no ReLU; the saved output y (y <= 0 -> 0);
// or the output recomputed from x as the forward computed it, rounded as stored (the same bits:
// one tensor less to save and to read where no residual was added). Both layouts' kernels.
enum class Mask { kNone, kFromY, kFromX };

}  // namespace trainer::model

namespace trainer::model::cl {

// Training-mode forward: mean and invstd (float, c each) and the biased variance (double, c)
// over the rows; y = relu?((x - mean) * (invstd * weight) + bias (+ r)). r: nullptr or the
// residual, of x's shape. Statistics: per channel, the sums of (x - k) and (x - k)^2 with k the
// first row's value, in float over fixed chunks of rows, the chunks added in double in order.
template <class T>
void forward(const T* x, const T* r, T* y, int64_t rows, int64_t c, const float* weight,
             const float* bias, double eps, bool relu, float* mean, float* invstd, double* var);

// Backward of forward() with the statistics it returned: g = dy after ReLU's mask (relu: 0 where
// the output <= 0), dw = sum(g * (x - mean)) * invstd, db = sum(g), dx = (g - db / n - (x - mean)
// * dw * invstd / n) * invstd * weight (ATen's formula and order). The mask is read from y,
// forward's output, where y is given; with y nullptr it is recomputed from x, weight and bias
// (forward's arithmetic, the same bits; valid where no residual was added). g_out (nullptr, or
// x's shape; used only with y) receives g: the residual's gradient. dx nullptr: not computed.
// Sums as forward's: float over fixed chunks of rows, the chunks in double in order.
template <class T>
void backward(const T* dy, const T* y, const T* x, T* g_out, T* dx, int64_t rows, int64_t c,
              const float* weight, const float* bias, const float* mean, const float* invstd,
              bool relu, float* dw, float* db);

extern template void forward<float>(const float*, const float*, float*, int64_t, int64_t,
                                    const float*, const float*, double, bool, float*, float*,
                                    double*);
extern template void forward<c10::BFloat16>(const c10::BFloat16*, const c10::BFloat16*,
                                            c10::BFloat16*, int64_t, int64_t, const float*,
                                            const float*, double, bool, float*, float*, double*);
extern template void backward<float>(const float*, const float*, const float*, float*, float*,
                                     int64_t, int64_t, const float*, const float*, const float*,
                                     const float*, bool, float*, float*);
extern template void backward<c10::BFloat16>(const c10::BFloat16*, const c10::BFloat16*,
                                             const c10::BFloat16*, c10::BFloat16*, c10::BFloat16*,
                                             int64_t, int64_t, const float*, const float*,
                                             const float*, const float*, bool, float*, float*);

}  // namespace trainer::model::cl
