#include "trainer/dist/process_group.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#include "trainer/dist/group_impl.h"
#include "trainer/util/address.h"
#include "trainer/util/error.h"
#include "trainer/util/memory.h"
#include "trainer/util/open_files.h"
#include "trainer/util/signals.h"

namespace trainer::dist {

namespace detail {

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000.0)));
}

std::string seconds_text(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

std::string address(const std::string& host, int port) { return util::host_port(host, port); }

std::string plain_message(const std::exception& e) {
  std::string m;
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    m = ce->what_without_backtrace();
  } else {
    m = e.what();
  }
  if (auto cut = m.find("\nException raised from"); cut != std::string::npos) m.resize(cut);
  while (!m.empty() && std::isspace(static_cast<unsigned char>(m.back()))) m.pop_back();
  std::replace(m.begin(), m.end(), '\n', ' ');
  if (m.size() > 600) m = m.substr(0, 600) + "...";
  return m;
}

}  // namespace detail

namespace {

using detail::Clock;
using detail::plain_message;
using detail::seconds_text;
using std::chrono::milliseconds;

constexpr int64_t kChunkBytes = int64_t{64} << 20;  // flat buffers of all_reduce_sum/broadcast
constexpr milliseconds kWaitSlice{200};             // how often a waiting rank checks signals
constexpr std::chrono::seconds kStopGrace{5};       // wait on after a signal, then give up
constexpr std::chrono::microseconds kCompareBackoff{200000};  // first_differing's polling, at most
constexpr milliseconds kFirstPeerPoll{1000};  // a wait this long starts reading the store:
constexpr milliseconds kPeerPoll{500};        // then this often, for peers' failures and silence

// Keys of the failure reports in the rendezvous store (ProcessGroup::leave_after_failure).
constexpr milliseconds kHeartbeat{1000};  // how often a rank counts up its heartbeat
// How often the chief reads them all: a little less often than they beat, so that liveness stays
// under 2 store operations per rank and second, and every round still sees most ranks move.
constexpr milliseconds kWatchEvery{1250};
constexpr milliseconds kRoundSlack{1000};  // a round later than this: the chief itself stalled
constexpr std::chrono::seconds kSilentAfter{3};  // no heartbeat for this long: "silent"
constexpr size_t kBeatSamples = 64;              // heartbeat round trips kept (ControlStats)
std::string alive_key(int rank) { return "trainer/alive/" + std::to_string(rank); }
// Added to a rank's heartbeat counter when it leaves the group: it is gone, not silent.
constexpr int64_t kLeftMark = int64_t{1} << 40;
using detail::kSilentKey;
const char* const kFailedKey = "trainer/failed";  // the rank of the newest report
std::string failure_key(int rank) { return "trainer/failure/" + std::to_string(rank); }
std::string left_key(int rank) { return "trainer/left/" + std::to_string(rank); }

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

bool contains_any(const std::string& text, std::initializer_list<const char*> needles) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* n : needles) {
    if (lower.find(n) != std::string::npos) return true;
  }
  return false;
}

bool gloo_reduces(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat:
    case torch::kDouble:
    case torch::kHalf:
    case torch::kChar:
    case torch::kByte:
    case torch::kInt:
    case torch::kLong:
      return true;
    default:
      return false;
  }
}

// The dtype a tensor travels as: Gloo has no bf16, bool or int16 kernels. bf16 -> fp32 -> bf16
// is exact, so broadcast stays bit-exact and sums are at least as precise.
torch::ScalarType wire_type(torch::ScalarType t) {
  if (gloo_reduces(t)) return t;
  switch (t) {
    case torch::kBFloat16:
      return torch::kFloat;
    case torch::kBool:
      return torch::kByte;
    case torch::kShort:
      return torch::kInt;
    default:
      throw Error(ErrorKind::kInternal, std::string("dist: tensors of dtype ") + c10::toString(t) +
                                            " cannot be communicated");
  }
}

