// Portable random draws from a std::mt19937_64, whose output sequence the C++ standard fixes
// (the std:: distributions are implementation-defined, so they are not used): uniform reals,
// unbiased integers and a Fisher-Yates shuffle. Pure functions of the engine passed in;
// thread-safe as long as each thread uses its own engine.
#pragma once

#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace trainer::data {

using Rng = std::mt19937_64;

// Uniform in [0, 1) with 53 random bits.
inline double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Uniform in [lo, hi).
inline double uniform(Rng& rng, double lo, double hi) { return lo + (hi - lo) * uniform01(rng); }

// Uniform integer in [0, bound) without modulo bias; bound >= 1.
inline uint64_t uniform_index(Rng& rng, uint64_t bound) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  const uint64_t rem = (max % bound + 1) % bound;  // 2^64 mod bound
  for (;;) {
    const uint64_t x = rng();
    if (rem == 0 || x < max - rem + 1) return x % bound;
  }
}

// Uniform integer in [lo, hi); hi > lo.
inline int64_t uniform_int(Rng& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(uniform_index(rng, static_cast<uint64_t>(hi - lo)));
}

// Fisher-Yates (Durstenfeld) shuffle: the same permutation for the same engine state everywhere.
template <typename T>
void shuffle_in_place(std::vector<T>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(uniform_index(rng, i));
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace trainer::data
