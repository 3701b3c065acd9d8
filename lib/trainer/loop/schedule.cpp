#include "trainer/loop/schedule.h"

#include <algorithm>
#include <cmath>

namespace trainer::train {

double learning_rate_at(const config::LrScheduleSpec& schedule, double base_lr, int64_t step,
                        const ScheduleShape& shape) {
  const double spe = static_cast<double>(std::max<int64_t>(1, shape.steps_per_epoch));
  const double total = spe * static_cast<double>(std::max<int64_t>(1, shape.total_epochs));
  // Whole warm-up steps (a fractional warm-up rounds up, so no step goes above base_lr); the
  // small slack keeps e.g. 0.1 epoch x 30 steps (3.0000000000000004) at 3 steps.
  const double warmup = std::max(0.0, std::ceil(schedule.warmup_epochs * spe - 1e-9));
  const double s = static_cast<double>(step);
  if (warmup > 0 && s < warmup) return base_lr * ((s + 1) / warmup);

  if (schedule.name == "cosine") {
    // progress 0 at the first step after warm-up, 1 at the last step (total - 1).
    const double span = std::max(1.0, total - 1 - warmup);
    const double progress = std::clamp((s - warmup) / span, 0.0, 1.0);
    return schedule.min_lr + (base_lr - schedule.min_lr) * 0.5 * (1 + std::cos(M_PI * progress));
  }
  if (schedule.name == "step") {
    const auto epoch = static_cast<int64_t>(s / spe);
    const int64_t every = std::max(1, schedule.step_epochs);
    return base_lr * std::pow(schedule.gamma, static_cast<double>(epoch / every));
  }
  return base_lr;  // constant
}

}  // namespace trainer::train
