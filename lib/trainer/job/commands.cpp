#include "trainer/job/commands.h"

#include <spdlog/spdlog.h>

#include <fmt/format.h>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/cluster/environment.h"
#include "trainer/cluster/job_dir.h"
#include "trainer/cluster/local_rank.h"
#include "trainer/cluster/slurm.h"
#include "trainer/config/job_spec.h"
#include "trainer/data/image.h"
#include "trainer/data/loader.h"
#include "trainer/dist/process_group.h"
#include "trainer/job/agreement.h"
#include "trainer/job/data_plan.h"
#include "trainer/job/sidecar.h"
#include "trainer/job/train_job.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/evaluate.h"
#include "trainer/loop/model_dir.h"
#include "trainer/loop/runtime.h"
#include "trainer/model/pth.h"
#include "trainer/model/safetensors.h"
#include "trainer/util/cpu.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/log.h"
#include "trainer/util/memory.h"
#include "trainer/util/signals.h"
#include "trainer/util/storage.h"

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

// The chief's claim (through chief_writes): checks that the job dir holds this job (or none) and
// records the spec. A different job (in job.yaml or in its checkpoints) is an error unless
// --overwrite, which clears that job's outputs first. Nothing is written before the checks pass.
void claim_job_dir(const cluster::JobDir& dir, const config::JobSpec& spec, bool overwrite) {
  std::optional<std::string> conflict;
  if (fs::exists(dir.job_yaml())) {
    try {
      const config::JobSpec previous = config::load_job_spec(dir.job_yaml().string(), {});
      if (auto diff = config::first_difference(previous, spec, config::resumable_changes(spec))) {
        conflict = fmt::format("{} is {} there but {} here", diff->field, diff->left, diff->right);
      }
    } catch (const ConfigError& e) {
      conflict = fmt::format("its job.yaml does not parse ({})", e.what());
    }
  }
  const auto latest = latest_checkpoint(dir.checkpoints_dir());
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
  }
  util::write_file_atomic(dir.job_yaml(), config::to_yaml(spec));
}

}  // namespace

