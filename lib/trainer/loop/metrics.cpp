#include "trainer/loop/metrics.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainer/util/device.h"
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

namespace {

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

EpochMeter::EpochMeter(int num_workers, dist::ProcessGroup& group, const torch::Device& device,
                       MetricsLog metrics, Summaries summaries, Progress progress, int every_steps)
    : workers_(num_workers),
      distributed_(group.world_size() > 1),
      group_(group),
      device_(device),
      read_every_(device.is_cuda() ? std::max(1, every_steps) : 1),
      timer_(device),
      metrics_(std::move(metrics)),
      summaries_(std::move(summaries)),
      progress_(std::move(progress)) {}

void EpochMeter::start_epoch(const TrainPosition& pos, int64_t epochs, int64_t steps) {
  progress_.start_epoch(pos.epoch, epochs, steps, pos.batch_in_epoch);
  images_due_ = true;
  epoch_start_ = std::chrono::steady_clock::now();
  usage_ = util::resource_usage();
  loss_sum_ = correct_sum_ = comm_wait_s_ = step_time_s_ = data_wait_s_ = sys_s_ = 0;
  faults_ = skipped_steps_ = 0;
  seen_ = steps_ = 0;
  timer_.reset();  // not what the last epoch's validation and checkpoint took
  timer_.mark();
}

std::optional<data::Batch> EpochMeter::next_batch(data::Loader& loader) {
  const auto start = std::chrono::steady_clock::now();
  std::optional<data::Batch> batch = loader.next();
  data_wait_ = seconds(std::chrono::steady_clock::now() - start);
  return batch;
}

void EpochMeter::end_step(const TrainPosition& pos, const data::Batch& batch, const StepResult& r,
                          double lr, const dist::GradSyncStats& sync) {
  timer_.mark();
  const util::ResourceUsage usage = util::resource_usage();
  Pending p;
  p.pos = pos;
  p.result = r;
  p.lr = lr;
  p.data_wait = data_wait_;
  p.usage = usage - usage_;
  p.comm_wait = sync.wait_s;
  usage_ = usage;
  pending_.push_back(std::move(p));
  if (images_due_) summaries_.input_images(pos.global_step, batch.images);
  images_due_ = false;
  if (static_cast<int>(pending_.size()) >= read_every_) flush();
}

void EpochMeter::flush() {
  if (pending_.empty()) return;
  std::vector<torch::Tensor> values;
  for (const auto& p : pending_) {
    if (p.result.examples == 0) continue;
    values.push_back(p.result.loss_sum.reshape({1}));
    values.push_back(p.result.correct.to(torch::kDouble).reshape({1}));
  }
  if (device_.is_cuda())
    group_.wait_device("reading the step metrics", util::device_ready_probe(device_));
  torch::Tensor host;
  std::vector<double> dts;
  {
    const HostSyncAllowed intended;
    if (!values.empty()) host = torch::cat(values).to(torch::kCPU);
    dts = timer_.intervals();
  }
  const double* v = host.defined() ? host.data_ptr<double>() : nullptr;
  size_t k = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    const Pending& p = pending_[i];
    double loss = 0, accuracy = 0;
    if (p.result.examples > 0) {
      const double n = static_cast<double>(p.result.examples);
      loss = v[k] / n;
      accuracy = v[k + 1] / n;
      loss_sum_ += loss * n;
      correct_sum_ += accuracy * n;
      k += 2;
    }
    write_step(p, loss, accuracy, i < dts.size() ? dts[i] : 0.0);
  }
  pending_.clear();
}

void EpochMeter::end_progress() {
  flush();
  progress_.end_epoch();
}

