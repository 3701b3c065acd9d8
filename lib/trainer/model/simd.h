// Wide float vectors for the trainer's own CPU kernels that are compiled for several instruction
// sets (model/batch_norm.cpp, model/batch_norm_cl.cpp): GCC/Clang vector extensions of 8 and 16
// lanes, and TRAINER_CLONES, which compiles a function for AVX-512, AVX2 and the baseline x86-64
// (GCC's target_clones: the best the CPU runs is chosen once, at load time). Such a kernel must
// give the same bits in every clone: its lanes' arithmetic is IEEE float step by step, which the
// build guarantees by compiling these files with -ffp-contract=off (lib/CMakeLists.txt), and the
// order of every sum is fixed by the code, not by the vector width. Clang (the sanitizer builds):
// the baseline only; GCC's ThreadSanitizer build too (below).
#pragma once

#include <cstdint>
#include <cstring>

// Not under ThreadSanitizer: GCC instruments the clones' resolver, which runs while the loader
// starts the program, before TSan's runtime, and crashes it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TRAINER_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TRAINER_CLONES
#endif
#define TRAINER_INLINE __attribute__((always_inline)) inline

namespace trainer::model::simd {

typedef float F8 __attribute__((vector_size(32)));
typedef float F16 __attribute__((vector_size(64)));

template <class V>
constexpr int kLanes = sizeof(V) / sizeof(float);

// The lane-mask type of a float vector (what its comparisons give): int32 lanes, -1 or 0.
template <class V>
using MaskOf = decltype(V{} <= V{});

template <class V>
TRAINER_INLINE V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class V>
TRAINER_INLINE void store(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

template <class V>
TRAINER_INLINE V splat(float f) {
  V v;
  for (int l = 0; l < kLanes<V>; ++l) v[l] = f;
  return v;
}

// a where `mask`, else b, lane by lane.
template <class V>
TRAINER_INLINE V select(MaskOf<V> mask, V a, V b) {
  using M = MaskOf<V>;
  return reinterpret_cast<V>((reinterpret_cast<M>(a) & mask) | (reinterpret_cast<M>(b) & ~mask));
}

// ReLU: +0.0 where v <= 0 (a NaN stays NaN, as torch.relu keeps it).
template <class V>
TRAINER_INLINE V relu(V v) {
  return select<V>(!(v <= splat<V>(0.0f)), v, V{});
}
TRAINER_INLINE float relu(float v) { return v <= 0.0f ? 0.0f : v; }

// ReLU's backward: 0 where the output y <= 0, else the gradient g (threshold_backward(g, y, 0)'s
// bits; a NaN output passes the gradient).
template <class V>
TRAINER_INLINE V relu_grad(V g, V y) {
  return select<V>(!(y <= splat<V>(0.0f)), g, V{});
}
TRAINER_INLINE float relu_grad(float g, float y) { return y <= 0.0f ? 0.0f : g; }

}  // namespace trainer::model::simd