namespace {

dist::DistOptions dist_options(const config::JobSpec& spec, const cluster::ClusterSpec& cluster,
                               const torch::Device& device) {
  dist::DistOptions o;
  o.rank = cluster.rank;
  o.world_size = cluster.world_size;
  // A one-process job that names NCCL still forms a (one-rank) group at its own address.
  if (cluster.world_size > 1 ||
      (spec.distributed.backend == "nccl" && !cluster.chief_address.empty())) {
    o.chief_host = cluster::host_of(cluster.chief_address);
    o.chief_port = cluster::port_of(cluster.chief_address);
    // No own address (a torchrun worker): Gloo binds to this machine's hostname.
    o.own_host = cluster.own_address.empty() ? "" : cluster::host_of(cluster.own_address);
    for (int r = 0; r < cluster.world_size; ++r) {
      o.task_names.push_back(cluster::task_name(cluster, r) + " (" + cluster.worker_addresses[r] +
                             ")");
    }
  }
  o.interface = spec.distributed.interface;
  o.backend = spec.distributed.backend;
  o.use_cuda = device.is_cuda();
  o.rendezvous_timeout_s = spec.distributed.rendezvous_timeout_s;
  o.timeout_s = spec.distributed.timeout_s;
  return o;
}

// Every rank resumes from the chief's checkpoint; a task that sees another one (a job dir that
// is not one shared directory) cannot resume.
void agree_on_resume(dist::ProcessGroup& group, const cluster::ClusterSpec& cluster,
                     const std::optional<CheckpointInfo>& resume) {
  if (group.world_size() == 1) return;
  const auto names =
      group.all_gather_strings(resume ? resume->dir.filename().string() : std::string("(none)"));
  for (size_t rank = 1; rank < names.size(); ++rank) {
    if (names[rank] == names[0]) continue;
    throw ConfigError(fmt::format(
        "{} sees checkpoint {} in the job dir but the chief resumes from {}: to resume, --job-dir "
        "must be one directory shared by every task",
        cluster::task_name(cluster, static_cast<int>(rank)), names[rank], names[0]));
  }
}

// What train would run on here: device, effective precision and layout, the thread budget, the
// allocator and the CPU (inspect's `runtime`).
nlohmann::json runtime_json(const config::JobSpec& spec, const cluster::ClusterSpec& cluster) {
  const cluster::LocalRank local = cluster::local_rank(cluster::process_environment(), cluster);
  const DeviceChoice device = resolve_device(spec.train.device, spec.distributed.backend, local);
  const ThreadBudget budget = plan_threads(spec, cluster.world_size);
  apply_threads(budget);  // auto precision or layout is timed on the job's threads
  const ModelSettings settings = model_settings(spec, device.device, /*warn_emulated_bf16=*/false);
  const util::CpuFeatures cpu = util::cpu_features();
  const util::AllocatorInfo alloc = util::allocator_info();
  return {
      {"device", settings.device.str()},
      {"device_reason", device.why},  // which local rank, how many GPUs
      {"local_rank",
       {{"index", local.index},
        {"world_size", local.world_size > 0 ? nlohmann::json(local.world_size) : nullptr},
        {"source", local.source}}},
      {"precision", settings.precision},
      {"deterministic", settings.deterministic},
      {"precision_requested", spec.train.precision},
      {"memory_format", settings.channels_last ? "channels_last" : "nchw"},
      {"memory_format_requested", spec.train.channels_last},
      // How auto precision or layout was decided on this CPU: the candidates' timings.
      {"format_choice",
       settings.format_choice ? settings.format_choice->to_json() : nlohmann::json()},
      // Which BatchNorm the job trains with: frozen (eval mode), sync (statistics over the
      // global batch) or per-replica (each replica's own batch, as one process).
      {"batchnorm", spec.model.freeze_batchnorm                           ? "frozen"
                    : spec.model.sync_batchnorm && cluster.world_size > 1 ? "sync"
                                                                          : "per-replica"},
      {"micro_batch_size", spec.train.micro_batch_size > 0 ? spec.train.micro_batch_size
                                                           : spec.train.per_replica_batch_size},
      {"threads",
       {{"cores", budget.cores},
        {"intra_op", budget.intra_op},
        {"inter_op", budget.inter_op},
        {"decode", budget.decode},
        {"record_reader", budget.record_reader},
        {"gloo", budget.gloo}}},
      {"allocator", alloc.name + (alloc.settings.empty() ? "" : " (" + alloc.settings + ")")},
      {"cpu", {{"model", cpu.model}, {"flags", cpu.flags()}, {"native_bf16", cpu.native_bf16()}}}};
}

}  // namespace

