#include "trainer/launch/supervisor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "trainer/util/cpu.h"
#include "trainer/util/error.h"

extern char** environ;  // NOLINT: POSIX

namespace trainer::launch {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxLine = 64 * 1024;  // a longer line without '\n' is passed on in pieces
constexpr auto kDrainAfterExit = std::chrono::seconds(1);  // output after the last exit
constexpr double kSettleS = 5;  // after an exit 4, the others' time to stop on their own

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }

Clock::time_point seconds_from_now(double s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

int ms_until(Clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms + 1, 0, 1000));
}

// ---- descriptors and pipes ---------------------------------------------------------------------

// Moves a new descriptor above 0..2 so that the child's dup2() onto 0..2 cannot clobber it.
int above_stdio(int fd) {
  if (fd > 2) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  ::close(fd);
  if (moved < 0) throw Error(ErrorKind::kInternal, sys_error("launch: fcntl(F_DUPFD_CLOEXEC)"));
  return moved;
}

struct UniqueFd {
  int fd = -1;
  explicit UniqueFd(int f) : fd(f) {}
  ~UniqueFd() {
    if (fd >= 0) ::close(fd);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
};

struct Pipe {
  int read = -1;
  int write = -1;
};

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw Error(ErrorKind::kInternal, sys_error("launch: pipe2"));
  return {above_stdio(fds[0]), above_stdio(fds[1])};
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Writes everything or gives up quietly (a closed terminal must not stop the cluster).
void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return;
    }
  }
}

// ---- output streams ----------------------------------------------------------------------------

// One child's stdout or stderr: reads what the pipe has and writes whole lines, prefixed.
struct Stream {
  int fd = -1;         // read end; -1 once at EOF
  int out_fd = -1;     // where the prefixed lines go
  std::string prefix;  // "[worker 1] "
  std::string buffer;  // the start of a line not yet complete

  std::string last_error;  // the message of the last line logged at level error

  void emit(bool flush_partial) {
    std::string out;
    size_t start = 0;
    for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
      out += prefix;
      out.append(buffer, start, nl + 1 - start);
      remember_error(buffer.substr(start, nl - start));
    }
    buffer.erase(0, start);
    if (!buffer.empty() && (flush_partial || buffer.size() >= kMaxLine)) {
      out += prefix + buffer + "\n";
      buffer.clear();
    }
    if (!out.empty()) write_all(out_fd, out);
  }

  // spdlog's "<date> <time> error <message>" lines: keep the message (the cause of a failure).
  void remember_error(const std::string& line) {
    static const std::string kLevel = " error ";
    const size_t at = line.find(kLevel);
    if (at != std::string::npos && at < 32) last_error = line.substr(at + kLevel.size());
  }

  // Reads once; false at EOF (or a read error), after flushing a partial last line.
  bool read_some() {
    char chunk[kReadChunk];
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {
      emit(/*flush_partial=*/true);
      close_fd(fd);
      return false;
    }
    buffer.append(chunk, static_cast<size_t>(n));
    emit(/*flush_partial=*/false);
    return true;
  }

  void close_now() {
    if (fd < 0) return;
    emit(/*flush_partial=*/true);
    close_fd(fd);
  }
};

// ---- children ----------------------------------------------------------------------------------

struct Child {
  LaunchTask task;
  std::vector<int> cpus;  // its affinity mask; empty = the launcher's
  pid_t pid = -1;         // also its process group
  bool running = false;
  bool asked_to_stop = false;  // a SIGINT/SIGTERM was sent to its group
  int exit_code = 0;           // once !running: the exit status, or 128 + signal
  Stream out, err;

  bool streams_open() const { return out.fd >= 0 || err.fd >= 0; }
  void signal_group(int sig) const {
    if (pid > 0) ::kill(-pid, sig);  // the child and whatever it started
  }
};

