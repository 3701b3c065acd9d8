// The thread budget (train.threads, data.num_workers: auto) and train.precision: auto.
#include "common/catch.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "trainer/loop/runtime.h"
#include "trainer/util/cpu.h"
#include "trainer/util/device.h"
#include "trainer/util/error.h"

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
  CHECK_THAT(b.describe(), trainer::test::Contains("16 core(s)") &&
                               trainer::test::Contains("3 intra-op") &&
                               trainer::test::Contains("5 decode"));
}

TEST_CASE("train.precision: auto is bf16 exactly where the CPU computes bf16 natively",
          "[runtime]") {
  const bool native = trainer::util::cpu_features().native_bf16();
  CHECK(effective_precision("auto", torch::kCPU) == (native ? "bf16" : "fp32"));
  CHECK(effective_precision("fp32", torch::kCPU) == "fp32");
  CHECK(effective_precision("bf16", torch::kCPU) == "bf16");
}

TEST_CASE("train.precision on GPUs: auto picks bf16 on sm80+, fp16 on sm70/75, fp32 before",
          "[runtime]") {
  CHECK(effective_precision("auto", 9, false) == "bf16");  // H100
  CHECK(effective_precision("auto", 8, false) == "bf16");  // A100, L4
  CHECK(effective_precision("auto", 7, false) == "fp16");  // V100, T4: the tutorial's GPU
  CHECK(effective_precision("auto", 6, false) == "fp32");  // P100
  CHECK(effective_precision("fp16", 7, false) == "fp16");
  CHECK(effective_precision("fp32", 7, true) == "fp32");
  CHECK(effective_precision("bf16", 8, false) == "bf16");
  // What no kernel computes is refused with the reason and the way out.
  CHECK_THROWS_WITH(effective_precision("bf16", 7, true),
                    trainer::test::Contains("train.precision: bf16 needs a GPU of compute "
                                            "capability 8.0") &&
                        trainer::test::Contains("this one is 7.x") &&
                        trainer::test::Contains("use fp16"));
  CHECK_THROWS_AS(effective_precision("bf16", 7, true), trainer::ConfigError);
  CHECK_THROWS_WITH(effective_precision("fp16", 0, true),
                    trainer::test::Contains("fp16 trains on CUDA GPUs only"));
  CHECK_THROWS_AS(effective_precision("fp16", torch::kCPU), trainer::ConfigError);
}

TEST_CASE("inference precision and train.deterministic per device", "[runtime]") {
  using trainer::train::effective_deterministic;
  using trainer::train::inference_precision;
  const torch::Device cuda(torch::kCUDA, 0);
  CHECK(inference_precision("fp16", torch::kCPU) == "fp32");  // no fp16 autocast on CPUs
  CHECK(inference_precision("fp16", cuda) == "fp16");
  CHECK(inference_precision("bf16", torch::kCPU) == "bf16");
  CHECK(effective_deterministic("auto", torch::kCPU));
  CHECK_FALSE(effective_deterministic("auto", cuda));
  CHECK(effective_deterministic("true", cuda));
  CHECK_FALSE(effective_deterministic("false", torch::kCPU));
}

TEST_CASE("TRAINER_CUDA_SYNC_DEBUG: only warn or error", "[runtime]") {
  ::setenv("TRAINER_CUDA_SYNC_DEBUG", "loud", 1);
  CHECK_THROWS_WITH(trainer::train::StepSyncCheck(torch::kCPU),
                    trainer::test::Contains("TRAINER_CUDA_SYNC_DEBUG: expected warn or error, "
                                            "got 'loud'"));
  ::setenv("TRAINER_CUDA_SYNC_DEBUG", "error", 1);
  trainer::train::StepSyncCheck on_cpu(torch::kCPU);  // the CPU has nothing to check
  on_cpu.begin_step();
  on_cpu.end_step();
  ::unsetenv("TRAINER_CUDA_SYNC_DEBUG");
}

TEST_CASE("StepTimer on the CPU: the intervals between marks, each once", "[runtime]") {
  trainer::train::StepTimer timer(torch::kCPU);
  CHECK(timer.intervals().empty());
  timer.mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  timer.mark();
  timer.mark();
  const std::vector<double> first = timer.intervals();
  REQUIRE(first.size() == 2);
  CHECK(first[0] >= 0.019);
  CHECK(first[1] < first[0]);
  timer.mark();
  CHECK(timer.intervals().size() == 1);  // from the last mark of the previous read
  timer.reset();
  timer.mark();
  CHECK(timer.intervals().empty());
  CHECK(trainer::util::device_ready_probe(torch::kCPU)());
}

TEST_CASE("measure_bf16_cost times both precisions", "[runtime]") {
  const auto [bf16_s, fp32_s] = trainer::train::measure_bf16_cost();
  CHECK(bf16_s > 0);
  CHECK(fp32_s > 0);
}
