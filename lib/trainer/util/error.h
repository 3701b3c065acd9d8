// Error kinds of the whole program. Every fallible step throws one of these with a message
// that names the file, field or task and what was expected; app/trainer/main.cpp alone maps a
// kind to the process exit code (see exit_code()). Thread-safe: plain value types.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace trainer {

enum class ErrorKind {
  kUsage,        // bad command line                          -> exit 2
  kConfig,       // bad job spec or cluster spec              -> exit 2
  kData,         // unreadable/corrupt data, bad manifest     -> exit 3
  kDistributed,  // a peer lost, a timeout, a rendezvous fail -> exit 4
  kInterrupted,  // stopped by SIGTERM/SIGINT                 -> exit 143
  kInternal,     // a bug or an unexpected library failure    -> exit 1
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

struct UsageError : Error {
  explicit UsageError(const std::string& m) : Error(ErrorKind::kUsage, m) {}
};
struct ConfigError : Error {
  explicit ConfigError(const std::string& m) : Error(ErrorKind::kConfig, m) {}
};
struct DataError : Error {
  explicit DataError(const std::string& m) : Error(ErrorKind::kData, m) {}
};
struct DistributedError : Error {
  explicit DistributedError(const std::string& m) : Error(ErrorKind::kDistributed, m) {}
};
struct Interrupted : Error {
  explicit Interrupted(const std::string& m) : Error(ErrorKind::kInterrupted, m) {}
};

// Raised on one rank because another rank failed (its cause read from the rendezvous store): its
// kind is the failing rank's, its message names that task and its cause. A rank that fails this
// way does not report the failure as its own.
struct PeerFailed : Error {
  PeerFailed(ErrorKind kind, const std::string& m) : Error(kind, m) {}
};

// The process exit code for an error kind: the one table of it.
int exit_code(ErrorKind kind);

// "usage error", "config error", "data error", "distributed error", "interrupted",
// "internal error".
const char* kind_name(ErrorKind kind);

// What an exception means to the program: its kind and a one-line message. The one mapping of
// exception types to kinds, used by main() and by the failure a rank reports to its peers:
// trainer::Error keeps its kind and message; std::filesystem::filesystem_error is a data error
// (exit 3) that names the path(s) and says when the disk is full or the path read-only;
// std::bad_alloc is internal, "out of memory"; c10::Error (LibTorch) is internal, without its C++
// backtrace; anything else is internal.
struct ErrorSummary {
  ErrorKind kind = ErrorKind::kInternal;
  std::string message;
};
ErrorSummary describe_exception(const std::exception_ptr& e);

}  // namespace trainer
