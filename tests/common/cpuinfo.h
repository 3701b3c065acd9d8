// The kernel's view of the CPU's features (the first "flags" line of /proc/cpuinfo), for tests
// that check the trainer's own CPUID reading against it. Empty where there is no such line.
#pragma once

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace trainer::test_support {

inline std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

}  // namespace trainer::test_support
