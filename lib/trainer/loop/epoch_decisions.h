// What the loop does with each epoch's validation: the validation itself (the trained weights,
// and the EMA's when train.ema keeps one, summed over every worker) and the decisions taken on
// it: checkpoint.keep_best, train.early_stopping and the ReduceLROnPlateau schedule
// (loop/watch.h's state machines), with their state for the checkpoint and its restore. Every
// rank holds the same sums, so every rank decides alike. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/config/job_spec.h"
#include "trainer/data/loader.h"
#include "trainer/dist/process_group.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/ema.h"
#include "trainer/loop/evaluate.h"
#include "trainer/loop/runtime.h"
#include "trainer/loop/watch.h"
#include "trainer/model/net.h"

namespace trainer::train {

// One epoch's validation: the trained weights' counts and, with an EMA, the average's.
struct EpochValidation {
  EvalCounts raw;
  std::optional<EvalCounts> ema;

  // Adds val_loss, val_accuracy (and val_ema_*) to `metrics` and their text to `line`.
  void report(std::map<std::string, double>* metrics, std::string* line) const;
};

// Evaluates `net` (and `ema`'s average when not null) on `loader`, summed over `group`. The
// model is left in eval mode: the caller sets its training mode again.
EpochValidation validate_epoch(dist::ProcessGroup& group, model::Net& net, WeightEma* ema,
                               data::Loader& loader, int64_t num_classes,
                               const ModelSettings& settings);

class EpochDecisions {
 public:
  // The job's checkpoint.keep_best, train.early_stopping, train.lr_schedule (plateau) and
  // export.weights; `base_lr` is the rate the plateau schedule scales; `ema` whether train.ema
  // keeps an average (keep_best and early stopping then watch the weights the export holds).
  EpochDecisions(const config::JobSpec& spec, double base_lr, bool ema);

  struct Outcome {
    bool new_best = false;    // keep_best: this epoch's model is the best so far
    bool stop_early = false;  // early stopping: no more epochs
  };
  // After a finished epoch, from its validation; appends to `line` what it decided (the rate
  // reduction is logged).
  Outcome decide(const EpochValidation& validation, int64_t epoch, std::string* line);

  // The accuracy the job reports: of the weights the export holds.
  double reported_accuracy(const EpochValidation& validation) const;
  // The plateau schedule's factor on the scheduled rate (1 until it reduces).
  // (1 with a learning rate of 0: nothing to scale.)
  double lr_factor() const { return base_lr_ > 0 ? plateau_.lr() / base_lr_ : 1.0; }
  // A job that had stopped early: nothing is left to train.
  bool stopped_early() const;
  double best() const { return best_.best(); }
  const std::string& best_metric() const { return best_metric_; }
  int64_t early_wait() const { return early_.wait(); }

  // The checkpoint's recipe state: each decision's state with the metric it watched, and the
  // EMA's count when `ema` is not null.
  nlohmann::json state(const WeightEma* ema) const;
  // Restores from `checkpoint`: a decision that watched another metric (they may change between
  // runs) starts afresh, saying so; damaged state is a DataError naming state.json and the key;
  // with `ema`, a checkpoint without EMA weights is a DataError, else the average is restored.
  void restore(const CheckpointInfo& checkpoint, WeightEma* ema);

 private:
  double value(const EvalCounts& counts, const std::string& metric) const;

  std::string best_metric_;
  config::EarlyStoppingSpec early_spec_;
  config::LrScheduleSpec schedule_;
  double base_lr_;
  bool watch_ema_;
  BestTracker best_;
  EarlyStopping early_;
  ReduceOnPlateau plateau_;
};

}  // namespace trainer::train
