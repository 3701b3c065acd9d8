// Cooperative stop on SIGTERM/SIGINT: the handler only sets a flag; the training loop polls
// stop_requested() between steps, writes what it must, and throws Interrupted (exit 143).
// Thread-safe (a lock-free atomic).
#pragma once

namespace trainer::util {

void install_stop_handlers();
bool stop_requested();
int stop_signal();  // the signal that asked for the stop, 0 if none

}  // namespace trainer::util
