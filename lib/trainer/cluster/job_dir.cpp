#include "trainer/cluster/job_dir.h"

#include <system_error>

#include "trainer/util/error.h"
#include "trainer/util/fs.h"

namespace trainer::cluster {

JobDir::JobDir(fs::path root, const ClusterSpec& cluster)
    : root_(std::move(root)),
      is_chief_(cluster.is_chief()),
      is_evaluator_(cluster.task_type == "evaluator") {
  write_dir_ = is_chief_       ? root_
               : is_evaluator_ ? root_ / "eval"
                               : root_ / ("workertemp_" + std::to_string(cluster.task_index));
}

void JobDir::prepare() const {
  std::error_code ec;
  if (fs::exists(root_, ec) && !fs::is_directory(root_, ec)) {
    throw ConfigError("--job-dir '" + root_.string() + "': exists and is not a directory");
  }
  for (const fs::path& dir : is_chief_ ? std::vector<fs::path>{root_, checkpoints_dir()}
                                       : std::vector<fs::path>{write_dir_}) {
    fs::create_directories(dir, ec);
    if (ec) util::throw_io_error("--job-dir: cannot create", dir, ec.value());
  }
  util::require_writable_dir(write_dir_);
}

void JobDir::check_present() const {
  std::error_code ec;
  if (!fs::is_directory(write_dir_, ec)) {
    throw DataError("'" + write_dir_.string() +
                    "' has disappeared while the job ran (removed, or its file system unmounted)");
  }
}

void JobDir::write_while_present(const std::function<void()>& write) const {
  check_present();
  try {
    write();
  } catch (const DataError&) {
    check_present();
    throw;
  }
}

void JobDir::finish_clean() const {
  if (is_chief_ || is_evaluator_) return;
  std::error_code ec;
  fs::remove_all(write_dir_, ec);
}

}  // namespace trainer::cluster
