#include "trainer/job/train_job.h"

#include <spdlog/spdlog.h>

#include <fmt/format.h>
#include <memory>

#include "trainer/data/loader.h"
#include "trainer/dist/replicas.h"
#include "trainer/job/agreement.h"
#include "trainer/job/data_plan.h"
#include "trainer/loop/ema.h"
#include "trainer/loop/epoch_decisions.h"
#include "trainer/loop/evaluate.h"
#include "trainer/loop/events.h"
#include "trainer/loop/metrics.h"
#include "trainer/loop/model_dir.h"
#include "trainer/loop/optimizer.h"
#include "trainer/loop/runtime.h"
#include "trainer/loop/schedule.h"
#include "trainer/loop/step.h"
#include "trainer/loop/watch.h"
#include "trainer/model/net.h"
#include "trainer/util/device.h"
#include "trainer/util/error.h"
#include "trainer/util/log.h"
#include "trainer/util/memory.h"
#include "trainer/util/signals.h"

namespace trainer::train {

namespace {

void log_plan(const config::JobSpec& spec, const DataPlan& plan, const TrainContext& ctx,
              const model::Net& net) {
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

// The loop's chief-only writes: checkpoints (after proving every replica holds the same weights
// and statistics) and the exported model, each through chief_writes() (agreement.h), the one
// door to what only the chief writes. Every rank calls these (they are collectives).
class ChiefWrites {
 public:
  // `ema`: the job's weight average (train.ema), or nullptr; `decisions`: the epoch-end
  // decisions, whose state is written with each checkpoint.
  ChiefWrites(const config::JobSpec& spec, const TrainContext& ctx, Stepper& stepper,
              WeightEma* ema, const EpochDecisions& decisions)
      : spec_(spec),
        ctx_(ctx),
        stepper_(stepper),
        ema_(ema),
        decisions_(decisions),
        identity_(job_identity(spec)) {}

  void checkpoint(const TrainPosition& at) {
    dist::check_replicas_agree(ctx_.group, replica_state(stepper_.net()),
                               fmt::format("at the checkpoint of step {}", at.global_step));
    chief_writes(ctx_.group, ctx_.cluster, ctx_.job_dir, "writing a checkpoint", [&] {
      const model::StateDict ema = ema_ ? ema_->state() : model::StateDict();
      const auto dir = save_checkpoint(
          ctx_.job_dir.checkpoints_dir(), at, identity_, ctx_.checkpoint_plan, *stepper_.net(),
          stepper_.optimizer(), spec_.checkpoint.keep,
          stepper_.scaler().enabled() ? stepper_.scaler().state() : nlohmann::json(),
          decisions_.state(ema_), ema_ ? &ema : nullptr);
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

  // The weights the export holds: the EMA's unless export.weights: raw (or no EMA).
  model::Net& exported_net() {
    if (ema_ != nullptr && spec_.export_.weights == "ema") return ema_->net();
    return stepper_.net();
  }

  // The chief's summary names the model dir (its `model:` line); the others' stays empty.
  void export_model(TrainSummary* summary) {
    export_to(ctx_.job_dir.model_dir(), "at the end", "exporting the model", summary);
  }

  // checkpoint.keep_best: the best epoch's model beside the last, in JOB_DIR/model_best.
  void export_best(TrainSummary* summary, int64_t epoch) {
    TrainSummary scratch = *summary;  // not the job's model dir
    export_to(ctx_.job_dir.model_best_dir(), fmt::format("at the best epoch ({})", epoch + 1),
              "writing the best model", &scratch);
  }

 private:
  void export_to(const fs::path& out_dir, const std::string& when, const char* what,
                 TrainSummary* summary) {
    dist::check_replicas_agree(ctx_.group, replica_state(exported_net()), when);
    chief_writes(ctx_.group, ctx_.cluster, ctx_.job_dir, what, [&] {
      ModelInfo info;
      info.arch = spec_.model.arch;
      info.num_classes = ctx_.plan.num_classes;
      info.head_hidden = spec_.model.head_hidden;
      info.class_names = ctx_.plan.class_names;
      info.image_size = spec_.data.image_size;
      info.normalize = spec_.data.normalize;
      info.reduced_decode = spec_.data.reduced_decode;
      info.interpolation = spec_.data.interpolation;
      info.eval_resize = spec_.data.eval_resize;
      info.eval_resize_size = spec_.data.eval_resize_size;
      info.eval_crop_size = spec_.data.eval_crop_size;
      info.precision = ctx_.settings.precision;
      info.channels_last = ctx_.settings.channels_last;
      info.global_step = summary->global_step;
      info.epochs = summary->epochs_done;
      info.batch_size = spec_.train.per_replica_batch_size;
      OnnxOptions onnx;
      onnx.include_preprocessing = spec_.export_.onnx_preprocessing;
      onnx.opset = spec_.export_.onnx_opset;
      train::export_model(out_dir, exported_net(), info, spec_.export_.onnx ? &onnx : nullptr);
      summary->model_dir = out_dir;
    });
  }

  const config::JobSpec& spec_;
  const TrainContext& ctx_;
  Stepper& stepper_;
  WeightEma* ema_;
  const EpochDecisions& decisions_;
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

// The learning rate the schedule scales: train.optimizer.learning_rate, times the number of
// replicas under train.scale_lr: linear (the linear scaling rule), said once.
double base_learning_rate(const config::TrainSpec& train, int num_workers) {
  const double base =
      train.optimizer.learning_rate * (train.scale_lr == "linear" ? num_workers : 1);
  if (train.scale_lr == "linear") {
    spdlog::info("train.scale_lr: linear: learning rate {} x {} replicas = {}",
                 train.optimizer.learning_rate, num_workers, base);
  }
  return base;
}

// The recipe's loss and batch settings on the stepper (class weights), and what they mean said
// once: the weights, a sampler that corrects the imbalance twice, the batch mixing.
void set_up_recipe(const config::JobSpec& spec, const DataPlan& plan, Stepper& stepper) {
  const std::vector<double> weights = class_weights(spec.train.class_weights, plan.num_classes,
                                                    label_counts(plan.train, plan.num_classes));
  stepper.set_class_weights(weights);
  if (!weights.empty()) spdlog::info("train.class_weights: {}", fmt::join(weights, ", "));
  if (spec.data.sampler == "balanced" &&
      spec.train.class_weights == std::vector<std::string>{"balanced"}) {
    spdlog::warn(
        "data.sampler: balanced and train.class_weights: balanced both correct the class "
        "imbalance: together they over-weight the rare classes (use one of them)");
  }
  if (spec.train.mixup_alpha > 0 || spec.train.cutmix_alpha > 0) {
    spdlog::info("train: mixup alpha {}, CutMix alpha {} (pairs within each replica's batch)",
                 spec.train.mixup_alpha, spec.train.cutmix_alpha);
  }
}

// The EMA of the weights (train.ema), or nullptr; its decay adjusted as torchvision adjusts it.
std::unique_ptr<WeightEma> make_ema(const config::JobSpec& spec, const TrainContext& ctx,
                                    Stepper& stepper) {
  if (spec.train.ema.decay <= 0) return nullptr;
  const config::EmaSpec& e = spec.train.ema;
  const double decay =
      adjusted_ema_decay(e.decay, ctx.plan.global_batch_size, e.every_steps, spec.train.epochs);
  spdlog::info("train.ema: decay {} adjusted to {} (global batch {}, every {} steps, {} epochs)",
               e.decay, decay, ctx.plan.global_batch_size, e.every_steps, spec.train.epochs);
  return std::make_unique<WeightEma>(stepper.net(), spec.model, ctx.plan.num_classes, ctx.settings,
                                     decay);
}

// Resumes the weights, the optimizer, the loss scaler, the epoch-end decisions and the EMA from
// the checkpoint the job starts at; returns its position.
TrainPosition resume(const CheckpointInfo& from, const TrainContext& ctx, Stepper& stepper,
                     EpochDecisions& decisions, WeightEma* ema) {
  restore_checkpoint(from, *stepper.net(), stepper.optimizer(), ctx.settings.device);
  if (stepper.scaler().enabled() && !from.loss_scaler.is_null()) {
    stepper.scaler().restore(from.loss_scaler, "'" + (from.dir / "state.json").string() + "'");
  }
  decisions.restore(from, ema);
  const TrainPosition pos = from.position;
  spdlog::info("resumed from {} (epoch {}, batch {}, step {})", from.dir.string(), pos.epoch + 1,
               pos.batch_in_epoch, pos.global_step);
  return pos;
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
  data::LoaderOptions train_options =
      train_loader_options(spec.data, spec.train, plan, ctx.budget.decode);
  train_options.pin_memory = ctx.settings.device.is_cuda();
  data::Loader train_loader(plan.train.examples, std::move(train_options));
  std::unique_ptr<data::Loader> val_loader;
  if (plan.validation) {
    val_loader = make_eval_loader(spec.data, *plan.validation,
                                  EvalReading{spec.train.per_replica_batch_size, plan.num_classes,
                                              ctx.budget.decode, plan.worker, plan.num_workers});
  }

  // 2. Kernels (deterministic or cuDNN benchmark mode), model and optimizer, the recipe (class
  // weights, the EMA of the weights) and the schedule with the epoch-end decisions.
  configure_kernels(ctx.settings.device, ctx.settings.deterministic);
  StepSyncCheck sync_check(ctx.settings.device);
  Stepper stepper(spec, ctx.settings, group.world_size() > 1,
                  build_model(spec.model, plan.num_classes, spec.train.seed));
  log_plan(spec, plan, ctx, stepper.net());
  const double base_lr = base_learning_rate(spec.train, plan.num_workers);
  const ScheduleShape shape{plan.steps_per_epoch, spec.train.epochs};
  set_up_recipe(spec, plan, stepper);
  std::unique_ptr<WeightEma> ema = make_ema(spec, ctx, stepper);
  EpochDecisions decisions(spec, base_lr, ema != nullptr);

  // 3. Resume, then the chief's weights everywhere, then the gradient sync.
  TrainPosition pos;
  if (ctx.resume) pos = resume(*ctx.resume, ctx, stepper, decisions, ema.get());
  dist::broadcast_parameters(group, replica_state(stepper.net()));
  stepper.connect(group);
  ChiefWrites chief(spec, ctx, stepper, ema.get(), decisions);
  const int64_t first_step = ctx.resume ? pos.global_step : 0;
  EpochMeter meter(
      plan.num_workers, group, ctx.settings.device,
      MetricsLog(ctx.job_dir.metrics_file(), first_step), open_summaries(spec, ctx, first_step),
      Progress(util::stderr_is_tty(), spec.logging.every_steps), spec.logging.every_steps);

  // 4. The loop: steps, then per epoch validation, its decisions and the checkpoint cadence.
  TrainSummary summary;
  summary.epochs_done = pos.epoch;
  // A resumed job may already be at train.max_steps (then only the export below runs).
  auto at_max_steps = [&] {
    return spec.train.max_steps > 0 && pos.global_step >= spec.train.max_steps;
  };
  bool stop = at_max_steps();
  if (decisions.stopped_early()) {  // a job that stopped early and is started again only exports
    spdlog::info("train.early_stopping: this job stopped early at epoch {}; nothing left to train",
                 pos.epoch);
    pos.epoch = spec.train.epochs;
  }
  for (; pos.epoch < spec.train.epochs && !stop; ++pos.epoch, pos.batch_in_epoch = 0) {
    set_train_mode(stepper.net(), spec.model);
    train_loader.start_epoch(pos.epoch, pos.batch_in_epoch);
    meter.start_epoch(pos, spec.train.epochs, plan.steps_per_epoch);
    while (auto batch = meter.next_batch(train_loader)) {
      // The schedule's step is the position in this plan's epochs: the global step, unless the
      // job resumed at an epoch boundary with another number of workers (check_resume_plan).
      const int64_t schedule_step = pos.epoch * plan.steps_per_epoch + pos.batch_in_epoch;
      const double lr = learning_rate_at(spec.train.lr_schedule, base_lr, schedule_step, shape) *
                        decisions.lr_factor();
      sync_check.begin_step();
      const uint64_t mix_seed =
          batch_mix_seed(spec.data.seed, pos.epoch, batch->index, plan.worker);
      const StepResult r = stepper.step(*batch, lr, mix_seed, pos.epoch);
      if (ema && batch->index % spec.train.ema.every_steps == 0) {
        ema->update(stepper.net());
        // torchvision: during the warm-up the average restarts at every update.
        if (static_cast<double>(pos.epoch) < spec.train.lr_schedule.warmup_epochs)
          ema->reset_count();
      }
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
    EpochDecisions::Outcome decided;
    if (val_loader && (epoch_finished || stop)) {
      const EpochValidation val = validate_epoch(group, stepper.net(), ema.get(), *val_loader,
                                                 plan.num_classes, ctx.settings);
      set_train_mode(stepper.net(), spec.model);
      val.report(&epoch_metrics, &line);
      summary.val_accuracy = decisions.reported_accuracy(val);
      if (epoch_finished) decided = decisions.decide(val, pos.epoch, &line);
    }
    spdlog::info("epoch {}/{}: {}", pos.epoch + 1, spec.train.epochs, line);
    meter.write_epoch(pos, epoch_metrics);
    summary.epochs_done = epoch_finished ? pos.epoch + 1 : pos.epoch;
    if (decided.new_best) {  // before the checkpoint that records it as the best
      summary.global_step = pos.global_step;
      chief.export_best(&summary, pos.epoch);
      spdlog::info("checkpoint.keep_best: {} {:.4f} at epoch {}: {}", decisions.best_metric(),
                   decisions.best(), pos.epoch + 1, ctx.job_dir.model_best_dir().string());
    }
    chief.checkpoint_if_due(pos, epoch_finished, stop || decided.stop_early);
    if (decided.stop_early) {
      spdlog::info(
          "train.early_stopping: stopped after epoch {} of {}; the best {} was at epoch {}",
          pos.epoch + 1, spec.train.epochs, spec.train.early_stopping.metric,
          pos.epoch + 1 - decisions.early_wait());
      ++pos.epoch;  // the epoch is done
      break;
    }
  }
  if (stop) {
    spdlog::info("train.max_steps {} reached at step {}", spec.train.max_steps, pos.global_step);
  }

  // 5. Export (chief only), after proving the replicas agree.
  summary.global_step = pos.global_step;
  meter.close();
  chief.export_model(&summary);
  return summary;
}

}  // namespace trainer::train
