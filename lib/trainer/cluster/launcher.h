// `trainer launch`: runs a whole training cluster on this machine. Starts N worker processes (plus
// a chief) on one host, each with its own TF_CONFIG as AI Platform sets it on each machine (and
// LOCAL_RANK, LOCAL_WORLD_SIZE as torchrun sets them, which pick each process's GPU), prefixes
// every line of their stdout/stderr with the task name ("[chief] ", "[worker 1] "), forwards
// SIGINT/SIGTERM to them, and when one fails stops the others (after an exit 4, once they have
// had a few seconds to stop on their own with their own cause) and returns its exit code
// (or, with --max-restarts, starts them all again).
// POSIX only (fork/exec, pipes, poll, process groups). run_launch() owns the children it starts
// and installs its own SIGINT/SIGTERM/SIGCHLD handlers for its duration: one launch at a time per
// process, from one thread.
#pragma once

#include <string>
#include <vector>

namespace trainer::cluster {

struct LaunchOptions {
  int workers = 2;     // worker processes, 1..64 (--workers)
  bool chief = false;  // also start a `chief` task (rank 0) besides the workers (--chief)
  // Also start an `evaluator` task (TensorFlow's sidecar evaluator: it evaluates every new
  // checkpoint on the validation split, outside the training group) (--evaluator).
  bool evaluator = false;
  int base_port = 0;  // first port; the chief gets base_port, then the workers in order.
                      // 0 = pick free ports on `host` (bind port 0, read it, close) (--base-port)
  std::string host = "127.0.0.1";  // every task's host in TF_CONFIG
  std::string program;             // the binary to run; "" = this one (/proc/self/exe)
  std::vector<std::string> args;   // passed to every process (e.g. `--config c.yaml --job-dir d`)
  // After a failure: SIGTERM the others, SIGKILL them after this. After an exit 4 (a peer or
  // link lost, which the others meet too) they first get min(5 s, this) to stop on their own.
  double stop_grace_s = 10.0;
  int stdout_fd = 1;  // where the children's prefixed stdout lines go
  int stderr_fd = 2;  // where the children's prefixed stderr lines go
  // Give each process its own slice of the CPUs this launcher may use (sched_setaffinity), so
  // that every process sizes its threads for its share instead of each taking every core. Only
  // when there are at least as many CPUs as processes; false = inherit the launcher's mask.
  bool pin_cpus = true;  // (--no-pin to turn off)
  // When a process dies (a signal) or fails with a data (3) or distributed (4) error: stop the
  // others and start the whole group again, at most this many times (--max-restarts, as
  // torchrun's). The processes resume from the newest complete checkpoint, so the run ends with
  // the same weights as one that never failed. Other failures (2: config, 1: internal, a stop
  // asked for by SIGINT/SIGTERM) are never retried.
  int max_restarts = 0;
};

// The CPUs of each of `processes` processes: `cpus` cut into contiguous slices of near-equal
// size (the first ones get one more). Empty slices (no pinning) when cpus.size() < processes.
std::vector<std::vector<int>> split_cpus(const std::vector<int>& cpus, int processes);

// One process of the launched cluster.
struct LaunchTask {
  std::string type;       // "chief" | "worker"
  int index = 0;          // index within its type
  std::string address;    // host:port ("[::1]:port" for an IPv6 host)
  std::string tf_config;  // the TF_CONFIG value this process gets
  // LOCAL_RANK and LOCAL_WORLD_SIZE, set as torchrun sets them: the training tasks (chief first)
  // are local ranks 0..N-1 of N; the evaluator gets neither (-1, 0).
  int local_rank = -1;
  int local_world_size = 0;
  std::string name() const;  // "chief", "worker 1", "evaluator": the line prefix, no brackets
};

// The cluster `options` describe, given one port per process (chief first): every task's
// TF_CONFIG lists the whole cluster ({"cluster": {"chief": [..], "worker": [..]}, "task": {..}}),
// and each training task has its local rank (its rank: they all run on this host).
// Pure. Throws UsageError naming --workers / --base-port / the missing train arguments.
std::vector<LaunchTask> plan_launch(const LaunchOptions& options, const std::vector<int>& ports);

// `count` distinct ports that are free on `host` now (each bound to port 0 and read back; all
// held until the last is picked, then released). Another process may still take one before the
// cluster binds it. Throws Error(kInternal) when the host cannot be bound.
std::vector<int> pick_free_ports(const std::string& host, int count);

// Starts the cluster and waits for it: 0 when every process exits 0, else the exit code of the
// first process that failed (128 + S for one killed by signal S) once no restart is left. Logs
// (spdlog, stderr) the plan, which task failed first with the last error it logged, and each
// restart with that cause. Throws UsageError for bad options (before starting anything).
int run_launch(const LaunchOptions& options);

}  // namespace trainer::cluster
