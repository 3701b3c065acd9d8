#include "trainer/util/open_files.h"

#include <sys/resource.h>

#include <cstdint>
#include <fstream>
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
    if (::setrlimit(RLIMIT_NOFILE, &raised) != 0 && rl.rlim_max == RLIM_INFINITY) {
      // Linux refuses a soft limit above fs.nr_open: take that, the most a process may have.
      std::ifstream nr_open("/proc/sys/fs/nr_open");
      rlim_t most = 0;
      if (nr_open >> most && most > rl.rlim_cur) {
        raised.rlim_cur = most;
        ::setrlimit(RLIMIT_NOFILE, &raised);
      }
    }
  }
  return open_file_limit();
}

}  // namespace trainer::util
