// Cooperative stop on SIGTERM/SIGINT: the handler only sets a flag; the training loop polls
// stop_requested() between steps, writes what it must (the checkpoint of this step), and throws
// Interrupted (exit 143). A second signal changes nothing (it says so on stderr): the checkpoint
// being written is finished, so the old or the new one is complete, never neither. A third
// exits at once with 143; a checkpoint then half-written is only a temp dir that is never read.
// Thread-safe (lock-free atomics; the handler is async-signal-safe).
#pragma once

namespace trainer::util {

void install_stop_handlers();
// SIGPIPE ignored for the whole process: a write to a socket or pipe whose reader is gone (a peer
// that died mid-collective: Gloo writes with writev, which cannot say MSG_NOSIGNAL) then fails
// with EPIPE, which is reported as a lost peer (exit 4), instead of killing this process with
// 141. Python does the same at start-up, which is why PyTorch never sees it. Call once, early.
void ignore_sigpipe();
bool stop_requested();
int stop_signal();            // the first signal that asked for the stop, 0 if none
int stop_signals_received();  // how many have arrived

}  // namespace trainer::util
