// The thread budget (train.threads, data.num_workers: auto) and train.precision: auto.
#include <catch2/catch.hpp>

#include "trainer/train/runtime.h"
#include "trainer/util/cpu.h"

using trainer::train::effective_precision;
using trainer::train::plan_threads;
using trainer::train::ThreadBudget;

TEST_CASE("plan_threads: auto sizes every kind of thread for the cores this process may use",
          "[runtime]") {
  // 2 cores (a small VM, or one of two workers pinned to half of 4): compute gets both, one
  // decode thread, one Gloo thread.
  ThreadBudget b = plan_threads(0, 0, 2, false, true);
  CHECK(b.cores == 2);
  CHECK(b.intra_op == 2);
  CHECK(b.inter_op == 1);
  CHECK(b.decode == 1);
  CHECK(b.record_reader == 0);
  CHECK(b.gloo == 1);
  // 16 cores: 2 decode threads, which compute leaves to them; records add a reader.
  b = plan_threads(0, 0, 16, true, false);
  CHECK(b.decode == 2);
  CHECK(b.intra_op == 14);
  CHECK(b.record_reader == 1);
  CHECK(b.gloo == 0);
  // 1 core: nothing below 1.
  b = plan_threads(0, 0, 1, false, false);
  CHECK(b.intra_op == 1);
  CHECK(b.decode == 1);
  // What the spec says explicitly wins.
  b = plan_threads(3, 5, 16, false, true);
  CHECK(b.intra_op == 3);
  CHECK(b.decode == 5);
  CHECK(b.gloo == 2);
  CHECK_THAT(b.describe(), Catch::Matchers::Contains("16 core(s)") &&
                               Catch::Matchers::Contains("3 intra-op") &&
                               Catch::Matchers::Contains("5 decode"));
}

TEST_CASE("train.precision: auto is bf16 exactly where the CPU computes bf16 natively",
          "[runtime]") {
  const bool native = trainer::util::cpu_features().native_bf16();
  CHECK(effective_precision("auto", torch::kCPU) == (native ? "bf16" : "fp32"));
  CHECK(effective_precision("fp32", torch::kCPU) == "fp32");
  CHECK(effective_precision("bf16", torch::kCPU) == "bf16");
}

TEST_CASE("measure_bf16_cost times both precisions", "[runtime]") {
  const auto [bf16_s, fp32_s] = trainer::train::measure_bf16_cost();
  CHECK(bf16_s > 0);
  CHECK(fp32_s > 0);
}
