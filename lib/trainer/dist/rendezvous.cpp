// Meeting at the chief: rank 0 hosts the c10d TCPStore on its TF_CONFIG port and waits until
// every rank has joined; the others probe the chief's address until it listens, then connect.
// Then every rank creates its Gloo (and, for CUDA training in CUDA builds, NCCL) group.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "trainer/dist/group_impl.h"
#include "trainer/util/error.h"
#include "trainer/util/signals.h"

namespace trainer::dist {

namespace {

using detail::address;
using detail::Clock;
using detail::plain_message;
using detail::seconds_text;
using detail::to_ms;
using std::chrono::milliseconds;

constexpr milliseconds kPoll{20};                    // rendezvous polling
constexpr milliseconds kReadyPoll{250};              // a joined rank's polling, at most
constexpr milliseconds kConnectAttempt{5000};        // one connection attempt to the chief
constexpr milliseconds kProbeBackoff{1000};          // longest pause between probes
constexpr std::chrono::seconds kReportEvery{30};     // "still waiting" log lines
const char* const kJoinedKey = "trainer/joined";     // count of ranks that joined
const char* const kWorldKey = "trainer/world_size";  // the chief's world size
using detail::kReadyKey;

// Whether a TCP connection to host:port opens within `timeout`; else `error` says why. Quiet,
// unlike c10d's own connect, which logs an error line for every failed attempt.
bool port_open(const std::string& host, int port, milliseconds timeout, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    error = "cannot resolve '" + host + "': " + ::gai_strerror(rc);
    return false;
  }
  bool open = false;
  for (addrinfo* a = found; a != nullptr && !open; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int ready = ::poll(&p, 1, static_cast<int>(timeout.count()));
        if (ready == 1) {
          socklen_t len = sizeof(err);
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        } else {
          err = ready == 0 ? ETIMEDOUT : errno;
        }
      }
    }
    ::close(fd);
    if (err == 0) {
      open = true;
    } else {
      error = std::strerror(err);
    }
  }
  ::freeaddrinfo(found);
  return open;
}

// The rendezvous store's server in LibTorch 1.13 (c10d's TCPStore daemon) reads a request with
// blocking recv() calls once poll() says a connection is readable, so a stranger that sends the
// start of a request and stops (a half-open connection, a slow scanner) stalls the whole store,
// and with it every rank, for ever. (From 2.4 on the server runs on libuv by default, which never
// blocks on one connection; the bound below is harmless there, and test_strangers covers both.)
// Sockets accepted by a listening socket inherit its SO_RCVTIMEO / SO_SNDTIMEO (Linux copies them
// into each accepted socket), so bounding the listener's makes such a read fail after
// kStrangerTimeout; the daemon then closes that connection and goes on. Real clients send each
// request in one piece and read each reply at once, so they never meet the bound. The listener is
// found among this process's descriptors (TCPStore does not expose it) as the listening TCP
// socket on `port`. False when not found.
constexpr std::chrono::seconds kStrangerTimeout{2};

bool bound_store_listener(int port) {
  bool found = false;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    int listening = 0;
    socklen_t len = sizeof listening;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening == 0) {
      continue;
    }
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int bound_port = -1;
    if (addr.ss_family == AF_INET) {
      bound_port = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      bound_port = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    }
    if (bound_port != port) continue;
    timeval tv{};
    tv.tv_sec = kStrangerTimeout.count();
    found = ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 &&
            ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0;
  }
  return found;
}

void check_stop(const std::string& where) {
  if (util::stop_requested()) {
    throw Interrupted("stopped by signal " + std::to_string(util::stop_signal()) + " " + where);
  }
}

}  // namespace

void ProcessGroup::Impl::announce(const std::string& chief) {
  const std::string r = std::to_string(opts.rank);
  const std::string n = std::to_string(opts.world_size);
  if (opts.rank == 0) {
    store->set(kWorldKey, std::vector<uint8_t>(n.begin(), n.end()));
  } else {
    const auto theirs = store->get(kWorldKey);
    const std::string chief_n(theirs.begin(), theirs.end());
    if (chief_n != n) {
      throw ConfigError("rendezvous: this task's TF_CONFIG gives a world of " + n +
                        " training tasks, but the chief at " + chief + " counts " + chief_n +
                        ": every task must be started with the same cluster");
    }
  }
  if (store->add("trainer/rank/" + r, 1) > 1) {
    throw ConfigError("rendezvous: rank " + r + " has already joined the chief at " + chief +
                      " from another process: two tasks have the same TF_CONFIG task type and "
                      "index");
  }
  store->add(kJoinedKey, 1);
}