std::map<std::string, double> EpochMeter::end_epoch(const data::Loader& loader, std::string* line) {
  flush();
  progress_.end_epoch();
  if (loader.skipped_total() > 0) {
    spdlog::warn("{} corrupt training images skipped so far (data.on_corrupt: skip)",
                 loader.skipped_total());
  }
  if (loader.cached_examples() > 0) {
    spdlog::info("data.cache: memory holds {} of {} training images, {:.1f} MiB",
                 loader.cached_examples(), loader.num_examples(),
                 static_cast<double>(loader.cached_bytes()) / (1024.0 * 1024.0));
  }
  std::map<std::string, double> m = {
      {"epoch_time_s", seconds(std::chrono::steady_clock::now() - epoch_start_)}};
  if (seen_ == 0) {
    *line = "no training steps this run";
    return m;
  }
  m["train_loss"] = loss_sum_ / static_cast<double>(seen_);
  m["train_accuracy"] = correct_sum_ / static_cast<double>(seen_);
  m["minor_faults_per_step"] = static_cast<double>(faults_) / static_cast<double>(steps_);
  m["sys_time_per_step_s"] = sys_s_ / static_cast<double>(steps_);
  m["data_wait_share"] = step_time_s_ > 0 ? data_wait_s_ / step_time_s_ : 0;
  if (scaled_) m["skipped_steps"] = static_cast<double>(skipped_steps_);
  *line = fmt::format(
      "train loss {:.4f} acc {:.4f}; per step {:.0f} minor page faults, {:.3f} s in the kernel, "
      "{:.1f}% of step time waiting for input",
      m["train_loss"], m["train_accuracy"], m["minor_faults_per_step"], m["sys_time_per_step_s"],
      100 * m["data_wait_share"]);
  if (distributed_ && step_time_s_ > 0) {
    m["comm_wait_share"] = comm_wait_s_ / step_time_s_;
    *line += fmt::format(", {:.1f}% waiting on gradients", 100 * comm_wait_s_ / step_time_s_);
  }
  if (scaled_ && skipped_steps_ > 0) {
    *line += fmt::format("; {} step(s) skipped for inf/NaN fp16 gradients", skipped_steps_);
  }
  return m;
}

void EpochMeter::write_epoch(const TrainPosition& pos,
                             const std::map<std::string, double>& record) {
  metrics_.write(pos.global_step, pos.epoch + 1, record);
  summaries_.epoch(pos.global_step, record);
}

void EpochMeter::close() { summaries_.close(); }

void EpochMeter::write_step(const Pending& p, double loss, double accuracy, double dt) {
  const StepResult& r = p.result;
  const double ips = dt > 0 ? static_cast<double>(r.examples) * workers_ / dt : 0;
  ips_ema_ = ips_ema_ == 0 ? ips : 0.8 * ips_ema_ + 0.2 * ips;
  seen_ += r.examples;
  ++steps_;
  step_time_s_ += dt;
  data_wait_s_ += p.data_wait;
  faults_ += p.usage.minor_faults;
  sys_s_ += p.usage.sys_s;
  std::map<std::string, double> record = {
      {"loss", loss},
      {"accuracy", accuracy},
      {"learning_rate", p.lr},
      {"images_per_sec", ips},
      {"step_time_s", dt},
      {"data_wait_s", p.data_wait},
      {"minor_faults", static_cast<double>(p.usage.minor_faults)},
      {"sys_time_s", p.usage.sys_s}};
  if (distributed_) {
    comm_wait_s_ += p.comm_wait;
    record["comm_wait_s"] = p.comm_wait;
  }
  if (r.loss_scale > 0) {  // fp16
    scaled_ = true;
    record["loss_scale"] = r.loss_scale;
    record["skipped_step"] = r.skipped ? 1 : 0;
    if (r.skipped) ++skipped_steps_;
  }
  metrics_.write(p.pos.global_step, p.pos.epoch + 1, record);
  summaries_.train_step(p.pos.global_step, record);
  progress_.step(p.pos.batch_in_epoch, loss, accuracy, p.lr, ips_ema_);
}

}  // namespace trainer::train
