// Little-endian numbers in byte buffers: the one reader and writer of them, for the TFRecord
// framing, safetensors headers, torch.save zips and TensorBoard's tensor_content. The caller
// bounds the range (these functions do not check it). Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace trainer::util {

// The n-byte (1..8) little-endian unsigned integer at p.
inline uint64_t load_le(const char* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(p[k]);
  return v;
}

// Writes the low n bytes (1..8) of v at p, little-endian.
inline void store_le(char* p, uint64_t v, int n) {
  for (int k = 0; k < n; ++k) p[k] = static_cast<char>((v >> (8 * k)) & 0xFF);
}

// The little-endian IEEE float (T = float) or double (T = double) at p.
template <typename T>
T load_le_real(const char* p) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "float or double");
  const uint64_t bits = load_le(p, static_cast<int>(sizeof(T)));
  T x;
  if constexpr (sizeof(T) == 4) {
    const auto narrow = static_cast<uint32_t>(bits);
    std::memcpy(&x, &narrow, sizeof x);
  } else {
    std::memcpy(&x, &bits, sizeof x);
  }
  return x;
}

}  // namespace trainer::util
