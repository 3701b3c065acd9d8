#include "trainer/model/batch_norm_cl.h"

#include "trainer/model/simd.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace trainer::model::cl {

namespace {

using c10::BFloat16;

// 16 float lanes (one AVX-512 register, two AVX2 or four SSE ones), each a channel.
using VF = simd::F16;
constexpr int64_t kLanes = simd::kLanes<VF>;
typedef uint32_t VU __attribute__((vector_size(64)));
typedef uint16_t VH __attribute__((vector_size(32)));
using simd::relu;
using simd::relu_grad;

// bfloat16 <-> float as c10::BFloat16 converts: widening is exact; narrowing rounds to nearest,
// ties to even, and every NaN becomes 0x7FC0.
TRAINER_INLINE uint16_t bf16_bits(float f) {
  if (f != f) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16);
}
TRAINER_INLINE float widen(float v) { return v; }
TRAINER_INLINE float widen(BFloat16 v) {
  const uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
TRAINER_INLINE void put(float* p, float v) { *p = v; }
TRAINER_INLINE void put(BFloat16* p, float v) { p->x = bf16_bits(v); }
// What reading back put(p, v) gives.
TRAINER_INLINE float rounded(float v, const float*) { return v; }
TRAINER_INLINE float rounded(float v, const BFloat16*) {
  BFloat16 b;
  put(&b, v);
  return widen(b);
}

TRAINER_INLINE VF vload(const float* p) { return simd::load<VF>(p); }
TRAINER_INLINE VF vload(const BFloat16* p) {
  VH h;
  std::memcpy(&h, p, sizeof h);
  return reinterpret_cast<VF>(__builtin_convertvector(h, VU) << 16);
}
TRAINER_INLINE VU vbf16_bits(VF v) {
  const VU u = reinterpret_cast<VU>(v);
  const VU r = (u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16;
  const VU nan = reinterpret_cast<VU>(v != v);
  return (r & ~nan) | (nan & 0x7FC0u);
}
TRAINER_INLINE void vput(float* p, VF v) { simd::store(p, v); }
TRAINER_INLINE void vput(BFloat16* p, VF v) {
  const VH h = __builtin_convertvector(vbf16_bits(v), VH);
  std::memcpy(p, &h, sizeof h);
}
TRAINER_INLINE VF vrounded(VF v, const float*) { return v; }
TRAINER_INLINE VF vrounded(VF v, const BFloat16*) {
  return reinterpret_cast<VF>(vbf16_bits(v) << 16);
}

TRAINER_INLINE VF vrelu(VF v) { return simd::relu(v); }
TRAINER_INLINE VF vrelu_grad(VF g, VF y) { return simd::relu_grad(g, y); }

// Rows summed in fixed chunks (each chunk's sums in float, by one thread, whichever), the chunks'
// sums added in double in chunk order: the bits do not depend on the threads.
constexpr int64_t kRowChunk = 128;

// Forward, statistics: per channel, the sums of (x - k) and (x - k)^2 over rows [start, stop)
// in float, rows in order, into s[0..c) and q[0..c). Row by row (the memory in order, for the
// prefetcher), the sums kept in s and q (in L1).
template <class T>
TRAINER_INLINE void chunk_sums(const T* __restrict x, int64_t start, int64_t stop, int64_t c,
                               const float* __restrict k, float* __restrict s,
                               float* __restrict q) {
  std::fill(s, s + c, 0.0f);
  std::fill(q, q + c, 0.0f);
  for (int64_t row = start; row < stop; ++row) {
    const T* p = x + row * c;
    int64_t ch = 0;
    for (; ch + kLanes <= c; ch += kLanes) {
      const VF d = vload(p + ch) - vload(k + ch);
      vput(s + ch, vload(s + ch) + d);
      vput(q + ch, vload(q + ch) + d * d);
    }
    for (; ch < c; ++ch) {
      const float d = widen(p[ch]) - k[ch];
      s[ch] += d;
      q[ch] += d * d;
    }
  }
}

// Forward, output: y = (x - mean) * scale + bias; with a residual, that rounded as stored, plus
// r (`out += identity`); then ReLU; rounded once as stored.
template <class T, bool kResidual, bool kRelu>
TRAINER_INLINE void normalize_rows(const T* __restrict x, const T* __restrict r, T* __restrict y,
                                   int64_t begin, int64_t end, int64_t c, const float* mean,
                                   const float* scale, const float* bias) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t off = row * c;
    int64_t ch = 0;
    for (; ch + kLanes <= c; ch += kLanes) {
      VF v = (vload(x + off + ch) - vload(mean + ch)) * vload(scale + ch) + vload(bias + ch);
      if constexpr (kResidual) v = vrounded(v, x) + vload(r + off + ch);
      if constexpr (kRelu) v = vrelu(v);
      vput(y + off + ch, v);
    }
    for (; ch < c; ++ch) {
      float v = (widen(x[off + ch]) - mean[ch]) * scale[ch] + bias[ch];
      if constexpr (kResidual) v = rounded(v, x) + widen(r[off + ch]);
      if constexpr (kRelu) v = relu(v);
      put(y + off + ch, v);
    }
  }
}