// Every child this launch started; the destructor kills and reaps those still running, so an
// exception never leaves orphans.
struct ChildSet {
  std::vector<Child> children;
  ~ChildSet() {
    for (auto& c : children) {
      if (c.running) {
        c.signal_group(SIGKILL);
        int status = 0;
        while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
        }
      }
      close_fd(c.out.fd);
      close_fd(c.err.fd);
    }
  }
};

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// The absolute path execve() gets: "" = this binary; a name without '/' is looked up in PATH.
std::string resolve_program(const std::string& program) {
  if (program.empty()) {
    std::vector<char> buf(4096);
    const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
    return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : "/proc/self/exe";
  }
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    const size_t colon = std::min(dirs.find(':', start), dirs.size());
    std::string dir = dirs.substr(start, colon - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = colon + 1;
  }
  return program;  // execve fails with ENOENT, reported like any other start failure
}

// This process's environment, "NAME=value" each.
std::vector<std::string> launcher_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Forks and execs one child; returns the errno of a failed exec (0 = started).
int start_child(Child& child, const std::string& program, const std::vector<std::string>& args,
                int out_fd, int err_fd, int devnull) {
  // Everything the child needs is built before fork(): after it, only async-signal-safe calls.
  std::vector<std::string> argv_s = {program};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s = child_environment(launcher_environment(), child.task);
  std::vector<char*> argv = c_strings(argv_s);
  std::vector<char*> envp = c_strings(env_s);

  Pipe out = make_pipe();
  Pipe err = make_pipe();
  Pipe status = make_pipe();  // CLOEXEC: EOF = exec succeeded; an int = exec's errno
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : child.cpus) CPU_SET(cpu, &cpus);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {out.read, out.write, err.read, err.write, status.read, status.write}) {
      ::close(fd);
    }
    errno = e;
    throw Error(ErrorKind::kInternal, sys_error("launch: fork"));
  }
  if (pid == 0) {
    ::setpgid(0, 0);                     // its own group: signals reach what it starts
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the launcher dies -> the child is asked to stop
    if (::getppid() != parent) ::_exit(127);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (!child.cpus.empty()) ::sched_setaffinity(0, sizeof cpus, &cpus);  // best effort
    ::dup2(devnull, 0);  // in its own group it must not read the terminal
    ::dup2(out.write, 1);
    ::dup2(err.write, 2);
    ::execve(program.c_str(), argv.data(), envp.data());
    const int e = errno;
    ssize_t ignored = ::write(status.write, &e, sizeof e);
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that the group exists before we may signal it
  ::close(out.write);
  ::close(err.write);
  ::close(status.write);
  int exec_errno = 0;
  ssize_t n;
  while ((n = ::read(status.read, &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
  }
  ::close(status.read);
  if (n != static_cast<ssize_t>(sizeof exec_errno)) exec_errno = 0;

  child.pid = pid;
  child.running = true;
  for (int fd : {out.read, err.read}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  const std::string prefix = "[" + child.task.name() + "] ";
  child.out = Stream{out.read, out_fd, prefix, "", ""};
  child.err = Stream{err.read, err_fd, prefix, "", ""};
  return exec_errno;
}

// ---- signals -----------------------------------------------------------------------------------

std::atomic<int> g_wake_fd{-1};
std::atomic<int> g_sigint{0};   // SIGINTs received and not yet forwarded
std::atomic<int> g_sigterm{0};  // SIGTERMs received and not yet forwarded

extern "C" void on_launcher_signal(int sig) {
  const int saved = errno;
  if (sig == SIGINT) g_sigint.fetch_add(1);
  if (sig == SIGTERM) g_sigterm.fetch_add(1);
  const int fd = g_wake_fd.load();
  if (fd >= 0) {
    const char byte = 0;
    ssize_t ignored = ::write(fd, &byte, 1);
    (void)ignored;
  }
  errno = saved;
}

// Installs the launcher's handlers (SIGINT/SIGTERM/SIGCHLD write to a self-pipe, SIGPIPE is
// ignored) and restores the previous ones on destruction.
class SignalScope {
 public:
  SignalScope() : wake_(make_pipe()) {
    for (int fd : {wake_.read, wake_.write}) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    g_sigint = 0;
    g_sigterm = 0;
    g_wake_fd = wake_.write;
    struct sigaction sa {};
    sa.sa_handler = on_launcher_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    ::sigaction(SIGCHLD, &sa, &old_chld_);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
  }
  ~SignalScope() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGCHLD, &old_chld_, nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    g_wake_fd = -1;
    close_fd(wake_.read);
    close_fd(wake_.write);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  int wake_fd() const { return wake_.read; }
  void drain() const {
    char buf[256];
    while (::read(wake_.read, buf, sizeof buf) > 0) {
    }
  }

 private:
  Pipe wake_;
  struct sigaction old_int_ = {};
  struct sigaction old_term_ = {};
  struct sigaction old_chld_ = {};
  struct sigaction old_pipe_ = {};
};

// ---- one start of the whole group --------------------------------------------------------------

// How one start of the whole group ended.
struct GroupOutcome {
  int code = 0;                    // 0, or the exit code of the process that failed first
  std::string task;                // that process ("worker 1")
  std::string cause;               // the last error it logged ("" = none)
  bool stopped_by_signal = false;  // the launcher got SIGINT/SIGTERM and forwarded it
};

// The processes of one start and the deadlines of stopping them. Each step below is one part of
// run_group's loop; their order there is the order of the original single loop.
class Group {
 public:
  Group(const LaunchOptions& options, SignalScope& signals)
      : options_(options), signals_(signals) {}

  // Starts every task, each on its slice of the CPUs; a task that cannot be started (exec
  // failed: exit 127) fails first, and the tasks after it are not started.
  void start(const std::vector<LaunchTask>& tasks, const std::string& program, int devnull) {
    set_.children.reserve(tasks.size());
    const auto slices = options_.pin_cpus
                            ? split_cpus(util::usable_cpus(), static_cast<int>(tasks.size()))
                            : std::vector<std::vector<int>>(tasks.size());
    for (size_t i = 0; i < tasks.size(); ++i) {
      const auto& t = tasks[i];
      Child& c = set_.children.emplace_back();
      c.task = t;
      c.cpus = slices[i];
      if (!c.cpus.empty()) {
        spdlog::info("launch: {} runs on CPU {}", t.name(), fmt::join(c.cpus, ","));
      }
      const int exec_errno =
          start_child(c, program, options_.args, options_.stdout_fd, options_.stderr_fd, devnull);
      if (exec_errno != 0) {
        int status = 0;
        while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
        }
        c.running = false;
        c.exit_code = 127;
        spdlog::error("launch: cannot start {}: {}: {}", t.name(), program,
                      std::strerror(exec_errno));
        fail_first(set_.children.size() - 1);
        break;
      }
    }
  }

  // Forwards the signals the launcher got to every process group still running.
  void forward_signals() {
    for (auto [counter, sig] : {std::pair{&g_sigint, SIGINT}, std::pair{&g_sigterm, SIGTERM}}) {
      if (counter->exchange(0) == 0) continue;
      spdlog::warn("launch: got {}; forwarding it to the processes",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      outcome_.stopped_by_signal = true;
      for (auto& c : set_.children) {
        if (!c.running) continue;
        c.signal_group(sig);
        c.asked_to_stop = true;
      }
    }
  }

  // Collects the exit of every child that has exited; the first failure stops the others.
  void reap() {
    for (size_t i = 0; i < set_.children.size(); ++i) {
      Child& c = set_.children[i];
      if (!c.running) continue;
      int status = 0;
      const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r != c.pid) continue;
      c.running = false;
      c.exit_code = decode_status(status);
      if (c.exit_code == 0) {
        spdlog::info("launch: {} exited with code 0", c.task.name());
      } else if (first_failure_) {
        spdlog::info("launch: {} exited with code {}", c.task.name(), c.exit_code);
      } else {
        fail_first(i);
      }
    }
  }

  // SIGTERM after an exit 4's settling time, SIGKILL after the grace period, and once every
  // child has exited, the output they left open cut after kDrainAfterExit.
  void enforce_deadlines() {
    if (term_at_ && Clock::now() >= *term_at_) stop_others();
    if (kill_at_ && Clock::now() >= *kill_at_) {
      for (const auto& c : set_.children) {
        if (c.running) {
          spdlog::warn("launch: {} did not stop within {} s of SIGTERM; killing it", c.task.name(),
                       options_.stop_grace_s);
        }
        if (c.running || c.streams_open()) c.signal_group(SIGKILL);
      }
      kill_at_.reset();
    }
    if (!any_running() && !drain_until_) drain_until_ = Clock::now() + kDrainAfterExit;
    if (drain_until_ && Clock::now() >= *drain_until_) {
      // Every child has exited; output still held open by something they left behind is cut.
      for (auto& c : set_.children) {
        if (c.streams_open()) c.signal_group(SIGKILL);
        c.out.close_now();
        c.err.close_now();
      }
    }
  }

  // Every child has exited and all their output has been passed on.
  bool finished() const {
    const bool any_open = std::any_of(set_.children.begin(), set_.children.end(),
                                      [](const Child& c) { return c.streams_open(); });
    return !any_running() && !any_open;
  }

  // Waits for output (and passes it on), a signal (SIGCHLD included) or the next deadline.
  void wait_and_copy_output() {
    std::vector<pollfd> fds = {{signals_.wake_fd(), POLLIN, 0}};
    std::vector<Stream*> streams = {nullptr};  // streams[k] reads fds[k]
    for (auto& c : set_.children) {
      for (Stream* s : {&c.out, &c.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
      }
    }
    int timeout = 1000;
    if (kill_at_) timeout = std::min(timeout, ms_until(*kill_at_));
    if (term_at_) timeout = std::min(timeout, ms_until(*term_at_));
    if (drain_until_) timeout = std::min(timeout, ms_until(*drain_until_));
    const int ready = ::poll(fds.data(), fds.size(), timeout);
    if (ready < 0 && errno != EINTR) throw Error(ErrorKind::kInternal, sys_error("launch: poll"));
    if (ready <= 0) return;
    if (fds[0].revents != 0) signals_.drain();
    for (size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents != 0) streams[k]->read_some();
    }
  }

  // Once finished(): which process failed first, with its code and last logged error.
  GroupOutcome outcome() const {
    GroupOutcome outcome = outcome_;
    if (!first_failure_) {
      spdlog::info("launch: all {} processes exited with code 0", set_.children.size());
      return outcome;
    }
    const Child& failed = set_.children[*first_failure_];
    outcome.code = failed.exit_code;
    outcome.task = failed.task.name();
    outcome.cause = failed.err.last_error;
    return outcome;
  }

 private:
  bool any_running() const {
    return std::any_of(set_.children.begin(), set_.children.end(),
                       [](const Child& c) { return c.running; });
  }

  // SIGTERM to every process not yet asked to stop; SIGKILL once the grace period is over.
  void stop_others() {
    term_at_.reset();
    for (auto& other : set_.children) {
      if ((other.running || other.streams_open()) && !other.asked_to_stop) {
        other.signal_group(SIGTERM);
        other.asked_to_stop = true;
      }
    }
    kill_at_ = seconds_from_now(options_.stop_grace_s);
  }

  // Child i failed; if it is the first, says so and stops the others (after an exit 4, only
  // those that have not stopped on their own within the settling time).
  void fail_first(size_t i) {
    if (first_failure_) return;
    first_failure_ = i;
    const Child& c = set_.children[i];
    if (c.asked_to_stop) {
      spdlog::warn(
          "launch: {} stopped first (exit code {}) after the forwarded signal; "
          "stopping the others",
          c.task.name(), c.exit_code);
    } else if (c.exit_code == exit_code(ErrorKind::kDistributed)) {
      // A lost peer or a broken group: every other training process meets the same loss within
      // seconds and stops with its own cause (which peer it lost); a SIGTERM first would turn
      // that into "stopped by signal". Those that have not stopped by then are stopped.
      const double settle = std::min(kSettleS, options_.stop_grace_s);
      spdlog::error(
          "launch: {} failed first (exit code {}); stopping the others that have not stopped "
          "on their own within {} s",
          c.task.name(), c.exit_code, settle);
      term_at_ = seconds_from_now(settle);
      return;
    } else {
      spdlog::error("launch: {} failed first (exit code {}); stopping the others", c.task.name(),
                    c.exit_code);
    }
    stop_others();
  }

  const LaunchOptions& options_;
  SignalScope& signals_;
  ChildSet set_;
  GroupOutcome outcome_;  // stopped_by_signal, until outcome() fills in the rest
  std::optional<size_t> first_failure_;
  std::optional<Clock::time_point> term_at_;      // SIGTERM what still runs at this time
  std::optional<Clock::time_point> kill_at_;      // SIGKILL what still runs at this time
  std::optional<Clock::time_point> drain_until_;  // set once every child has exited
};

// Starts every task and waits until all have exited; when one fails, stops the others.
GroupOutcome run_group(const LaunchOptions& options, const std::vector<LaunchTask>& tasks,
                       const std::string& program, SignalScope& signals, int devnull) {
  Group group(options, signals);
  group.start(tasks, program, devnull);
  for (;;) {
    group.forward_signals();
    group.reap();
    group.enforce_deadlines();
    if (group.finished()) break;
    group.wait_and_copy_output();
  }
  return group.outcome();
}

}  // namespace

std::vector<int> pick_free_ports(const std::string& host, int count) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "0", &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw DistributedError("launch: cannot resolve host '" + host + "': " + ::gai_strerror(rc));
  }
  std::vector<int> sockets;
  std::vector<int> ports;
  std::string failure;
  for (int i = 0; i < count && failure.empty(); ++i) {
    const int s = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
    if (s < 0) {
      failure = sys_error("socket");
      break;
    }
    sockets.push_back(s);
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::bind(s, found->ai_addr, found->ai_addrlen) != 0) {
      failure = sys_error("bind");
    } else if (::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      failure = sys_error("getsockname");
    } else {
      ports.push_back(addr.ss_family == AF_INET6
                          ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                          : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port));
    }
  }
  ::freeaddrinfo(found);
  for (int s : sockets) ::close(s);
  if (!failure.empty()) {
    throw DistributedError("launch: cannot pick a free port on '" + host + "': " + failure);
  }
  return ports;
}