namespace {

// Seconds the chief waits, after a failure, for the others to read why (at most timeout_s).
constexpr double kFailureGraceS = 15;

// On the way out of a failed run: this process's own failure (not one caused by a peer's, not a
// lost connection or a signal, which every rank sees for itself) goes to the others with its task
// and cause; the chief then waits a little for them to read it (ProcessGroup::leave_after_failure).
void tell_peers(dist::ProcessGroup& group, const cluster::ClusterSpec& cluster,
                const config::JobSpec& spec, const std::exception_ptr& error) {
  std::optional<dist::FailureReport> mine;
  try {
    std::rethrow_exception(error);
  } catch (const PeerFailed&) {
  } catch (...) {
    const ErrorSummary f = describe_exception(error);
    if (f.kind != ErrorKind::kDistributed && f.kind != ErrorKind::kInterrupted) {
      mine = dist::FailureReport{cluster::task_name(cluster, cluster.rank), f.kind, f.message};
    }
  }
  group.leave_after_failure(mine, std::min(spec.distributed.timeout_s, kFailureGraceS));
}

// train.precision or train.channels_last auto (the same spec on every rank, so every rank takes
// part): the chief's choice, timed on its CPU, goes to every other rank.
void share_format_choice(dist::ProcessGroup& group, const config::JobSpec& spec,
                         ModelSettings& settings) {
  if (group.world_size() == 1) return;
  if (spec.train.precision != "auto" && spec.train.channels_last != "auto") return;
  const bool chief = group.rank() == 0;
  const std::string mine =
      chief && settings.format_choice ? settings.format_choice->to_json().dump() : "";
  const std::vector<std::string> all = group.all_gather_strings(mine);
  if (chief || all[0].empty() || !settings.format_choice) return;  // a GPU job: no CPU timing
  adopt_format_choice(settings, nlohmann::json::parse(all[0]));
}

// Steps 3 to 5 of run_train, once the process group is up.
int train_in_group(const TrainOptions& options, const config::JobSpec& spec,
                   const cluster::ClusterSpec& cluster, const cluster::JobDir& job_dir,
                   const ModelSettings& settings, const ThreadBudget& budget,
                   dist::ProcessGroup& group) {
  // 3. The data plan, and proof that every process runs the same job.
  DataPlan plan;
  const data::ListOptions list = list_options_for(job_dir.root().string());
  agree(group, cluster, "listing the data", [&] { plan = plan_data(spec, cluster, list); });
  chief_writes(group, cluster, job_dir, "caching the record counts",
               [&] { cache_record_counts(plan, list); });
  // The kernels' format too: every replica must compute alike (auto: the chief's choice).
  verify_same_job(group, cluster,
                  job_description(spec, plan.train, plan.validation ? &*plan.validation : nullptr) +
                      "effective precision=" + settings.precision + "\neffective memory format=" +
                      (settings.channels_last ? "channels_last" : "nchw") + "\n");

  // 4. The job dir: the same job or none (the chief's claim); where to resume (every rank reads
  // the job dir the chief claimed, and all must see the same checkpoint).
  chief_writes(group, cluster, job_dir, "claiming the job dir",
               [&] { claim_job_dir(job_dir, spec, options.overwrite); });
  const std::optional<CheckpointInfo> resume = latest_checkpoint(job_dir.checkpoints_dir());
  agree_on_resume(group, cluster, resume);
  const CheckpointPlan checkpoint_plan{group.world_size(), plan.steps_per_epoch,
                                       group.all_gather_strings(data::shard_digest(plan.shard))};
  if (resume) check_resume_plan(*resume, checkpoint_plan);  // the same verdict on every rank
  const bool finished =
      resume &&
      (resume->position.epoch >= spec.train.epochs ||
       (spec.train.max_steps > 0 && resume->position.global_step >= spec.train.max_steps));
  // A finished job is left alone, unless it stopped before exporting its model (then the export
  // in train_job runs from the checkpoint without training). Every rank sees the same job dir
  // (agree_on_resume); one that misses the model makes all of them export it again.
  const bool has_model = finished && fs::exists(job_dir.model_dir() / "model.json") &&
                         (!spec.export_.onnx || fs::exists(job_dir.model_dir() / "model.onnx"));
  if (group.all_reduce_min(has_model ? 1 : 0) > 0) {
    spdlog::info(
        "{} already holds this job trained to epoch {} (step {}); nothing to do (raise "
        "--epochs to train further)",
        job_dir.root().string(), resume->position.epoch, resume->position.global_step);
    chief_writes(group, cluster, job_dir, "reporting the model",
                 [&] { std::printf("model: %s\n", job_dir.model_dir().string().c_str()); });
    job_dir.finish_clean();
    return 0;
  }

  // 5. Train, export.
  const TrainSummary summary = train_job(
      spec, TrainContext{cluster, job_dir, plan, group, settings, budget, resume, checkpoint_plan});
  if (summary.model_dir) {  // where this rank exported it: the chief only
    spdlog::info("model written to {}", summary.model_dir->string());
    std::printf("model: %s\n", summary.model_dir->string().c_str());
    if (summary.val_accuracy) std::printf("validation accuracy: %.4f\n", *summary.val_accuracy);
  }
  job_dir.finish_clean();
  return 0;
}

}  // namespace

