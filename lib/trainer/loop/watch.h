// The decisions taken on each epoch's validation result (the result every rank agrees on:
// evaluation sums over all workers, so every rank decides the same):
//   ReduceOnPlateau: PyTorch's ReduceLROnPlateau (threshold 1e-4 relative, cooldown 0, eps 1e-8)
//                    on train.lr_schedule.metric, multiplying the rate by `factor` (not below
//                    min_lr) after more than `patience` epochs without improvement;
//   EarlyStopping:   Keras's EarlyStopping (min_delta, patience; stop when `wait` reaches it);
//   BestTracker:     checkpoint.keep_best (strictly better than the best so far).
// Each is a small state machine whose state a checkpoint carries (state()/restore()), so a
// resumed job decides as the uninterrupted one. Not thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

namespace trainer::train {

// "val_loss" is minimised, "val_accuracy" maximised.
bool metric_is_maximised(const std::string& metric);

class ReduceOnPlateau {
 public:
  // `lr`: the base rate it starts from. Its state holds the rate as a multiple of the base, so a
  // job resumed with another base (scale_lr: linear on another number of workers) keeps the
  // reductions, not the old absolute rate.
  ReduceOnPlateau(bool maximize, double factor, int patience, double min_lr, double lr);
  // After an epoch: the metric; returns true when the rate was reduced.
  bool step(double metric);
  double lr() const { return lr_; }
  nlohmann::json state() const;
  void restore(const nlohmann::json& state, const std::string& origin);

 private:
  bool better(double a) const;
  bool maximize_;
  double factor_;
  int patience_;
  double min_lr_;
  double base_;
  double lr_;
  double best_;
  int64_t bad_epochs_ = 0;
};

class EarlyStopping {
 public:
  EarlyStopping(bool maximize, double min_delta, int patience);
  // After an epoch: the metric; returns true when training should stop.
  bool step(double metric);
  int64_t wait() const { return wait_; }
  nlohmann::json state() const;
  void restore(const nlohmann::json& state, const std::string& origin);

 private:
  bool maximize_;
  double min_delta_;
  int patience_;
  double best_;
  int64_t wait_ = 0;
};

class BestTracker {
 public:
  explicit BestTracker(bool maximize);
  // True when `metric` is strictly better than every earlier one (the first always is).
  bool step(double metric, int64_t epoch);
  double best() const { return best_; }
  int64_t best_epoch() const { return best_epoch_; }
  nlohmann::json state() const;
  void restore(const nlohmann::json& state, const std::string& origin);

 private:
  bool maximize_;
  double best_;
  int64_t best_epoch_ = -1;
};

}  // namespace trainer::train