int run_launch(const LaunchOptions& options) {
  validate_options(options);
  const int count = process_count(options);
  const std::string program = resolve_program(options.program);
  if (std::getenv("TF_CONFIG") != nullptr) {
    spdlog::warn("launch: TF_CONFIG is set here; each process gets its own instead");
  }
  SignalScope signals;
  const UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (devnull.fd < 0) throw Error(ErrorKind::kInternal, sys_error("launch: open /dev/null"));
  for (int attempt = 0;; ++attempt) {
    std::vector<int> ports;
    if (options.base_port == 0) {
      ports = pick_free_ports(options.host, count);  // fresh ones for every attempt
    } else {
      for (int i = 0; i < count; ++i) ports.push_back(options.base_port + i);
    }
    const std::vector<LaunchTask> tasks = plan_launch(options, ports);
    spdlog::info("launch: {} processes ({}): {}", count, program, describe_plan(tasks));

    const GroupOutcome out = run_group(options, tasks, program, signals, devnull.fd);
    const std::string cause = out.cause.empty() ? "" : ": " + out.cause;
    switch (decide_restart(out.code, out.stopped_by_signal, attempt, options.max_restarts)) {
      case Restart::kNo:
        return out.code;
      case Restart::kNoAfterSignal:
        spdlog::warn("launch: not restarting: the launcher was asked to stop");
        return out.code;
      case Restart::kNoNotFixable:
        spdlog::error(
            "launch: not restarting: {} failed with exit code {}{}, which a restart would not "
            "fix (only a process that dies, or fails with a data (3) or distributed (4) error, "
            "is restarted)",
            out.task, out.code, cause);
        return out.code;
      case Restart::kNoRestartsLeft:
        spdlog::error("launch: {} failed with exit code {}{}; no restarts left (--max-restarts {})",
                      out.task, out.code, cause, options.max_restarts);
        return out.code;
      case Restart::kYes:
        break;
    }
    spdlog::warn(
        "launch: restart {} of {}: {} failed with exit code {}{}; starting every process again "
        "(they resume from the newest complete checkpoint)",
        attempt + 1, options.max_restarts, out.task, out.code, cause);
  }
}

}  // namespace trainer::launch
