// Shared by the libFuzzer targets (one per parser, each calling the code the trainer calls). A
// target feeds its input to the parser; the outcomes a user may meet for bad input (a usage,
// config or data error: exit 2 or 3 with a message) are expected and ignored; anything else (an
// internal error, an exception of a type the program does not expect, a crash, a hang, a leak or
// an oversized allocation, the last three caught by libFuzzer and ASan) is a finding: the target
// prints it and aborts, and libFuzzer saves the input as crash-<sha1>.
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "trainer/util/error.h"

namespace trainer::fuzz {

namespace fs = std::filesystem;

// A per-process scratch directory on tmpfs (for parsers that read files), removed at exit.
inline fs::path& scratch_path() {
  static fs::path dir;
  return dir;
}
inline const fs::path& scratch_dir() {
  fs::path& dir = scratch_path();
  if (dir.empty()) {
    std::error_code ec;
    const fs::path base =
        fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    dir = base / ("trainer-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::atexit([] {
      std::error_code ignored;
      fs::remove_all(scratch_path(), ignored);
    });
  }
  return dir;
}

inline void write_bytes(const fs::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// Quiets the library's logging (a warning per input would dominate the run).
inline void quiet_logs() { spdlog::set_level(spdlog::level::off); }

// Runs f; lets the errors the trainer reports to users pass, aborts on anything else. With
// FUZZ_PRINT set, prints each error message (to see why a reproduced input fails).
template <class F>
void expect_clean_errors(const char* target, F&& f) {
  try {
    f();
  } catch (...) {
    const ErrorSummary why = describe_exception(std::current_exception());
    if (std::getenv("FUZZ_PRINT")) {
      std::fprintf(stderr, "%s: %s\n", target, why.message.c_str());
    }
    if (why.kind == ErrorKind::kInternal) {
      std::fprintf(stderr, "%s: this input gives an internal error (a bug): %s\n", target,
                   why.message.c_str());
      std::abort();
    }
  }
}

}  // namespace trainer::fuzz
