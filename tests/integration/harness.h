// Helpers for integration tests: run the real `trainer` binary in a fresh temp dir with a given
// environment, capture stdout/stderr and the exit code; write small files; read metrics.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
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

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() / ("trainer-it-" + tag + "-" + std::to_string(::getpid()) +
                                         "-" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    if (std::getenv("TRAINER_KEEP_TEST_DIRS") == nullptr) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& p) const { return path_ / p; }

 private:
  fs::path path_;
};

// Runs `trainer ARGS` in `cwd` with extra environment assignments ("K=V"); TF_CONFIG is unset
// unless given.
inline Result run_trainer(const fs::path& cwd, const std::string& args,
                          const std::vector<std::string>& env = {}) {
  const fs::path out = cwd / ".stdout", err = cwd / ".stderr";
  std::string cmd = "cd " + quote(cwd.string()) + " && env -u TF_CONFIG";
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

// All records of a metrics.jsonl.
inline std::vector<nlohmann::json> read_metrics(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// Writes a small synthetic ImageFolder dataset with the real make-dataset subcommand.
inline void make_dataset(const fs::path& cwd, const std::string& out, int per_class, int size,
                         int classes = 5, int seed = 0) {
  const Result r =
      run_trainer(cwd, "make-dataset --out " + out + " --per-class " + std::to_string(per_class) +
                           " --image-size " + std::to_string(size) + " --classes " +
                           std::to_string(classes) + " --seed " + std::to_string(seed));
  if (r.code != 0) throw std::runtime_error("make-dataset failed: " + r.err);
}

}  // namespace trainer::testing
