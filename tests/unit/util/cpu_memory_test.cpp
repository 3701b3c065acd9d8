// The CPU features read with CPUID agree with the kernel's /proc/cpuinfo flags; the affinity
// mask gives the usable cores; resource_usage counts the page faults of first touches; and with
// glibc (the unit tests do not link jemalloc) configure_allocator keeps freed large blocks
// mapped, so reusing them takes almost no page faults.
#include "common/catch.h"

#include <sched.h>
#include <sys/prctl.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/cpuinfo.h"
#include "trainer/util/cpu.h"
#include "trainer/util/memory.h"

using namespace trainer::util;
using trainer::test_support::proc_cpuinfo_flags;

TEST_CASE("cpu_features agrees with /proc/cpuinfo", "[util][cpu]") {
  const auto flags = proc_cpuinfo_flags();
  if (flags.empty()) {
    WARN("no /proc/cpuinfo flags line (not x86 Linux): nothing to compare");
    return;
  }
  const CpuFeatures f = cpu_features();
  CAPTURE(f.model);
  CHECK(f.avx2 == (flags.count("avx2") > 0));
  CHECK(f.avx512f == (flags.count("avx512f") > 0));
  CHECK(f.avx512_bf16 == (flags.count("avx512_bf16") > 0));
  CHECK(f.amx_bf16 == (flags.count("amx_bf16") > 0));
  CHECK(f.native_bf16() == (f.avx512_bf16 || f.amx_bf16));
  CHECK_FALSE(f.model.empty());
}

TEST_CASE("usable_cores follows the affinity mask", "[util][cpu]") {
  cpu_set_t before;
  REQUIRE(sched_getaffinity(0, sizeof before, &before) == 0);
  CHECK(usable_cores() == CPU_COUNT(&before));
  const std::vector<int> cpus = usable_cpus();
  REQUIRE(!cpus.empty());
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus.back(), &one);
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  CHECK(usable_cores() == 1);
  CHECK(usable_cpus() == std::vector<int>{cpus.back()});
  REQUIRE(sched_setaffinity(0, sizeof before, &before) == 0);
}

TEST_CASE("resource_usage counts first touches as minor faults", "[util][memory]") {
  const size_t bytes = 32 << 20;
  char* p = static_cast<char*>(std::aligned_alloc(4096, bytes));
  REQUIRE(p != nullptr);
  const ResourceUsage a = resource_usage();
  volatile char* v = p;
  for (size_t i = 0; i < bytes; i += 4096) v[i] = 1;
  const ResourceUsage d = resource_usage() - a;
  std::free(p);
  // 8192 pages of 4 KiB (fewer with transparent huge pages); the heap may have had some mapped.
  CHECK(d.minor_faults > 0);
  CHECK(d.max_rss_kb > 0);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TRAINER_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TRAINER_SANITIZER_ALLOCATOR 1
#endif
#endif

TEST_CASE("configure_allocator keeps freed large blocks mapped", "[util][memory]") {
#ifdef TRAINER_SANITIZER_ALLOCATOR
  WARN("skipped: a sanitizer build has the sanitizer's allocator, which mallopt does not tune");
  return;
#endif
  const AllocatorInfo info = configure_allocator();
  CAPTURE(info.name, info.settings);
  REQUIRE(!info.name.empty());
  CHECK(allocator_info().name == info.name);
  // A training step in miniature: allocate activation-sized blocks, touch them, free them.
  const size_t bytes = 48 << 20;
  prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);  // count 4 KiB pages, whatever the host's THP setting
  auto step = [&] {
    const ResourceUsage a = resource_usage();
    for (int k = 0; k < 3; ++k) {
      char* p = static_cast<char*>(std::malloc(bytes));
      REQUIRE(p != nullptr);
      volatile char* v = p;  // stores the compiler may not drop with the malloc/free pair
      for (size_t i = 0; i < bytes; i += 4096) v[i] = static_cast<char>(k);
      std::free(p);
    }
    return (resource_usage() - a).minor_faults;
  };
  const int64_t first = step();
  const int64_t steady = std::min(step(), step());
  CAPTURE(first, steady);
  // Without the setting, glibc unmaps every 48 MiB block on free: each step faults ~36000
  // pages in again. With it, the steady step reuses mapped memory.
  CHECK(steady * 20 < first);
}
