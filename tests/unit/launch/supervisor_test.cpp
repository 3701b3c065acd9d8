// `trainer launch` with /bin/sh as the stand-in program: the TF_CONFIG every process receives
// (checked with the real parse_tf_config), line prefixes on stdout and stderr, a failing process
// stopping the others, SIGTERM/SIGINT forwarding, start failures, no leaked pipes, and free-port
// picking. Nothing here listens on a port, so fixed ports are safe.
#include "common/catch.h"
#include "common/log_capture.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/launch/plan.h"
#include "trainer/launch/supervisor.h"
#include "trainer/util/error.h"

using trainer::cluster::parse_tf_config;
using trainer::cluster::port_of;
using trainer::launch::LaunchOptions;
using trainer::launch::pick_free_ports;
using trainer::launch::run_launch;
using trainer::test::Contains;

namespace {

// An anonymous temporary file the launcher writes into; read back after (or during) the run.
class Capture {
 public:
  Capture() : file_(std::tmpfile()) { REQUIRE(file_ != nullptr); }
  ~Capture() { std::fclose(file_); }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

  int fd() const { return fileno(file_); }
  std::string text() const {
    std::string out;
    char buf[4096];
    for (off_t at = 0;;) {
      const ssize_t n = ::pread(fd(), buf, sizeof buf, at);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
      at += n;
    }
    return out;
  }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    std::istringstream in(text());
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }

 private:
  std::FILE* file_;
};

// `sh -c script` as every process of the cluster, its output captured.
LaunchOptions sh_cluster(const std::string& script, int workers, bool chief, const Capture& out,
                         const Capture& err) {
  LaunchOptions o;
  o.workers = workers;
  o.chief = chief;
  o.program = "/bin/sh";
  o.args = {"-c", script};
  o.stdout_fd = out.fd();
  o.stderr_fd = err.fd();
  return o;
}

// A shell test that is true in the process whose task is `type` / `index` (nlohmann::json
// writes the task object with sorted keys: {"index":1,"type":"worker"}).
std::string is_task(const std::string& type, int index) {
  return "case \"$TF_CONFIG\" in *'\"index\":" + std::to_string(index) + ",\"type\":\"" + type +
         "\"'*) true;; *) false;; esac";
}

using trainer::test_support::LogCapture;  // tests/common/log_capture.h

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("pick_free_ports: distinct ports that can be bound") {
  const auto ports = pick_free_ports("127.0.0.1", 6);
  REQUIRE(ports.size() == 6);
  CHECK(std::set<int>(ports.begin(), ports.end()).size() == 6);
  for (int p : ports) {
    CHECK(p > 0);
    CHECK(p <= 65535);
  }
  // Usually still free a moment later (someone else may take one; bind at least one of them).
  int bound = 0;
  for (int p : ports) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(p));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) ++bound;
    ::close(s);
  }
  CHECK(bound > 0);
  CHECK_THROWS_AS(pick_free_ports("no-such-host.invalid", 1), trainer::DistributedError);
}

TEST_CASE("run_launch: every process gets its own TF_CONFIG and the rest of the environment") {
  Capture out, err;
  LogCapture log;
  ::setenv("TF_CONFIG", R"({"cluster": {"ps": ["x:1"]}})", 1);  // replaced, not passed on
  ::setenv("LAUNCHER_TEST_VAR", "kept", 1);
  SECTION("free ports, with a chief") {
    auto o =
        sh_cluster(R"(echo "$TF_CONFIG"; echo "env=$LAUNCHER_TEST_VAR" >&2)", 2, true, out, err);
    REQUIRE(run_launch(o) == 0);
    const auto lines = out.lines();
    REQUIRE(lines.size() == 3);
    std::map<std::string, trainer::cluster::ClusterSpec> by_prefix;
    for (const auto& line : lines) {
      const size_t close = line.find("] ");
      REQUIRE(close != std::string::npos);
      by_prefix[line.substr(0, close + 2)] = parse_tf_config(line.substr(close + 2));
    }
    REQUIRE(by_prefix.count("[chief] "));
    REQUIRE(by_prefix.count("[worker 0] "));
    REQUIRE(by_prefix.count("[worker 1] "));
    const auto& chief = by_prefix["[chief] "];
    CHECK(chief.is_chief());
    CHECK(chief.rank == 0);
    CHECK(chief.world_size == 3);
    CHECK(by_prefix["[worker 0] "].rank == 1);
    CHECK(by_prefix["[worker 1] "].rank == 2);
    std::set<int> ports;
    for (auto& [prefix, spec] : by_prefix) {
      CHECK(spec.worker_addresses == chief.worker_addresses);
      CHECK(spec.own_address == spec.worker_addresses[static_cast<size_t>(spec.rank)]);
      ports.insert(port_of(spec.own_address));
    }
    CHECK(ports.size() == 3);
    CHECK(*ports.begin() > 0);
    const std::string e = err.text();
    CHECK(count_of(e, "env=kept\n") == 3);
    CHECK_THAT(e, Contains("[chief] env=kept\n") && Contains("[worker 1] env=kept\n"));
    CHECK_THAT(log.text(), Contains("TF_CONFIG is set here; each process gets its own instead"));
  }
  SECTION("a fixed base port, workers only: consecutive ports") {
    auto o = sh_cluster(R"(echo "$TF_CONFIG")", 3, false, out, err);
    o.base_port = 41000;  // nothing binds it: the stand-in only prints
    REQUIRE(run_launch(o) == 0);
    const auto lines = out.lines();
    REQUIRE(lines.size() == 3);
    for (const auto& line : lines) {
      const size_t close = line.find("] ");
      const auto spec = parse_tf_config(line.substr(close + 2));
      CHECK(line.substr(0, close + 2) == "[worker " + std::to_string(spec.task_index) + "] ");
      CHECK(spec.task_type == "worker");
      CHECK(spec.rank == spec.task_index);
      CHECK(spec.own_address == "127.0.0.1:" + std::to_string(41000 + spec.task_index));
      CHECK(spec.chief_address == "127.0.0.1:41000");
    }
  }
  ::unsetenv("TF_CONFIG");
  ::unsetenv("LAUNCHER_TEST_VAR");
}