// What the backward needs per channel, c floats each: the forward's mean, its scale (invstd *
// weight) and bias (for Mask::kFromX), and for dx: k = dotp * invstd^2 / n, grad_mean = sum / n,
// invstd, weight.
struct ChannelParams {
  const float* mean;
  const float* scale;
  const float* bias;
  const float* k;
  const float* grad_mean;
  const float* invstd;
  const float* weight;
};

// g = dy after ReLU's mask; xm = x - mean.
template <Mask kMask, class T>
TRAINER_INLINE VF vmasked(VF dy, VF xm, const T* y, const ChannelParams& p, int64_t o, int64_t ch) {
  if constexpr (kMask == Mask::kFromY) return vrelu_grad(dy, vload(y + o));
  if constexpr (kMask == Mask::kFromX) {
    return vrelu_grad(dy, vrounded(xm * vload(p.scale + ch) + vload(p.bias + ch), y));
  }
  return dy;
}
template <Mask kMask, class T>
TRAINER_INLINE float masked(float dy, float xm, const T* y, const ChannelParams& p, int64_t o,
                            int64_t ch) {
  if constexpr (kMask == Mask::kFromY) return relu_grad(dy, widen(y[o]));
  if constexpr (kMask == Mask::kFromX) {
    return relu_grad(dy, rounded(xm * p.scale[ch] + p.bias[ch], y));
  }
  return dy;
}

// Backward, first pass: per channel, the sums of g and of (x - mean) * g over rows [start, stop)
// in float, rows in order, into s and d (row by row, as chunk_sums); g = dy after ReLU's mask,
// stored to g_out (kStore; exact: a value of dy or 0).
template <class T, Mask kMask, bool kStore>
TRAINER_INLINE void backward_sums(const T* __restrict dy, const T* __restrict y,
                                  const T* __restrict x, T* __restrict g_out, int64_t start,
                                  int64_t stop, int64_t c, const ChannelParams& p,
                                  float* __restrict s, float* __restrict d) {
  std::fill(s, s + c, 0.0f);
  std::fill(d, d + c, 0.0f);
  for (int64_t row = start; row < stop; ++row) {
    const int64_t off = row * c;
    int64_t ch = 0;
    for (; ch + kLanes <= c; ch += kLanes) {
      const int64_t o = off + ch;
      const VF xm = vload(x + o) - vload(p.mean + ch);
      const VF g = vmasked<kMask>(vload(dy + o), xm, y, p, o, ch);
      if constexpr (kStore) vput(g_out + o, g);
      vput(s + ch, vload(s + ch) + g);
      vput(d + ch, vload(d + ch) + xm * g);
    }
    for (; ch < c; ++ch) {
      const int64_t o = off + ch;
      const float xm = widen(x[o]) - p.mean[ch];
      const float g = masked<kMask>(widen(dy[o]), xm, y, p, o, ch);
      if constexpr (kStore) put(g_out + o, g);
      s[ch] += g;
      d[ch] += xm * g;
    }
  }
}

