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
#include "trainer/train/metrics.h"
#include "trainer/train/model_dir.h"
#include "trainer/train/optimizer.h"
#include "trainer/train/runtime.h"
#include "trainer/train/schedule.h"
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
  spdlog::info("device {}, precision {}{}{}", settings.device.str(),
               settings.bf16 ? "bf16" : "fp32",
               spec.train.precision == "auto" ? " (train.precision: auto)" : "",
               settings.channels_last ? ", channels_last" : "");
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

// What one step computed on this replica.
struct StepResult {
  int64_t examples = 0;
  double loss = 0;      // mean over the examples
  double accuracy = 0;  // top-1, over the examples
};

// The model on its device and in its memory format, its optimizer (built after the placement)
// and the gradient average: one training step (torchvision's train_one_epoch body). A batch whose
// images were all corrupt (on_corrupt: skip) still takes part in the collectives, with no gradient,
// so every replica stays in lock-step.
// SyncBatchNorm's sums over the replicas, on the process group (blocking, in graph order: every
// replica runs the same graph, so the collectives match up).
class GroupStatsReducer : public model::StatsReducer {
 public:
  explicit GroupStatsReducer(dist::ProcessGroup& group) : group_(group) {}
  void sum_(torch::Tensor& t) override { group_.all_reduce_sum({t}); }

 private:
  dist::ProcessGroup& group_;
};

class Stepper {
 public:
  Stepper(const config::JobSpec& spec, const TrainContext& ctx, model::ResNet net)
      : spec_(spec),
        settings_(ctx.settings),
        distributed_(ctx.group.world_size() > 1),
        net_(placed(std::move(net), ctx.settings)),
        params_(trainable_parameters(net_)),
        optimizer_(make_optimizer(spec.train.optimizer, params_)),
        loss_options_(torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(
            spec.train.label_smoothing)) {}

  static model::ResNet placed(model::ResNet net, const ModelSettings& settings) {
    place_model(net, settings);
    return net;
  }

  model::ResNet& net() { return net_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }

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
    if (r.examples > 0) {
      const int64_t micro =
          spec_.train.micro_batch_size > 0 ? spec_.train.micro_batch_size : r.examples;
      double loss_sum = 0, correct = 0;
      for (int64_t start = 0; start < r.examples; start += micro) {
        const int64_t len = std::min(micro, r.examples - start);
        const bool last = start + len >= r.examples;
        sync_->set_accumulating(!last);
        const torch::Tensor labels = batch.labels.narrow(0, start, len).to(settings_.device);
        const torch::Tensor logits = forward_logits(
            net_, prepare_input(batch.images.narrow(0, start, len), settings_), settings_);
        const torch::Tensor loss =
            torch::nn::functional::cross_entropy(logits, labels, loss_options_);
        // Each micro-batch's mean weighted by its share: the gradients add up to the batch's.
        (len == r.examples ? loss : loss * (static_cast<double>(len) / r.examples)).backward();
        loss_sum += loss.item<double>() * static_cast<double>(len);
        correct += logits.argmax(1).eq(labels).sum().item<double>();
      }
      r.loss = loss_sum / static_cast<double>(r.examples);
      r.accuracy = correct / static_cast<double>(r.examples);
    }
    sync_->set_accumulating(false);
    sync_->finish();
    if (r.examples > 0 || distributed_) optimizer_->step();
    return r;
  }

  // Whether any replica was asked to stop (a signal) during this step: voted in the last
  // gradient bucket, so every replica learns the same answer without another collective.
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
  torch::nn::functional::CrossEntropyFuncOptions loss_options_;
  std::unique_ptr<dist::GradientSync> sync_;
  std::shared_ptr<model::StatsReducer> bn_reducer_;  // model.sync_batchnorm: the group's sum
};

// The per-step and per-epoch bookkeeping: timings, the wait for input, page faults and kernel
// time, metrics.jsonl records, the progress bar and the epoch's log line.
class EpochMeter {
 public:
  EpochMeter(const DataPlan& plan, bool distributed, MetricsLog metrics, Summaries summaries,
             Progress progress)
      : workers_(plan.num_workers),
        distributed_(distributed),
        metrics_(std::move(metrics)),
        summaries_(std::move(summaries)),
        progress_(std::move(progress)) {}

