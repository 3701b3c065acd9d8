// Helpers for integration tests: run the real `trainer` binary in a fresh temp dir with a given
// environment, capture stdout/stderr and the exit code; write small files; read metrics.
#pragma once

#include "common/temp_dir.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::testing {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

using trainer::test_support::TempDir;  // tests/common/temp_dir.h

// Runs `trainer ARGS` in `cwd` with extra environment assignments ("K=V"); TF_CONFIG is unset
// unless given.
inline Result run_trainer(const fs::path& cwd, const std::string& args,
                          const std::vector<std::string>& env = {}) {
  const fs::path out = cwd / ".stdout", err = cwd / ".stderr";
  // The kernel-choice cache (train.precision/channels_last auto) in the test's own dir, not in
  // the user's ~/.cache; a test may name another.
  std::string cmd = "cd " + quote(cwd.string()) + " && env -u TF_CONFIG TRAINER_CACHE_DIR=" +
                    quote((cwd / ".trainer-cache").string());
  for (const auto& e : env) cmd += " " + quote(e);
  cmd += " " + quote(TRAINER_BIN) + " " + args + " >" + quote(out.string()) + " 2>" +
         quote(err.string()) + " </dev/null";
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// Runs a shell command quietly; returns its exit status (128 when it did not exit).
inline int sh(const std::string& cmd) {
  const int status = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A trainer started in the background (fork + exec through /bin/sh), for multi-process tests.
class Background {
 public:
  // prefix: a command the trainer runs under (e.g. "ip netns exec NAME"), "" = none.
  Background(const fs::path& cwd, const std::string& args, const std::vector<std::string>& env,
             const std::string& tag, const std::string& prefix = "")
      : out_(cwd / (".stdout-" + tag)), err_(cwd / (".stderr-" + tag)) {
    std::string cmd =
        "cd " + quote(cwd.string()) + " && exec " + prefix +
        " env -u TF_CONFIG TRAINER_CACHE_DIR=" + quote((cwd / ".trainer-cache").string());
    for (const auto& e : env) cmd += " " + quote(e);
    cmd += " " + quote(TRAINER_BIN) + " " + args + " >" + quote(out_.string()) + " 2>" +
           quote(err_.string()) + " </dev/null";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0 && !done_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  pid_t pid() const { return pid_; }
  // Waits for the process; returns its result (exit code, or 128 + signal).
  Result wait() {
    if (!done_) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
      result_.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      done_ = true;
    }
    result_.out = slurp(out_);
    result_.err = slurp(err_);
    return result_;
  }

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  bool done_ = false;
  Result result_;
};

// The pid of the child of `parent` whose TF_CONFIG names task worker `index` (trainer launch's
// processes), or -1 (also once it has exited).
inline pid_t launched_worker(pid_t parent, int index) {
  const std::string want = "\"index\":" + std::to_string(index) + ",\"type\":\"worker\"";
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string pid, comm, state;
    long ppid = 0;
    if (!(stat >> pid >> comm >> state >> ppid) || ppid != parent) continue;
    if (slurp(e.path() / "environ").find(want) != std::string::npos) {
      return static_cast<pid_t>(std::stoi(name));
    }
  }
  return -1;
}

// A TF_CONFIG for `workers` workers (and a chief when `chief`) on 127.0.0.1 from `port` up.
inline std::string tf_config(int workers, bool chief, int port, const std::string& type,
                             int index) {
  auto addr = [](int p) { return "\"127.0.0.1:" + std::to_string(p) + "\""; };
  std::string cluster = "{";
  int p = port;
  if (chief) cluster += "\"chief\": [" + addr(p++) + "], ";
  cluster += "\"worker\": [";
  for (int i = 0; i < workers; ++i) cluster += (i ? ", " : "") + addr(p++);
  cluster += "]}";
  return "TF_CONFIG={\"cluster\": " + cluster + ", \"task\": {\"type\": \"" + type +
         "\", \"index\": " + std::to_string(index) + "}}";
}

// A port no one listens on right now (bind port 0, read it, close), for the chief's store.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Starts one process per task of a `workers`-worker cluster (worker 0 the chief) and waits.
inline std::vector<Result> run_cluster(const fs::path& cwd, int workers, const std::string& args,
                                       const std::vector<std::string>& per_task_args = {}) {
  const int port = free_port();
  std::vector<std::unique_ptr<Background>> procs;
  for (int i = 0; i < workers; ++i) {
    const std::string extra = i < static_cast<int>(per_task_args.size()) ? per_task_args[i] : "";
    procs.push_back(std::make_unique<Background>(
        cwd, args + " " + extra,
        std::vector<std::string>{tf_config(workers, false, port, "worker", i)},
        "w" + std::to_string(i)));
  }
  std::vector<Result> results;
  for (auto& p : procs) results.push_back(p->wait());
  return results;
}

// All records of a metrics.jsonl.
inline std::vector<nlohmann::json> read_metrics(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// The tensors of a safetensors file, as float vectors by name (F32 only; enough here).
inline std::map<std::string, std::vector<float>> read_f32(const fs::path& path) {
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__" || t["dtype"] != "F32") continue;
    const size_t b = t["data_offsets"][0], e = t["data_offsets"][1];
    std::vector<float> v((e - b) / 4);
    std::memcpy(v.data(), bytes.data() + 8 + n + b, e - b);
    out[name] = std::move(v);
  }
  return out;
}

// The largest relative difference between two sets of tensors with the same names and sizes
// (relative to max(|a|, 1e-3)); infinity when names or sizes differ.
inline double largest_relative_difference(const std::map<std::string, std::vector<float>>& a,
                                          const std::map<std::string, std::vector<float>>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (const auto& [name, va] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.size() != va.size()) {
      return std::numeric_limits<double>::infinity();
    }
    for (size_t i = 0; i < va.size(); ++i) {
      const double rel =
          std::abs(va[i] - it->second[i]) / std::max(1e-3, static_cast<double>(std::abs(va[i])));
      worst = std::max(worst, rel);
    }
  }
  return worst;
}