// Backward, second pass: dx = (g - grad_mean - (x - mean) * k) * invstd * weight, g from g_in
// (dy, or the stored g) after the mask.
template <class T, Mask kMask>
TRAINER_INLINE void dx_rows(const T* __restrict g_in, const T* __restrict y, const T* __restrict x,
                            T* __restrict dx, int64_t begin, int64_t end, int64_t c,
                            const ChannelParams& p) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t off = row * c;
    int64_t ch = 0;
    for (; ch + kLanes <= c; ch += kLanes) {
      const int64_t o = off + ch;
      const VF xm = vload(x + o) - vload(p.mean + ch);
      const VF g = vmasked<kMask>(vload(g_in + o), xm, y, p, o, ch);
      vput(dx + o, (g - vload(p.grad_mean + ch) - xm * vload(p.k + ch)) * vload(p.invstd + ch) *
                       vload(p.weight + ch));
    }
    for (; ch < c; ++ch) {
      const int64_t o = off + ch;
      const float xm = widen(x[o]) - p.mean[ch];
      const float g = masked<kMask>(widen(g_in[o]), xm, y, p, o, ch);
      put(dx + o, (g - p.grad_mean[ch] - xm * p.k[ch]) * p.invstd[ch] * p.weight[ch]);
    }
  }
}

// The compiled (cloned) entry points, an overload per element type; the flags pick the
// instantiation inside, so each clone holds all of them.
#define TRAINER_BN_CL_KERNELS(T)                                                                 \
  TRAINER_CLONES void chunk_sums_kernel(const T* x, int64_t start, int64_t stop, int64_t c,      \
                                        const float* k, float* s, float* q) {                    \
    chunk_sums<T>(x, start, stop, c, k, s, q);                                                   \
  }                                                                                              \
  TRAINER_CLONES void normalize_kernel(const T* x, const T* r, T* y, int64_t begin, int64_t end, \
                                       int64_t c, const float* mean, const float* scale,         \
                                       const float* bias, bool relu) {                           \
    if (r != nullptr) {                                                                          \
      relu ? normalize_rows<T, true, true>(x, r, y, begin, end, c, mean, scale, bias)            \
           : normalize_rows<T, true, false>(x, r, y, begin, end, c, mean, scale, bias);          \
    } else {                                                                                     \
      relu ? normalize_rows<T, false, true>(x, r, y, begin, end, c, mean, scale, bias)           \
           : normalize_rows<T, false, false>(x, r, y, begin, end, c, mean, scale, bias);         \
    }                                                                                            \
  }                                                                                              \
  TRAINER_CLONES void backward_sums_kernel(                                                      \
      const T* dy, const T* y, const T* x, T* g_out, int64_t start, int64_t stop, int64_t c,     \
      const ChannelParams& p, Mask mask, float* s, float* d) {                                   \
    if (mask == Mask::kFromY) {                                                                  \
      g_out ? backward_sums<T, Mask::kFromY, true>(dy, y, x, g_out, start, stop, c, p, s, d)     \
            : backward_sums<T, Mask::kFromY, false>(dy, y, x, g_out, start, stop, c, p, s, d);   \
    } else if (mask == Mask::kFromX) {                                                           \
      backward_sums<T, Mask::kFromX, false>(dy, x, x, g_out, start, stop, c, p, s, d);           \
    } else {                                                                                     \
      backward_sums<T, Mask::kNone, false>(dy, y, x, g_out, start, stop, c, p, s, d);            \
    }                                                                                            \
  }                                                                                              \
  TRAINER_CLONES void dx_kernel(const T* g_in, const T* y, const T* x, T* dx, int64_t begin,     \
                                int64_t end, int64_t c, const ChannelParams& p, Mask mask) {     \
    if (mask == Mask::kFromY) {                                                                  \
      dx_rows<T, Mask::kFromY>(g_in, y, x, dx, begin, end, c, p);                                \
    } else if (mask == Mask::kFromX) {                                                           \
      dx_rows<T, Mask::kFromX>(g_in, x, x, dx, begin, end, c, p);                                \
    } else {                                                                                     \
      dx_rows<T, Mask::kNone>(g_in, y, x, dx, begin, end, c, p);                                 \
    }                                                                                            \
  }

TRAINER_BN_CL_KERNELS(float)
TRAINER_BN_CL_KERNELS(BFloat16)
#undef TRAINER_BN_CL_KERNELS

int64_t chunk_count(int64_t rows) { return (rows + kRowChunk - 1) / kRowChunk; }

// Rows per task of an elementwise pass: about 32k values.
int64_t row_grain(int64_t c) { return std::max<int64_t>(1, 32768 / c); }

}  // namespace