  void start_epoch(const TrainPosition& pos, int64_t epochs, int64_t steps) {
    progress_.start_epoch(pos.epoch, epochs, steps, pos.batch_in_epoch);
    images_due_ = true;
    epoch_start_ = step_start_ = Clock::now();
    usage_ = util::resource_usage();
    loss_sum_ = correct_sum_ = comm_wait_s_ = step_time_s_ = data_wait_s_ = sys_s_ = 0;
    faults_ = 0;
    seen_ = steps_ = 0;
  }
  // Loader::next(), timed: the time the loop waited for input.
  std::optional<data::Batch> next_batch(data::Loader& loader) {
    const auto start = Clock::now();
    std::optional<data::Batch> batch = loader.next();
    data_wait_ = seconds(Clock::now() - start);
    return batch;
  }

  // After a step (pos: the position after it): its metrics.jsonl record, its summaries (with
  // the batch's first images at an epoch's first step) and the progress bar.
  void end_step(const TrainPosition& pos, const data::Batch& batch, const StepResult& r, double lr,
                const dist::GradSyncStats& sync) {
    const auto now = Clock::now();
    const double dt = seconds(now - step_start_);
    step_start_ = now;
    const util::ResourceUsage usage = util::resource_usage();
    const util::ResourceUsage delta = usage - usage_;
    usage_ = usage;
    const double ips = static_cast<double>(r.examples) * workers_ / dt;
    ips_ema_ = ips_ema_ == 0 ? ips : 0.8 * ips_ema_ + 0.2 * ips;
    loss_sum_ += r.loss * static_cast<double>(r.examples);
    correct_sum_ += r.accuracy * static_cast<double>(r.examples);
    seen_ += r.examples;
    ++steps_;
    step_time_s_ += dt;
    data_wait_s_ += data_wait_;
    faults_ += delta.minor_faults;
    sys_s_ += delta.sys_s;
    std::map<std::string, double> record = {
        {"loss", r.loss},
        {"accuracy", r.accuracy},
        {"learning_rate", lr},
        {"images_per_sec", ips},
        {"step_time_s", dt},
        {"data_wait_s", data_wait_},
        {"minor_faults", static_cast<double>(delta.minor_faults)},
        {"sys_time_s", delta.sys_s}};
    if (distributed_) {
      comm_wait_s_ += sync.wait_s;
      record["comm_wait_s"] = sync.wait_s;
    }
    metrics_.write(pos.global_step, pos.epoch + 1, record);
    summaries_.train_step(pos.global_step, record);
    if (images_due_) summaries_.input_images(pos.global_step, batch.images);
    images_due_ = false;
    progress_.step(pos.batch_in_epoch, r.loss, r.accuracy, lr, ips_ema_);
  }

  // Ends the progress bar (also before a stop on a signal).
  void end_progress() { progress_.end_epoch(); }

  // Ends the progress bar, logs what the loader skipped and caches, and returns the epoch's
  // metrics.jsonl record and the start of its log line.
  std::map<std::string, double> end_epoch(const data::Loader& loader, std::string* line) {
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
    *line = fmt::format(
        "train loss {:.4f} acc {:.4f}; per step {:.0f} minor page faults, {:.3f} s in the kernel, "
        "{:.1f}% of step time waiting for input",
        m["train_loss"], m["train_accuracy"], m["minor_faults_per_step"], m["sys_time_per_step_s"],
        100 * m["data_wait_share"]);
    if (distributed_ && step_time_s_ > 0) {
      m["comm_wait_share"] = comm_wait_s_ / step_time_s_;
      *line += fmt::format(", {:.1f}% waiting on gradients", 100 * comm_wait_s_ / step_time_s_);
    }
    return m;
  }

  void write_epoch(const TrainPosition& pos, const std::map<std::string, double>& record) {
    metrics_.write(pos.global_step, pos.epoch + 1, record);
    summaries_.epoch(pos.global_step, record);
  }

  void close() { summaries_.close(); }

 private:
  int workers_;
  bool distributed_;
  MetricsLog metrics_;
  Summaries summaries_;
  Progress progress_;
  bool images_due_ = false;
  Clock::time_point epoch_start_, step_start_;
  util::ResourceUsage usage_;
  double data_wait_ = 0, ips_ema_ = 0;
  double loss_sum_ = 0, correct_sum_ = 0, comm_wait_s_ = 0, step_time_s_ = 0, data_wait_s_ = 0,
         sys_s_ = 0;
  int64_t faults_ = 0, seen_ = 0, steps_ = 0;
};

