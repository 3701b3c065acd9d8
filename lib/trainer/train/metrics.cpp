#include "trainer/train/metrics.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainer/util/error.h"
#include "trainer/util/fs.h"

namespace trainer::train {

MetricsLog::MetricsLog(const std::filesystem::path& path, int64_t resume_step) {
  const std::string existing = std::filesystem::exists(path) ? util::read_file(path) : "";
  // A last line without its newline was cut short by a crash; appending to it would glue the
  // next record onto it, so it is dropped even when nothing else is.
  const bool torn = !existing.empty() && existing.back() != '\n';
  if (resume_step >= 0 || torn) {
    const int64_t last_kept = resume_step >= 0 ? resume_step : INT64_MAX;
    std::istringstream in(existing);
    std::string kept, line;
    while (std::getline(in, line)) {
      try {
        if (nlohmann::json::parse(line).value("step", int64_t{0}) > last_kept) continue;
      } catch (const nlohmann::json::exception&) {
        continue;  // a line cut short by a crash
      }
      kept += line + "\n";
    }
    util::write_file_atomic(path, kept);
  }
  out_ = util::AppendFile(path);
}

void MetricsLog::write(int64_t step, int64_t epoch, const std::map<std::string, double>& values) {
  if (!out_.is_open()) return;
  nlohmann::json record = {{"step", step}, {"epoch", epoch}};
  for (const auto& [name, value] : values) {
    record[name] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
  }
  out_.append(record.dump() + "\n");
}

Progress::Progress(bool interactive, int every_steps)
    : interactive_(interactive), every_steps_(std::max(1, every_steps)) {}

void Progress::start_epoch(int64_t epoch, int64_t total_epochs, int64_t steps, int64_t first_step) {
  epoch_ = epoch;
  total_epochs_ = total_epochs;
  steps_ = steps;
  first_step_ = first_step;
  start_ = std::chrono::steady_clock::now();
  drew_ = false;
}

void Progress::step(int64_t step_in_epoch, double loss, double accuracy, double lr,
                    double images_per_s) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = step_in_epoch - first_step_;
  const double eta = done > 0 ? elapsed / done * static_cast<double>(steps_ - step_in_epoch) : 0;
  const std::string stats =
      fmt::format("loss {:.4f} acc {:.3f} lr {:.3g} {:.1f} img/s ETA {:02d}:{:02d}", loss, accuracy,
                  lr, images_per_s, static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  if (interactive_) {
    constexpr int kWidth = 30;
    const int filled = steps_ > 0 ? static_cast<int>(kWidth * step_in_epoch / steps_) : kWidth;
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), ' ');
    std::fprintf(stderr, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld %s",
                 static_cast<long long>(epoch_ + 1), static_cast<long long>(total_epochs_),
                 bar.c_str(), static_cast<long long>(step_in_epoch), static_cast<long long>(steps_),
                 stats.c_str());
    std::fflush(stderr);
    drew_ = true;
  } else if (step_in_epoch % every_steps_ == 0 || step_in_epoch == steps_) {
    spdlog::info("epoch {}/{} step {}/{} {}", epoch_ + 1, total_epochs_, step_in_epoch, steps_,
                 stats);
  }
}

void Progress::end_epoch() {
  if (drew_) std::fputc('\n', stderr);
  drew_ = false;
}

}  // namespace trainer::train
