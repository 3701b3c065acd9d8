// Logging set-up (spdlog). One call at start-up configures the process-wide logger: stderr,
// plus an optional log file. Other code logs with spdlog::info/warn/error directly.
// Thread-safe after set-up (spdlog's multi-threaded sinks).
#pragma once

#include <string>

namespace trainer::util {

// level: trace|debug|info|warn|error. log_file: empty = stderr only.
void setup_logging(const std::string& level, const std::string& log_file = "");

// True when stderr is a terminal (progress bars instead of periodic lines).
bool stderr_is_tty();

}  // namespace trainer::util
