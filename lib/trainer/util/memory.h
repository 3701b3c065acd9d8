// Process memory: which allocator this process runs on, told to keep freed memory mapped so that
// the training step does not page-fault its activations back in every step, and the per-process
// resource counters (minor page faults, kernel and user time, peak RSS) the loop records.
// configure_allocator() is called once at start-up, before any large allocation; the rest is
// thread-safe (getrusage).
#pragma once

#include <cstdint>
#include <string>

namespace trainer::util {

struct AllocatorInfo {
  std::string name;      // "jemalloc 5.3.0-..." or "glibc"
  std::string settings;  // what keeps freed memory mapped, as configured
};

// With jemalloc linked in (the trainer binary links Debian's libjemalloc with its configuration
// compiled in: dirty and muzzy decay off, so freed pages stay mapped and are reused), reads that
// configuration back. Otherwise configures glibc: no mmap for large blocks (they would be unmapped
// on free and faulted in again next step) and no trimming of the heap top.
AllocatorInfo configure_allocator();

// The allocator already configured (same values as configure_allocator returned).
AllocatorInfo allocator_info();

// Declares `p` (a heap object this process gives up on purpose: a process group whose threads
// may be blocked on a dead peer) as meant to outlive the process, so that LeakSanitizer in the
// sanitizer build treats it, and what it holds, as reachable. A no-op in other builds.
void leak_on_purpose(const void* p);

struct ResourceUsage {
  int64_t minor_faults = 0;  // page faults served without I/O (first touch of a page)
  int64_t major_faults = 0;
  double user_s = 0;
  double sys_s = 0;        // time in the kernel (page faults, madvise, munmap, ...)
  int64_t max_rss_kb = 0;  // peak resident set so far
};

// getrusage(RUSAGE_SELF): all threads of this process.
ResourceUsage resource_usage();

// b - a for the counters (max_rss_kb: b's).
ResourceUsage operator-(const ResourceUsage& b, const ResourceUsage& a);

// Memory this process can still take: /proc/meminfo's MemAvailable, lowered to the cgroup's
// limit minus its usage when the process runs in a cgroup with a limit (v2 memory.max, v1
// memory.limit_in_bytes: a container). -1 when neither can be read.
int64_t available_memory_bytes();

}  // namespace trainer::util
