#include "trainer/loop/watch.h"

#include <algorithm>
#include <cmath>

#include "trainer/util/error.h"

namespace trainer::train {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// JSON has no infinity: the "no best yet" value is written as null.
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

double read_number(const nlohmann::json& j, const char* key, double none,
                   const std::string& origin) {
  if (!j.is_object() || !j.contains(key)) {
    throw DataError(origin + ": missing '" + key + "'");
  }
  const nlohmann::json& v = j.at(key);
  if (v.is_null()) return none;
  if (!v.is_number()) throw DataError(origin + ": '" + key + "' is not a number");
  return v.get<double>();
}

int64_t read_count(const nlohmann::json& j, const char* key, const std::string& origin) {
  const double v = read_number(j, key, 0, origin);
  if (v < 0 || v > 1e15 || v != std::floor(v)) {
    throw DataError(origin + ": '" + key + "' is not a count");
  }
  return static_cast<int64_t>(v);
}

}  // namespace

bool metric_is_maximised(const std::string& metric) { return metric == "val_accuracy"; }

ReduceOnPlateau::ReduceOnPlateau(bool maximize, double factor, int patience, double min_lr,
                                 double lr)
    : maximize_(maximize),
      factor_(factor),
      patience_(patience),
      min_lr_(min_lr),
      base_(lr),
      lr_(lr),
      best_(maximize ? -kInf : kInf) {}

bool ReduceOnPlateau::better(double a) const {
  constexpr double kThreshold = 1e-4;  // mode 'rel'
  return maximize_ ? a > best_ * (1.0 + kThreshold) : a < best_ * (1.0 - kThreshold);
}

bool ReduceOnPlateau::step(double metric) {
  if (better(metric)) {
    best_ = metric;
    bad_epochs_ = 0;
  } else {
    ++bad_epochs_;
  }
  if (bad_epochs_ <= patience_) return false;
  bad_epochs_ = 0;
  const double reduced = std::max(lr_ * factor_, min_lr_);
  if (lr_ - reduced <= 1e-8) return false;  // PyTorch's eps
  lr_ = reduced;
  return true;
}

nlohmann::json ReduceOnPlateau::state() const {
  return {{"lr_scale", base_ > 0 ? lr_ / base_ : 1.0},
          {"best", number(best_)},
          {"bad_epochs", bad_epochs_}};
}

void ReduceOnPlateau::restore(const nlohmann::json& state, const std::string& origin) {
  const double scale = read_number(state, "lr_scale", 0, origin);
  if (!(scale > 0 && scale <= 1)) throw DataError(origin + ": 'lr_scale' is not in (0, 1]");
  lr_ = base_ * scale;
  best_ = read_number(state, "best", maximize_ ? -kInf : kInf, origin);
  bad_epochs_ = read_count(state, "bad_epochs", origin);
}

EarlyStopping::EarlyStopping(bool maximize, double min_delta, int patience)
    : maximize_(maximize),
      min_delta_(min_delta),
      patience_(patience),
      best_(maximize ? -kInf : kInf) {}

bool EarlyStopping::step(double metric) {
  const bool improved = maximize_ ? metric - min_delta_ > best_ : metric + min_delta_ < best_;
  ++wait_;
  if (improved) {
    best_ = metric;
    wait_ = 0;
  }
  return patience_ > 0 && wait_ >= patience_;
}

nlohmann::json EarlyStopping::state() const { return {{"best", number(best_)}, {"wait", wait_}}; }

void EarlyStopping::restore(const nlohmann::json& state, const std::string& origin) {
  best_ = read_number(state, "best", maximize_ ? -kInf : kInf, origin);
  wait_ = read_count(state, "wait", origin);
}

BestTracker::BestTracker(bool maximize) : maximize_(maximize), best_(maximize ? -kInf : kInf) {}

bool BestTracker::step(double metric, int64_t epoch) {
  const bool improved = maximize_ ? metric > best_ : metric < best_;
  if (improved) {
    best_ = metric;
    best_epoch_ = epoch;
  }
  return improved;
}

nlohmann::json BestTracker::state() const {
  return {{"best", number(best_)}, {"epoch", best_epoch_}};
}

void BestTracker::restore(const nlohmann::json& state, const std::string& origin) {
  best_ = read_number(state, "best", maximize_ ? -kInf : kInf, origin);
  const double epoch = read_number(state, "epoch", -1, origin);
  if (!(epoch >= -1 && epoch <= 1e15 && epoch == std::floor(epoch))) {
    throw DataError(origin + ": 'epoch' is not an epoch number");
  }
  best_epoch_ = static_cast<int64_t>(epoch);
}

}  // namespace trainer::train
