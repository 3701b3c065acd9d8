// Portable random draws from a std::mt19937_64, whose output sequence the C++ standard fixes
// (the std:: distributions are implementation-defined, so they are not used): uniform reals,
// unbiased integers and a Fisher-Yates shuffle. Pure functions of the engine passed in;
// thread-safe as long as each thread uses its own engine.
#pragma once

#include <cmath>
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

// Standard normal (Box-Muller, the cosine branch; two uniform draws per call).
inline double standard_normal(Rng& rng) {
  const double u1 = 1.0 - uniform01(rng);  // (0, 1]
  const double u2 = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Gamma(shape, 1) by Marsaglia and Tsang's method (shape < 1 boosted by U^(1/shape)); shape > 0.
inline double gamma_sample(Rng& rng, double shape) {
  if (shape < 1.0) {
    const double boost = std::pow(1.0 - uniform01(rng), 1.0 / shape);
    return gamma_sample(rng, shape + 1.0) * boost;
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0;
    double v = 0;
    do {
      x = standard_normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = 1.0 - uniform01(rng);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

// Beta(a, b) as X / (X + Y) of two Gamma draws; a, b > 0.
inline double beta_sample(Rng& rng, double a, double b) {
  const double x = gamma_sample(rng, a);
  const double y = gamma_sample(rng, b);
  return x + y > 0 ? x / (x + y) : 0.5;
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