TEST_CASE("run_launch: every training process gets LOCAL_RANK and LOCAL_WORLD_SIZE") {
  Capture out, err;
  ::setenv("LOCAL_RANK", "7", 1);  // the launcher's own: replaced, never passed on
  ::setenv("LOCAL_WORLD_SIZE", "8", 1);
  auto o = sh_cluster(R"(echo "local=${LOCAL_RANK-unset}/${LOCAL_WORLD_SIZE-unset}")", 2, true, out,
                      err);
  o.evaluator = true;
  o.base_port = 42000;  // nothing binds it: the stand-in only prints
  const int code = run_launch(o);
  ::unsetenv("LOCAL_RANK");
  ::unsetenv("LOCAL_WORLD_SIZE");
  REQUIRE(code == 0);
  const std::string text = out.text();
  CHECK_THAT(text, Contains("[chief] local=0/3\n"));
  CHECK_THAT(text, Contains("[worker 0] local=1/3\n"));
  CHECK_THAT(text, Contains("[worker 1] local=2/3\n"));
  CHECK_THAT(text, Contains("[evaluator] local=unset/unset\n"));
}

TEST_CASE(
    "run_launch: each line is prefixed, stdout and stderr kept apart, partial lines flushed") {
  Capture out, err;
  LogCapture log;
  auto o = sh_cluster(
      R"(echo one; echo two; echo oops >&2; printf 'a\rb\n'; printf 'last without newline')", 2,
      false, out, err);
  REQUIRE(run_launch(o) == 0);
  const std::string text = out.text();
  for (const std::string p : {"[worker 0] ", "[worker 1] "}) {
    CHECK_THAT(text, Contains(p + "one\n" + p + "two\n"));
    CHECK_THAT(text, Contains(p + "a\rb\n"));
    CHECK_THAT(text, Contains(p + "last without newline\n"));
  }
  CHECK(err.text().find("[worker 0] oops\n") != std::string::npos);
  CHECK(err.text().find("[worker 1] oops\n") != std::string::npos);
  CHECK_THAT(err.text(), !Contains("one"));
  CHECK(out.lines().size() == 8);
  for (const auto& line : out.lines()) CHECK(line.rfind("[worker ", 0) == 0);
}

TEST_CASE("run_launch: the first failure stops the others and its code is returned") {
  Capture out, err;
  LogCapture log;
  const auto start = std::chrono::steady_clock::now();
  SECTION("a worker exits 3; the others are stopped with SIGTERM") {
    // The others run a child of their own (sleep): the whole process group is stopped.
    auto o = sh_cluster(
        "if " + is_task("worker", 1) + "; then echo failing; exit 3; fi; " + "sleep 30; echo never",
        3, true, out, err);
    CHECK(run_launch(o) == 3);
    CHECK_THAT(out.text(), Contains("[worker 1] failing\n") && !Contains("never"));
    CHECK_THAT(log.text(), Contains("worker 1 failed first (exit code 3); stopping the others"));
  }
  SECTION("a process killed by a signal counts as 128 + signal") {
    auto o = sh_cluster("if " + is_task("worker", 0) + "; then kill -9 $$; fi; sleep 30", 2, false,
                        out, err);
    CHECK(run_launch(o) == 137);
  }
  SECTION("a process that ignores SIGTERM is killed after the grace period") {
    // The chief fails once the worker ignores SIGTERM (the worker says so with a file).
    char dir[] = "/tmp/launcher_test_XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    const std::string ready = std::string(dir) + "/ready";
    auto o = sh_cluster("if " + is_task("chief", 0) + "; then while [ ! -e " + ready +
                            " ]; do sleep 0.01; done; exit 5; fi; trap '' TERM; touch " + ready +
                            "; sleep 30",
                        1, true, out, err);
    o.stop_grace_s = 0.3;
    CHECK(run_launch(o) == 5);
    CHECK(seconds_since(start) >= 0.3);
    CHECK_THAT(log.text(), Contains("worker 0 did not stop within 0.3 s of SIGTERM; killing it"));
    std::filesystem::remove_all(dir);
  }
  SECTION("a program that cannot be started is exit 127") {
    auto o = sh_cluster("true", 2, false, out, err);
    o.program = "/nonexistent/trainer";
    CHECK(run_launch(o) == 127);
    CHECK_THAT(log.text(), Contains("cannot start worker 0: /nonexistent/trainer: No such file"));
  }
  CHECK(seconds_since(start) < 5);
}

