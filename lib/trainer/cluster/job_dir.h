// The job directory layout and the one helper that decides where this process may write.
// The chief owns JOB_DIR (job.yaml, metrics.jsonl, checkpoints/, model/, logs/); every other worker
// writes only under JOB_DIR/workertemp_<task index>/, which it removes when it ends cleanly; the
// evaluator task owns JOB_DIR/eval/ (its metrics.jsonl and log), which it keeps.
// Nothing else in the program checks the rank to decide a path. Not thread-safe to prepare();
// the accessors are const.
#pragma once

#include <filesystem>
#include <functional>

#include "trainer/cluster/cluster_spec.h"

namespace trainer::cluster {

namespace fs = std::filesystem;

class JobDir {
 public:
  JobDir(fs::path root, const ClusterSpec& cluster);

  const fs::path& root() const { return root_; }

  // Where this process writes: the job dir itself on the chief, eval/ on the evaluator, its
  // workertemp_<i> on another worker.
  const fs::path& write_dir() const { return write_dir_; }

  fs::path job_yaml() const { return root_ / "job.yaml"; }
  // The chief's metrics; on another worker its own step timings, in its workertemp dir.
  fs::path metrics_file() const { return write_dir_ / "metrics.jsonl"; }
  fs::path checkpoints_dir() const { return root_ / "checkpoints"; }
  fs::path model_dir() const { return root_ / "model"; }
  fs::path model_best_dir() const { return root_ / "model_best"; }  // checkpoint.keep_best
  fs::path logs_dir() const { return root_ / "logs"; }              // the chief's TensorBoard runs
  fs::path log_file() const { return write_dir_ / "trainer.log"; }

  // Creates write_dir() (and the chief's sub-dirs) and checks that it is writable. Throws
  // ConfigError when a file is in the way of the job dir, DataError naming the path and cause
  // when a directory cannot be created or written (no permission, a read-only or full disk).
  void prepare() const;

  // Throws DataError when write_dir() is no longer a directory (removed while the job ran), so
  // that nothing is written into a directory re-created in its place.
  void check_present() const;

  // Runs `write` (a checkpoint, the model export) after check_present(); when it fails because
  // the job dir vanished meanwhile, the error says that instead of naming a missing file.
  void write_while_present(const std::function<void()>& write) const;

  // Removes a non-chief's workertemp dir after a clean finish (no-op on the chief).
  void finish_clean() const;

 private:
  fs::path root_;
  fs::path write_dir_;
  bool is_chief_;
  bool is_evaluator_;
};

}  // namespace trainer::cluster