template <class T>
void forward(const T* x, const T* r, T* y, int64_t rows, int64_t c, const float* weight,
             const float* bias, double eps, bool relu, float* mean, float* invstd, double* var) {
  const double count = static_cast<double>(rows);
  const int64_t chunks = chunk_count(rows);
  std::vector<float> k(static_cast<size_t>(c));  // the first row: a value of each channel
  for (int64_t ch = 0; ch < c; ++ch) k[ch] = widen(x[ch]);
  // [chunk][sums of c | squares of c]; chunk_sums writes every value.
  const std::unique_ptr<float[]> partial(new float[static_cast<size_t>(chunks * 2 * c)]);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      float* s = partial.get() + chunk * 2 * c;
      chunk_sums_kernel(x, chunk * kRowChunk, std::min(rows, (chunk + 1) * kRowChunk), c, k.data(),
                        s, s + c);
    }
  });
  std::vector<float> scale(static_cast<size_t>(c));
  at::parallel_for(0, c, 64, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      double sum = 0, sumsq = 0;
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        sum += partial[chunk * 2 * c + ch];
        sumsq += partial[chunk * 2 * c + c + ch];
      }
      const ChannelStats st = channel_stats(sum, sumsq, k[ch], count, eps);
      mean[ch] = st.mean;
      invstd[ch] = st.invstd;
      var[ch] = st.var;
      scale[ch] = st.invstd * weight[ch];
    }
  });
  at::parallel_for(0, rows, row_grain(c), [&](int64_t begin, int64_t end) {
    normalize_kernel(x, r, y, begin, end, c, mean, scale.data(), bias, relu);
  });
}

template <class T>
void backward(const T* dy, const T* y, const T* x, T* g_out, T* dx, int64_t rows, int64_t c,
              const float* weight, const float* bias, const float* mean, const float* invstd,
              bool relu, float* dw, float* db) {
  const double count = static_cast<double>(rows);
  const int64_t chunks = chunk_count(rows);
  const Mask mask = !relu ? Mask::kNone : y != nullptr ? Mask::kFromY : Mask::kFromX;
  T* gm = mask == Mask::kFromY ? g_out : nullptr;  // otherwise nothing to store (header)
  std::vector<float> scale(static_cast<size_t>(c)), k(static_cast<size_t>(c)),
      grad_mean(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) scale[ch] = invstd[ch] * weight[ch];  // forward's product
  const ChannelParams p{mean, scale.data(), bias, k.data(), grad_mean.data(), invstd, weight};
  const std::unique_ptr<float[]> partial(new float[static_cast<size_t>(chunks * 2 * c)]);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      float* s = partial.get() + chunk * 2 * c;
      backward_sums_kernel(dy, y, x, gm, chunk * kRowChunk, std::min(rows, (chunk + 1) * kRowChunk),
                           c, p, mask, s, s + c);
    }
  });
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, dotp = 0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      sum += partial[chunk * 2 * c + ch];
      dotp += partial[chunk * 2 * c + c + ch];
    }
    const double is = invstd[ch];
    dw[ch] = static_cast<float>(dotp * is);
    db[ch] = static_cast<float>(sum);
    k[ch] = static_cast<float>(dotp * is * is / count);
    grad_mean[ch] = static_cast<float>(sum / count);
  }
  if (dx == nullptr) return;
  // g from the stored g (no mask left to apply), else from dy after the mask.
  const T* g_in = gm != nullptr ? gm : dy;
  const Mask dx_mask = gm != nullptr ? Mask::kNone : mask;
  at::parallel_for(0, rows, row_grain(c), [&](int64_t begin, int64_t end) {
    dx_kernel(g_in, y, x, dx, begin, end, c, p, dx_mask);
  });
}

template void forward<float>(const float*, const float*, float*, int64_t, int64_t, const float*,
                             const float*, double, bool, float*, float*, double*);
template void forward<BFloat16>(const BFloat16*, const BFloat16*, BFloat16*, int64_t, int64_t,
                                const float*, const float*, double, bool, float*, float*, double*);
template void backward<float>(const float*, const float*, const float*, float*, float*, int64_t,
                              int64_t, const float*, const float*, const float*, const float*, bool,
                              float*, float*);
template void backward<BFloat16>(const BFloat16*, const BFloat16*, const BFloat16*, BFloat16*,
                                 BFloat16*, int64_t, int64_t, const float*, const float*,
                                 const float*, const float*, bool, float*, float*);

}  // namespace trainer::model::cl
