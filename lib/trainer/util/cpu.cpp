#include "trainer/util/cpu.h"

#include <sched.h>

#include <cstring>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TRAINER_X86 1
#endif

namespace trainer::util {

std::vector<std::string> CpuFeatures::flags() const {
  std::vector<std::string> out;
  if (avx2) out.emplace_back("avx2");
  if (avx512f) out.emplace_back("avx512f");
  if (avx512_bf16) out.emplace_back("avx512_bf16");
  if (amx_bf16) out.emplace_back("amx_bf16");
  return out;
}

CpuFeatures cpu_features() {
  CpuFeatures f;
#ifdef TRAINER_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.amx_bf16 = (d >> 22) & 1;
    const unsigned subleaves = a;
    if (subleaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = (a >> 5) & 1;
  }
  if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      unsigned r[4] = {};
      __get_cpuid(0x80000002 + i, &r[0], &r[1], &r[2], &r[3]);
      std::memcpy(brand + 16 * i, r, 16);
    }
    f.model = brand;
    const auto first = f.model.find_first_not_of(' ');
    const auto last = f.model.find_last_not_of(' ');
    f.model = first == std::string::npos ? "" : f.model.substr(first, last - first + 1);
  }
#endif
  return f;
}

std::vector<int> usable_cpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) out.push_back(i);
    }
  }
  if (out.empty()) {
    const unsigned n = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 0; i < n; ++i) out.push_back(static_cast<int>(i));
  }
  return out;
}

int usable_cores() { return static_cast<int>(usable_cpus().size()); }

}  // namespace trainer::util
