// Stop signals, in a forked child (the handlers are process-wide): the first asks for a stop,
// a second changes nothing (the checkpoint being written is finished), a third exits at once
// with 143.
#include "common/catch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include "trainer/util/signals.h"

using namespace trainer;

TEST_CASE("stop signals: the first asks, the second is ignored, the third exits 143",
          "[util][signals]") {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    util::install_stop_handlers();
    if (util::stop_requested()) ::_exit(10);
    ::raise(SIGTERM);
    if (!util::stop_requested() || util::stop_signal() != SIGTERM) ::_exit(11);
    ::raise(SIGINT);  // the second: still running, the first signal is what is reported
    if (util::stop_signal() != SIGTERM || util::stop_signals_received() != 2) ::_exit(12);
    ::raise(SIGTERM);  // the third: _exit(143) inside the handler
    ::_exit(13);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 143);
}

TEST_CASE("ignore_sigpipe: a write to a pipe with no reader fails with EPIPE, not a kill",
          "[util][signals]") {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    util::ignore_sigpipe();
    int fds[2];
    if (::pipe(fds) != 0) ::_exit(10);
    ::close(fds[0]);
    const ssize_t n = ::write(fds[1], "x", 1);
    ::_exit(n < 0 && errno == EPIPE ? 0 : 11);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));  // not killed by SIGPIPE (141)
  CHECK(WEXITSTATUS(status) == 0);
}