// Writes a small synthetic ImageFolder dataset with the real make-dataset subcommand.
// A tmpfs of `bytes` mounted at `at` for the test's lifetime.
class Tmpfs {
 public:
  Tmpfs(const fs::path& at, uint64_t bytes) : at_(at) {
    fs::create_directories(at);
    if (sh("mount -t tmpfs -o size=" + std::to_string(bytes) + " trainer-test " +
           quote(at.string())) != 0) {
      throw std::runtime_error("cannot mount a tmpfs at " + at.string());
    }
  }
  ~Tmpfs() { sh("umount -l " + quote(at_.string())); }
  void remount(const std::string& options) const {
    if (sh("mount -o remount," + options + " " + quote(at_.string())) != 0) {
      throw std::runtime_error("cannot remount " + at_.string() + " " + options);
    }
  }

  // Whether this machine lets the test mount a tmpfs (root with CAP_SYS_ADMIN).
  static std::string unavailable(const fs::path& probe) {
    if (::geteuid() != 0) return "not root";
    fs::create_directories(probe);
    if (sh("mount -t tmpfs -o size=1m trainer-probe " + quote(probe.string())) != 0) {
      return "'mount -t tmpfs' fails here (no CAP_SYS_ADMIN?)";
    }
    sh("umount " + quote(probe.string()));
    return "";
  }

 private:
  fs::path at_;
};

#define REQUIRE_TMPFS(dir)                                            \
  do {                                                                \
    const std::string why = Tmpfs::unavailable((dir) / "probe");      \
    if (!why.empty()) {                                               \
      WARN("skipped: a test file system cannot be mounted: " << why); \
      return;                                                         \
    }                                                                 \
  } while (0)

inline void make_dataset(const fs::path& cwd, const std::string& out, int per_class, int size,
                         int classes = 5, int seed = 0) {
  const Result r =
      run_trainer(cwd, "make-dataset --out " + out + " --per-class " + std::to_string(per_class) +
                           " --image-size " + std::to_string(size) + " --classes " +
                           std::to_string(classes) + " --seed " + std::to_string(seed));
  if (r.code != 0) throw std::runtime_error("make-dataset failed: " + r.err);
}

}  // namespace trainer::testing
