// What this process may compute on: the CPU's model and the instruction-set features that
// decide precision (native bf16: AVX512_BF16 or AMX-BF16, read with CPUID), and the number of
// cores it may use (its CPU affinity mask, not the host's core count: two workers on one host,
// each pinned to its own cores, each see their own share). Stateless; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace trainer::util {

struct CpuFeatures {
  std::string model;  // CPUID brand string ("" when unknown)
  bool avx2 = false;
  bool avx512f = false;
  bool avx512_bf16 = false;  // bf16 dot products in AVX-512
  bool amx_bf16 = false;     // AMX tiles with bf16
  // The CPU computes bf16 matrix products natively (otherwise LibTorch emulates them, ~20x slower).
  bool native_bf16() const { return avx512_bf16 || amx_bf16; }
  std::vector<std::string> flags() const;  // the features above that are present, by name
};

CpuFeatures cpu_features();

// CPUs in this process's affinity mask (sched_getaffinity), at least 1.
int usable_cores();

// The CPUs of the affinity mask, ascending.
std::vector<int> usable_cpus();

}  // namespace trainer::util