void ProcessGroup::Impl::rendezvous() {
  const auto deadline = Clock::now() + to_ms(opts.rendezvous_timeout_s);
  const std::string chief = address(opts.chief_host, opts.chief_port);
  const std::string limit =
      "distributed.rendezvous_timeout_s = " + seconds_text(opts.rendezvous_timeout_s) + " s";

  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(opts.chief_port);
  so.waitWorkers = false;
  if (opts.rank == 0) {
    so.isServer = true;
    so.timeout = to_ms(opts.rendezvous_timeout_s);
    try {
      // The store listens on every interface; the chief itself talks to it over loopback, so a
      // TF_CONFIG name that does not route back to this machine does not matter here.
      store = compat::make_tcp_store("127.0.0.1", so);
      if (!bound_store_listener(opts.chief_port)) {
        spdlog::warn(
            "rendezvous: could not bound the store's reads on port {}: a connection "
            "that stops half-way through a request can stall the store",
            opts.chief_port);
      }
      open_control();
      announce(chief);
      joined = true;
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw DistributedError("rendezvous: the chief (rank 0) could not listen on port " +
                             std::to_string(opts.chief_port) + " (its TF_CONFIG address " + chief +
                             "; is another process using that port?): " + plain_message(e));
    }
    auto next_report = Clock::now() + kReportEvery;
    while (true) {
      check_stop("while the chief waited for the others to join");
      int64_t joined = 0;
      try {
        joined = store->add(kJoinedKey, 0);
      } catch (const std::exception& e) {
        throw DistributedError("rendezvous: the chief's own store failed: " + plain_message(e));
      }
      if (joined >= opts.world_size) break;
      if (Clock::now() >= next_report) {
        spdlog::info("rendezvous: {} of {} tasks joined the chief on port {}; waiting", joined,
                     opts.world_size, opts.chief_port);
        next_report += kReportEvery;
      }
      if (Clock::now() >= deadline) {
        std::string missing;
        for (int r = 1; r < opts.world_size; ++r) {
          if (!store->check({"trainer/rank/" + std::to_string(r)})) {
            missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          }
        }
        throw DistributedError("rendezvous: the chief at " + chief + " waited " + limit +
                               ", but only " + std::to_string(joined) + " of " +
                               std::to_string(opts.world_size) +
                               " tasks joined; missing ranks: " + missing +
                               " (are they running, with this chief address in TF_CONFIG?)");
      }
      std::this_thread::sleep_for(kPoll);
    }
    // Every rank has joined (and beats): the chief starts watching them, then lets them go.
    store->set(detail::kSilentKey, std::vector<uint8_t>{});
    start_heartbeat();
    store->set(kReadyKey, std::vector<uint8_t>{'1'});
  } else {
    so.isServer = false;
    std::string last_error = "none";
    auto backoff = milliseconds(50);
    auto next_report = Clock::now() + kReportEvery;
    while (true) {
      check_stop("while waiting for the chief at " + chief);
      const auto remaining = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (remaining.count() <= 0) {
        throw DistributedError("rendezvous: rank " + std::to_string(opts.rank) +
                               " could not reach the chief at " + chief + " within " + limit +
                               " (is the chief running, and can this machine reach that "
                               "address?); last error: " +
                               last_error);
      }
      if (Clock::now() >= next_report) {
        spdlog::info("rendezvous: still waiting for the chief at {} ({})", chief, last_error);
        next_report += kReportEvery;
      }
      // Cluster machines start minutes apart: probe quietly until the chief listens.
      if (port_open(opts.chief_host, opts.chief_port, std::min(remaining, kProbeBackoff),
                    last_error)) {
        so.timeout = std::min(remaining, kConnectAttempt);
        try {
          store = compat::make_tcp_store(opts.chief_host, so);
          break;
        } catch (const std::exception& e) {
          last_error = plain_message(e);
        }
      }
      std::this_thread::sleep_for(std::min(remaining, backoff));
      backoff = std::min(backoff * 2, kProbeBackoff);
    }
    try {
      store->setTimeout(std::max(
          milliseconds(1000), std::chrono::duration_cast<milliseconds>(deadline - Clock::now())));
      open_control();
      announce(chief);
      joined = true;
      start_heartbeat();  // beating from now: the chief watches every rank once all joined
      // Backing off to kReadyPoll: a thousand ranks polling every kPoll would flood the store.
      auto pause = kPoll;
      while (!store->check({kReadyKey})) {
        check_stop("while waiting at the chief for the others to join");
        if (Clock::now() >= deadline) {
          throw DistributedError("rendezvous: rank " + std::to_string(opts.rank) +
                                 " reached the chief at " + chief + ", but only " +
                                 std::to_string(store->add(kJoinedKey, 0)) + " of " +
                                 std::to_string(opts.world_size) + " tasks joined within " + limit);
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, kReadyPoll);
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw DistributedError("rendezvous: rank " + std::to_string(opts.rank) +
                             " lost the chief at " + chief +
                             " while waiting for the others: " + plain_message(e));
    }
  }
  store->setTimeout(to_ms(opts.timeout_s));
  if (opts.mesh) make_backends();
}

// The control connection: heartbeats and failure reports, with their own short timeout, so that
// they never change the timeout of `store`, which Gloo's and NCCL's set-up use.
c10::intrusive_ptr<c10d::Store> ProcessGroup::Impl::control_client() const {
  c10d::TCPStoreOptions co;
  co.port = static_cast<std::uint16_t>(opts.chief_port);
  co.isServer = false;
  co.waitWorkers = false;
  co.timeout = detail::kControlTimeout;
  return compat::make_tcp_store(opts.rank == 0 ? "127.0.0.1" : opts.chief_host, co);
}

// The first control connections open while every other rank opens its own: a burst of
// connects at the chief's listener. LibTorch 2.x listens with backlog -1, which some network
// stacks (gVisor's) take as the smallest accept queue; a SYN dropped there is sent again by the
// kernel only after 1, 3 and 7 s, past kControlTimeout. So each first connection gets up to 4
// attempts (a chief lost in just that moment is named after 4 x kControlTimeout instead of 1);
// reconnecting later (ctl()) keeps its single attempt, so liveness stays as quick as it was.
c10::intrusive_ptr<c10d::Store> ProcessGroup::Impl::first_control_client() const {
  constexpr int kAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    try {
      return control_client();
    } catch (const std::exception&) {
      if (attempt == kAttempts) throw;
    }
  }
}

