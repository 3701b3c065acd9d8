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
#include "trainer/train/metrics.h"
#include "trainer/train/model_dir.h"
#include "trainer/train/optimizer.h"
#include "trainer/train/runtime.h"
#include "trainer/train/schedule.h"
#include "trainer/util/error.h"
#include "trainer/util/log.h"
#include "trainer/util/signals.h"

namespace trainer::train {

namespace {

using Clock = std::chrono::steady_clock;

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

void log_plan(const config::JobSpec& spec, const DataPlan& plan, const cluster::ClusterSpec& cl,
              const ModelSettings& settings, int threads, const model::ResNet& net) {
  spdlog::info("model {} ({} classes{}), {} parameters", spec.model.arch, plan.num_classes,
               spec.model.head_hidden > 0 ? fmt::format(", head {}", spec.model.head_hidden) : "",
               model::count_parameters(*net));
  spdlog::info("device {}, {} intra-op threads, precision {}{}", settings.device.str(), threads,
               spec.train.precision, settings.channels_last ? ", channels_last" : "");
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
  spdlog::info("global batch {} = {} per replica x {} replica(s); {} steps per epoch",
               plan.global_batch_size, spec.train.per_replica_batch_size, plan.num_workers,
               plan.steps_per_epoch);
  if (plan.num_workers > 1) {
    spdlog::info("data.shard_policy: {}; this worker reads {} examples", plan.shard.reason,
                 plan.shard.examples_this_worker);
  }
  const std::string dropped = data::dropped_summary(plan.shard, spec.train.per_replica_batch_size);
  if (!dropped.empty()) spdlog::info("left out of each epoch: {}", dropped);
}

}  // namespace

std::string job_identity(const config::JobSpec& spec) {
  config::JobSpec identity = spec;
  identity.train.epochs = config::TrainSpec{}.epochs;
  identity.train.max_steps = config::TrainSpec{}.max_steps;
  identity.logging = config::LoggingSpec{};
  return config::fingerprint(identity);
}

TrainSummary train_job(const config::JobSpec& spec, const TrainContext& ctx) {
  const DataPlan& plan = ctx.plan;
  const ModelSettings& settings = ctx.settings;
  dist::ProcessGroup& group = ctx.group;
  const cluster::JobDir& job_dir = ctx.job_dir;
  const bool distributed = group.world_size() > 1;

  // 1. Data: this worker's shard, the same number of steps on every worker.
  data::Loader train_loader(plan.train.examples, train_loader_options(spec.data, spec.train, plan));
  std::unique_ptr<data::Loader> val_loader;
  if (plan.validation) {
    val_loader = std::make_unique<data::Loader>(
        plan.validation->examples,
        eval_loader_options(spec.data, spec.train.per_replica_batch_size, *plan.validation,
                            plan.num_classes, plan.worker, plan.num_workers));
  }

  // 2. Model: built from the seed, then the chief's weights everywhere.
  model::ResNet net = build_model(spec.model, plan.num_classes, spec.train.seed);
  log_plan(spec, plan, ctx.cluster, settings, ctx.threads, net);
  place_model(net, settings);
  std::vector<torch::Tensor> state = net->parameters();
  for (const auto& b : net->buffers()) state.push_back(b);
  std::vector<torch::Tensor> bn_stats;  // running statistics, broadcast each step as DDP does
  for (const auto& item : net->named_buffers()) {
    if (item.key().find("running_") != std::string::npos) bn_stats.push_back(item.value());
  }

  // 3. Optimizer and schedule (linear scaling rule when asked).
  auto optimizer = make_optimizer(spec.train.optimizer, trainable_parameters(net));
  const double base_lr =
      spec.train.optimizer.learning_rate * (spec.train.scale_lr == "linear" ? plan.num_workers : 1);
  if (spec.train.scale_lr == "linear") {
    spdlog::info("train.scale_lr: linear: learning rate {} x {} replicas = {}",
                 spec.train.optimizer.learning_rate, plan.num_workers, base_lr);
  }
  const ScheduleShape shape{plan.steps_per_epoch, spec.train.epochs};

  // 4. Resume, then make the replicas identical.
  TrainPosition pos;
  if (ctx.resume) {
    restore_checkpoint(*ctx.resume, *net, *optimizer);
    pos = ctx.resume->position;
    spdlog::info("resumed from {} (epoch {}, batch {}, step {})", ctx.resume->dir.string(),
                 pos.epoch + 1, pos.batch_in_epoch, pos.global_step);
  }
  dist::broadcast_parameters(group, state);
  dist::GradientSync grad_sync(group, trainable_parameters(net), spec.distributed.bucket_mb);
  if (distributed) {
    spdlog::info("gradients: {} all-reduce buckets of about {} MB over {} ({} replicas)",
                 grad_sync.num_buckets(), spec.distributed.bucket_mb, group.backend(),
                 group.world_size());
  }

  MetricsLog metrics(job_dir.metrics_file(), ctx.resume ? pos.global_step : 0);
  const std::string identity = job_identity(spec);
  auto checkpoint = [&](const TrainPosition& at) {
    dist::check_replicas_agree(group, net->parameters(),
                               fmt::format("at the checkpoint of step {}", at.global_step));
    agree(group, ctx.cluster, "writing a checkpoint", [&] {
      if (!job_dir.is_chief()) return;
      const auto dir = save_checkpoint(job_dir.checkpoints_dir(), at, identity, *net, *optimizer,
                                       spec.checkpoint.keep);
      spdlog::info("checkpoint {}", dir.string());
    });
  };

  // 5. The loop.
  Progress progress(util::stderr_is_tty(), spec.logging.every_steps);
  TrainSummary summary;
  summary.epochs_done = pos.epoch;
  const auto loss_options =
      torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(spec.train.label_smoothing);
  // A resumed job may already be at train.max_steps (then only the export below runs).
  bool stop = spec.train.max_steps > 0 && pos.global_step >= spec.train.max_steps;
  for (; pos.epoch < spec.train.epochs && !stop; ++pos.epoch, pos.batch_in_epoch = 0) {
    set_train_mode(net, spec.model);
    train_loader.start_epoch(pos.epoch, pos.batch_in_epoch);
    progress.start_epoch(pos.epoch, spec.train.epochs, plan.steps_per_epoch, pos.batch_in_epoch);
    const auto epoch_start = Clock::now();
    double loss_sum = 0, correct_sum = 0, comm_wait_s = 0, step_time_s = 0;
    int64_t seen = 0;
    double ips_ema = 0;
    auto step_start = Clock::now();
    while (auto batch = train_loader.next()) {
      const double lr = learning_rate_at(spec.train.lr_schedule, base_lr, pos.global_step, shape);
      set_learning_rate(*optimizer, lr);
      if (distributed && !spec.model.freeze_batchnorm) dist::broadcast_parameters(group, bn_stats);
      // A batch whose images were all corrupt (on_corrupt: skip) still takes part in the
      // collectives, with a zero gradient, so every replica stays in lock-step.
      const int64_t n = batch->images.size(0);
      double loss_v = 0, acc = 0;
      optimizer->zero_grad();
      if (n > 0) {
        const torch::Tensor labels = batch->labels.to(settings.device);
        const torch::Tensor logits =
            forward_logits(net, prepare_input(batch->images, settings), settings);
        const torch::Tensor loss =
            torch::nn::functional::cross_entropy(logits, labels, loss_options);
        loss.backward();
        loss_v = loss.item<double>();
        acc = logits.argmax(1).eq(labels).sum().item<double>() / static_cast<double>(n);
      }
      grad_sync.finish();
      if (n > 0 || distributed) optimizer->step();

      const auto now = Clock::now();
      const double dt = std::chrono::duration<double>(now - step_start).count();
      step_start = now;
      const double ips = static_cast<double>(n) * plan.num_workers / dt;
      ips_ema = ips_ema == 0 ? ips : 0.8 * ips_ema + 0.2 * ips;
      loss_sum += loss_v * static_cast<double>(n);
      correct_sum += acc * static_cast<double>(n);
      seen += n;
      comm_wait_s += grad_sync.last_step().wait_s;
      step_time_s += dt;
      ++pos.global_step;
      std::map<std::string, double> record = {
          {"loss", loss_v}, {"accuracy", acc}, {"learning_rate", lr}, {"images_per_sec", ips}};
      if (distributed) {
        record["step_time_s"] = dt;
        record["comm_wait_s"] = grad_sync.last_step().wait_s;
      }
      metrics.write(pos.global_step, pos.epoch + 1, record);
      progress.step(batch->index + 1, loss_v, acc, lr, ips_ema);
      pos.batch_in_epoch = batch->index + 1;
      // Every replica stops at the same step when any of them was asked to.
      if (group.all_reduce_max(util::stop_requested() ? 1 : 0) > 0) {
        progress.end_epoch();
        checkpoint(pos);
        throw Interrupted(fmt::format(
            "stopped by a signal at step {}; the newest checkpoint holds this position: start the "
            "same command again to resume",
            pos.global_step));
      }
      if (spec.train.max_steps > 0 && pos.global_step >= spec.train.max_steps) {
        stop = true;
        break;
      }
    }
    progress.end_epoch();
    if (train_loader.skipped_total() > 0) {
      spdlog::warn("{} corrupt training images skipped so far (data.on_corrupt: skip)",
                   train_loader.skipped_total());
    }
    if (spec.data.cache == "memory") {
      spdlog::info("data.cache: memory holds {} of {} training images, {:.1f} MiB",
                   train_loader.cached_examples(), train_loader.num_examples(),
                   static_cast<double>(train_loader.cached_bytes()) / (1024.0 * 1024.0));
    }

    const bool epoch_finished = pos.batch_in_epoch >= plan.steps_per_epoch;
    std::map<std::string, double> epoch_metrics = {
        {"epoch_time_s", std::chrono::duration<double>(Clock::now() - epoch_start).count()}};
    if (seen > 0) {
      epoch_metrics["train_loss"] = loss_sum / static_cast<double>(seen);
      epoch_metrics["train_accuracy"] = correct_sum / static_cast<double>(seen);
    }
    std::string line =
        seen > 0 ? fmt::format("train loss {:.4f} acc {:.4f}", epoch_metrics.at("train_loss"),
                               epoch_metrics.at("train_accuracy"))
                 : std::string("no training steps this run");
    if (distributed && step_time_s > 0) {
      epoch_metrics["comm_wait_share"] = comm_wait_s / step_time_s;
      line += fmt::format(", waiting on gradients {:.1f}% of step time",
                          100 * comm_wait_s / step_time_s);
    }
    if (val_loader && (epoch_finished || stop)) {
      const EvalCounts val =
          evaluate_distributed(group, net, *val_loader, plan.num_classes, settings);
      set_train_mode(net, spec.model);
      epoch_metrics["val_loss"] = val.loss();
      epoch_metrics["val_accuracy"] = val.accuracy();
      summary.val_accuracy = val.accuracy();
      line += fmt::format(", validation loss {:.4f} acc {:.4f} ({} examples)", val.loss(),
                          val.accuracy(), val.num_examples);
    }
    spdlog::info("epoch {}/{}: {}", pos.epoch + 1, spec.train.epochs, line);
    metrics.write(pos.global_step, pos.epoch + 1, epoch_metrics);

    if (epoch_finished) {
      const TrainPosition next{pos.epoch + 1, 0, pos.global_step};
      const bool last = next.epoch >= spec.train.epochs;
      if (stop || last || next.epoch % spec.checkpoint.every_epochs == 0) checkpoint(next);
    } else if (stop) {
      checkpoint(pos);
    }
    summary.epochs_done = epoch_finished ? pos.epoch + 1 : pos.epoch;
  }
  if (stop) {
    spdlog::info("train.max_steps {} reached at step {}", spec.train.max_steps, pos.global_step);
  }

  // 6. Export (chief only), after proving the replicas agree.
  dist::check_replicas_agree(group, net->parameters(), "at the end");
  summary.global_step = pos.global_step;
  agree(group, ctx.cluster, "exporting the model", [&] {
    if (!job_dir.is_chief()) return;
    ModelInfo info;
    info.arch = spec.model.arch;
    info.num_classes = plan.num_classes;
    info.head_hidden = spec.model.head_hidden;
    info.class_names = plan.class_names;
    info.image_size = spec.data.image_size;
    info.normalize = spec.data.normalize;
    info.reduced_decode = spec.data.reduced_decode;
    info.precision = spec.train.precision;
    info.channels_last = spec.train.channels_last;
    info.global_step = pos.global_step;
    info.epochs = summary.epochs_done;
    export_model(job_dir.model_dir(), net, info);
  });
  return summary;
}

}  // namespace trainer::train
