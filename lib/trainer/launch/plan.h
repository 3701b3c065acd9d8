// `trainer launch`'s plan: which processes a local training cluster has and what each one gets.
// LaunchOptions (the command's options); one LaunchTask per process with its TF_CONFIG, as AI
// Platform sets it on each machine, and LOCAL_RANK, LOCAL_WORLD_SIZE, as torchrun sets them (they
// pick each process's GPU); each process's slice of the CPUs and its environment; and which
// failures a restart may fix. supervisor.h starts and watches the processes.
// Pure functions over plain values; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace trainer::launch {

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

// The processes `options` start: the workers, plus the chief and the evaluator when asked for.
int process_count(const LaunchOptions& options);

// Throws UsageError naming --workers / --base-port / the missing train arguments (or the host or
// stop_grace_s) when `options` cannot be launched.
void validate_options(const LaunchOptions& options);

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
// Throws UsageError naming --workers / --base-port / the missing train arguments.
std::vector<LaunchTask> plan_launch(const LaunchOptions& options, const std::vector<int>& ports);

// The plan in one line, for the log: "chief 127.0.0.1:5000, worker 0 127.0.0.1:5001".
std::string describe_plan(const std::vector<LaunchTask>& tasks);

// The environment of `task`'s process ("NAME=value" entries): `inherited` (the launcher's), with
// TF_CONFIG, LOCAL_RANK and LOCAL_WORLD_SIZE replaced (the evaluator gets no local rank).
std::vector<std::string> child_environment(const std::vector<std::string>& inherited,
                                           const LaunchTask& task);

// A failure a restart may fix: a process that died (killed, crashed; 128 + signal) or failed
// with a data (3) or distributed (4) error. Not: a usage or config error (2), an internal error
// (1), a stop asked for by SIGINT/SIGTERM (130, 143).
bool restartable(int exit_code);

// What run_launch does once one start of the whole group has ended.
enum class Restart {
  kNo,              // return the code: it is 0, or --max-restarts is 0
  kNoAfterSignal,   // return it: the launcher was asked to stop (SIGINT/SIGTERM)
  kNoNotFixable,    // return it: a failure a restart would not fix (!restartable)
  kNoRestartsLeft,  // return it: --max-restarts restarts have been made
  kYes,             // start every process again
};

// The decision for a group that ended with `exit_code` (0, or the code of the process that failed
// first), `stopped_by_signal` when the launcher forwarded a SIGINT/SIGTERM, after
// `restarts_done` restarts of at most `max_restarts`.
Restart decide_restart(int exit_code, bool stopped_by_signal, int restarts_done, int max_restarts);

}  // namespace trainer::launch
