#include "trainer/train/trainer.h"

#include <spdlog/spdlog.h>

#include <fmt/format.h>
#include <chrono>
#include <memory>

#include "trainer/data/loader.h"
#include "trainer/dist/grad_sync.h"
#include "trainer/dist/replicas.h"
#include "trainer/model/resnet.h"
#include "trainer/train/agreement.h"
#include "trainer/train/data_plan.h"
#include "trainer/train/evaluate.h"
#include "trainer/train/events.h"
#include "trainer/train/loss_scaler.h"
#include "trainer/train/metrics.h"
#include "trainer/train/model_dir.h"
#include "trainer/train/optimizer.h"
#include "trainer/train/runtime.h"
#include "trainer/train/schedule.h"
#include "trainer/util/device.h"
#include "trainer/util/error.h"
#include "trainer/util/log.h"
#include "trainer/util/memory.h"
#include "trainer/util/signals.h"

namespace trainer::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

void set_train_mode(model::ResNet& net, const config::ModelSpec& spec) {
  net->train();
  if (spec.freeze_batchnorm) model::set_batchnorm_eval(*net);
}

std::vector<torch::Tensor> trainable_parameters(const model::ResNet& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

// Parameters and buffers: what the replicas must hold identically.
std::vector<torch::Tensor> replica_state(const model::ResNet& net) {
  std::vector<torch::Tensor> state = net->parameters();
  for (const auto& b : net->buffers()) state.push_back(b);
  return state;
}

// The BN running statistics (running_mean, running_var), averaged across replicas every step.
std::vector<torch::Tensor> bn_statistics(const model::ResNet& net) {
  std::vector<torch::Tensor> out;
  for (const auto& item : net->named_buffers()) {
    if (item.value().is_floating_point() && item.key().find("running_") != std::string::npos) {
      out.push_back(item.value());
    }
  }
  return out;
}

// Validation on this worker's part, with the counts summed over all workers: each example is
// evaluated once across the cluster, so the result equals a single-worker evaluation.
EvalCounts evaluate_distributed(dist::ProcessGroup& group, model::ResNet& net, data::Loader& loader,
                                int64_t num_classes, const ModelSettings& settings) {
  EvalCounts counts = evaluate(net, loader, num_classes, settings);
  if (group.world_size() == 1) return counts;
  std::vector<int64_t> flat = {counts.num_examples, counts.skipped};
  for (const auto& row : counts.confusion) flat.insert(flat.end(), row.begin(), row.end());
  flat = group.all_reduce(flat, dist::Reduce::kSum);
  torch::Tensor loss = torch::tensor({counts.loss_sum}, torch::kFloat64);
  group.all_reduce_sum({loss});
  counts.num_examples = flat[0];
  counts.skipped = flat[1];
  size_t k = 2;
  for (auto& row : counts.confusion) {
    for (auto& cell : row) cell = flat[k++];
  }
  counts.loss_sum = loss.item<double>();
  return counts;
}

void log_plan(const config::JobSpec& spec, const DataPlan& plan, const TrainContext& ctx,
              const model::ResNet& net) {
  const ModelSettings& settings = ctx.settings;
  spdlog::info("model {} ({} classes{}), {} parameters", spec.model.arch, plan.num_classes,
               spec.model.head_hidden > 0 ? fmt::format(", head {}", spec.model.head_hidden) : "",
               model::count_parameters(*net));
  spdlog::info("device {}, precision {}{}{}{}", settings.device.str(), settings.precision,
               spec.train.precision == "auto" ? " (train.precision: auto)" : "",
               settings.loss_scaling() ? " with dynamic loss scaling" : "",
               settings.channels_last ? ", channels_last" : "");
  if (settings.device.is_cuda()) {
    spdlog::info("kernels: {}", settings.deterministic
                                    ? "deterministic (cuDNN deterministic, no benchmark mode; "
                                      "train.deterministic)"
                                    : "cuDNN benchmark mode (fast; runs differ in the last bits: "
                                      "train.deterministic: true for bit-exact resume)");
  }
  spdlog::info("threads: {}", ctx.budget.describe());
  const util::AllocatorInfo alloc = util::allocator_info();
  spdlog::info("memory: {}{}", alloc.name, alloc.settings.empty() ? "" : ", " + alloc.settings);
  spdlog::info("data: {} training examples in {} classes [{}] from {}", plan.train.examples.size(),
               plan.num_classes, fmt::join(plan.class_names, ", "), plan.train.origin);
  if (plan.train.is_records()) {
    spdlog::info("data: {} record files, counts from {}; interleave {}, shuffle buffer {}",
                 plan.train.record_files.size(), plan.train.counts_from, spec.data.interleave,
                 spec.data.shuffle_buffer);
  }
  if (plan.validation) {
    spdlog::info("data: {} validation examples from {}", plan.validation->examples.size(),
                 plan.validation->origin);
  }
  spdlog::info("global batch {} = {} per replica x {} replica(s){}; {} steps per epoch",
               plan.global_batch_size, spec.train.per_replica_batch_size, plan.num_workers,
               spec.train.micro_batch_size > 0
                   ? fmt::format(" in micro-batches of {}", spec.train.micro_batch_size)
                   : "",
               plan.steps_per_epoch);
  if (plan.num_workers > 1) {
    spdlog::info("data.shard_policy: {}; this worker reads {} examples", plan.shard.reason,
                 plan.shard.examples_this_worker);
  }
  const std::string dropped = data::dropped_summary(plan.shard, spec.train.per_replica_batch_size);
  if (!dropped.empty()) spdlog::info("left out of each epoch: {}", dropped);
}

// What one step computed on this replica. The sums stay on the model's device until the meter
// reads them (every step on the CPU, every logging.every_steps on a GPU), so a GPU step never
// waits for the host.
struct StepResult {
  int64_t examples = 0;
  torch::Tensor loss_sum;  // float64 [], the loss summed over the examples; undefined: none
  torch::Tensor correct;   // int64 [], top-1 hits; undefined: none
  bool skipped = false;    // fp16: an inf/NaN gradient, the optimizer step was skipped
  double loss_scale = 0;   // fp16: the loss scale this step used (0 = no loss scaling)
};

// SyncBatchNorm's sums over the replicas, on the process group (blocking, in graph order: every
// replica runs the same graph, so the collectives match up).
class GroupStatsReducer : public model::StatsReducer {
 public:
  explicit GroupStatsReducer(dist::ProcessGroup& group) : group_(group) {}
  void sum_(torch::Tensor& t) override { group_.all_reduce_sum({t}); }

 private:
  dist::ProcessGroup& group_;
};

// The model on its device and in its memory format, its optimizer (built after the placement),
// the loss scaler (fp16) and the gradient average: one training step (torchvision's
// train_one_epoch body). A batch whose images were all corrupt (on_corrupt: skip) still takes
// part in the collectives, with no gradient, so every replica stays in lock-step.
class Stepper {
 public:
  Stepper(const config::JobSpec& spec, const TrainContext& ctx, model::ResNet net)
      : spec_(spec),
        settings_(ctx.settings),
        distributed_(ctx.group.world_size() > 1),
        net_(placed(std::move(net), ctx.settings)),
        params_(trainable_parameters(net_)),
        optimizer_(make_optimizer(spec.train.optimizer, params_)),
        scaler_(ctx.settings.loss_scaling()),
        loss_options_(torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(
            spec.train.label_smoothing)) {}

  static model::ResNet placed(model::ResNet net, const ModelSettings& settings) {
    place_model(net, settings);
    return net;
  }

  model::ResNet& net() { return net_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  LossScaler& scaler() { return scaler_; }

  // After resume and the initial broadcast: gradients (and, unless BN is frozen, the BN running
  // statistics and the stop vote) travel in the same all-reduce buckets.
  void connect(dist::ProcessGroup& group) {
    dist::GradSyncOptions o;
    o.bucket_mb = spec_.distributed.bucket_mb;
    if (!spec_.model.freeze_batchnorm) o.averaged_buffers = bn_statistics(net_);
    o.stop_vote = [] { return util::stop_requested(); };
    sync_ = std::make_unique<dist::GradientSync>(group, params_, std::move(o));
    if (distributed_ && spec_.model.sync_batchnorm && !spec_.model.freeze_batchnorm) {
      bn_reducer_ = std::make_shared<GroupStatsReducer>(group);
      model::set_batchnorm_reducer(*net_, bn_reducer_);
      spdlog::info("model.sync_batchnorm: BN statistics over the global batch ({} replicas)",
                   group.world_size());
    }
    if (distributed_) {
      spdlog::info(
          "gradients: {} all-reduce buckets of about {} MB over {} ({} replicas){}",
          sync_->num_buckets(), spec_.distributed.bucket_mb, group.backend(), group.world_size(),
          spec_.model.freeze_batchnorm ? "" : "; BN statistics averaged in the last bucket");
    }
  }

  StepResult step(const data::Batch& batch, double lr) {
    set_learning_rate(*optimizer_, lr);
    // Reset, not zero: the first backward hands its gradient over without a fill and an add.
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
    StepResult r;
    r.examples = batch.images.size(0);
    r.loss_scale = scaler_.enabled() ? scaler_.scale() : 0;
    if (r.examples > 0) {
      const int64_t micro =
          spec_.train.micro_batch_size > 0 ? spec_.train.micro_batch_size : r.examples;
      for (int64_t start = 0; start < r.examples; start += micro) {
        const int64_t len = std::min(micro, r.examples - start);
        const bool last = start + len >= r.examples;
        sync_->set_accumulating(!last);
        const torch::Tensor labels = prepare_labels(batch.labels.narrow(0, start, len), settings_);
        const torch::Tensor logits = forward_logits(
            net_, prepare_input(batch.images.narrow(0, start, len), settings_), settings_);
        const torch::Tensor loss =
            torch::nn::functional::cross_entropy(logits, labels, loss_options_);
        // Each micro-batch's mean weighted by its share: the gradients add up to the batch's.
        scaler_
            .scale_loss(len == r.examples ? loss : loss * (static_cast<double>(len) / r.examples))
            .backward();
        torch::NoGradGuard no_grad;
        const torch::Tensor loss_part = loss.detach().to(torch::kDouble) * static_cast<double>(len);
        const torch::Tensor hits = logits.argmax(1).eq(labels).sum();
        r.loss_sum = r.loss_sum.defined() ? r.loss_sum + loss_part : loss_part;
        r.correct = r.correct.defined() ? r.correct + hits : hits;
      }
    }
    sync_->set_accumulating(false);
    sync_->finish();
    bool step_ok = true;
    if (scaler_.enabled()) {
      const HostSyncAllowed intended;  // GradScaler.step reads its overflow flag the same way
      step_ok = scaler_.unscale_and_update(params_);
      r.skipped = !step_ok;
    }
    if (step_ok && (r.examples > 0 || distributed_)) optimizer_->step();
    return r;
  }

  // Whether any replica was asked to stop (a signal) during this step: voted in the last
  // gradient bucket, so every replica learns the same answer without another collective (on a
  // GPU the vote is read a step late, on every rank alike).
  bool stop_everywhere() const {
    return distributed_ ? sync_->last_step().stop_votes > 0 : util::stop_requested();
  }

  const dist::GradSyncStats& sync_stats() const { return sync_->last_step(); }

 private:
  const config::JobSpec& spec_;
  const ModelSettings& settings_;
  const bool distributed_;
  model::ResNet net_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LossScaler scaler_;
  torch::nn::functional::CrossEntropyFuncOptions loss_options_;
  std::unique_ptr<dist::GradientSync> sync_;
  std::shared_ptr<model::StatsReducer> bn_reducer_;  // model.sync_batchnorm: the group's sum
};

// The per-step and per-epoch bookkeeping: timings, the wait for input, page faults and kernel
// time, metrics.jsonl records, the progress bar and the epoch's log line. A step's record needs
// its loss, which lives on the device: on the CPU it is read at once; on a GPU the steps wait in
// `pending_` and are read together every logging.every_steps (one wait on the device, through
// the process group's polling wait, so a hung peer or a signal is still noticed), at the end of
// an epoch and before a checkpoint. Step times come from a StepTimer (CUDA events on a GPU).
class EpochMeter {
 public:
  EpochMeter(const DataPlan& plan, const TrainContext& ctx, MetricsLog metrics, Summaries summaries,
             Progress progress, int every_steps)
      : workers_(plan.num_workers),
        distributed_(ctx.group.world_size() > 1),
        group_(ctx.group),
        device_(ctx.settings.device),
        read_every_(ctx.settings.device.is_cuda() ? std::max(1, every_steps) : 1),
        timer_(ctx.settings.device),
        metrics_(std::move(metrics)),
        summaries_(std::move(summaries)),
        progress_(std::move(progress)) {}

  void start_epoch(const TrainPosition& pos, int64_t epochs, int64_t steps) {
    progress_.start_epoch(pos.epoch, epochs, steps, pos.batch_in_epoch);
    images_due_ = true;
    epoch_start_ = Clock::now();
    usage_ = util::resource_usage();
    loss_sum_ = correct_sum_ = comm_wait_s_ = step_time_s_ = data_wait_s_ = sys_s_ = 0;
    faults_ = skipped_steps_ = 0;
    seen_ = steps_ = 0;
    timer_.reset();  // not what the last epoch's validation and checkpoint took
    timer_.mark();
  }
  // Loader::next(), timed: the time the loop waited for input.
  std::optional<data::Batch> next_batch(data::Loader& loader) {
    const auto start = Clock::now();
    std::optional<data::Batch> batch = loader.next();
    data_wait_ = seconds(Clock::now() - start);
    return batch;
  }

  // After a step (pos: the position after it): its summaries' input images at an epoch's first
  // step now, its metrics.jsonl record, scalar summaries and the progress bar once its values are
  // read (flush()).
  void end_step(const TrainPosition& pos, const data::Batch& batch, const StepResult& r, double lr,
                const dist::GradSyncStats& sync) {
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

  // Reads the pending steps' values from the device (one wait) and writes their records.
  void flush() {
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

  // Ends the progress bar (also before a stop on a signal).
  void end_progress() {
    flush();
    progress_.end_epoch();
  }

  // Ends the progress bar, logs what the loader skipped and caches, and returns the epoch's
  // metrics.jsonl record and the start of its log line.
  std::map<std::string, double> end_epoch(const data::Loader& loader, std::string* line) {
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
    std::map<std::string, double> m = {{"epoch_time_s", seconds(Clock::now() - epoch_start_)}};
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

  void write_epoch(const TrainPosition& pos, const std::map<std::string, double>& record) {
    metrics_.write(pos.global_step, pos.epoch + 1, record);
    summaries_.epoch(pos.global_step, record);
  }

  void close() { summaries_.close(); }

 private:
  struct Pending {
    TrainPosition pos;
    StepResult result;
    double lr = 0, data_wait = 0, comm_wait = 0;
    util::ResourceUsage usage;
  };

  void write_step(const Pending& p, double loss, double accuracy, double dt) {
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
  Clock::time_point epoch_start_;
  util::ResourceUsage usage_;
  double data_wait_ = 0, ips_ema_ = 0;
  double loss_sum_ = 0, correct_sum_ = 0, comm_wait_s_ = 0, step_time_s_ = 0, data_wait_s_ = 0,
         sys_s_ = 0;
  int64_t faults_ = 0, seen_ = 0, steps_ = 0, skipped_steps_ = 0;
};

// The loop's chief-only writes: checkpoints (after proving every replica holds the same weights
// and statistics) and the exported model, each through chief_writes() (agreement.h), the one
// door to what only the chief writes. Every rank calls these (they are collectives).
class ChiefWrites {
 public:
  ChiefWrites(const config::JobSpec& spec, const TrainContext& ctx, Stepper& stepper)
      : spec_(spec), ctx_(ctx), stepper_(stepper), identity_(job_identity(spec)) {}

  void checkpoint(const TrainPosition& at) {
    dist::check_replicas_agree(ctx_.group, replica_state(stepper_.net()),
                               fmt::format("at the checkpoint of step {}", at.global_step));
    chief_writes(ctx_.group, ctx_.cluster, ctx_.job_dir, "writing a checkpoint", [&] {
      const auto dir = save_checkpoint(
          ctx_.job_dir.checkpoints_dir(), at, identity_, ctx_.checkpoint_plan, *stepper_.net(),
          stepper_.optimizer(), spec_.checkpoint.keep,
          stepper_.scaler().enabled() ? stepper_.scaler().state() : nlohmann::json());
      spdlog::info("checkpoint {}", dir.string());
    });
  }

  // checkpoint.every_steps, after a step inside an epoch (the end of an epoch, and stopping at
  // max_steps, have their own checkpoint in checkpoint_if_due).
  bool step_checkpoint_due(const TrainPosition& pos) const {
    const int every = spec_.checkpoint.every_steps;
    return every > 0 && pos.global_step % every == 0 &&
           pos.batch_in_epoch < ctx_.plan.steps_per_epoch;
  }

  // The cadence at the end of an epoch's steps: a finished epoch checkpoints every
  // checkpoint.every_epochs, at the last epoch and when stopping at max_steps; a run stopped
  // mid-epoch checkpoints where it stopped.
  void checkpoint_if_due(const TrainPosition& pos, bool epoch_finished, bool stopping) {
    if (epoch_finished) {
      const TrainPosition next{pos.epoch + 1, 0, pos.global_step};
      const bool last = next.epoch >= spec_.train.epochs;
      if (stopping || last || next.epoch % spec_.checkpoint.every_epochs == 0) checkpoint(next);
    } else if (stopping) {
      checkpoint(pos);
    }
  }

  void export_model(const TrainSummary& summary) {
    dist::check_replicas_agree(ctx_.group, replica_state(stepper_.net()), "at the end");
    chief_writes(ctx_.group, ctx_.cluster, ctx_.job_dir, "exporting the model", [&] {
      ModelInfo info;
      info.arch = spec_.model.arch;
      info.num_classes = ctx_.plan.num_classes;
      info.head_hidden = spec_.model.head_hidden;
      info.class_names = ctx_.plan.class_names;
      info.image_size = spec_.data.image_size;
      info.normalize = spec_.data.normalize;
      info.reduced_decode = spec_.data.reduced_decode;
      info.precision = ctx_.settings.precision;
      info.channels_last = ctx_.settings.channels_last;
      info.global_step = summary.global_step;
      info.epochs = summary.epochs_done;
      info.batch_size = spec_.train.per_replica_batch_size;
      OnnxOptions onnx;
      onnx.include_preprocessing = spec_.export_.onnx_preprocessing;
      onnx.opset = spec_.export_.onnx_opset;
      train::export_model(ctx_.job_dir.model_dir(), stepper_.net(), info,
                          spec_.export_.onnx ? &onnx : nullptr);
    });
  }

 private:
  const config::JobSpec& spec_;
  const TrainContext& ctx_;
  Stepper& stepper_;
  std::string identity_;
};

// Every replica was asked to stop at this step: checkpoint here and exit (143).
[[noreturn]] void stop_on_signal(EpochMeter& meter, ChiefWrites& chief, const TrainPosition& pos) {
  meter.end_progress();
  chief.checkpoint(pos);
  throw Interrupted(fmt::format(
      "stopped by a signal at step {}; the newest checkpoint holds this position: start the same "
      "command again to resume",
      pos.global_step));
}

// The chief's TensorBoard event files (logging.tensorboard), opened inside agree() so that a
// failure on the chief stops every rank; the resolved job spec is their first summary.
Summaries open_summaries(const config::JobSpec& spec, const TrainContext& ctx, int64_t first_step) {
  Summaries summaries;
  chief_writes(ctx.group, ctx.cluster, ctx.job_dir, "opening the TensorBoard event files", [&] {
    if (!spec.logging.tensorboard) return;
    summaries = Summaries(ctx.job_dir.logs_dir(), spec.logging, first_step);
    summaries.job_spec(first_step, config::to_yaml(spec));
  });
  return summaries;
}

void add_validation(const EvalCounts& val, std::map<std::string, double>* metrics,
                    std::string* line) {
  (*metrics)["val_loss"] = val.loss();
  (*metrics)["val_accuracy"] = val.accuracy();
  *line += fmt::format("; validation loss {:.4f} acc {:.4f} ({} examples)", val.loss(),
                       val.accuracy(), val.num_examples);
}

}  // namespace

std::string job_identity(const config::JobSpec& spec) {
  // The fields of config::resumable_changes() may differ between runs of one job.
  return config::fingerprint(spec, config::resumable_changes(spec));
}

TrainSummary train_job(const config::JobSpec& spec, const TrainContext& ctx) {
  const DataPlan& plan = ctx.plan;
  dist::ProcessGroup& group = ctx.group;

  // 1. Data: this worker's shard, the same number of steps on every worker.
  config::DataSpec data = spec.data;
  data.num_workers = ctx.budget.decode;
  data::LoaderOptions train_options = train_loader_options(data, spec.train, plan);
  train_options.pin_memory = ctx.settings.device.is_cuda();
  data::Loader train_loader(plan.train.examples, std::move(train_options));
  std::unique_ptr<data::Loader> val_loader;
  if (plan.validation) {
    val_loader = std::make_unique<data::Loader>(
        plan.validation->examples,
        eval_loader_options(data, spec.train.per_replica_batch_size, *plan.validation,
                            plan.num_classes, plan.worker, plan.num_workers));
  }

  // 2. Kernels (deterministic or cuDNN benchmark mode), model and optimizer; the schedule
  // (linear scaling rule when asked).
  configure_kernels(ctx.settings.device, ctx.settings.deterministic);
  StepSyncCheck sync_check(ctx.settings.device);
  Stepper stepper(spec, ctx, build_model(spec.model, plan.num_classes, spec.train.seed));
  log_plan(spec, plan, ctx, stepper.net());
  const double base_lr =
      spec.train.optimizer.learning_rate * (spec.train.scale_lr == "linear" ? plan.num_workers : 1);
  if (spec.train.scale_lr == "linear") {
    spdlog::info("train.scale_lr: linear: learning rate {} x {} replicas = {}",
                 spec.train.optimizer.learning_rate, plan.num_workers, base_lr);
  }
  const ScheduleShape shape{plan.steps_per_epoch, spec.train.epochs};

  // 3. Resume, then the chief's weights everywhere, then the gradient sync.
  TrainPosition pos;
  if (ctx.resume) {
    restore_checkpoint(*ctx.resume, *stepper.net(), stepper.optimizer(), ctx.settings.device);
    if (stepper.scaler().enabled() && !ctx.resume->loss_scaler.is_null()) {
      stepper.scaler().restore(ctx.resume->loss_scaler,
                               "'" + (ctx.resume->dir / "state.json").string() + "'");
    }
    pos = ctx.resume->position;
    spdlog::info("resumed from {} (epoch {}, batch {}, step {})", ctx.resume->dir.string(),
                 pos.epoch + 1, pos.batch_in_epoch, pos.global_step);
  }
  dist::broadcast_parameters(group, replica_state(stepper.net()));
  stepper.connect(group);
  ChiefWrites chief(spec, ctx, stepper);
  const int64_t first_step = ctx.resume ? pos.global_step : 0;
  EpochMeter meter(plan, ctx, MetricsLog(ctx.job_dir.metrics_file(), first_step),
                   open_summaries(spec, ctx, first_step),
                   Progress(util::stderr_is_tty(), spec.logging.every_steps),
                   spec.logging.every_steps);

  // 4. The loop: steps, then per epoch validation and the checkpoint cadence.
  TrainSummary summary;
  summary.epochs_done = pos.epoch;
  // A resumed job may already be at train.max_steps (then only the export below runs).
  auto at_max_steps = [&] {
    return spec.train.max_steps > 0 && pos.global_step >= spec.train.max_steps;
  };
  bool stop = at_max_steps();
  for (; pos.epoch < spec.train.epochs && !stop; ++pos.epoch, pos.batch_in_epoch = 0) {
    set_train_mode(stepper.net(), spec.model);
    train_loader.start_epoch(pos.epoch, pos.batch_in_epoch);
    meter.start_epoch(pos, spec.train.epochs, plan.steps_per_epoch);
    while (auto batch = meter.next_batch(train_loader)) {
      // The schedule's step is the position in this plan's epochs: the global step, unless the
      // job resumed at an epoch boundary with another number of workers (check_resume_plan).
      const int64_t schedule_step = pos.epoch * plan.steps_per_epoch + pos.batch_in_epoch;
      const double lr = learning_rate_at(spec.train.lr_schedule, base_lr, schedule_step, shape);
      sync_check.begin_step();
      const StepResult r = stepper.step(*batch, lr);
      pos = {pos.epoch, batch->index + 1, pos.global_step + 1};
      meter.end_step(pos, *batch, r, lr, stepper.sync_stats());
      sync_check.end_step();
      if (stepper.stop_everywhere()) stop_on_signal(meter, chief, pos);  // every replica alike
      if ((stop = at_max_steps())) break;
      if (chief.step_checkpoint_due(pos)) {
        meter.flush();  // metrics.jsonl holds every step up to the checkpoint
        chief.checkpoint(pos);
      }
    }
    std::string line;
    std::map<std::string, double> epoch_metrics = meter.end_epoch(train_loader, &line);
    const bool epoch_finished = pos.batch_in_epoch >= plan.steps_per_epoch;
    if (val_loader && (epoch_finished || stop)) {
      const EvalCounts val =
          evaluate_distributed(group, stepper.net(), *val_loader, plan.num_classes, ctx.settings);
      set_train_mode(stepper.net(), spec.model);
      summary.val_accuracy = val.accuracy();
      add_validation(val, &epoch_metrics, &line);
    }
    spdlog::info("epoch {}/{}: {}", pos.epoch + 1, spec.train.epochs, line);
    meter.write_epoch(pos, epoch_metrics);
    chief.checkpoint_if_due(pos, epoch_finished, stop);
    summary.epochs_done = epoch_finished ? pos.epoch + 1 : pos.epoch;
  }
  if (stop) {
    spdlog::info("train.max_steps {} reached at step {}", spec.train.max_steps, pos.global_step);
  }

  // 5. Export (chief only), after proving the replicas agree.
  summary.global_step = pos.global_step;
  meter.close();
  chief.export_model(summary);
  return summary;
}

}  // namespace trainer::train
