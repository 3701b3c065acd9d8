// Test helpers for dist/: a free loopback port, and N ranks run as threads of this process,
// each with its own real ProcessGroup (Gloo over 127.0.0.1), as gloo's own tests do. Catch2's
// assertions are not thread-safe: rank functions return values, the test asserts after join.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#include "trainer/dist/process_group.h"

namespace trainer::dist::testing {

// LibTorch 2.x keeps one flight recorder per process, and a group's first collective inserts the
// group into a std::map of it before taking its mutex (c10d::FlightRecorder::
// recordWithResetEnabled, FlightRecorderDetail.hpp). With one group per process, as the trainer
// has, nothing races; with ranks run as threads here, two groups' collectives do (LibTorch 2.11:
// a SIGSEGV in std::_Rb_tree_insert_and_rebalance under ProcessGroupGloo::enqueue, about 1 run in
// 40 of "GradientSync averages gradients across ranks"). The recorder is off for every process
// that includes this file, set before main() and so before any group exists; 1.13 has none.
inline const bool kFlightRecorderOff = [] {
  ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/1);
  return true;
}();

// A port nothing listens on right now (bound to port 0, then released).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_port: socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("free_port: bind() failed");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

inline DistOptions loopback_options(int rank, int world, int port) {
  DistOptions o;
  o.rank = rank;
  o.world_size = world;
  o.chief_host = "127.0.0.1";
  o.chief_port = port;
  o.own_host = "127.0.0.1";
  o.backend = "gloo";
  o.rendezvous_timeout_s = 20;
  o.timeout_s = 20;
  return o;
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The message of the E that f() throws; otherwise a text that no test expects.
template <class E, class F>
std::string what_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<another exception type> ") + e.what();
  }
  return "<no exception>";
}

// Runs fn(rank, group) for every rank on its own thread, each connected on a fresh port; returns
// the results in rank order after all threads joined; rethrows the lowest rank's exception.
template <class Fn>
auto run_ranks(
    int world, Fn fn, const std::function<void(DistOptions&)>& tweak = [](DistOptions&) {}) {
  using Result = std::invoke_result_t<Fn&, int, ProcessGroup&>;
  const int port = free_port();
  std::vector<Result> results(static_cast<size_t>(world));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto options = loopback_options(r, world, port);
        tweak(options);
        auto group = ProcessGroup::connect(options);
        results[r] = fn(r, *group);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return results;
}

}  // namespace trainer::dist::testing
