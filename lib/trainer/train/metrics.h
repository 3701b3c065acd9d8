// Where numbers go: MetricsLog appends one JSON object per line (step, epoch, metric names) to
// JOB_DIR/metrics.jsonl, written per record; Progress shows a live bar with images/s and ETA on
// a terminal and plain periodic log lines otherwise. Neither is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "trainer/util/fs.h"

namespace trainer::train {

class MetricsLog {
 public:
  MetricsLog() = default;  // disabled: records are dropped (a non-chief, or inspect)
  // Opens `path` for appending. resume_step >= 0 first drops records with step > resume_step
  // (left by a run that went on past its last checkpoint), so each step is recorded once. A last
  // line without its newline (cut short by a crash) is dropped in either case. A record that
  // cannot be written (a full disk, the file deleted) throws DataError and leaves the file as it
  // was (util::AppendFile).
  MetricsLog(const std::filesystem::path& path, int64_t resume_step);

  void write(int64_t step, int64_t epoch, const std::map<std::string, double>& values);

 private:
  util::AppendFile out_;
};

class Progress {
 public:
  // every_steps: how often a plain line is logged when not on a terminal.
  Progress(bool interactive, int every_steps);

  void start_epoch(int64_t epoch, int64_t total_epochs, int64_t steps, int64_t first_step);
  // After each training step of the epoch (step_in_epoch is 1-based after the step).
  void step(int64_t step_in_epoch, double loss, double accuracy, double lr, double images_per_s);
  void end_epoch();

 private:
  bool interactive_;
  int every_steps_;
  int64_t epoch_ = 0, total_epochs_ = 0, steps_ = 0, first_step_ = 0;
  std::chrono::steady_clock::time_point start_;
  bool drew_ = false;
};

}  // namespace trainer::train
