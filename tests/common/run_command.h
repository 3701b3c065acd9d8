// The one way the tests run a shell command and read what it printed (the parity scripts, the
// reference peers): stdout and stderr together, and the exit status. Not thread-safe to share.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace trainer::test_support {

struct Run {
  int rc = -1;  // the exit status; -1 when the command could not start or did not exit
  std::string output;
};

inline Run run_command(const std::string& command) {
  Run run;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) run.output.append(buf, n);
  const int status = ::pclose(pipe);
  run.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

}  // namespace trainer::test_support
