#include "trainer/util/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <vector>

namespace trainer::util {

void setup_logging(const std::string& level, const std::string& log_file) {
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!log_file.empty()) {
    sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_file, false));
  }
  auto logger = std::make_shared<spdlog::logger>("trainer", sinks.begin(), sinks.end());
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  // A log file that cannot be written (a full disk) must not stop the job or repeat an error per
  // line: say so once; the lines still reach stderr. The job's own writes report the cause.
  logger->set_error_handler([log_file](const std::string& message) {
    static std::atomic<bool> told{false};
    if (!told.exchange(true)) {
      std::fprintf(stderr, "trainer: cannot write the log file '%s' (%s); logging to stderr only\n",
                   log_file.c_str(), message.c_str());
    }
  });
  spdlog::set_default_logger(logger);
}

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

}  // namespace trainer::util
