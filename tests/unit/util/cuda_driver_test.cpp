// The driver check of a CUDA build on plain numbers: which driver runs which CUDA, and what the
// messages name. (tests/integration/test_cli.cpp runs the real probe against a stand-in
// libcuda.so.1.)
#include "common/catch.h"

#include "trainer/util/cuda_driver.h"

using trainer::test::Contains;
using trainer::util::CudaDriver;

TEST_CASE("cuda driver: the release each CUDA major needs, and the version text", "[cuda]") {
  CHECK(trainer::util::minimum_driver_release(13000) == "R580");
  CHECK(trainer::util::minimum_driver_release(13020) == "R580");
  CHECK(trainer::util::minimum_driver_release(12010) == "R525");
  CHECK(trainer::util::minimum_driver_release(11080) == "R450");
  CHECK(trainer::util::minimum_driver_release(10020).empty());
  CHECK(trainer::util::cuda_version_text(13000) == "13.0");
  CHECK(trainer::util::cuda_version_text(12040) == "12.4");
  CHECK(trainer::util::cuda_version_text(12090) == "12.9");
}

TEST_CASE("cuda driver: older than the build's CUDA major is a problem naming both", "[cuda]") {
  const CudaDriver old{12040, "550.54.15", ""};
  const std::string problem = trainer::util::cuda_driver_problem(old, 13000);
  CHECK_THAT(problem, Contains("550.54.15 (CUDA 12.4)") && Contains("CUDA 13.0") &&
                          Contains("R580 or newer") && Contains("train.device: cpu") &&
                          Contains("TRAINER_TORCH_VERSION"));
  CHECK_THAT(trainer::util::describe_cuda_driver(old, 13000),
             Contains("550.54.15 (CUDA 12.4)") && Contains("R580") && Contains("TOO OLD"));
  // Without /proc's release the driver is named by its CUDA version alone.
  CHECK_THAT(trainer::util::cuda_driver_problem({12080, "", ""}, 13000),
             Contains("is CUDA 12.8,") && Contains("R580"));
}

TEST_CASE("cuda driver: the same major or newer runs it (minor-version compatibility)", "[cuda]") {
  CHECK(trainer::util::cuda_driver_problem({13000, "580.65.06", ""}, 13000).empty());
  CHECK(
      trainer::util::cuda_driver_problem({13000, "", ""}, 13020).empty());  // 13.2 on a 13.0 driver
  CHECK(trainer::util::cuda_driver_problem({13020, "", ""}, 12040).empty());
  CHECK_THAT(trainer::util::describe_cuda_driver({13000, "580.65.06", ""}, 13000),
             Contains("580.65.06 (CUDA 13.0)") && Contains(": ok"));
}

TEST_CASE(
    "cuda driver: no driver is no problem here (no GPU is visible: the device choice says so)",
    "[cuda]") {
  const CudaDriver none{0, "", "no NVIDIA driver (libcuda.so.1 not found)"};
  CHECK(trainer::util::cuda_driver_problem(none, 13000).empty());
  CHECK_THAT(trainer::util::describe_cuda_driver(none, 13000),
             Contains("NVIDIA driver: none (no NVIDIA driver (libcuda.so.1 not found))") &&
                 Contains("CUDA 13.0 needs R580 or newer"));
}
