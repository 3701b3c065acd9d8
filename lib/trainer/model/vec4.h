// Four-lane float and int32 vectors in GCC/Clang vector extensions (SSE on any x86-64, NEON on
// ARM) for the trainer's own CPU kernels compiled once, for the baseline (model/max_pool.cpp,
// and the optimizers' step where LibTorch has no fused one, loop/optimizer_kernels.cpp; batch
// norm's, compiled for several instruction sets, use model/simd.h): plain loops
// are not vectorised well there (a float compare-and-select is not if-converted under the default
// -ftrapping-math). Lane arithmetic is IEEE float, lane by lane, so a kernel's bits do not depend
// on the vector unit. Header-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace trainer::model::vec {

typedef float Vec4 __attribute__((vector_size(16)));
typedef int32_t Mask4 __attribute__((vector_size(16)));  // lane masks: -1 (true) or 0

inline Vec4 load4(const float* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store4(float* p, Vec4 v) { std::memcpy(p, &v, sizeof v); }

inline Vec4 splat4(float v) { return Vec4{v, v, v, v}; }

// Lane by lane: a where `mask`, else b.
inline Vec4 select4(Mask4 mask, Vec4 a, Vec4 b) {
  return reinterpret_cast<Vec4>((reinterpret_cast<Mask4>(a) & mask) |
                                (reinterpret_cast<Mask4>(b) & ~mask));
}
inline Mask4 select4(Mask4 mask, Mask4 a, Mask4 b) { return (a & mask) | (b & ~mask); }

// max(v, 0) lane by lane, +0.0 for v <= 0 (ReLU; a NaN stays NaN, as torch.relu keeps it).
inline Vec4 relu4(Vec4 v) {
  const Mask4 keep = !(v <= splat4(0.0f));
  return reinterpret_cast<Vec4>(reinterpret_cast<Mask4>(v) & keep);
}

// The correctly rounded square root lane by lane (IEEE's sqrt: the bits std::sqrt gives).
inline Vec4 sqrt4(Vec4 v) {
#if defined(__SSE__)
  return reinterpret_cast<Vec4>(_mm_sqrt_ps(reinterpret_cast<__m128>(v)));
#else
  return Vec4{std::sqrt(v[0]), std::sqrt(v[1]), std::sqrt(v[2]), std::sqrt(v[3])};
#endif
}

// max(a, b) lane by lane as torch.maximum computes it: NaN where either is NaN.
inline Vec4 max4(Vec4 a, Vec4 b) { return select4(b != b, b, select4(a < b, b, a)); }

}  // namespace trainer::model::vec
