// `trainer launch`: runs the cluster plan.h describes on this machine. Starts one process per
// task (fork/exec, each in its own process group, on its own slice of the CPUs), prefixes every
// line of their stdout/stderr with the task name ("[chief] ", "[worker 1] "), forwards
// SIGINT/SIGTERM to them, and when one fails stops the others (after an exit 4, once they have
// had a few seconds to stop on their own with their own cause) and returns its exit code
// (or, with --max-restarts, starts them all again).
// POSIX only (fork/exec, pipes, poll, process groups). run_launch() owns the children it starts
// and installs its own SIGINT/SIGTERM/SIGCHLD handlers for its duration: one launch at a time per
// process, from one thread. pick_free_ports() keeps no state.
#pragma once

#include <string>
#include <vector>

#include "trainer/launch/plan.h"

namespace trainer::launch {

// `count` distinct ports that are free on `host` now (each bound to port 0 and read back; all
// held until the last is picked, then released). Another process may still take one before the
// cluster binds it. Throws DistributedError when the host cannot be resolved or bound.
std::vector<int> pick_free_ports(const std::string& host, int count);

// Starts the cluster and waits for it: 0 when every process exits 0, else the exit code of the
// first process that failed (128 + S for one killed by signal S) once no restart is left. Logs
// (spdlog, stderr) the plan, which task failed first with the last error it logged, and each
// restart with that cause. Throws UsageError for bad options (before starting anything).
int run_launch(const LaunchOptions& options);

}  // namespace trainer::launch