int run_train(const TrainOptions& options) {
  if (options.job_dir.empty()) throw UsageError("--job-dir is required");
  // 1. The job and this process's role.
  const config::JobSpec spec = resolve_spec(options.config, options.overrides, options.epochs);
  const cluster::ClusterSpec cluster = cluster::cluster_from_env(spec.distributed.cluster);
  const cluster::JobDir job_dir(util::local_path(options.job_dir, "--job-dir"), cluster);
  if (cluster.task_type == "evaluator") {  // outside the training group: no rendezvous
    job_dir.prepare();
    util::setup_logging(spec.logging.level, job_dir.log_file().string());
    util::install_stop_handlers();
    return run_sidecar_evaluator(spec, cluster, job_dir);
  }
  // A job dir this task cannot write fails the job only once the group is up, so that every task
  // stops with this one's cause (exit 3) instead of the others waiting out the rendezvous.
  std::exception_ptr unwritable;
  try {
    job_dir.prepare();
  } catch (const DataError&) {
    unwritable = std::current_exception();
  }
  util::setup_logging(spec.logging.level, unwritable ? "" : job_dir.log_file().string());
  util::install_stop_handlers();
  spdlog::info("trainer {}: job {} in {} as {} (rank {} of {})", TRAINER_VERSION,
               options.config.empty() ? "(defaults)" : options.config, job_dir.root().string(),
               cluster::task_name(cluster, cluster.rank), cluster.rank, cluster.world_size);

  // 2. Run-time: this process's device, made current before any CUDA work and before the group
  // exists; precision, threads. Then meet the others at the chief.
  const cluster::LocalRank local = cluster::local_rank(cluster::process_environment(), cluster);
  const DeviceChoice device = resolve_device(spec.train.device, spec.distributed.backend, local);
  activate_device(device.device);
  spdlog::info("device {} ({})", device.device.str(), device.why);
  const ThreadBudget budget = plan_threads(spec, cluster.world_size);
  apply_threads(budget);
  // Auto precision or layout on a CPU: the chief times the candidates; the others take its
  // choice once the group is up, so every replica runs the same kernels.
  ModelSettings settings = model_settings(spec, device.device, /*warn_emulated_bf16=*/true,
                                          /*measure=*/cluster.rank == 0);
  dist::DistOptions dist_opts = dist_options(spec, cluster, settings.device);
  dist_opts.threads = budget.gloo;
  const auto group = dist::ProcessGroup::connect(dist_opts);
  try {
    share_format_choice(*group, spec, settings);
    agree(*group, cluster, "preparing the job dir", [&] {
      if (unwritable) std::rethrow_exception(unwritable);
    });
    return train_in_group(options, spec, cluster, job_dir, settings, budget, *group);
  } catch (...) {
    tell_peers(*group, cluster, spec, std::current_exception());
    throw;
  }
}

int run_inspect(const InspectOptions& options, std::ostream& out) {
  const config::JobSpec spec = resolve_spec(options.config, options.overrides, options.epochs);
  const cluster::ClusterSpec cluster = cluster::cluster_from_env(spec.distributed.cluster);
  nlohmann::json doc;
  doc["job"] = config::to_json(spec);
  doc["cluster"] = cluster::to_json(cluster);
  if (spec.distributed.cluster == "slurm") {  // the TF_CONFIG this SLURM task amounts to
    doc["cluster"]["tf_config"] =
        nlohmann::json::parse(cluster::tf_config_from_slurm(cluster::process_environment()));
  }
  const std::string job_root =
      options.job_dir.empty() ? "" : util::local_path(options.job_dir, "--job-dir");
  if (!job_root.empty()) {
    const cluster::JobDir job_dir(job_root, cluster);
    doc["cluster"]["write_dir"] = job_dir.write_dir().string();
  }
  const DataPlan plan = plan_data(spec, cluster, list_options_for(job_root));
  doc["data"] = to_json(plan);
  doc["runtime"] = runtime_json(spec, cluster);
  doc["fingerprint"] = config::fingerprint(spec);
  out << doc.dump(2) << "\n";
  return 0;
}