void ProcessGroup::Impl::open_control() {
  try {
    control = first_control_client();
    if (opts.rank == 0) {
      const int clients = detail::watch_clients(opts.world_size);
      for (int k = 1; k < clients; ++k) watchers.push_back(first_control_client());
    }
  } catch (const std::exception& e) {
    throw DistributedError("rendezvous: rank " + std::to_string(opts.rank) +
                           " reached the chief's store at " +
                           address(opts.chief_host, opts.chief_port) +
                           " but could not open a second connection to it: " + plain_message(e));
  }
}

void ProcessGroup::Impl::make_backends() {
  std::shared_ptr<::gloo::transport::Device> device;
  const std::string bind =
      !opts.interface.empty() ? "network interface '" + opts.interface + "' (distributed.interface)"
                              : "host '" + opts.own_host + "' (this task's TF_CONFIG address)";
  try {
    if (!opts.interface.empty()) {
      device = c10d::ProcessGroupGloo::createDeviceForInterface(opts.interface);
    } else if (!opts.own_host.empty()) {
      device = c10d::ProcessGroupGloo::createDeviceForHostname(opts.own_host);
    } else {
      device = c10d::ProcessGroupGloo::createDefaultDevice();
    }
  } catch (const std::exception& e) {
    throw DistributedError("rendezvous: Gloo cannot bind to " + bind +
                           "; set distributed.interface to the network interface of this "
                           "machine that the others can reach (e.g. eth0): " +
                           plain_message(e));
  }
  const std::string r = std::to_string(opts.rank);
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(to_ms(opts.timeout_s));
    gloo_options->devices.push_back(device);
    if (opts.threads > 0) gloo_options->threads = opts.threads;
    cpu = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("gloo", store), opts.rank, opts.world_size,
        gloo_options);
  } catch (const std::exception& e) {
    throw DistributedError("rendezvous: rank " + r + " could not connect Gloo (bound to " + bind +
                           ") to every peer: " + plain_message(e));
  }
#ifdef TRAINER_WITH_CUDA
  if (backend_name == "nccl") {
    // No blocking wait: a wait only makes the CUDA stream wait, and the host never blocks inside
    // a step. The trainer's own polling wait (wait_device) gives up at distributed.timeout_s,
    // aborts the communicators and exits 4 naming the silent task; NCCL's watchdog, with its
    // timeout a minute later, is only the backstop. CleanUpOnly (2): on an NCCL error the
    // watchdog aborts the communicators and fails the work instead of killing the process, so
    // the error reaches that wait. A user's own settings of these variables are kept.
    ::setenv("NCCL_ASYNC_ERROR_HANDLING", "2", 0);
    ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", 0);
    if (!opts.interface.empty()) ::setenv("NCCL_SOCKET_IFNAME", opts.interface.c_str(), 0);
    try {
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = to_ms(opts.timeout_s + 60);
      cuda = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>("nccl", store), opts.rank, opts.world_size,
          nccl_options);
    } catch (const std::exception& e) {
      throw DistributedError("rendezvous: rank " + r +
                             " could not create the NCCL group: " + plain_message(e));
    }
  }
#endif
}

}  // namespace trainer::dist
