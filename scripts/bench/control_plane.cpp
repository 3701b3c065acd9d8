// Benchmark (not a test) of the control plane at scale: the trainer's own rendezvous, job
// agreement (ProcessGroup::first_differing, what verify_same_job uses), liveness and failure
// propagation, for N ranks on one host, without models or Gloo meshes (DistOptions::mesh =
// false). Ranks are threads in a few child processes of this one, each with its own store
// connections and heartbeat, against the real c10d TCPStore the chief (rank 0) hosts. The last
// rank runs alone in a process of its own, which is SIGKILLed once every rank has been in steady
// state for a while; the others are then waiting in a collective that rank never joins, and
// only liveness can tell them why (there is no mesh whose sockets would close).
//
//   control_plane_bench N [N ...]     one JSON line per N on stdout:
//     ranks, meet_s (start to the last rank's connect() returning), agree_s (to the last rank's
//     agreement), store_ops_per_s (all ranks' store requests per second in steady state: no
//     collective waiting), store_ops_per_s_waiting (the same while all wait on the killed rank),
//     heartbeat_median_ms / heartbeat_p95_ms (one heartbeat's round trip, steady state),
//     death_to_exit_s (the SIGKILL to the last process's exit), named (ranks whose error named the
//     killed rank), processes.
// Environment: CONTROL_PLANE_STEADY_S (default 10), the steady-state window.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "dist_test_util.h"  // tests/unit/dist: free_port, loopback_options
#include "trainer/dist/process_group.h"
#include "trainer/util/open_files.h"
#include "trainer/util/signals.h"

namespace {

using trainer::dist::DistOptions;
using trainer::dist::ProcessGroup;

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // the same clock in every process on this host
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

double seconds_between(int64_t from_ns, int64_t to_ns) { return (to_ns - from_ns) / 1e9; }

double steady_seconds() {
  const char* v = std::getenv("CONTROL_PLANE_STEADY_S");
  return v != nullptr ? std::atof(v) : 10.0;
}

// ---- a child process: ranks [first, first + count) as threads ---------------------------------

std::mutex g_out;

void say(const nlohmann::json& line) {
  std::lock_guard<std::mutex> lock(g_out);
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

void run_rank(int rank, int world, int port, int64_t start_ns, double steady_s, bool victim) {
  nlohmann::json out{{"rank", rank}};
  try {
    DistOptions o = trainer::dist::testing::loopback_options(rank, world, port);
    o.mesh = false;
    o.rendezvous_timeout_s = 600;
    o.timeout_s = 120;
    auto group = ProcessGroup::connect(o);
    out["meet_s"] = seconds_between(start_ns, now_ns());
    // The job agreement: every rank's description against the chief's (the trainer's is a few
    // KB: every job-spec field, two listing digests, the version).
    const std::string description(4096, 'j');
    if (group->first_differing("job", description)) throw std::runtime_error("descriptions differ");
    out["agree_s"] = seconds_between(start_ns, now_ns());
    // Steady state: every rank training (here: sleeping), only liveness talks to the store.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const int64_t ops0 = group->control_stats().store_operations;
    const int64_t t0 = now_ns();
    std::this_thread::sleep_for(std::chrono::duration<double>(steady_s));
    const auto stats = group->control_stats();
    out["window_s"] = seconds_between(t0, now_ns());
    out["ops"] = stats.store_operations - ops0;
    const size_t recent = std::min(stats.heartbeat_ms.size(), static_cast<size_t>(steady_s));
    out["beat_ms"] =
        std::vector<double>(stats.heartbeat_ms.end() - recent, stats.heartbeat_ms.end());
    out["phase"] = "steady";
    say(out);
    if (victim) {
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // until SIGKILL
    }
    // A collective the killed rank never joins: only liveness can end it.
    // (Each ask takes 50 ms, as a slow device query might: a thousand threads asking every few
    // milliseconds would measure the CPUs, not the control plane.)
    std::string error;
    const int64_t wait_ops = group->control_stats().store_operations;
    const int64_t wait_ns = now_ns();
    try {
      group->wait_device("a collective", [] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return false;
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
    const int64_t end_ns = now_ns();
    out = {{"rank", rank},
           {"phase", "exit"},
           {"t_ns", end_ns},
           {"error", error},
           {"waiting_ops_per_s", (group->control_stats().store_operations - wait_ops) /
                                     seconds_between(wait_ns, end_ns)}};
    group->leave_after_failure(std::nullopt, 15);
    say(out);
  } catch (const std::exception& e) {
    say({{"rank", rank}, {"phase", "failed"}, {"error", e.what()}, {"t_ns", now_ns()}});
  }
}

int run_child(int argc, char** argv) {
  if (argc != 9) return 2;
  const int port = std::atoi(argv[2]);
  const int world = std::atoi(argv[3]);
  const int first = std::atoi(argv[4]);
  const int count = std::atoi(argv[5]);
  const int64_t start_ns = std::atoll(argv[6]);
  const double steady_s = std::atof(argv[7]);
  const bool victim = std::string(argv[8]) == "victim";
  spdlog::set_level(spdlog::level::err);
  trainer::util::ignore_sigpipe();
  std::vector<std::thread> ranks;
  for (int r = first; r < first + count; ++r) {
    ranks.emplace_back(run_rank, r, world, port, start_ns, steady_s, victim);
  }
  for (auto& t : ranks) t.join();
  std::fflush(stdout);
  ::_exit(0);  // the groups are leaked on purpose after a failure: no destructors to wait for
}

// ---- the coordinator ------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int fd = -1;  // its stdout
  std::string pending;
  int64_t exit_ns = 0;
  bool victim = false;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1) + 0.5)];
}

