// Learning-rate schedules as a pure function of the step: linear warm-up over
// lr_schedule.warmup_epochs (rounded up to whole steps; step 0 = base / warm-up steps, the last
// warm-up step = base), then constant, cosine (base on the first step after warm-up, min_lr on
// the last step) or step decay (x gamma every step_epochs, counted from step 0). Thread-safe.
#pragma once

#include <cstdint>

#include "trainer/config/job_spec.h"

namespace trainer::train {

struct ScheduleShape {
  int64_t steps_per_epoch = 1;
  int64_t total_epochs = 1;
};

// The learning rate for optimizer step `step` (0-based).
double learning_rate_at(const config::LrScheduleSpec& schedule, double base_lr, int64_t step,
                        const ScheduleShape& shape);

}  // namespace trainer::train