// The one place that decides what only the chief writes: checkpoints (after proving every
// replica holds the same weights and statistics) and the exported model. Every rank calls these
// (they are collectives); agree() turns a failure on the chief into the same error everywhere.
class ChiefWrites {
 public:
  ChiefWrites(const config::JobSpec& spec, const TrainContext& ctx, Stepper& stepper)
      : spec_(spec), ctx_(ctx), stepper_(stepper), identity_(job_identity(spec)) {}

  void checkpoint(const TrainPosition& at) {
    dist::check_replicas_agree(ctx_.group, replica_state(stepper_.net()),
                               fmt::format("at the checkpoint of step {}", at.global_step));
    agree(ctx_.group, ctx_.cluster, "writing a checkpoint", [&] {
      if (!ctx_.job_dir.is_chief()) return;
      ctx_.job_dir.write_while_present([&] {
        const auto dir =
            save_checkpoint(ctx_.job_dir.checkpoints_dir(), at, identity_, ctx_.checkpoint_plan,
                            *stepper_.net(), stepper_.optimizer(), spec_.checkpoint.keep);
        spdlog::info("checkpoint {}", dir.string());
      });
    });
  }

  // checkpoint.every_steps, after a step inside an epoch (the end of an epoch, and stopping at
  // max_steps, have their own checkpoint in checkpoint_if_due).
  void checkpoint_if_step_due(const TrainPosition& pos) {
    const int every = spec_.checkpoint.every_steps;
    if (every > 0 && pos.global_step % every == 0 &&
        pos.batch_in_epoch < ctx_.plan.steps_per_epoch) {
      checkpoint(pos);
    }
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
    agree(ctx_.group, ctx_.cluster, "exporting the model", [&] {
      if (!ctx_.job_dir.is_chief()) return;
      ModelInfo info;
      info.arch = spec_.model.arch;
      info.num_classes = ctx_.plan.num_classes;
      info.head_hidden = spec_.model.head_hidden;
      info.class_names = ctx_.plan.class_names;
      info.image_size = spec_.data.image_size;
      info.normalize = spec_.data.normalize;
      info.reduced_decode = spec_.data.reduced_decode;
      info.precision = ctx_.settings.bf16 ? "bf16" : "fp32";
      info.channels_last = ctx_.settings.channels_last;
      info.global_step = summary.global_step;
      info.epochs = summary.epochs_done;
      ctx_.job_dir.write_while_present(
          [&] { train::export_model(ctx_.job_dir.model_dir(), stepper_.net(), info); });
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
  agree(ctx.group, ctx.cluster, "opening the TensorBoard event files", [&] {
    if (!ctx.job_dir.is_chief() || !spec.logging.tensorboard) return;
    ctx.job_dir.write_while_present([&] {
      summaries = Summaries(ctx.job_dir.logs_dir(), spec.logging, first_step);
      summaries.job_spec(first_step, config::to_yaml(spec));
    });
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
  data::Loader train_loader(plan.train.examples, train_loader_options(data, spec.train, plan));
  std::unique_ptr<data::Loader> val_loader;
  if (plan.validation) {
    val_loader = std::make_unique<data::Loader>(
        plan.validation->examples,
        eval_loader_options(data, spec.train.per_replica_batch_size, *plan.validation,
                            plan.num_classes, plan.worker, plan.num_workers));
  }

  // 2. Model and optimizer; the schedule (linear scaling rule when asked).
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
    restore_checkpoint(*ctx.resume, *stepper.net(), stepper.optimizer());
    pos = ctx.resume->position;
    spdlog::info("resumed from {} (epoch {}, batch {}, step {})", ctx.resume->dir.string(),
                 pos.epoch + 1, pos.batch_in_epoch, pos.global_step);
  }
  dist::broadcast_parameters(group, replica_state(stepper.net()));
  stepper.connect(group);
  ChiefWrites chief(spec, ctx, stepper);
  const int64_t first_step = ctx.resume ? pos.global_step : 0;
  EpochMeter meter(plan, group.world_size() > 1, MetricsLog(ctx.job_dir.metrics_file(), first_step),
                   open_summaries(spec, ctx, first_step),
                   Progress(util::stderr_is_tty(), spec.logging.every_steps));

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
      const StepResult r = stepper.step(*batch, lr);
      pos = {pos.epoch, batch->index + 1, pos.global_step + 1};
      meter.end_step(pos, *batch, r, lr, stepper.sync_stats());
      if (stepper.stop_everywhere()) stop_on_signal(meter, chief, pos);  // every replica alike
      if ((stop = at_max_steps())) break;
      chief.checkpoint_if_step_due(pos);
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
