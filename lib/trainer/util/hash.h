// FNV-1a, the one copy: 64-bit byte-wise (listing digests), 64-bit word-wise (replica checksums)
// and 128-bit byte-wise (the job-spec fingerprint). Values are stored in job dirs and compared
// across ranks, so outputs must never change. Plain values, no shared state: thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace trainer::util {

// 64-bit FNV-1a: h = (h ^ byte) * prime for each byte, from the offset basis.
// Fnv1a64().add("a").value() == 0xaf63dc4c8601ec8c; of no bytes: kOffset.
class Fnv1a64 {
 public:
  static constexpr uint64_t kOffset = 0xcbf29ce484222325ULL;
  static constexpr uint64_t kPrime = 0x100000001b3ULL;

  Fnv1a64() = default;
  // Starts from `basis` instead of kOffset (for a digest that must stay what it always was).
  explicit Fnv1a64(uint64_t basis) : h_(basis) {}

  Fnv1a64& add_byte(unsigned char b) {
    h_ = (h_ ^ b) * kPrime;
    return *this;
  }
  Fnv1a64& add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) add_byte(p[i]);
    return *this;
  }
  Fnv1a64& add(std::string_view s) { return add(s.data(), s.size()); }

  // Word-wise variant: one step per 64-bit word, h = (h ^ word) * prime. Each step is a
  // bijection of the running hash, so a change in any single word always changes the result.
  Fnv1a64& add_word(uint64_t word) {
    h_ = (h_ ^ word) * kPrime;
    return *this;
  }
  // data[0, n) as host-order 64-bit words (memcpy, any alignment); a last partial word is
  // zero-padded and has its byte count (1..7) xor-ed into its top byte, so trailing zero bytes
  // still count.
  Fnv1a64& add_words(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      add_word(w);
    }
    if (i < n) {
      uint64_t tail = 0;
      std::memcpy(&tail, p + i, n - i);
      add_word(tail ^ (static_cast<uint64_t>(n - i) << 56));
    }
    return *this;
  }

  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = kOffset;
};

// 128-bit FNV-1a (GCC/Clang unsigned __int128), byte-wise as Fnv1a64::add.
// Of "a": 0xd228cb696f1a8caf78912b704e4a8964; of no bytes: kOffset.
class Fnv1a128 {
 public:
  __extension__ typedef unsigned __int128 uint128;
  static constexpr uint128 kOffset =
      (uint128{0x6c62272e07bb0142ULL} << 64) | uint128{0x62b821756295c58dULL};
  static constexpr uint128 kPrime = (uint128{1} << 88) | uint128{0x13B};  // 2^88 + 0x13B

  Fnv1a128& add_byte(unsigned char b) {
    h_ = (h_ ^ b) * kPrime;
    return *this;
  }
  Fnv1a128& add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) add_byte(p[i]);
    return *this;
  }
  Fnv1a128& add(std::string_view s) { return add(s.data(), s.size()); }

  uint128 value() const { return h_; }
  uint64_t high() const { return static_cast<uint64_t>(h_ >> 64); }
  uint64_t low() const { return static_cast<uint64_t>(h_); }

 private:
  uint128 h_ = kOffset;
};

}  // namespace trainer::util
