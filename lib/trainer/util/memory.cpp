#include "trainer/util/memory.h"

#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <fstream>
#include <mutex>
#include <string>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRAINER_HAS_LSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TRAINER_HAS_LSAN 1
#endif
#ifdef TRAINER_HAS_LSAN
#include <sanitizer/lsan_interface.h>
#endif

// Present when the binary links jemalloc (weak: null otherwise, e.g. in the unit tests).
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen)
    __attribute__((weak));

namespace trainer::util {

namespace {

std::once_flag g_once;
AllocatorInfo g_info;

template <class T>
bool jemalloc_read(const char* name, T* out) {
  size_t len = sizeof(T);
  return mallctl(name, out, &len, nullptr, 0) == 0;
}

AllocatorInfo configure() {
  AllocatorInfo info;
  if (mallctl != nullptr) {
    const char* version = nullptr;
    ssize_t dirty = 0, muzzy = 0;
    info.name = jemalloc_read("version", &version) && version ? std::string("jemalloc ") + version
                                                              : std::string("jemalloc");
    if (jemalloc_read("opt.dirty_decay_ms", &dirty) &&
        jemalloc_read("opt.muzzy_decay_ms", &muzzy)) {
      info.settings = "dirty_decay_ms " + std::to_string(dirty) + ", muzzy_decay_ms " +
                      std::to_string(muzzy) +
                      (dirty < 0 && muzzy < 0 ? " (freed pages stay mapped)" : "");
    }
    return info;
  }
  info.name = "glibc";
  // Large blocks from the heap, never mmap'ed (munmap on free, page faults on reuse); the top of
  // the heap is never trimmed back to the system.
  const bool ok = mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1 &&
                  mallopt(M_TOP_PAD, 64 << 20) == 1;
  info.settings = ok ? "M_MMAP_MAX 0, M_TRIM_THRESHOLD INT_MAX, M_TOP_PAD 64 MiB"
                     : "mallopt failed: the allocator's defaults are in force";
  return info;
}

}  // namespace

AllocatorInfo configure_allocator() {
  std::call_once(g_once, [] { g_info = configure(); });
  return g_info;
}

AllocatorInfo allocator_info() { return configure_allocator(); }

ResourceUsage resource_usage() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
  ResourceUsage u;
  u.minor_faults = ru.ru_minflt;
  u.major_faults = ru.ru_majflt;
  u.user_s = secs(ru.ru_utime);
  u.sys_s = secs(ru.ru_stime);
  u.max_rss_kb = ru.ru_maxrss;
  return u;
}

ResourceUsage operator-(const ResourceUsage& b, const ResourceUsage& a) {
  ResourceUsage d;
  d.minor_faults = b.minor_faults - a.minor_faults;
  d.major_faults = b.major_faults - a.major_faults;
  d.user_s = b.user_s - a.user_s;
  d.sys_s = b.sys_s - a.sys_s;
  d.max_rss_kb = b.max_rss_kb;
  return d;
}

namespace {

// The first integer in a file, or -1 (missing, "max", unreadable).
int64_t read_number(const char* path) {
  std::ifstream in(path);
  long long v = -1;
  if (!(in >> v)) return -1;
  return v;
}

}  // namespace

int64_t available_memory_bytes() {
  int64_t available = -1;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    long long kb = 0;
    if (!(meminfo >> kb)) break;
    if (key == "MemAvailable:") {
      available = static_cast<int64_t>(kb) * 1024;
      break;
    }
    meminfo.ignore(64, '\n');
  }
  const auto lower = [&available](int64_t limit, int64_t used) {
    // "No limit" reads as max or a huge page-rounded number.
    if (limit <= 0 || limit >= (int64_t{1} << 60) || used < 0) return;
    const int64_t left = std::max<int64_t>(0, limit - used);
    available = available < 0 ? left : std::min(available, left);
  };
  lower(read_number("/sys/fs/cgroup/memory.max"), read_number("/sys/fs/cgroup/memory.current"));
  lower(read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes"));
  return available;
}

void leak_on_purpose(const void* p) {
#ifdef TRAINER_HAS_LSAN
  if (p != nullptr) __lsan_ignore_object(p);
#else
  (void)p;
#endif
}

}  // namespace trainer::util
