// learning_rate_at: constant, linear warm-up, cosine and step decay, as pure functions of the
// step.
#include "common/catch.h"

#include <cmath>

#include "trainer/config/job_spec.h"
#include "trainer/loop/schedule.h"

using trainer::config::LrScheduleSpec;
using trainer::train::learning_rate_at;
using trainer::train::ScheduleShape;

namespace {

LrScheduleSpec schedule(const std::string& name, double warmup_epochs = 0) {
  LrScheduleSpec s;
  s.name = name;
  s.warmup_epochs = warmup_epochs;
  return s;
}

}  // namespace

TEST_CASE("constant schedule gives the base rate at every step", "[schedule]") {
  const ScheduleShape shape{10, 3};
  for (int64_t step : {0, 1, 9, 10, 29, 30, 1000}) {
    INFO("step " << step);
    CHECK(learning_rate_at(schedule("constant"), 0.01, step, shape) == 0.01);
  }
}

TEST_CASE("linear warm-up rises from base/warmup_steps to base", "[schedule]") {
  const double base = 0.1;
  const ScheduleShape shape{4, 5};  // 20 steps
  for (const std::string name : {"constant", "cosine", "step"}) {
    INFO(name);
    const LrScheduleSpec s = schedule(name, /*warmup_epochs=*/2);  // 8 warm-up steps
    for (int64_t step = 0; step < 8; ++step) {
      INFO("step " << step);
      CHECK(learning_rate_at(s, base, step, shape) ==
            Approx(base * static_cast<double>(step + 1) / 8).epsilon(1e-12));
    }
    CHECK(learning_rate_at(s, base, 0, shape) == Approx(base / 8).epsilon(1e-12));
    CHECK(learning_rate_at(s, base, 7, shape) == Approx(base).epsilon(1e-12));
  }
}

TEST_CASE("a fractional warm-up never goes above the base rate", "[schedule]") {
  const double base = 0.1;
  const ScheduleShape shape{5, 4};                     // 20 steps
  const LrScheduleSpec s = schedule("constant", 0.5);  // 2.5 steps -> 3 whole steps
  double previous = 0;
  for (int64_t step = 0; step < 20; ++step) {
    INFO("step " << step);
    const double lr = learning_rate_at(s, base, step, shape);
    CHECK(lr <= base * (1 + 1e-12));
    CHECK(lr >= previous);
    previous = lr;
  }
  CHECK(learning_rate_at(s, base, 2, shape) == Approx(base).epsilon(1e-12));
  // 0.1 epoch x 30 steps is 3.0000000000000004 in floating point: still 3 warm-up steps.
  const LrScheduleSpec tenth = schedule("constant", 0.1);
  CHECK(learning_rate_at(tenth, base, 0, {30, 2}) == Approx(base / 3).epsilon(1e-12));
  CHECK(learning_rate_at(tenth, base, 2, {30, 2}) == Approx(base).epsilon(1e-12));
}

TEST_CASE("cosine starts at base after warm-up, ends at min_lr on the last step", "[schedule]") {
  const double base = 0.2;
  LrScheduleSpec s = schedule("cosine", /*warmup_epochs=*/1);
  s.min_lr = 0.002;
  const ScheduleShape shape{5, 4};  // 20 steps, 5 of warm-up
  const int64_t last = 19;

  CHECK(learning_rate_at(s, base, 5, shape) == Approx(base).epsilon(1e-12));
  CHECK(learning_rate_at(s, base, last, shape) == Approx(s.min_lr).epsilon(1e-12));
  double previous = learning_rate_at(s, base, 5, shape);
  for (int64_t step = 6; step <= last; ++step) {
    INFO("step " << step);
    const double lr = learning_rate_at(s, base, step, shape);
    CHECK(lr < previous);
    CHECK(lr >= s.min_lr);
    previous = lr;
  }
  // Half-way through the decay: the mean of base and min_lr.
  CHECK(learning_rate_at(s, base, 12, shape) == Approx((base + s.min_lr) / 2).epsilon(1e-12));
  // Past the end (e.g. more steps than planned) it stays at min_lr.
  CHECK(learning_rate_at(s, base, 100, shape) == Approx(s.min_lr).epsilon(1e-12));

  SECTION("without warm-up it starts at base on step 0") {
    const LrScheduleSpec plain = schedule("cosine");
    CHECK(learning_rate_at(plain, base, 0, shape) == Approx(base).epsilon(1e-12));
    CHECK(learning_rate_at(plain, base, last, shape) == Approx(0.0).margin(1e-15));
  }
}

TEST_CASE("step decay multiplies by gamma at every step_epochs boundary", "[schedule]") {
  LrScheduleSpec s = schedule("step");
  s.step_epochs = 2;
  s.gamma = 0.5;
  const ScheduleShape shape{3, 7};  // epochs of 3 steps
  const double base = 0.8;
  struct Expect {
    int64_t step;
    double lr;
  };
  for (const Expect& e : {Expect{0, 0.8}, Expect{5, 0.8},   // epochs 0-1
                          Expect{6, 0.4}, Expect{11, 0.4},  // epochs 2-3
                          Expect{12, 0.2}, Expect{17, 0.2}, Expect{18, 0.1}, Expect{20, 0.1}}) {
    INFO("step " << e.step);
    CHECK(learning_rate_at(s, base, e.step, shape) == Approx(e.lr).epsilon(1e-12));
  }

  SECTION("a step_epochs of 0 (a spec built in code) does not divide by zero") {
    s.step_epochs = 0;
    CHECK(std::isfinite(learning_rate_at(s, base, 7, shape)));
  }
}