void validate(const DistOptions& o) {
  if (o.world_size < 1) {
    throw ConfigError("distributed: world size must be at least 1, got " +
                      std::to_string(o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    throw ConfigError("distributed: rank " + std::to_string(o.rank) +
                      " is outside a world of size " + std::to_string(o.world_size));
  }
  if (o.backend != "auto" && o.backend != "gloo" && o.backend != "nccl") {
    throw ConfigError("distributed.backend: expected one of auto|gloo|nccl, got '" + o.backend +
                      "'");
  }
  if (o.backend == "nccl") {
#ifndef TRAINER_WITH_CUDA
    throw ConfigError(
        "distributed.backend: nccl needs a CUDA build of LibTorch, and this build has no CUDA; "
        "use gloo or auto");
#endif
    if (!o.use_cuda) {
      throw ConfigError(
          "distributed.backend: nccl communicates CUDA tensors, but this job trains on the CPU; "
          "use gloo or auto");
    }
  }
  if (!(o.timeout_s > 0)) {
    throw ConfigError("distributed.timeout_s: expected a number of seconds > 0, got " +
                      seconds_text(o.timeout_s));
  }
  if (!(o.rendezvous_timeout_s > 0)) {
    throw ConfigError("distributed.rendezvous_timeout_s: expected a number of seconds > 0, got " +
                      seconds_text(o.rendezvous_timeout_s));
  }
  if (o.world_size == 1 && o.backend == "nccl" && o.chief_host.empty()) {
    throw ConfigError(
        "distributed.backend: nccl with one process still opens an NCCL group, which meets "
        "through a store at the chief's address: give the process one in TF_CONFIG (one worker, "
        "e.g. localhost:2222), or use auto, which needs no group for one process");
  }
  if (o.world_size > 1 || o.backend == "nccl") {
    if (o.chief_host.empty()) {
      throw ConfigError("distributed: the chief's host is empty (TF_CONFIG's chief address)");
    }
    if (o.chief_port < 1 || o.chief_port > 65535) {
      throw ConfigError("distributed: the chief's port must be in 1..65535, got " +
                        std::to_string(o.chief_port) + " (TF_CONFIG's chief address)");
    }
  }
}

std::string resolve_backend(const DistOptions& o) {
  // One process is its own group, unless NCCL is asked for by name: a one-rank NCCL group
  // (the only NCCL group one GPU can hold) exercises the NCCL path.
  if (o.world_size == 1 && o.backend != "nccl") return "local";
  if (o.backend == "auto") {
#ifdef TRAINER_WITH_CUDA
    return o.use_cuda ? "nccl" : "gloo";
#else
    return "gloo";
#endif
  }
  return o.backend;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

ProcessGroup::Impl::Impl(const DistOptions& o) : opts(o), backend_name(resolve_backend(o)) {}

// A group that failed, or that still has collectives in flight, is leaked on purpose: its
// destructor would wait for Gloo's worker threads, which may be blocked on a dead peer until the
// timeout (once per queued collective). The process is about to exit (4 or 143) anyway.
ProcessGroup::Impl::~Impl() {
  stop_heartbeat();
  bool leak = !failure.empty();
  if (!leak && joined && opts.rank != 0) {
    // Gone, not silent: the chief may go on (exporting, or failing and waiting for the others
    // to read why) and must neither call it silent nor wait for it.
    try {
      std::lock_guard<std::mutex> lock(store_mutex);
      store_ops += 2;
      ctl().set(left_key(opts.rank), bytes_of("1"));
      ctl().add(alive_key(opts.rank), kLeftMark);
    } catch (const std::exception&) {
    }
  }
  for (auto& w : in_flight) leak = leak || !w->isCompleted();
  if (leak) {
    for (auto& w : in_flight) util::leak_on_purpose(w.release());
    util::leak_on_purpose(cuda.release());
    util::leak_on_purpose(cpu.release());
    util::leak_on_purpose(control.release());
    for (auto& w : watchers) util::leak_on_purpose(w.release());
    util::leak_on_purpose(store.release());
    return;
  }
#ifdef TRAINER_WITH_CUDA
  // NCCL's communicators are destroyed explicitly before the group goes (LibTorch 2.4+ warns
  // at exit otherwise).
  if (cuda) compat::shutdown_nccl(*cuda);
#endif
}

std::string ProcessGroup::Impl::task(int rank) const {
  if (rank >= 0 && rank < static_cast<int>(opts.task_names.size())) return opts.task_names[rank];
  return "rank " + std::to_string(rank);
}

void ProcessGroup::Impl::start_heartbeat() {
  if (local() || !joined || heartbeat.joinable()) return;
  const auto now = Clock::now();
  beats.assign(opts.world_size, -1);
  heard.assign(opts.world_size, now);
  store_answered = now;
  heartbeat = std::thread([this] {
    std::unique_lock<std::mutex> lock(heartbeat_mutex);
    while (!heartbeat_stop) {
      lock.unlock();
      beat();
      lock.lock();
      heartbeat_cv.wait_for(lock, opts.rank == 0 ? kWatchEvery : kHeartbeat,
                            [this] { return heartbeat_stop; });
    }
  });
}

void ProcessGroup::Impl::stop_heartbeat() {
  if (!heartbeat.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(heartbeat_mutex);
    heartbeat_stop = true;
  }
  heartbeat_cv.notify_all();
  heartbeat.join();
}

c10d::Store& ProcessGroup::Impl::ctl() {
  if (control_broken) {  // new connections: the old ones may still deliver a late reply
    control = control_client();
    for (auto& w : watchers) w = control_client();
    control_broken = false;
  }
  return *control;
}

void ProcessGroup::Impl::answered() {
  std::lock_guard<std::mutex> lock(heartbeat_mutex);
  store_answered = Clock::now();
}

void ProcessGroup::Impl::beat() {
  std::string newly_silent;
  try {
    std::lock_guard<std::mutex> lock(store_mutex);
    if (opts.rank == 0) {
      newly_silent = watch();
    } else {
      const auto start = Clock::now();
      ++store_ops;
      ctl().add(alive_key(opts.rank), 1);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      std::lock_guard<std::mutex> hb(heartbeat_mutex);
      if (beat_ms.size() >= kBeatSamples) beat_ms.erase(beat_ms.begin());
      beat_ms.push_back(ms);
    }
  } catch (const std::exception& e) {
    spdlog::debug("heartbeat: the rendezvous store does not answer: {}", plain_message(e));
    control_broken = true;
    return;
  }
  answered();
  if (!newly_silent.empty()) spdlog::warn("liveness: not heard from {}", newly_silent);
}

namespace {

// "3 12\n7 4\n": rank and seconds silent, one line per silent rank, as the chief published it.
std::string silent_record(const std::vector<std::pair<int, int64_t>>& silent) {
  std::string out;
  for (const auto& [rank, seconds] : silent) {
    out += std::to_string(rank) + " " + std::to_string(seconds) + "\n";
  }
  return out;
}

}  // namespace

std::string ProcessGroup::Impl::watch() {
  // The counters are read over `watchers` connections at once (slices of the ranks): one client's
  // round trips one after another would take about a second per thousand ranks.
  std::vector<int64_t> counts(opts.world_size, -1);
  c10d::Store& first = ctl();
  const int clients = static_cast<int>(watchers.size()) + 1;
  std::vector<std::exception_ptr> errors(clients);
  const auto read_slice = [&](int k) {
    c10d::Store& c = k == 0 ? first : *watchers[k - 1];
    try {
      for (int r = 1 + k; r < opts.world_size; r += clients) counts[r] = c.add(alive_key(r), 0);
    } catch (...) {
      errors[k] = std::current_exception();
    }
  };
  std::vector<std::thread> slices;
  for (int k = 1; k < clients; ++k) slices.emplace_back(read_slice, k);
  read_slice(0);
  for (auto& t : slices) t.join();
  store_ops += opts.world_size - 1;
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  const auto now = Clock::now();
  std::vector<std::pair<int, int64_t>> silent;
  {
    std::lock_guard<std::mutex> lock(heartbeat_mutex);
    // No round for kSilentAfter: this process (or the store) was stalled, not necessarily the
    // others. Their clocks start again rather than their silence being misjudged.
    if (last_round != Clock::time_point{} && now - last_round >= kSilentAfter) {
      std::fill(heard.begin(), heard.end(), now);
    }
    last_round = now;
    for (int r = 1; r < opts.world_size; ++r) {
      if (counts[r] != beats[r] || counts[r] >= kLeftMark) {  // beating, or gone on purpose
        beats[r] = counts[r];
        heard[r] = now;
      } else if (now - heard[r] >= kSilentAfter) {
        silent.emplace_back(
            r, std::chrono::duration_cast<std::chrono::seconds>(now - heard[r]).count());
      }
    }
  }
  // Published only when the set of silent ranks changes, with the seconds of that moment.
  std::string ranks;
  for (const auto& entry : silent) ranks += std::to_string(entry.first) + ",";
  if (ranks == published) return "";
  ++store_ops;
  first.set(kSilentKey, bytes_of(silent_record(silent)));
  published = ranks;
  return describe_silent(silent);
}

// The chief judges silence as of its last round, and only when that round is recent: after a
// stall of its own it waits for the next round instead of blaming the others.
bool ProcessGroup::Impl::chief_sees_silent(int rank, Clock::time_point now) const {
  return now - last_round <= kWatchEvery + kRoundSlack && last_round - heard[rank] >= kSilentAfter;
}

bool ProcessGroup::Impl::is_silent(int rank) {
  if (local() || !heartbeat.joinable() || opts.rank != 0) return false;
  std::lock_guard<std::mutex> lock(heartbeat_mutex);
  return rank > 0 && rank < opts.world_size && chief_sees_silent(rank, Clock::now());
}

std::vector<std::pair<int, int64_t>> ProcessGroup::Impl::silent_ranks() {
  std::vector<std::pair<int, int64_t>> out;
  if (local() || !heartbeat.joinable()) return out;
  const auto now = Clock::now();
  const auto seconds = [&now](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::seconds>(now - t).count();
  };
  if (opts.rank == 0) {
    std::lock_guard<std::mutex> lock(heartbeat_mutex);
    for (int r = 1; r < opts.world_size; ++r) {
      if (chief_sees_silent(r, now)) out.emplace_back(r, seconds(heard[r]));
    }
    return out;
  }
  std::string record;
  try {
    std::lock_guard<std::mutex> lock(store_mutex);
    store_ops += 2;  // LibTorch's get is a wait, then the get
    record = string_of(ctl().get(kSilentKey));
  } catch (const std::exception&) {
    control_broken = true;
    // The chief's store out of reach: named once nothing has answered for kSilentAfter.
    std::lock_guard<std::mutex> lock(heartbeat_mutex);
    const auto last = Clock::now();
    if (last - store_answered >= kSilentAfter) {
      out.emplace_back(
          0, std::chrono::duration_cast<std::chrono::seconds>(last - store_answered).count());
    }
    return out;
  }
  answered();
  std::istringstream in(record);
  std::map<int, Clock::time_point> still;
  std::lock_guard<std::mutex> lock(heartbeat_mutex);
  for (int rank = 0, published_s = 0; in >> rank >> published_s;) {
    if (rank <= 0 || rank >= opts.world_size || rank == opts.rank) continue;
    const auto first = seen_silent.find(rank);
    const auto since = first == seen_silent.end() ? now : first->second;
    still[rank] = since;
    out.emplace_back(rank, published_s + seconds(since));
  }
  seen_silent = std::move(still);
  return out;
}

std::string ProcessGroup::Impl::silent_peers() { return describe_silent(silent_ranks()); }

std::string ProcessGroup::Impl::describe_silent(
    const std::vector<std::pair<int, int64_t>>& silent) const {
  std::string out;
  for (const auto& [rank, seconds] : silent) {
    out += out.empty() ? "" : ", ";
    if (rank == 0 && opts.rank != 0) {
      out += task(0) + " (its rendezvous store at " +
             detail::address(opts.chief_host, opts.chief_port) + " has not answered for " +
             std::to_string(seconds) + " s)";
    } else {
      out += task(rank) + " (silent for " + std::to_string(seconds) + " s)";
    }
  }
  return out;
}

std::string ProcessGroup::Impl::who() const {
  return "rank " + std::to_string(opts.rank) + " of " + std::to_string(opts.world_size) + " (" +
         backend_name + ")";
}

void ProcessGroup::Impl::record_failure(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex);
  if (failure.empty()) failure = message;
}

void ProcessGroup::Impl::raise(const std::string& message) {
  if (util::stop_requested()) {
    throw Interrupted("stopped by signal " + std::to_string(util::stop_signal()) + "; " + message);
  }
  throw DistributedError(message);
}

std::optional<PeerFailed> ProcessGroup::Impl::peer_failure() {
  if (local() || !joined) return std::nullopt;
  try {
    std::lock_guard<std::mutex> lock(store_mutex);
    ++store_ops;
    if (!ctl().check({kFailedKey})) return std::nullopt;
    store_ops += 5;  // a get is two requests
    const int rank = std::stoi(string_of(ctl().get(kFailedKey)));
    if (rank == opts.rank || !ctl().check({failure_key(rank)})) return std::nullopt;
    // "<kind>\n<task>\n<message>"
    const std::string record = string_of(ctl().get(failure_key(rank)));
    const size_t a = record.find('\n');
    const size_t b = a == std::string::npos ? a : record.find('\n', a + 1);
    if (b == std::string::npos) return std::nullopt;
    const int kind_number = std::stoi(record.substr(0, a));
    if (kind_number < 0 || kind_number > static_cast<int>(ErrorKind::kInternal))
      return std::nullopt;
    const auto kind = static_cast<ErrorKind>(kind_number);
    const std::string task = record.substr(a + 1, b - a - 1);
    const std::string message = record.substr(b + 1);
    const std::string name = kind_name(kind);
    const bool named = message.compare(0, name.size(), name) == 0;
    return PeerFailed(kind, task + " failed: " + (named ? "" : name + ": ") + message);
  } catch (const std::exception&) {
    control_broken = true;
    return std::nullopt;  // the chief (and its store) is gone too: nothing to learn
  }
}

void ProcessGroup::leave_after_failure(const std::optional<FailureReport>& mine, double grace_s) {
  Impl& s = *impl_;
  if (s.local() || !s.joined) return;
  try {
    std::lock_guard<std::mutex> lock(s.store_mutex);
    if (mine) {
      const std::string record =
          std::to_string(static_cast<int>(mine->kind)) + "\n" + mine->task + "\n" + mine->message;
      s.ctl().set(failure_key(s.opts.rank), bytes_of(record));
      s.ctl().set(kFailedKey, bytes_of(std::to_string(s.opts.rank)));
      s.store_ops += 2;
    }
    ++s.store_ops;
    s.ctl().set(left_key(s.opts.rank), bytes_of("1"));
    if (s.opts.rank != 0) s.ctl().add(alive_key(s.opts.rank), kLeftMark);
  } catch (const std::exception& e) {
    spdlog::debug("could not report the failure to the other tasks: {}", plain_message(e));
    return;
  }
  if (s.opts.rank != 0) return;
  // The chief's process hosts the store: keep it up until the others have read the cause. A
  // task whose heartbeat has stopped (its host or link is gone) will never read it: not waited for.
  const auto deadline = Clock::now() + detail::to_ms(grace_s);
  bool logged = false;
  while (Clock::now() < deadline) {
    std::vector<std::string> others;
    for (int r = 1; r < s.opts.world_size; ++r) {
      if (!s.is_silent(r)) others.push_back(left_key(r));
    }
    if (others.empty()) return;
    try {
      std::lock_guard<std::mutex> lock(s.store_mutex);
      ++s.store_ops;
      if (s.ctl().check(others)) return;
    } catch (const std::exception&) {
      return;
    }
    if (!logged) {
      spdlog::info("waiting up to {} s for the other tasks to stop and read why",
                   seconds_text(grace_s));
      logged = true;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
}

void ProcessGroup::Impl::fail(const std::string& what, const std::exception& e) {
  if (auto peer = peer_failure()) {
    record_failure(peer->what());
    throw PeerFailed(*peer);
  }
  const std::string detail = plain_message(e);
  std::string cause;
  const std::string silent = silent_peers();
  if (contains_any(detail, {"timed out", "timeout"})) {
    cause = "no answer from a peer within distributed.timeout_s = " + seconds_text(opts.timeout_s) +
            " s: " +
            (silent.empty()
                 ? std::string("a peer is stuck, has died, or fell out of step (every rank must "
                               "run the same collectives in the same order)")
                 : "not heard from " + silent + ": its process, host or network link is gone");
  } else if (contains_any(detail, {"closed by peer", "connection reset", "broken pipe",
                                   "connection refused", "connection closed", "socket closed",
                                   "eof", "read error", "write error", "peer"})) {
    cause = "lost the connection to a peer: its process ended or the network failed";
    if (!silent.empty()) cause += "; not heard from " + silent;
  } else {
    cause = "failed";
  }
  const std::string message = what + " on " + who() + ": " + cause + " [" + detail + "]";
  record_failure(message);
  raise(message);
}

void ProcessGroup::Impl::check_usable_locked(const std::string& what) const {
  if (!failure.empty()) {
    raise(what + " on " + who() + ": refused, this process group already failed: " + failure);
  }
}

bool ProcessGroup::Impl::poll(const std::string& what, const std::function<bool()>& ready,
                              milliseconds limit, std::chrono::microseconds max_sleep,
                              const std::shared_ptr<Wake>& wake) {
  const auto start = Clock::now();
  auto next_poll = start + kFirstPeerPoll;
  auto next_slice = start + kWaitSlice;
  std::optional<Clock::time_point> stop_seen;
  std::chrono::microseconds sleep{50};
  while (!ready()) {
    {
      std::unique_lock<std::mutex> lock(wake->m);
      wake->cv.wait_for(lock, sleep, [&] { return wake->done; });
    }
    sleep = std::min(max_sleep, sleep * 2);
    const auto now = Clock::now();
    if (now < next_slice && now < next_poll) continue;
    next_slice = now + kWaitSlice;
    if (ready()) break;
    if (now >= next_poll) {  // a peer that failed and said so will never join this collective
      next_poll = now + kPeerPoll;
      if (auto peer = peer_failure()) {
        abort_cuda();
        record_failure(peer->what());
        throw PeerFailed(*peer);
      }
      try {
        check_cuda_failures();
      } catch (const std::exception& e) {
        abort_cuda();
        fail(what, e);
      }
      // A peer not heard from for kSilentAfter will not join: its process is frozen or its
      // host or link is gone (a process that died is also seen by the mesh, sooner).
      if (const std::string silent = silent_peers(); !silent.empty()) {
        abort_cuda();
        const std::string message = what + " on " + who() + ": not heard from " + silent +
                                    ": its process, host or network link is gone (no heartbeat "
                                    "for " +
                                    std::to_string(kSilentAfter.count()) + " s)";
        record_failure(message);
        raise(message);
      }
    }
    if (util::stop_requested()) {
      if (!stop_seen) stop_seen = now;
      if (now - *stop_seen >= kStopGrace) {
        abort_cuda();
        const std::string message = what + " on " + who() +
                                    ": abandoned after a stop signal (the peers did not "
                                    "complete it within " +
                                    std::to_string(kStopGrace.count()) + " s)";
        record_failure(message);
        raise(message);
      }
    }
    if (now - start >= limit) return false;
  }
  return true;
}

// When the collective has not completed kStopGrace after a stop signal, the peers have stopped
// too (or are gone), and waiting on would only delay the exit.
void ProcessGroup::Impl::wait(const std::string& what, const c10::intrusive_ptr<compat::Work>& work,
                              bool on_gloo) {
  if (!on_gloo) {
    // NCCL without blocking wait: the current stream waits for the collective's stream; the
    // host does not. Throws only for a failure NCCL already knows of.
    try {
      check_cuda_failures();
      work->wait();
    } catch (const std::exception& e) {
      abort_cuda();
      fail(what, e);
    }
    return;
  }
  // Gloo enforces timeout_s itself (its error says so); the poll's own limit is a safety net.
  auto net = detail::to_ms(2 * opts.timeout_s + 60);
  auto wake = std::make_shared<Wake>();
  work->getFuture()->addCallback([wake](c10::ivalue::Future&) {
    std::lock_guard<std::mutex> lock(wake->m);
    wake->done = true;
    wake->cv.notify_all();
  });
  const auto is_done = [wake] {
    std::lock_guard<std::mutex> lock(wake->m);
    return wake->done;
  };
  // Done: wait() returns at once or rethrows the failure. Not done: report the timeout.
  if (!poll(what, is_done, net, kWaitSlice, wake)) net = milliseconds(1);
  try {
    work->wait(net);
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

void ProcessGroup::Impl::wait_device(const std::string& what, const std::function<bool()>& ready) {
  if (ready()) {
    check_cuda_failures_or_fail(what);
    return;
  }
  const auto limit = detail::to_ms(opts.timeout_s);
  // Alone (one GPU, no group) nothing can hang on a peer: wait as long as the device takes.
  const auto alone = std::chrono::duration_cast<milliseconds>(std::chrono::hours(24 * 365));
  if (!poll(what, ready, local() ? alone : limit, std::chrono::microseconds(2000),
            std::make_shared<Wake>())) {
    abort_cuda();
    fail(what, std::runtime_error("the device's work (its collectives among it) timed out after " +
                                  seconds_text(opts.timeout_s) + " s"));
  }
  check_cuda_failures_or_fail(what);
}

void ProcessGroup::Impl::check_cuda_failures_or_fail(const std::string& what) {
  try {
    check_cuda_failures();
  } catch (const std::exception& e) {
    abort_cuda();
    fail(what, e);
  }
}

void ProcessGroup::Impl::check_cuda_failures() {
  if (!cuda) return;
  std::vector<c10::intrusive_ptr<compat::Work>> works;
  {
    std::lock_guard<std::mutex> lock(mutex);
    works = in_flight;
  }
  for (const auto& w : works) {
    if (w->isCompleted() && w->exception()) std::rethrow_exception(w->exception());
  }
}

void ProcessGroup::Impl::abort_cuda() noexcept {
#ifdef TRAINER_WITH_CUDA
  if (!cuda) return;
  std::vector<c10::intrusive_ptr<compat::Work>> works;
  {
    std::lock_guard<std::mutex> lock(mutex);
    works = in_flight;
  }
  compat::abort_nccl(*cuda, works);
#endif
}

// ---------------------------------------------------------------------------------------------

struct AsyncWork::State {
  std::shared_ptr<ProcessGroup::Impl> impl;
  c10::intrusive_ptr<compat::Work> work;
  std::string what;
  bool on_gloo = true;
  bool waited = false;
};

AsyncWork::AsyncWork() = default;
AsyncWork::~AsyncWork() = default;
AsyncWork::AsyncWork(AsyncWork&&) noexcept = default;
AsyncWork& AsyncWork::operator=(AsyncWork&&) noexcept = default;

bool AsyncWork::pending() const { return state_ && !state_->waited; }

void AsyncWork::wait() {
  if (!state_ || state_->waited) return;
  {
    std::lock_guard<std::mutex> lock(state_->impl->mutex);
    state_->impl->check_usable_locked(state_->what);
  }
  state_->impl->wait(state_->what, state_->work, state_->on_gloo);
  state_->waited = true;
}

// ---------------------------------------------------------------------------------------------

namespace {

// Tensors of one dtype and device, packed into flat buffers of at most kChunkBytes (a larger
// tensor is a chunk of its own). A lone contiguous tensor of a wire dtype is used in place.
struct Chunk {
  std::vector<torch::Tensor> members;
  torch::Tensor flat;
  bool in_place = false;
};

std::vector<Chunk> make_chunks(const std::vector<torch::Tensor>& tensors) {
  std::vector<std::vector<torch::Tensor>> groups;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    auto same = [&](const std::vector<torch::Tensor>& g) {
      return g.front().device() == t.device() && g.front().scalar_type() == t.scalar_type();
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end()) {
      groups.push_back({t});
    } else {
      it->push_back(t);
    }
  }
  std::vector<Chunk> chunks;
  for (const auto& group : groups) {
    const auto wire = wire_type(group.front().scalar_type());
    const int64_t item = static_cast<int64_t>(c10::elementSize(wire));
    Chunk current;
    int64_t bytes = 0;
    for (const auto& t : group) {
      if (!current.members.empty() && bytes + t.numel() * item > kChunkBytes) {
        chunks.push_back(std::move(current));
        current = Chunk{};
        bytes = 0;
      }
      current.members.push_back(t);
      bytes += t.numel() * item;
    }
    chunks.push_back(std::move(current));
  }
  torch::NoGradGuard no_grad;
  for (auto& c : chunks) {
    const auto& first = c.members.front();
    const auto wire = wire_type(first.scalar_type());
    if (c.members.size() == 1 && first.is_contiguous() && wire == first.scalar_type()) {
      c.flat = first.detach();
      c.in_place = true;
      continue;
    }
    std::vector<torch::Tensor> pieces;
    pieces.reserve(c.members.size());
    for (const auto& t : c.members) pieces.push_back(t.detach().reshape({-1}).to(wire));
    c.flat = torch::cat(pieces);
  }
  return chunks;
}

void unpack(const Chunk& c) {
  if (c.in_place) return;
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& t : c.members) {
    const int64_t n = t.numel();
    t.detach().copy_(c.flat.narrow(0, offset, n).view(t.sizes()));
    offset += n;
  }
}

c10d::ReduceOp to_c10d(Reduce op) {
  switch (op) {
    case Reduce::kMin:
      return c10d::ReduceOp::MIN;
    case Reduce::kMax:
      return c10d::ReduceOp::MAX;
    case Reduce::kSum:
      break;
  }
  return c10d::ReduceOp::SUM;
}

}  // namespace

int64_t open_files_needed(const DistOptions& o) {
  constexpr int64_t kBase = 256;          // libraries, logs, data files, decode threads
  constexpr int64_t kPerStoreClient = 4;  // 1.13: two sockets and a pipe (2.x's libuv: fewer)
  const int64_t n = std::max(1, o.world_size);
  int64_t need = kBase + 2 * kPerStoreClient;
  if (o.mesh) need += (n - 1) + 1;  // Gloo: a socket per peer, and its listener
  if (o.rank == 0) {
    need += 2 * 2 * n + 1;  // the store: both connections of every task (2 sockets each)
    need += 6 * (detail::watch_clients(o.world_size) - 1);  // the watchers: both ends
  }
  if (o.use_cuda) need += 64 + (o.rank == 0 ? n : 0);  // NCCL: rings, proxy; the bootstrap root
  return need;
}

void check_open_files(const DistOptions& o, int64_t limit) {
  if (o.world_size <= 1) return;
  const int64_t need = open_files_needed(o);
  if (limit >= need) return;
  const std::string n = std::to_string(need);
  throw ConfigError(
      "open files: a job of " + std::to_string(o.world_size) + " training tasks needs about " + n +
      " open files in " +
      (o.rank == 0 ? "the chief's process (which hosts the store)" : "each process") +
      " (a connection to each peer" + (o.rank == 0 ? " and the store's side of every task's" : "") +
      "), but this process may open at most " + std::to_string(limit) +
      " (RLIMIT_NOFILE, its soft limit raised to the hard one: `ulimit -Hn`). Raise it where the "
      "trainer starts: `ulimit "
      "-n " +
      n +
      "` in its shell (above the hard limit only as root, or with nofile in "
      "/etc/security/limits.conf), `docker run --ulimit nofile=" +
      n + ":" + n + "`, LimitNOFILE=" + n +
      " in a systemd unit, or your scheduler's limit on open files");
}

std::unique_ptr<ProcessGroup> ProcessGroup::connect(const DistOptions& options) {
  validate(options);
  check_open_files(options, util::raise_open_file_limit().soft);
  auto impl = std::make_shared<Impl>(options);
  if (!impl->local()) {
    try {
      impl->rendezvous();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // anything the steps above did not name
      throw DistributedError("rendezvous at the chief " +
                             detail::address(options.chief_host, options.chief_port) +
                             " failed: " + plain_message(e));
    }
  }
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return impl_->opts.rank; }
int ProcessGroup::world_size() const { return impl_->opts.world_size; }
std::string ProcessGroup::backend() const { return impl_->backend_name; }

std::string nccl_version() {
#ifdef TRAINER_WITH_CUDA
  return c10d::getNcclVersion();
#else
  return "";
#endif
}
bool ProcessGroup::communicates() const { return !impl_->local(); }

void ProcessGroup::wait_device(const std::string& what, const std::function<bool()>& ready) {
  impl_->wait_device(what, ready);
}

void ProcessGroup::all_reduce_sum(const std::vector<torch::Tensor>& tensors) {
  if (impl_->local()) return;
  const std::string what = "all_reduce_sum";
  auto chunks = make_chunks(tensors);
  std::vector<c10::intrusive_ptr<compat::Work>> works;
  for (auto& c : chunks) {
    works.push_back(impl_->launch(what, [&] {
      std::vector<at::Tensor> io{c.flat};
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::SUM;
      return impl_->backend_for(c.flat).allreduce(io, o);
    }));
  }
  for (size_t i = 0; i < works.size(); ++i) {
    impl_->wait(what, works[i], impl_->on_gloo(chunks[i].flat));
  }
  for (const auto& c : chunks) unpack(c);
}

AsyncWork ProcessGroup::all_reduce_sum_async(const torch::Tensor& flat) {
  AsyncWork handle;
  if (impl_->local()) return handle;
  if (!flat.defined() || flat.is_sparse() || !flat.is_contiguous() ||
      !gloo_reduces(flat.scalar_type())) {
    throw Error(ErrorKind::kInternal,
                "all_reduce_sum_async: needs a dense contiguous tensor of a Gloo dtype");
  }
  const std::string what = "all_reduce_sum_async";
  auto work = impl_->launch(what, [&] {
    std::vector<at::Tensor> io{flat.detach()};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    return impl_->backend_for(flat).allreduce(io, o);
  });
  handle.state_ = std::make_shared<AsyncWork::State>();
  handle.state_->impl = impl_;
  handle.state_->work = std::move(work);
  handle.state_->what = what;
  handle.state_->on_gloo = impl_->on_gloo(flat);
  return handle;
}

void ProcessGroup::broadcast(const std::vector<torch::Tensor>& tensors, int root) {
  if (root < 0 || root >= world_size()) {
    throw Error(ErrorKind::kInternal, "broadcast: root " + std::to_string(root) +
                                          " is outside a world of " + std::to_string(world_size()));
  }
  if (impl_->local()) return;
  const std::string what = "broadcast";
  auto chunks = make_chunks(tensors);
  std::vector<c10::intrusive_ptr<compat::Work>> works;
  for (auto& c : chunks) {
    works.push_back(impl_->launch(what, [&] {
      std::vector<at::Tensor> io{c.flat};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.rootTensor = 0;
      return impl_->backend_for(c.flat).broadcast(io, o);
    }));
  }
  for (size_t i = 0; i < works.size(); ++i) {
    impl_->wait(what, works[i], impl_->on_gloo(chunks[i].flat));
  }
  if (rank() != root) {
    for (const auto& c : chunks) unpack(c);
  }
}

std::vector<int64_t> ProcessGroup::all_reduce(const std::vector<int64_t>& values, Reduce op) {
  if (impl_->local() || values.empty()) return values;
  const std::string what = std::string("all_reduce(") +
                           (op == Reduce::kSum   ? "sum"
                            : op == Reduce::kMin ? "min"
                                                 : "max") +
                           ")";
  auto t = torch::tensor(values, torch::kLong);
  auto work = impl_->launch(what, [&] {
    std::vector<at::Tensor> io{t};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    return impl_->cpu->allreduce(io, o);
  });
  impl_->wait(what, work, /*on_gloo=*/true);
  const int64_t* p = t.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

int64_t ProcessGroup::all_reduce(int64_t value, Reduce op) {
  return all_reduce(std::vector<int64_t>{value}, op).front();
}

std::vector<std::string> ProcessGroup::all_gather_strings(const std::string& mine) {
  if (impl_->local()) return {mine};
  const std::string what = "all_gather_strings";
  const int n = world_size();
  auto gather = [&](const torch::Tensor& input) {
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < n; ++r) outputs[0].push_back(torch::empty_like(input));
    auto work = impl_->launch(what, [&] {
      std::vector<at::Tensor> inputs{input};
      return impl_->cpu->allgather(outputs, inputs);
    });
    impl_->wait(what, work, /*on_gloo=*/true);
    return outputs[0];
  };
  const auto lengths = gather(torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong));
  int64_t longest = 1;  // never a zero-size message
  for (const auto& l : lengths) longest = std::max(longest, l.item<int64_t>());
  auto bytes = torch::zeros({longest}, torch::kByte);
  std::copy(mine.begin(), mine.end(), reinterpret_cast<char*>(bytes.data_ptr<uint8_t>()));
  const auto all = gather(bytes);
  std::vector<std::string> result;
  for (int r = 0; r < n; ++r) {
    const char* p = reinterpret_cast<const char*>(all[r].data_ptr<uint8_t>());
    result.emplace_back(p, static_cast<size_t>(lengths[r].item<int64_t>()));
  }
  return result;
}

void ProcessGroup::barrier() {
  if (impl_->local()) return;
  const std::string what = "barrier";
  auto work = impl_->launch(what, [&] { return impl_->cpu->barrier(c10d::BarrierOptions()); });
  impl_->wait(what, work, /*on_gloo=*/true);
}

ControlStats ProcessGroup::control_stats() const {
  ControlStats out;
  out.store_operations = impl_->store_ops.load();
  std::lock_guard<std::mutex> lock(impl_->heartbeat_mutex);
  out.heartbeat_ms = impl_->beat_ms;
  return out;
}

// Keys under trainer/compare/<name>/: "text/<rank>" (the chief's, and each differing one),
// "checked", "differing" and "done" (counters), "verdict" (the chief's answer: "" or the rank).
std::optional<Difference> ProcessGroup::first_differing(const std::string& name,
                                                        const std::string& text) {
  Impl& s = *impl_;
  if (s.local()) return std::nullopt;
  const std::string what = "comparing " + name + " with the chief's";
  const std::string prefix = "trainer/compare/" + name + "/";
  const auto text_key = [&prefix](int rank) { return prefix + "text/" + std::to_string(rank); };
  const int n = s.opts.world_size;
  const int me = s.opts.rank;
  // One store request, counted, under store_mutex.
  const auto request = [&s](auto&& f) {
    std::lock_guard<std::mutex> lock(s.store_mutex);
    ++s.store_ops;
    try {
      return f(s.ctl());
    } catch (const std::exception&) {
      s.control_broken = true;
      throw;
    }
  };
  const auto wait_until = [&](const std::function<bool()>& ready) {
    auto wake = std::make_shared<Impl::Wake>();
    if (!s.poll(what, ready, detail::to_ms(s.opts.timeout_s), kCompareBackoff, wake)) {
      s.fail(what, std::runtime_error("timed out after " + seconds_text(s.opts.timeout_s) + " s"));
    }
  };
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.check_usable_locked(what);
  }
  try {
    Difference d;
    std::string verdict;
    if (me == 0) {
      d.chief = text;
      request([&](c10d::Store& c) {
        c.set(text_key(0), bytes_of(text));
        return 0;
      });
      wait_until([&] {
        return request([&](c10d::Store& c) { return c.add(prefix + "checked", 0); }) >= n - 1;
      });
      if (request([&](c10d::Store& c) { return c.add(prefix + "differing", 0); }) > 0) {
        for (int r = 1; r < n && verdict.empty(); ++r) {  // only when one differs
          if (request([&](c10d::Store& c) { return c.check({text_key(r)}); })) {
            verdict = std::to_string(r);
          }
        }
      }
      request([&](c10d::Store& c) {
        c.set(prefix + "verdict", bytes_of(verdict));
        return 0;
      });
    } else {
      wait_until([&] { return request([&](c10d::Store& c) { return c.check({text_key(0)}); }); });
      d.chief = request([&](c10d::Store& c) { return string_of(c.get(text_key(0))); });
      ++s.store_ops;  // a get is two requests (a wait, then the get)
      if (text != d.chief) {
        request([&](c10d::Store& c) {
          c.set(text_key(me), bytes_of(text));
          return c.add(prefix + "differing", 1);
        });
        ++s.store_ops;
      }
      request([&](c10d::Store& c) { return c.add(prefix + "checked", 1); });
      wait_until(
          [&] { return request([&](c10d::Store& c) { return c.check({prefix + "verdict"}); }); });
      verdict = request([&](c10d::Store& c) { return string_of(c.get(prefix + "verdict")); });
      ++s.store_ops;
    }
    if (!verdict.empty()) {
      d.rank = std::stoi(verdict);
      d.theirs = d.rank == me
                     ? text
                     : request([&](c10d::Store& c) { return string_of(c.get(text_key(d.rank))); });
    }
    // The chief, whose process hosts the store the others read from, returns only once every
    // rank has its answer.
    if (me == 0) {
      wait_until([&] {
        return request([&](c10d::Store& c) { return c.add(prefix + "done", 0); }) >= n - 1;
      });
    } else {
      request([&](c10d::Store& c) { return c.add(prefix + "done", 1); });
    }
    if (verdict.empty()) return std::nullopt;
    return d;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    s.fail(what, e);
  }
}

}  // namespace trainer::dist
