#include "trainer/util/open_files.h"

#include <sys/resource.h>

#include <cstdint>
#include <limits>

namespace trainer::util {

namespace {

int64_t value_of(rlim_t v) {
  if (v == RLIM_INFINITY || v > static_cast<rlim_t>(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return static_cast<int64_t>(v);
}

}  // namespace

OpenFileLimit open_file_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return {};
  return {value_of(rl.rlim_cur), value_of(rl.rlim_max)};
}

OpenFileLimit raise_open_file_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != rl.rlim_max &&
      (rl.rlim_max == RLIM_INFINITY || rl.rlim_cur < rl.rlim_max)) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    // An unlimited hard limit cannot be the soft one on Linux (above fs.nr_open): leave it.
    ::setrlimit(RLIMIT_NOFILE, &raised);
  }
  return open_file_limit();
}

}  // namespace trainer::util
