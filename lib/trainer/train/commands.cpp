#include "trainer/train/commands.h"

#include <spdlog/spdlog.h>

#include <fmt/format.h>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/job_dir.h"
#include "trainer/config/job_spec.h"
#include "trainer/data/image.h"
#include "trainer/data/loader.h"
#include "trainer/train/checkpoint.h"
#include "trainer/train/data_plan.h"
#include "trainer/train/evaluate.h"
#include "trainer/train/model_dir.h"
#include "trainer/train/runtime.h"
#include "trainer/train/trainer.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/log.h"
#include "trainer/util/signals.h"

namespace trainer::train {

namespace fs = std::filesystem;

namespace {

config::JobSpec resolve_spec(const std::string& path, std::vector<std::string> overrides,
                             int epochs) {
  if (epochs < 0)
    throw UsageError("--epochs: expected a positive number, got " + std::to_string(epochs));
  if (epochs > 0) overrides.push_back("train.epochs=" + std::to_string(epochs));
  return config::load_job_spec(path, overrides);
}

// Checks that the job dir holds this job (or none) and records the spec; returns the checkpoint
// to resume from. A different job (in job.yaml or in its checkpoints) is an error unless
// --overwrite, which clears that job's outputs first. Nothing is written before the checks pass.
std::optional<CheckpointInfo> claim_job_dir(const cluster::JobDir& dir, const config::JobSpec& spec,
                                            bool overwrite) {
  if (!dir.is_chief()) return latest_checkpoint(dir.checkpoints_dir());
  std::optional<std::string> conflict;
  if (fs::exists(dir.job_yaml())) {
    try {
      const config::JobSpec previous = config::load_job_spec(dir.job_yaml().string(), {});
      if (auto diff = config::first_difference(previous, spec, config::resumable_changes())) {
        conflict = fmt::format("{} is {} there but {} here", diff->field, diff->left, diff->right);
      }
    } catch (const ConfigError& e) {
      conflict = fmt::format("its job.yaml does not parse ({})", e.what());
    }
  }
  auto latest = latest_checkpoint(dir.checkpoints_dir());
  if (!conflict && latest && latest->fingerprint != job_identity(spec)) {
    conflict = "its checkpoint " + latest->dir.filename().string() +
               " was written by a different job spec";
  }
  if (conflict && !overwrite) {
    throw ConfigError(fmt::format(
        "--job-dir '{}' holds a different job: {}; use a new --job-dir, or --overwrite to discard "
        "that job's checkpoints, metrics and model",
        dir.root().string(), *conflict));
  }
  if (conflict) {
    spdlog::warn("--overwrite: discarding the previous job in {} ({})", dir.root().string(),
                 *conflict);
    for (const fs::path& p : {dir.checkpoints_dir(), dir.model_dir(), dir.metrics_file()}) {
      fs::remove_all(p);
    }
    fs::create_directories(dir.checkpoints_dir());
    latest.reset();
  }
  util::write_file_atomic(dir.job_yaml(), config::to_yaml(spec));
  return latest;
}

}  // namespace

int run_train(const TrainOptions& options) {
  if (options.job_dir.empty()) throw UsageError("--job-dir is required");
  const config::JobSpec spec = resolve_spec(options.config, options.overrides, options.epochs);
  const cluster::ClusterSpec cluster = cluster::cluster_from_env();
  const cluster::JobDir job_dir(options.job_dir, cluster);
  job_dir.prepare();
  util::setup_logging(spec.logging.level, job_dir.log_file().string());
  util::install_stop_handlers();
  spdlog::info("trainer {}: job {} in {}", TRAINER_VERSION,
               options.config.empty() ? "(defaults)" : options.config, job_dir.root().string());

  const auto resume = claim_job_dir(job_dir, spec, options.overwrite);
  const bool finished =
      resume &&
      (resume->position.epoch >= spec.train.epochs ||
       (spec.train.max_steps > 0 && resume->position.global_step >= spec.train.max_steps));
  // A finished job is left alone, unless it stopped before exporting its model (then the export
  // below runs from the checkpoint without training).
  if (finished && (!job_dir.is_chief() || fs::exists(job_dir.model_dir() / "model.json"))) {
    spdlog::info(
        "{} already holds this job trained to epoch {} (step {}); nothing to do (raise "
        "--epochs to train further)",
        job_dir.root().string(), resume->position.epoch, resume->position.global_step);
    if (job_dir.is_chief()) {
      std::printf("model: %s\n", job_dir.model_dir().string().c_str());
    }
    return 0;
  }
  const TrainSummary summary = train_job(spec, cluster, job_dir, resume);
  if (job_dir.is_chief()) {
    spdlog::info("model written to {}", job_dir.model_dir().string());
    std::printf("model: %s\n", job_dir.model_dir().string().c_str());
    if (summary.val_accuracy) std::printf("validation accuracy: %.4f\n", *summary.val_accuracy);
  }
  job_dir.finish_clean();
  return 0;
}

int run_inspect(const InspectOptions& options, std::ostream& out) {
  const config::JobSpec spec = resolve_spec(options.config, options.overrides, options.epochs);
  const cluster::ClusterSpec cluster = cluster::cluster_from_env();
  nlohmann::json doc;
  doc["job"] = config::to_json(spec);
  doc["cluster"] = cluster::to_json(cluster);
  if (!options.job_dir.empty()) {
    const cluster::JobDir job_dir(options.job_dir, cluster);
    doc["cluster"]["write_dir"] = job_dir.write_dir().string();
  }
  const DataPlan plan = plan_data(spec, cluster);
  doc["data"] = to_json(plan);
  doc["fingerprint"] = config::fingerprint(spec);
  out << doc.dump(2) << "\n";
  return 0;
}

int run_evaluate(const EvaluateOptions& options, std::ostream& out) {
  const LoadedModel loaded = load_model_dir(options.model_dir);
  const config::JobSpec spec = resolve_spec(options.config, options.overrides, 0);
  configure_threads(spec.train.threads);
  const data::Listing listing = list_split(spec.data, options.split, loaded.info.class_names);
  if (listing.class_names != loaded.info.class_names) {
    throw DataError(fmt::format("{} has classes [{}] but the model was trained on [{}]",
                                listing.origin, fmt::join(listing.class_names, ", "),
                                fmt::join(loaded.info.class_names, ", ")));
  }
  config::DataSpec data = spec.data;
  data.image_size = loaded.info.image_size;  // preprocess exactly as the model was trained
  data.normalize = loaded.info.normalize;
  data::Loader loader(listing.examples,
                      eval_loader_options(data, spec.train.per_replica_batch_size));

  ModelSettings settings;
  settings.device = resolve_device(spec.train.device);
  settings.bf16 = loaded.info.precision == "bf16";
  settings.channels_last = loaded.info.channels_last;
  model::ResNet net = loaded.net;
  place_model(net, settings);
  const EvalCounts counts = evaluate(net, loader, loaded.info.num_classes, settings);
  nlohmann::json doc = counts.to_json(loaded.info.class_names);
  doc["split"] = options.split;
  doc["model"] = options.model_dir;
  out << doc.dump() << "\n";
  return 0;
}

int run_predict(const PredictOptions& options, std::ostream& out) {
  if (options.images.empty()) throw UsageError("predict: give at least one IMAGE");
  const LoadedModel loaded = load_model_dir(options.model_dir);
  configure_threads(options.threads);
  data::PreprocessOptions pre;
  pre.image_size = loaded.info.image_size;
  pre.normalize = loaded.info.normalize;
  const data::ImagePipeline pipeline(pre);

  ModelSettings settings;
  settings.bf16 = loaded.info.precision == "bf16";
  settings.channels_last = loaded.info.channels_last;
  model::ResNet net = loaded.net;
  place_model(net, settings);
  net->eval();
  torch::NoGradGuard no_grad;
  for (const std::string& path : options.images) {
    const torch::Tensor x = pipeline.load(path, 0).unsqueeze(0);
    const torch::Tensor probs =
        torch::softmax(forward_logits(net, prepare_input(x, settings), settings), 1)[0].cpu();
    const int64_t index = probs.argmax().item<int64_t>();
    const std::vector<float> p(probs.data_ptr<float>(), probs.data_ptr<float>() + probs.numel());
    out << nlohmann::json{{"path", path},
                          {"label", loaded.info.class_names.at(static_cast<size_t>(index))},
                          {"index", index},
                          {"probabilities", p}}
               .dump()
        << "\n";
    out.flush();
  }
  return 0;
}

int run_make_dataset(const MakeDatasetOptions& options, std::ostream& out) {
  const data::SyntheticSummary summary = data::make_synthetic_dataset(options);
  nlohmann::json doc = {{"out", options.out_dir}, {"classes", summary.class_names}};
  for (const auto& [split, n] : summary.images_per_split) doc["images"][split] = n;
  out << doc.dump() << "\n";
  return 0;
}

}  // namespace trainer::train
