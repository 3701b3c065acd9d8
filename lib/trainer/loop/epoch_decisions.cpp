#include "trainer/loop/epoch_decisions.h"

#include <spdlog/spdlog.h>

#include <climits>

#include <fmt/format.h>

#include "trainer/util/error.h"
#include "trainer/util/json.h"

namespace trainer::train {

void EpochValidation::report(std::map<std::string, double>* metrics, std::string* line) const {
  (*metrics)["val_loss"] = raw.loss();
  (*metrics)["val_accuracy"] = raw.accuracy();
  *line += fmt::format("; validation loss {:.4f} acc {:.4f} ({} examples)", raw.loss(),
                       raw.accuracy(), raw.num_examples);
  if (!ema) return;
  (*metrics)["val_ema_loss"] = ema->loss();
  (*metrics)["val_ema_accuracy"] = ema->accuracy();
  *line += fmt::format("; EMA loss {:.4f} acc {:.4f}", ema->loss(), ema->accuracy());
}

EpochValidation validate_epoch(dist::ProcessGroup& group, model::Net& net, WeightEma* ema,
                               data::Loader& loader, int64_t num_classes,
                               const ModelSettings& settings) {
  EpochValidation v;
  v.raw = evaluate_distributed(group, net, loader, num_classes, settings);
  if (ema) v.ema = evaluate_distributed(group, ema->net(), loader, num_classes, settings);
  return v;
}

EpochDecisions::EpochDecisions(const config::JobSpec& spec, double base_lr, bool ema)
    : best_metric_(spec.checkpoint.keep_best),
      early_spec_(spec.train.early_stopping),
      schedule_(spec.train.lr_schedule),
      base_lr_(base_lr),
      // keep_best and early stopping watch the weights the export holds; the plateau schedule
      // the trained (raw) weights whose rate it sets.
      watch_ema_(ema && spec.export_.weights == "ema"),
      best_(metric_is_maximised(best_metric_)),
      early_(metric_is_maximised(early_spec_.metric), early_spec_.min_delta, early_spec_.patience),
      plateau_(metric_is_maximised(schedule_.metric), schedule_.factor, schedule_.patience,
               schedule_.min_lr, base_lr) {}

double EpochDecisions::value(const EvalCounts& counts, const std::string& metric) const {
  return metric == "val_accuracy" ? counts.accuracy() : counts.loss();
}

double EpochDecisions::reported_accuracy(const EpochValidation& v) const {
  return watch_ema_ && v.ema ? v.ema->accuracy() : v.raw.accuracy();
}

EpochDecisions::Outcome EpochDecisions::decide(const EpochValidation& v, int64_t epoch,
                                               std::string* line) {
  const EvalCounts& watched = watch_ema_ && v.ema ? *v.ema : v.raw;
  Outcome out;
  if (schedule_.name == "plateau" && plateau_.step(value(v.raw, schedule_.metric))) {
    spdlog::info(
        "train.lr_schedule: plateau: {} did not improve for more than {} epochs: learning rate "
        "{} from now on",
        schedule_.metric, schedule_.patience, plateau_.lr());
  }
  if (best_metric_ != "off") out.new_best = best_.step(value(watched, best_metric_), epoch);
  if (early_spec_.patience > 0 && early_.step(value(watched, early_spec_.metric))) {
    out.stop_early = true;
    *line += fmt::format("; no improvement of {} for {} epochs: stopping early", early_spec_.metric,
                         early_.wait());
  }
  return out;
}

bool EpochDecisions::stopped_early() const {
  return early_spec_.patience > 0 && early_.wait() >= early_spec_.patience;
}

namespace {

nlohmann::json with_metric(nlohmann::json state, const std::string& metric) {
  state["metric"] = metric;
  return state;
}

}  // namespace

nlohmann::json EpochDecisions::state(const WeightEma* ema) const {
  nlohmann::json j = {{"best", with_metric(best_.state(), best_metric_)},
                      {"early_stopping", with_metric(early_.state(), early_spec_.metric)},
                      {"plateau", with_metric(plateau_.state(), schedule_.metric)}};
  if (ema) j["ema_count"] = ema->count();
  return j;
}

void EpochDecisions::restore(const CheckpointInfo& checkpoint, WeightEma* ema) {
  const std::string where = "'" + (checkpoint.dir / "state.json").string() + "': recipe";
  const nlohmann::json& recipe = checkpoint.recipe;
  if (!recipe.is_null() && !recipe.is_object()) throw DataError(where + ": not an object");
  const auto part = [&](const char* key) -> const nlohmann::json& {
    if (!recipe.contains(key)) throw DataError(where + ": no '" + key + "'");
    return recipe.at(key);
  };
  // A decision's state is restored when it watched the same metric.
  const auto same_metric = [&](const char* key, const std::string& metric) {
    const nlohmann::json& state = part(key);
    if (state.is_object() && state.value("metric", std::string()) == metric) return true;
    spdlog::info("{}: the checkpoint's state watched another metric; {} starts afresh", key,
                 metric);
    return false;
  };
  if (recipe.is_object()) {
    if (same_metric("best", best_metric_)) best_.restore(part("best"), where + ".best");
    if (same_metric("early_stopping", early_spec_.metric)) {
      early_.restore(part("early_stopping"), where + ".early_stopping");
    }
    if (schedule_.name == "plateau" && same_metric("plateau", schedule_.metric)) {
      plateau_.restore(part("plateau"), where + ".plateau");
    }
  }
  if (!ema) return;
  if (!checkpoint.has_ema || !recipe.is_object() || !recipe.contains("ema_count")) {
    throw DataError("'" + checkpoint.dir.string() +
                    "': holds no EMA weights (ema.safetensors), but train.ema.decay is set");
  }
  ema->restore(load_checkpoint_ema(checkpoint),
               util::json_int(recipe, "ema_count", 0, INT64_MAX, where),
               (checkpoint.dir / "ema.safetensors").string());
}

}  // namespace trainer::train