nlohmann::json run_size(int n, const std::string& self) {
  const int port = trainer::dist::testing::free_port();
  const double steady_s = steady_seconds();
  const int others = n - 1;  // ranks 0..n-2 in the shared processes, rank n-1 alone
  const int processes = std::max(1, std::min(16, (others + 63) / 64));
  const int64_t start_ns = now_ns();
  std::vector<Child> children;
  auto spawn = [&](int first, int count, bool victim) {
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) std::exit(1);
    Child c;
    c.victim = victim;
    c.pid = ::fork();
    if (c.pid == 0) {
      ::dup2(pipefd[1], 1);
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 2);
      const std::vector<std::string> args = {self,
                                             "--child",
                                             std::to_string(port),
                                             std::to_string(n),
                                             std::to_string(first),
                                             std::to_string(count),
                                             std::to_string(start_ns),
                                             std::to_string(steady_s),
                                             victim ? "victim" : "rank"};
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(self.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(pipefd[1]);
    c.fd = pipefd[0];
    children.push_back(c);
  };
  for (int p = 0, first = 0; p < processes; ++p) {
    const int count = others / processes + (p < others % processes ? 1 : 0);
    spawn(first, count, false);
    first += count;
  }
  spawn(n - 1, 1, true);

  std::vector<nlohmann::json> steady, exits, failed;
  int64_t killed_ns = 0;
  const int64_t give_up_ns = start_ns + int64_t{600} * 1000000000;
  for (;;) {
    // Reap.
    for (auto& c : children) {
      if (c.exit_ns != 0) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) == c.pid) c.exit_ns = now_ns();
    }
    const bool all_out = std::all_of(children.begin(), children.end(),
                                     [](const Child& c) { return c.exit_ns != 0 && c.fd < 0; });
    if (all_out) break;
    if (now_ns() > give_up_ns) {
      for (auto& c : children) ::kill(c.pid, SIGKILL);
      for (auto& c : children) ::waitpid(c.pid, nullptr, 0);
      return {{"ranks", n}, {"error", "gave up after 600 s"}};
    }
    std::vector<pollfd> fds;
    std::vector<Child*> who;
    for (auto& c : children) {
      if (c.fd < 0) continue;
      fds.push_back({c.fd, POLLIN, 0});
      who.push_back(&c);
    }
    ::poll(fds.data(), fds.size(), 50);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      char buf[65536];
      const ssize_t got = ::read(fds[k].fd, buf, sizeof buf);
      if (got <= 0) {
        ::close(who[k]->fd);
        who[k]->fd = -1;
        continue;
      }
      who[k]->pending.append(buf, static_cast<size_t>(got));
      for (size_t nl; (nl = who[k]->pending.find('\n')) != std::string::npos;) {
        const auto line = nlohmann::json::parse(who[k]->pending.substr(0, nl));
        who[k]->pending.erase(0, nl + 1);
        const std::string phase = line.value("phase", "");
        if (phase == "steady") steady.push_back(line);
        if (phase == "exit") exits.push_back(line);
        if (phase == "failed") failed.push_back(line);
      }
    }
    if (killed_ns == 0 && static_cast<int>(steady.size()) == n) {
      // Every rank has been in steady state; the others now wait in the collective.
      std::this_thread::sleep_for(std::chrono::seconds(2));
      ::kill(children.back().pid, SIGKILL);
      killed_ns = now_ns();
    }
    if (killed_ns == 0 && !failed.empty()) {
      for (auto& c : children) ::kill(c.pid, SIGKILL);
    }
  }

  nlohmann::json result{{"ranks", n}, {"processes", processes + 1}};
  if (!failed.empty() || static_cast<int>(steady.size()) != n) {
    result["error"] = failed.empty() ? std::string("not every rank reached steady state")
                                     : failed.front().value("error", "");
    result["failed_ranks"] = failed.size();
    return result;
  }
  double meet = 0, agree = 0, ops_per_s = 0;
  std::vector<double> beats;
  for (const auto& s : steady) {
    meet = std::max(meet, s["meet_s"].get<double>());
    agree = std::max(agree, s["agree_s"].get<double>());
    ops_per_s += s["ops"].get<double>() / s["window_s"].get<double>();
    for (double b : s["beat_ms"]) beats.push_back(b);
  }
  int64_t last_exit = 0;
  for (const auto& c : children) {
    if (!c.victim) last_exit = std::max(last_exit, c.exit_ns);
  }
  const std::string victim_name = "rank " + std::to_string(n - 1) + " (silent";
  int named = 0;
  for (const auto& e : exits) {
    if (e["error"].get<std::string>().find(victim_name) != std::string::npos) ++named;
  }
  result["meet_s"] = meet;
  result["agree_s"] = agree;
  result["store_ops_per_s"] = ops_per_s;
  result["heartbeat_median_ms"] = percentile(beats, 0.5);
  result["heartbeat_p95_ms"] = percentile(beats, 0.95);
  result["death_to_exit_s"] = seconds_between(killed_ns, last_exit);
  double waiting = 0;
  for (const auto& e : exits) waiting += e["waiting_ops_per_s"].get<double>();
  result["store_ops_per_s_waiting"] = waiting;
  std::vector<double> failed_at;  // when each rank's collective failed
  for (const auto& e : exits)
    failed_at.push_back(seconds_between(killed_ns, e["t_ns"].get<int64_t>()));
  result["death_to_first_failure_s"] = percentile(failed_at, 0);
  result["death_to_last_failure_s"] = percentile(failed_at, 1);
  result["named"] = named;
  result["exited"] = exits.size();
  if (!exits.empty() && named < static_cast<int>(exits.size())) {
    for (const auto& e : exits) {
      if (e["error"].get<std::string>().find(victim_name) == std::string::npos) {
        result["unnamed_error"] = e["error"];
        break;
      }
    }
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--child") return run_child(argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s N [N ...]   (ranks; one JSON line per N)\n", argv[0]);
    return 2;
  }
  trainer::util::raise_open_file_limit();  // the children inherit it
  trainer::util::ignore_sigpipe();
  std::string self = "/proc/self/exe";
  char path[4096];
  const ssize_t len = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (len > 0) self.assign(path, static_cast<size_t>(len));
  int rc = 0;
  for (int i = 1; i < argc; ++i) {
    const int n = std::atoi(argv[i]);
    if (n < 2) {
      std::fprintf(stderr, "control_plane_bench: ranks must be at least 2, got '%s'\n", argv[i]);
      return 2;
    }
    nlohmann::json result;
    try {
      result = run_size(n, self);
    } catch (const std::exception& e) {
      result = {{"ranks", n}, {"error", e.what()}};
    }
    if (result.contains("error")) rc = 1;
    std::printf("%s\n", result.dump().c_str());
    std::fflush(stdout);
  }
  return rc;
}
