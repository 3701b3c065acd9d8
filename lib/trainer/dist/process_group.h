// The process group: rendezvous of all training processes at the chief (rank 0 hosts a c10d
// TCPStore on its own port) and the collectives the trainer needs, on plain tensors and values.
// Gloo carries CPU tensors and every small collective; in CUDA builds NCCL carries CUDA tensors.
// Heartbeats and failure reports use their own connection to the store (with a 5 s timeout), so
// they never change the timeout of the connection Gloo's and NCCL's set-up use. Liveness costs
// O(N) store operations per second in all: each rank writes its own heartbeat, the chief alone
// reads them and publishes who is silent; a collective that has waited a second reads that and
// fails naming a task not heard from for 3 s (its process frozen, its host or link gone). One wait
// polls for every backend (wait_device for work on a GPU). Every failure (a peer lost, a timeout,
// an unreachable chief) is a trainer::DistributedError that names the collective, so the program
// exits 4 instead of crashing or hanging; after a stop signal (util::stop_requested) it is
// Interrupted instead, and a Gloo collective still waiting 5 s after the signal is abandoned. When
// another rank failed and said why (leave_after_failure), the failure is a PeerFailed with that
// rank's cause and kind instead, and a Gloo collective waiting on that rank is abandoned within a
// second. A group that failed once refuses every later call. With world_size 1 every call is a
// local no-op. Ownership: ProcessGroup owns the store, the backends, their threads and sockets; an
// AsyncWork keeps what it needs alive. Thread-safety: collectives must be called in the same order
// on every rank (that is how ranks match them up); calls are serialised internally, so several
// threads may call, but then they must agree on the order themselves. AsyncWork::wait may be called
// from any thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/util/error.h"

namespace trainer::dist {

// How to meet the others and how long to wait. The distributed.* names are the job spec's.
struct DistOptions {
  int rank = 0;                       // 0 = the chief, which hosts the rendezvous store
  int world_size = 1;                 // training processes; 1 = no rendezvous, no sockets
  std::string chief_host;             // the chief's host from TF_CONFIG (others connect here)
  int chief_port = 0;                 // the chief's port from TF_CONFIG (the store listens here)
  std::string own_host;               // this task's host from TF_CONFIG: Gloo binds here
  std::string interface;              // distributed.interface: "" = bind own_host; else a NIC name
  std::string backend = "auto";       // distributed.backend: auto (NCCL on CUDA) | gloo | nccl
  bool use_cuda = false;              // training on CUDA (decides what `auto` means)
  double rendezvous_timeout_s = 900;  // distributed.rendezvous_timeout_s: wait for all to join
  double timeout_s = 1800;            // distributed.timeout_s: any one collective
  int threads = 0;                    // Gloo's worker threads (0 = c10d's default, 2)
  // false: the control plane only (rendezvous, first_differing, liveness, failure reports) and
  // no Gloo or NCCL mesh, so collectives are refused: for measuring the control plane at
  // thousands of ranks on one host (scripts/bench/control_plane.sh), where meshes cannot fit.
  bool mesh = true;
  // The task names in rank order ("chief", "worker 0", ...), for messages that name a peer;
  // empty = "rank N".
  std::vector<std::string> task_names;
};

// How many files a process of `options` needs open at once: Gloo's mesh (a socket per peer and a
// listener), its two store connections (LibTorch 1.13's store client holds two sockets and a
// pipe), on the chief the store's side of every task's connections, on a GPU NCCL's sockets, and
// a base for libraries, logs, data files and decoding. An estimate on the safe side.
int64_t open_files_needed(const DistOptions& options);

// ConfigError (exit 2) when `limit` (RLIMIT_NOFILE's soft limit, after it was raised to the hard
// one) is below open_files_needed(options), naming both numbers and how to raise it.
void check_open_files(const DistOptions& options, int64_t limit);

enum class Reduce { kSum, kMin, kMax };

// What this rank's control plane has done so far (benchmarks, diagnostics).
struct ControlStats {
  int64_t store_operations = 0;      // requests sent on the control connection of the store
  std::vector<double> heartbeat_ms;  // round trips of this rank's recent heartbeats (not the chief)
};

// first_differing's answer: the lowest rank whose text differs from the chief's.
struct Difference {
  int rank = 0;
  std::string chief;   // the chief's text
  std::string theirs;  // that rank's text
};

// What a rank whose run failed tells its peers (ProcessGroup::leave_after_failure).
struct FailureReport {
  std::string task;  // "worker 1", as the peers will name it
  ErrorKind kind = ErrorKind::kInternal;
  std::string message;
};

// A collective in flight. wait() blocks until it is done and throws DistributedError when it
// failed; waiting again is a no-op. A default-constructed AsyncWork is already done.
class AsyncWork {
 public:
  AsyncWork();
  ~AsyncWork();
  AsyncWork(AsyncWork&&) noexcept;
  AsyncWork& operator=(AsyncWork&&) noexcept;

