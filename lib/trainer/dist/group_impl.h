// Private to dist/: ProcessGroup's state, shared by process_group.cpp (collectives, failure
// handling) and rendezvous.cpp (meeting at the chief, creating the backends), and the helpers
// both use. Includes c10d, so never include it from a public header. Thread-safety: `mutex`
// guards launches, `failure` and `in_flight`; `store_mutex` guards `control` and `watchers`
// (replaced after a failed request, see ctl()); `heartbeat_mutex` the liveness state; the rest
// is set up once, in connect().
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "trainer/dist/c10d_compat.h"
#include "trainer/dist/process_group.h"

namespace trainer::dist {

namespace detail {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds to_ms(double seconds);
std::string seconds_text(double seconds);                // "2", "0.5"
std::string address(const std::string& host, int port);  // "host:port", "[v6]:port"
std::string plain_message(const std::exception& e);      // one line, no C++ backtrace

// Set by the chief in the rendezvous store once every rank has joined (so it exists afterwards).
inline constexpr const char* kReadyKey = "trainer/ready";
// The ranks the chief has not heard from ("<rank> <seconds>\n" each); set before kReadyKey.
inline constexpr const char* kSilentKey = "trainer/silent";

// The timeout of the control connection (heartbeats, failure reports): the longest a failure path
// waits on the store, so that a chief whose host vanished cannot hold a rank on its way out.
inline constexpr std::chrono::milliseconds kControlTimeout{5000};

// How many connections the chief reads heartbeats over: one per 128 other ranks, at most 16.
inline int watch_clients(int world_size) {
  return std::max(1, std::min(16, (world_size - 1 + 127) / 128));
}

}  // namespace detail

struct ProcessGroup::Impl {
  DistOptions opts;
  std::string backend_name;
  c10::intrusive_ptr<c10d::Store> store;    // rendezvous; Gloo's and NCCL's set-up use it
  c10::intrusive_ptr<c10d::Store> control;  // a second connection to the same store, with
                                            // kControlTimeout: heartbeats and failure reports
                                            // (never changes `store`'s timeout)
  // The chief's further connections for reading heartbeats in parallel (one per 128 ranks
  // beyond the first 128, at most 15), used only by watch().
  std::vector<c10::intrusive_ptr<c10d::Store>> watchers;
  c10::intrusive_ptr<compat::Backend> cpu;   // Gloo: CPU tensors and every small collective
  c10::intrusive_ptr<compat::Backend> cuda;  // NCCL for CUDA tensors; null = Gloo carries them

  std::mutex mutex;        // serialises launches: c10d numbers collectives by call order
  std::mutex store_mutex;  // serialises the use of `control`
  // A request on `control` (or a watcher) failed: a reply may still be on its way and would be
  // read as the answer to the next request, so the next heartbeat opens new connections.
  std::atomic<bool> control_broken{false};
  std::atomic<bool> joined{false};  // this rank joined the chief (announce succeeded)
  // `control`, replaced first when control_broken. store_mutex held; throws as the store does.
  c10d::Store& ctl();
  std::string failure;  // the first failure; once set, every call is refused
  std::vector<c10::intrusive_ptr<compat::Work>> in_flight;  // launched, not known to be done

  // Liveness, in O(N) store operations per second for the whole group: every rank but the chief
  // counts up its own key each kHeartbeat (one operation); the chief, whose process hosts the
  // store, reads every counter each kWatchEvery (1.25 s, over `watchers` at once) and publishes
  // the ranks not heard from for kSilentAfter in one key, only when that set changes. The others
  // read that key only while a collective has waited longer than a second (poll), and then fail
  // it naming the silent tasks instead of waiting out distributed.timeout_s. Guarded by
  // heartbeat_mutex.
  std::thread heartbeat;
  std::mutex heartbeat_mutex;
  std::condition_variable heartbeat_cv;
  bool heartbeat_stop = false;
  std::vector<int64_t> beats;                    // chief: the last counter seen per rank
  std::vector<detail::Clock::time_point> heard;  // chief: when each rank's counter last moved
  std::string published;                         // chief: the silent set last published
  detail::Clock::time_point last_round;          // chief: the end of its last round
  detail::Clock::time_point store_answered;      // the store's last answer to this rank
  // Not the chief: when this rank first read each rank in the published silent set.
  std::map<int, detail::Clock::time_point> seen_silent;
  std::vector<double> beat_ms;        // the round trips of this rank's recent heartbeats
  std::atomic<int64_t> store_ops{0};  // requests this rank sent on `control` (ControlStats)
  void start_heartbeat();
  void stop_heartbeat();
  void beat();  // one round: count up (a worker) or watch the others and publish (the chief)
  // The chief's round (store_mutex held); returns the newly silent tasks to log, or "".
  std::string watch();
  void answered();  // the store answered: store_answered = now
  // The chief: `rank` was silent at the last round, and that round is recent (heartbeat_mutex).
  bool chief_sees_silent(int rank, detail::Clock::time_point now) const;
  // The silent ranks with how long each has been silent: the chief's own view, or on the others
  // the published set (one store read); the store itself out of reach is rank 0's silence.
  std::vector<std::pair<int, int64_t>> silent_ranks();
  // "worker 1 (silent for 12 s)", the peers not heard from for kSilentAfter, or "" when none.
  std::string silent_peers();
  // silent_ranks()'s answer as text: "worker 1 (silent for 12 s), ..." (rank 0 on the others:
  // its store has not answered).
  std::string describe_silent(const std::vector<std::pair<int, int64_t>>& silent) const;
  bool is_silent(int rank);  // the chief: not heard from for kSilentAfter (false elsewhere)
  std::string task(int rank) const;