TEST_CASE("run_launch: after an exit 4 the others stop on their own before any SIGTERM") {
  Capture out, err;
  LogCapture log;
  // Worker 1 loses a peer first (exit 4); the others meet the same loss a moment later and exit
  // 4 themselves. A SIGTERM before that would have them say got-signal and exit 7 instead.
  auto o = sh_cluster("trap 'echo got-signal; exit 7' TERM; if " + is_task("worker", 1) +
                          "; then exit 4; fi; i=0; while [ $i -lt 10 ]; do sleep 0.05; "
                          "i=$((i+1)); done; echo own-cause; exit 4",
                      2, true, out, err);
  const auto start = std::chrono::steady_clock::now();
  CHECK(run_launch(o) == 4);
  CHECK(count_of(out.text(), "own-cause\n") == 2);
  CHECK_THAT(out.text(), !Contains("got-signal"));
  CHECK_THAT(log.text(), Contains("worker 1 failed first (exit code 4); stopping the others that "
                                  "have not stopped on their own within 5 s"));
  CHECK(seconds_since(start) < 5);
}

TEST_CASE("run_launch: after an exit 4, what has not stopped within 5 s gets SIGTERM") {
  Capture out, err;
  LogCapture log;
  auto o = sh_cluster("trap 'echo got-signal; exit 7' TERM; if " + is_task("worker", 0) +
                          "; then exit 4; fi; while :; do sleep 0.05; done",
                      1, true, out, err);
  const auto start = std::chrono::steady_clock::now();
  CHECK(run_launch(o) == 4);
  CHECK(count_of(out.text(), "got-signal\n") == 1);
  CHECK(seconds_since(start) >= 5);
  CHECK(seconds_since(start) < 10);
}

TEST_CASE("run_launch: SIGTERM and SIGINT to the launcher are forwarded to every process") {
  const int sig = GENERATE(SIGTERM, SIGINT);
  Capture out, err;
  LogCapture log;
  // Each process says it is ready, then waits; on the signal it says so and exits 7. (Short
  // sleeps: a signal that reaches a forked `sleep` before its exec is lost; the shell's trap
  // then runs when that sleep ends.) Each gets the signal once: a process that has been sent
  // the forwarded signal is not sent SIGTERM again when the first one exits.
  auto o = sh_cluster(
      "trap 'echo got-signal; exit 7' TERM INT; echo ready; "
      "while :; do sleep 0.05; done",
      2, true, out, err);
  const auto start = std::chrono::steady_clock::now();
  std::thread sender([&] {
    // Signal once every process is running (inside run_launch, so its handlers are installed).
    while (count_of(out.text(), "ready\n") < 3 && seconds_since(start) < 5) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(::getpid(), sig);
  });
  const int code = run_launch(o);
  sender.join();
  CHECK(code == 7);
  CHECK(count_of(out.text(), "got-signal\n") == 3);
  CHECK_THAT(log.text(), Contains(std::string("got ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
                                  "; forwarding it to the processes"));
  CHECK_THAT(log.text(), Contains("stopped first (exit code 7) after the forwarded signal"));
  CHECK(seconds_since(start) < 5);
}

TEST_CASE("run_launch: children inherit no pipe of the launcher's but their stdout and stderr") {
  // Pipes this test process already had (from whoever started it) may be inherited; none that
  // run_launch creates (the other children's output, its self-pipe) may be.
  std::set<std::string> preexisting;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    preexisting.insert(std::filesystem::read_symlink(entry.path(), ec).string());
  }
  Capture out, err;
  LogCapture log;
  auto o = sh_cluster("ls -l /proc/$$/fd; echo checked", 3, false, out, err);
  REQUIRE(run_launch(o) == 0);
  CHECK(count_of(out.text(), "checked\n") == 3);
  int own_pipes = 0;
  for (const auto& line : out.lines()) {
    const size_t arrow = line.find(" -> ");
    if (arrow == std::string::npos) continue;
    const std::string target = line.substr(arrow + 4);
    const std::string fd =
        line.substr(line.rfind(' ', arrow - 1) + 1, arrow - line.rfind(' ', arrow - 1) - 1);
    if (target.rfind("pipe:", 0) != 0) continue;
    if (fd == "1" || fd == "2") {
      ++own_pipes;
    } else {
      INFO(line);
      CHECK(preexisting.count(target) == 1);
    }
  }
  CHECK(own_pipes == 6);
}
