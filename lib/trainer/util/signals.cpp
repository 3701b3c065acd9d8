#include "trainer/util/signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace trainer::util {

namespace {

std::atomic<int> g_signal{0};
std::atomic<int> g_count{0};

void say(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

// Async-signal-safe: atomics, write(2) and _exit(2) only.
extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  const int n = g_count.fetch_add(1) + 1;
  if (n == 2) {
    say("trainer: a second stop signal: still finishing the step and writing the checkpoint, "
        "so that it is complete; a third signal exits at once (143)\n");
  } else if (n >= 3) {
    say("trainer: a third stop signal: exiting at once (143); the newest complete checkpoint "
        "stays as it was\n");
    ::_exit(143);
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void ignore_sigpipe() {
  struct sigaction sa {};
  sa.sa_handler = SIG_IGN;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPIPE, &sa, nullptr);
}

bool stop_requested() { return g_signal.load() != 0; }
int stop_signal() { return g_signal.load(); }
int stop_signals_received() { return g_count.load(); }

}  // namespace trainer::util