  void wait();
  bool pending() const;  // launched and not yet waited for

 private:
  friend class ProcessGroup;
  struct State;
  std::shared_ptr<State> state_;
};

class ProcessGroup {
 public:
  // Validates the options (ConfigError naming the distributed.* field) and the limit on open files
  // (check_open_files, after raising the soft limit to the hard one), then, for world_size > 1,
  // meets the others: the chief listens on chief_port and waits until every rank has joined;
  // the others connect to chief_host:chief_port, retrying until rendezvous_timeout_s. Failing
  // that is a DistributedError naming "the chief at host:port" (on a worker) or the ranks that
  // never came (on the chief). A stop signal while waiting throws Interrupted.
  static std::unique_ptr<ProcessGroup> connect(const DistOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  std::string backend() const;  // "gloo" or "nccl" as resolved; "local" for world_size 1
  // Whether collectives really communicate: false for one local process; true for world_size
  // > 1, and for one process that asked for NCCL explicitly (a one-rank NCCL group, which
  // exercises the NCCL path on one GPU).
  bool communicates() const;

  // The one polling wait on the device: returns once `ready` (e.g. a CUDA event's query) is
  // true. While waiting it notices a stop signal (Interrupted after 5 s), a failure another rank
  // published (PeerFailed, within about a second) and a failed NCCL collective; after
  // distributed.timeout_s it aborts NCCL's communicators and throws DistributedError naming the
  // tasks not heard from. The trainer calls it before it reads values the GPU computed, which is
  // where a hung collective shows on a GPU (NCCL waits never block the host).
  void wait_device(const std::string& what, const std::function<bool()>& ready);

  // In place, blocking: every tensor becomes the element-wise sum over ranks. Any dtype, layout
  // and shape; tensors of a dtype and device travel together as flat buffers.
  void all_reduce_sum(const std::vector<torch::Tensor>& tensors);

  // In place, non-blocking: `flat` (dense, contiguous, of a dtype Gloo reduces: float, double,
  // half, int8/32/64, uint8) becomes the sum over ranks once wait() returns. Do not touch it
  // before then.
  AsyncWork all_reduce_sum_async(const torch::Tensor& flat);

  // In place, blocking: every tensor becomes root's value, bit for bit.
  void broadcast(const std::vector<torch::Tensor>& tensors, int root = 0);

  int64_t all_reduce(int64_t value, Reduce op);
  std::vector<int64_t> all_reduce(const std::vector<int64_t>& values, Reduce op);  // each entry
  int64_t all_reduce_min(int64_t value) { return all_reduce(value, Reduce::kMin); }
  int64_t all_reduce_max(int64_t value) { return all_reduce(value, Reduce::kMax); }

  // Every rank's string, in rank order (any bytes, any lengths).
  std::vector<std::string> all_gather_strings(const std::string& mine);

  void barrier();

  // Compares every rank's `text` with the chief's through the rendezvous store, not a mesh: the
  // chief's text is read once by each rank and only a differing text is written, so it costs
  // O(1) store operations per rank however long the texts are (an all-gather moves N texts to
  // each of N ranks). Returns the same on every rank: the lowest rank whose text differs, or
  // nullopt. `name` tells comparisons apart (use each once per group). Waits as a collective
  // does (distributed.timeout_s, peers' failures, silence, stop signals); the chief, whose
  // process hosts the store, returns only once every rank has its answer. A collective.
  std::optional<Difference> first_differing(const std::string& name, const std::string& text);

  ControlStats control_stats() const;

  // On the way out of a failed run, on every rank; never throws, a no-op with world_size 1.
  // Publishes `mine` (this rank's own failure, not one caused by a peer's) in the rendezvous
  // store, then marks this rank as gone. A peer whose collective then fails, or that has been
  // waiting in one for a second, reads it and throws PeerFailed ("worker 1 failed: data error:
  // ...", of the failing rank's kind) instead of a bare connection error or the collective
  // timeout. The chief hosts the store, so it returns only when every other rank is gone or
  // `grace_s` has passed.
  void leave_after_failure(const std::optional<FailureReport>& mine, double grace_s);

  struct Impl;  // defined in process_group.cpp

 private:
  explicit ProcessGroup(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// NCCL's version as LibTorch reports it ("2.28.9"), or "" in a build without CUDA. Needs no GPU.
std::string nccl_version();

}  // namespace trainer::dist
