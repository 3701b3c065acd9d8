// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) as TFRecord and leveldb use it: a
// table-driven software path, an SSE4.2 hardware path on x86-64, and TFRecord's CRC mask.
// Stateless and thread-safe (the tables and the one-time dispatch are initialised once).
#pragma once

#include <cstddef>
#include <cstdint>

namespace trainer::util {

// CRC-32C of data[0, n) extending `crc` (the CRC of the bytes before it; 0 for none), so that
// crc32c(b, nb, crc32c(a, na)) == crc32c(a + b). crc32c("123456789", 9) == 0xE3069283.
// Uses the hardware path when the CPU has it (decided once).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// The portable path (slicing-by-8 tables); same results as crc32c().
uint32_t crc32c_software(const void* data, size_t n, uint32_t crc = 0);

// True when crc32c_hardware() uses the CPU's CRC32 instruction (x86-64 with SSE4.2).
bool crc32c_hardware_available();

// The SSE4.2 path; falls back to crc32c_software() where the instruction is not available.
uint32_t crc32c_hardware(const void* data, size_t n, uint32_t crc = 0);

// TFRecord's masked CRC (a CRC stored next to the data it covers is a poor check of data that
// itself contains CRCs, so the stored value is rotated and offset).
inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t unmask_crc(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace trainer::util
