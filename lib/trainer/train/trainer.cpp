#include "trainer/train/trainer.h"

#include <spdlog/spdlog.h>

#include <fmt/format.h>
#include <chrono>
#include <memory>

#include "trainer/data/loader.h"
#include "trainer/model/resnet.h"
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

void log_plan(const config::JobSpec& spec, const DataPlan& plan, const cluster::ClusterSpec& cl,
              const ModelSettings& settings, int threads, const model::ResNet& net) {
  spdlog::info("model {} ({} classes{}), {} parameters", spec.model.arch, plan.num_classes,
               spec.model.head_hidden > 0 ? fmt::format(", head {}", spec.model.head_hidden) : "",
               model::count_parameters(*net));
  spdlog::info("device {}, {} intra-op threads, precision {}{}", settings.device.str(), threads,
               spec.train.precision, settings.channels_last ? ", channels_last" : "");
  spdlog::info("data: {} training examples in {} classes [{}] from {}", plan.train.examples.size(),
               plan.num_classes, fmt::join(plan.class_names, ", "), plan.train.origin);
  if (plan.validation) {
    spdlog::info("data: {} validation examples from {}", plan.validation->examples.size(),
                 plan.validation->origin);
  }
  const int64_t used = plan.steps_per_epoch * spec.train.per_replica_batch_size;
  spdlog::info("global batch {} = {} per replica x {} replica(s); {} steps per epoch{}",
               plan.global_batch_size, spec.train.per_replica_batch_size, cl.world_size,
               plan.steps_per_epoch,
               used < static_cast<int64_t>(plan.train.examples.size())
                   ? fmt::format(" ({} examples left over each epoch)",
                                 plan.train.examples.size() - static_cast<size_t>(used))
                   : "");
}

}  // namespace

std::string job_identity(const config::JobSpec& spec) {
  config::JobSpec identity = spec;
  identity.train.epochs = config::TrainSpec{}.epochs;
  identity.train.max_steps = config::TrainSpec{}.max_steps;
  identity.logging = config::LoggingSpec{};
  return config::fingerprint(identity);
}

TrainSummary train_job(const config::JobSpec& spec, const cluster::ClusterSpec& cluster,
                       const cluster::JobDir& job_dir,
                       const std::optional<CheckpointInfo>& resume) {
  // 1. Run-time: device, threads.
  ModelSettings settings;
  settings.device = resolve_device(spec.train.device);
  settings.channels_last = spec.train.channels_last;
  settings.bf16 = spec.train.precision == "bf16";
  const int threads = configure_threads(spec.train.threads);

  // 2. Data.
  const DataPlan plan = plan_data(spec, cluster);
  data::Loader train_loader(plan.train.examples, train_loader_options(spec.data, spec.train));
  std::unique_ptr<data::Loader> val_loader;
  if (plan.validation) {
    val_loader = std::make_unique<data::Loader>(
        plan.validation->examples,
        eval_loader_options(spec.data, spec.train.per_replica_batch_size));
  }

  // 3. Model, optimizer, schedule.
  model::ResNet net = build_model(spec.model, plan.num_classes, spec.train.seed);
  log_plan(spec, plan, cluster, settings, threads, net);
  place_model(net, settings);
  auto optimizer = make_optimizer(spec.train.optimizer, trainable_parameters(net));
  const ScheduleShape shape{plan.steps_per_epoch, spec.train.epochs};

  // 4. Resume.
  TrainPosition pos;
  if (resume) {
    restore_checkpoint(*resume, *net, *optimizer);
    pos = resume->position;
    spdlog::info("resumed from {} (epoch {}, batch {}, step {})", resume->dir.string(),
                 pos.epoch + 1, pos.batch_in_epoch, pos.global_step);
  }
  MetricsLog metrics = job_dir.is_chief()
                           ? MetricsLog(job_dir.metrics_file(), resume ? pos.global_step : 0)
                           : MetricsLog();
  const std::string identity = job_identity(spec);
  auto checkpoint = [&](const TrainPosition& at) {
    if (!job_dir.is_chief()) return;
    const auto dir = save_checkpoint(job_dir.checkpoints_dir(), at, identity, *net, *optimizer,
                                     spec.checkpoint.keep);
    spdlog::info("checkpoint {}", dir.string());
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
    double loss_sum = 0, correct_sum = 0;
    int64_t seen = 0;
    double ips_ema = 0;
    auto step_start = Clock::now();
    while (auto batch = train_loader.next()) {
      if (batch->images.size(0) > 0) {
        const double lr = learning_rate_at(
            spec.train.lr_schedule, spec.train.optimizer.learning_rate, pos.global_step, shape);
        set_learning_rate(*optimizer, lr);
        const torch::Tensor labels = batch->labels.to(settings.device);
        const torch::Tensor logits =
            forward_logits(net, prepare_input(batch->images, settings), settings);
        const torch::Tensor loss =
            torch::nn::functional::cross_entropy(logits, labels, loss_options);
        optimizer->zero_grad();
        loss.backward();
        optimizer->step();

        const int64_t n = labels.size(0);
        const double loss_v = loss.item<double>();
        const double acc =
            logits.argmax(1).eq(labels).sum().item<double>() / static_cast<double>(n);
        const auto now = Clock::now();
        const double ips =
            static_cast<double>(n) / std::chrono::duration<double>(now - step_start).count();
        step_start = now;
        ips_ema = ips_ema == 0 ? ips : 0.8 * ips_ema + 0.2 * ips;
        loss_sum += loss_v * static_cast<double>(n);
        correct_sum += acc * static_cast<double>(n);
        seen += n;
        ++pos.global_step;
        metrics.write(
            pos.global_step, pos.epoch + 1,
            {{"loss", loss_v}, {"accuracy", acc}, {"learning_rate", lr}, {"images_per_sec", ips}});
        progress.step(batch->index + 1, loss_v, acc, lr, ips_ema);
      }
      pos.batch_in_epoch = batch->index + 1;
      if (util::stop_requested()) {
        progress.end_epoch();
        checkpoint(pos);
        throw Interrupted(fmt::format(
            "stopped by signal {} at step {}; the newest checkpoint holds this position: start the "
            "same command again to resume",
            util::stop_signal(), pos.global_step));
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
    if (val_loader && (epoch_finished || stop)) {
      const EvalCounts val = evaluate(net, *val_loader, plan.num_classes, settings);
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

  // 6. Export (chief only).
  summary.global_step = pos.global_step;
  if (job_dir.is_chief()) {
    ModelInfo info;
    info.arch = spec.model.arch;
    info.num_classes = plan.num_classes;
    info.head_hidden = spec.model.head_hidden;
    info.class_names = plan.class_names;
    info.image_size = spec.data.image_size;
    info.normalize = spec.data.normalize;
    info.precision = spec.train.precision;
    info.channels_last = spec.train.channels_last;
    info.global_step = pos.global_step;
    info.epochs = summary.epochs_done;
    export_model(job_dir.model_dir(), net, info);
  }
  return summary;
}

}  // namespace trainer::train
