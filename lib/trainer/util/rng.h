// Deterministic seeding: every random choice in the program derives from (seed, stream ids)
// through mix_seed, so a seed reproduces a run whatever the thread count. Pure functions.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace trainer::util {

// SplitMix64 finaliser: a well-mixed 64-bit hash of x.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Combines a seed with any number of stream identifiers (epoch, example index, ...).
inline uint64_t mix_seed(uint64_t seed, std::initializer_list<uint64_t> ids) {
  uint64_t h = splitmix64(seed);
  for (uint64_t id : ids) h = splitmix64(h ^ splitmix64(id));
  return h;
}

}  // namespace trainer::util