int run_evaluate(const EvaluateOptions& options, std::ostream& out) {
  const Tta tta = parse_tta(options.tta, "evaluate: --tta");
  const LoadedModel loaded = load_model_dir(options.model_dir);
  const config::JobSpec spec = resolve_spec(options.config, options.overrides, 0);
  const ThreadBudget budget = plan_threads(spec, 1);
  apply_threads(budget);
  const data::Listing listing = list_split(spec.data, options.split, loaded.info.class_names);
  if (listing.class_names != loaded.info.class_names) {
    throw DataError(fmt::format("{} has classes [{}] but the model was trained on [{}]",
                                listing.origin, fmt::join(listing.class_names, ", "),
                                fmt::join(loaded.info.class_names, ", ")));
  }
  EvalReading reading{spec.train.per_replica_batch_size, loaded.info.num_classes, budget.decode};
  reading.model = &loaded.info;  // preprocess exactly as the model was trained
  const std::unique_ptr<data::Loader> loader = make_eval_loader(spec.data, listing, reading);

  const torch::Device device =
      resolve_device(spec.train.device, spec.distributed.backend, {}).device;
  activate_device(device);
  ModelSettings settings = inference_settings(loaded.info, device);
  model::Net net = loaded.net;
  place_model(net, settings);
  const EvalCounts counts = evaluate(net, *loader, loaded.info.num_classes, settings, tta);
  nlohmann::json doc = counts.to_json(loaded.info.class_names);
  doc["split"] = options.split;
  doc["model"] = options.model_dir;
  if (tta != Tta::kNone) doc["tta"] = options.tta;
  out << doc.dump() << "\n";
  return 0;
}

int run_convert(const ConvertOptions& options, std::ostream& out) {
  const std::string input = util::local_path(options.input, "convert IN");
  const std::string output = util::local_path(options.output, "convert OUT");
  if (!std::filesystem::is_regular_file(input)) {
    throw UsageError("convert: '" + options.input + "' is not a file");
  }
  util::refuse_existing_output(output, options.overwrite, "convert", "OUT");
  if (std::filesystem::path(output).extension() != ".safetensors") {
    throw UsageError("convert: OUT '" + options.output + "' must end in .safetensors");
  }
  const model::StateDict tensors = model::load_weights(input);
  int64_t elements = 0;
  for (const auto& entry : tensors) elements += entry.second.numel();
  model::save_safetensors(
      output, tensors,
      {{"format", "pt"}, {"source", std::filesystem::path(options.input).filename().string()}});
  out << nlohmann::json{{"input", options.input},
                        {"output", options.output},
                        {"tensors", tensors.size()},
                        {"elements", elements},
                        {"bytes", std::filesystem::file_size(output)}}
             .dump()
      << "\n";
  return 0;
}

int run_make_dataset(const MakeDatasetOptions& options, std::ostream& out) {
  const synth::SyntheticSummary summary = synth::make_synthetic_dataset(options);
  nlohmann::json doc = {{"out", options.out_dir}, {"classes", summary.class_names}};
  for (const auto& [split, n] : summary.images_per_split) doc["images"][split] = n;
  if (!summary.files.empty()) doc["files"] = summary.files;
  out << doc.dump() << "\n";
  return 0;
}

}  // namespace trainer::train
