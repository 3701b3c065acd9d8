// Where numbers go: MetricsLog appends one JSON object per line (step, epoch, metric names) to
// JOB_DIR/metrics.jsonl, written per record; Progress shows a live bar with images/s and ETA on
// a terminal and plain periodic log lines otherwise; EpochMeter turns the training loop's steps
// and epochs into both, and into the TensorBoard summaries. None is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include <optional>
#include <vector>

#include <torch/torch.h>

#include "trainer/data/loader.h"
#include "trainer/dist/grad_sync.h"
#include "trainer/dist/process_group.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/events.h"
#include "trainer/loop/runtime.h"
#include "trainer/loop/step.h"
#include "trainer/util/fs.h"
#include "trainer/util/memory.h"

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

// The per-step and per-epoch bookkeeping: timings, the wait for input, page faults and kernel
// time, metrics.jsonl records, the progress bar and the epoch's log line. A step's record needs
// its loss, which lives on the device: on the CPU it is read at once; on a GPU the steps wait in
// `pending_` and are read together every logging.every_steps (one wait on the device, through
// the process group's polling wait, so a hung peer or a signal is still noticed), at the end of
// an epoch and before a checkpoint. Step times come from a StepTimer (CUDA events on a GPU).
class EpochMeter {
 public:
  // num_workers: the replicas (images/s counts the global batch); group: for the polling wait
  // on the device (a GPU); every_steps: logging.every_steps.
  EpochMeter(int num_workers, dist::ProcessGroup& group, const torch::Device& device,
             MetricsLog metrics, Summaries summaries, Progress progress, int every_steps);

  void start_epoch(const TrainPosition& pos, int64_t epochs, int64_t steps);
  // Loader::next(), timed: the time the loop waited for input.
  std::optional<data::Batch> next_batch(data::Loader& loader);

  // After a step (pos: the position after it): its summaries' input images at an epoch's first
  // step now, its metrics.jsonl record, scalar summaries and the progress bar once its values are
  // read (flush()).
  void end_step(const TrainPosition& pos, const data::Batch& batch, const StepResult& r, double lr,
                const dist::GradSyncStats& sync);

  // Reads the pending steps' values from the device (one wait) and writes their records.
  void flush();

  // Ends the progress bar (also before a stop on a signal).
  void end_progress();

  // Ends the progress bar, logs what the loader skipped and caches, and returns the epoch's
  // metrics.jsonl record and the start of its log line.
  std::map<std::string, double> end_epoch(const data::Loader& loader, std::string* line);

  void write_epoch(const TrainPosition& pos, const std::map<std::string, double>& record);

  void close();

 private:
  struct Pending {
    TrainPosition pos;
    StepResult result;
    double lr = 0, data_wait = 0, comm_wait = 0;
    util::ResourceUsage usage;
  };

  void write_step(const Pending& p, double loss, double accuracy, double dt);

  int workers_;
  bool distributed_;
  dist::ProcessGroup& group_;
  torch::Device device_;
  int read_every_;
  StepTimer timer_;
  MetricsLog metrics_;
  Summaries summaries_;
  Progress progress_;
  std::vector<Pending> pending_;
  bool images_due_ = false;
  bool scaled_ = false;
  std::chrono::steady_clock::time_point epoch_start_;
  util::ResourceUsage usage_;
  double data_wait_ = 0, ips_ema_ = 0;
  double loss_sum_ = 0, correct_sum_ = 0, comm_wait_s_ = 0, step_time_s_ = 0, data_wait_s_ = 0,
         sys_s_ = 0;
  int64_t faults_ = 0, seen_ = 0, steps_ = 0, skipped_steps_ = 0;
};

}  // namespace trainer::train
