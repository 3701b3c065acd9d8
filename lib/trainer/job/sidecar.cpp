#include "trainer/job/sidecar.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "trainer/job/data_plan.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/evaluate.h"
#include "trainer/loop/model_dir.h"
#include "trainer/loop/runtime.h"
#include "trainer/model/net.h"
#include "trainer/model/safetensors.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/signals.h"

namespace trainer::train {

namespace {

constexpr std::chrono::milliseconds kPoll{500};  // how often the job dir is looked at

// Steps already in the evaluator's metrics.jsonl (a restarted evaluator skips them).
std::set<int64_t> steps_done(const fs::path& metrics) {
  std::set<int64_t> steps;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("checkpoint") && j.contains("step") &&
        j["step"].is_number_integer()) {
      steps.insert(j["step"].get<int64_t>());
    }
  }
  return steps;
}

class Evaluator {
 public:
  Evaluator(const config::JobSpec& spec, const cluster::ClusterSpec& cluster,
            const cluster::JobDir& job_dir)
      : job_dir_(job_dir),
        settings_(model_settings(
            spec, resolve_device(spec.train.device, spec.distributed.backend, {}).device)) {
    if (!config::has_validation(spec.data)) {
      throw ConfigError(
          "TF_CONFIG names this task evaluator, which evaluates every checkpoint on the "
          "validation split: set data.validation.path or data.validation_split");
    }
    const ThreadBudget budget = plan_threads(spec, 1);
    apply_threads(budget);
    plan_ = plan_data(spec, cluster, list_options_for(job_dir.root().string()));
    loader_ = make_eval_loader(
        spec.data, *plan_.validation,
        EvalReading{spec.train.per_replica_batch_size, plan_.num_classes, budget.decode});
    net_ = build_model(spec.model, plan_.num_classes, spec.train.seed);
    place_model(net_, settings_);
    // The step the job ends at: an exported model from an earlier, shorter run is not the end.
    final_step_ = spec.train.epochs * plan_.steps_per_epoch;
    if (spec.train.max_steps > 0) final_step_ = std::min(final_step_, spec.train.max_steps);
    metrics_path_ = job_dir.metrics_file();
    done_ = steps_done(metrics_path_);
    spdlog::info(
        "evaluator: watching {} for checkpoints, evaluating {} validation examples each, until "
        "the model of step {} is evaluated; records go to {}",
        job_dir.checkpoints_dir().string(), plan_.validation->examples.size(), final_step_,
        metrics_path_.string());
  }

  int run() {
    for (;;) {
      evaluate_new_checkpoints();
      if (auto model = finished_model()) {
        evaluate_new_checkpoints();  // one written just before the model
        evaluate_model(*model);
        return 0;
      }
      for (auto waited = std::chrono::milliseconds(0); waited < kPoll; waited += kPoll / 5) {
        if (util::stop_requested()) {
          throw Interrupted("evaluator stopped by signal " + std::to_string(util::stop_signal()));
        }
        std::this_thread::sleep_for(kPoll / 5);
      }
    }
  }

 private:
  void evaluate_new_checkpoints() {
    for (const CheckpointInfo& c : complete_checkpoints(job_dir_.checkpoints_dir())) {
      const int64_t step = c.position.global_step;
      if (done_.count(step)) continue;
      done_.insert(step);
      const fs::path weights = c.dir / "model.safetensors";
      try {
        model::load_state_dict(*net_, model::load_safetensors(weights.string()), weights.string());
      } catch (const std::exception& e) {  // deleted under us (checkpoint.keep), or damaged
        spdlog::info("evaluator: skipping checkpoint {}: {}", c.dir.filename().string(), e.what());
        continue;
      }
      write(evaluate(net_, *loader_, plan_.num_classes, settings_),
            {{"step", step},
             {"epoch", c.position.epoch},
             {"batch_in_epoch", c.position.batch_in_epoch},
             {"checkpoint", c.dir.filename().string()}});
    }
  }

  // The exported model of the whole job, once it exists.
  std::optional<LoadedModel> finished_model() {
    if (!fs::exists(job_dir_.model_dir() / "model.json")) return std::nullopt;
    try {
      LoadedModel m = load_model_dir(job_dir_.model_dir());
      if (m.info.global_step < final_step_) return std::nullopt;  // an earlier run's
      return m;
    } catch (const std::exception& e) {  // being written: look again later
      spdlog::debug("evaluator: model not readable yet: {}", e.what());
      return std::nullopt;
    }
  }

  void evaluate_model(LoadedModel& m) {
    place_model(m.net, settings_);
    write(evaluate(m.net, *loader_, plan_.num_classes, settings_),
          {{"step", m.info.global_step},
           {"epoch", m.info.epochs},
           {"model", job_dir_.model_dir().string()}});
  }

  void write(const EvalCounts& counts, nlohmann::json record) {
    const nlohmann::json all = counts.to_json(plan_.class_names);
    record["val_loss"] = counts.loss();
    record["val_accuracy"] = counts.accuracy();
    record["per_class"] = all["per_class"];
    record["num_examples"] = counts.num_examples;
    util::AppendFile(metrics_path_).append(record.dump() + "\n");
    spdlog::info("evaluator: step {} ({}): validation loss {:.4f} acc {:.4f}",
                 record["step"].get<int64_t>(),
                 record.contains("checkpoint") ? record["checkpoint"].get<std::string>()
                                               : std::string("the exported model"),
                 counts.loss(), counts.accuracy());
  }

  const cluster::JobDir& job_dir_;
  ModelSettings settings_;
  DataPlan plan_;
  std::unique_ptr<data::Loader> loader_;
  model::Net net_{nullptr};
  int64_t final_step_ = std::numeric_limits<int64_t>::max();
  fs::path metrics_path_;
  std::set<int64_t> done_;
};

}  // namespace

int run_sidecar_evaluator(const config::JobSpec& spec, const cluster::ClusterSpec& cluster,
                          const cluster::JobDir& job_dir) {
  return Evaluator(spec, cluster, job_dir).run();
}

}  // namespace trainer::train