  explicit Impl(const DistOptions& o);
  ~Impl();

  bool local() const { return backend_name == "local"; }
  bool on_gloo(const torch::Tensor& t) const { return !(t.is_cuda() && cuda); }
  compat::Backend& backend_for(const torch::Tensor& t) { return on_gloo(t) ? *cpu : *cuda; }
  std::string who() const;  // "rank 1 of 3 (gloo)"

  // Failures: a DistributedError, or Interrupted when this process was asked to stop (its peers
  // are then stopping too, and that is why the collective could not complete).
  void record_failure(const std::string& message);
  [[noreturn]] static void raise(const std::string& message);
  [[noreturn]] void fail(const std::string& what, const std::exception& e);  // no lock held
  void check_usable_locked(const std::string& what) const;
  // The failure another rank published (leave_after_failure), as the PeerFailed to throw here;
  // nullopt when none was published or the store cannot be reached. Never throws.
  std::optional<PeerFailed> peer_failure();

  // Starts a collective: f() returns the c10d work. Refused once the group has failed.
  template <class Launch>
  c10::intrusive_ptr<compat::Work> launch(const std::string& what, Launch&& f);
  // Completes `work`; throws as fail() does. Gloo work is waited for on the host through poll();
  // NCCL work only makes the current CUDA stream wait for it (the host goes on: a GPU step never
  // waits for the host), and a failure or hang shows in the next wait_device().
  void wait(const std::string& what, const c10::intrusive_ptr<compat::Work>& work, bool on_gloo);

  // The one polling wait, for every backend: returns once ready() is true (asked with a backoff
  // from 50 us up to `max_sleep`, or at once when `wake` is notified); every kWaitSlice it checks
  // for a stop signal (kStopGrace after one: Interrupted); once it has waited a second, every
  // kPeerPoll for a failure another rank published (PeerFailed), for an NCCL collective that
  // failed, and for peers the liveness check calls silent (DistributedError naming them);
  // returns false once `limit` has passed without ready(). Before throwing, NCCL's communicators
  // are aborted.
  struct Wake {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
  };
  bool poll(const std::string& what, const std::function<bool()>& ready,
            std::chrono::milliseconds limit, std::chrono::microseconds max_sleep,
            const std::shared_ptr<Wake>& wake);
  // Waits (poll) until the device has done what `ready` stands for, for at most
  // distributed.timeout_s, then aborts NCCL and throws the timeout naming the silent tasks.
  void wait_device(const std::string& what, const std::function<bool()>& ready);
  // Aborts the NCCL communicators (their kernels return, the collectives fail) so that nothing
  // stays blocked on a peer that is gone; a no-op without NCCL. Never throws.
  void abort_cuda() noexcept;
  // Rethrows the failure of an NCCL collective in flight that has completed with one.
  void check_cuda_failures();
  void check_cuda_failures_or_fail(const std::string& what);  // as fail() does

  // rendezvous.cpp
  void rendezvous();
  void announce(const std::string& chief);
  void open_control();  // `control` and the chief's watchers; DistributedError when it cannot
  c10::intrusive_ptr<c10d::Store> control_client() const;        // one more connection to the store
  c10::intrusive_ptr<c10d::Store> first_control_client() const;  // ... with a few attempts
  void make_backends();
};

template <class Launch>
c10::intrusive_ptr<compat::Work> ProcessGroup::Impl::launch(const std::string& what, Launch&& f) {
  std::unique_lock<std::mutex> lock(mutex);
  check_usable_locked(what);
  if (!cpu) {
    throw Error(ErrorKind::kInternal, what + " on " + who() +
                                          ": this process group has no mesh (DistOptions::mesh "
                                          "is false): it carries no collectives");
  }
  try {
    auto work = f();
    in_flight.erase(std::remove_if(in_flight.begin(), in_flight.end(),
                                   [](const auto& w) { return w->isCompleted(); }),
                    in_flight.end());
    in_flight.push_back(work);
    return work;
  } catch (const std::exception& e) {
    lock.unlock();
    fail(what, e);
  }
}

}  // namespace trainer::dist
