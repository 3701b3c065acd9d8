// Which device a process trains on (choose_device, pure, so every case runs on a CPU): cpu, auto
// with and without GPUs, cuda as local rank mod the visible GPUs, cuda:N and N out of range, and
// NCCL's rule of one GPU per local rank (exit 2 naming both numbers).
#include "common/catch.h"

#include <string>

#include "trainer/cluster/local_rank.h"
#include "trainer/loop/runtime.h"
#include "trainer/util/error.h"

using trainer::ConfigError;
using trainer::cluster::LocalRank;
using trainer::test::Contains;
using trainer::train::choose_device;
using trainer::train::DeviceChoice;

namespace {

LocalRank torchrun(int index, int size) {
  LocalRank r;
  r.index = index;
  r.world_size = size;
  r.source = "LOCAL_RANK=" + std::to_string(index) + " of LOCAL_WORLD_SIZE=" + std::to_string(size);
  return r;
}

// The ConfigError message choose_device throws, or "(no error)".
std::string error_of(const std::string& device, const std::string& backend, const LocalRank& local,
                     int gpus) {
  try {
    choose_device(device, backend, local, gpus);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("choose_device: cpu, and auto without a GPU, train on the CPU", "[device]") {
  const DeviceChoice cpu = choose_device("cpu", "auto", torchrun(1, 2), 4);
  CHECK(cpu.device == torch::Device(torch::kCPU));
  CHECK(cpu.why == "train.device: cpu");
  const DeviceChoice none = choose_device("auto", "auto", torchrun(1, 2), 0);
  CHECK(none.device == torch::Device(torch::kCPU));
  CHECK(none.why == "train.device: auto, no CUDA GPU visible to this LibTorch");
  for (const char* asked : {"cuda", "cuda:0"}) {
    INFO(asked);
    CHECK_THAT(error_of(asked, "auto", LocalRank{}, 0),
               Contains("train.device: '" + std::string(asked) + "' requested") &&
                   Contains("sees no CUDA GPU"));
  }
}

TEST_CASE("choose_device: cuda and auto take GPU local rank mod visible GPUs", "[device]") {
  for (const char* asked : {"auto", "cuda"}) {
    INFO(asked);
    const DeviceChoice second = choose_device(asked, "auto", torchrun(1, 2), 2);
    CHECK(second.device == torch::Device(torch::kCUDA, 1));
    CHECK(second.why == "LOCAL_RANK=1 of LOCAL_WORLD_SIZE=2, 2 visible GPUs");
  }
  CHECK(choose_device("cuda", "auto", LocalRank{}, 1).device == torch::Device(torch::kCUDA, 0));
  CHECK(choose_device("cuda", "auto", LocalRank{}, 1).why ==
        "one process: local index 0, 1 visible GPU");
  // Gloo lets several processes share a GPU: 4 local ranks on 2 GPUs wrap around.
  const int expected[] = {0, 1, 0, 1};
  for (int rank = 0; rank < 4; ++rank) {
    INFO("local rank " << rank);
    const DeviceChoice c = choose_device("auto", "gloo", torchrun(rank, 4), 2);
    CHECK(c.device == torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(expected[rank])));
  }
  CHECK(choose_device("cuda", "gloo", torchrun(3, 4), 2).why ==
        "LOCAL_RANK=3 of LOCAL_WORLD_SIZE=4, 2 visible GPUs: 3 mod 2 = 1");
  // Fewer local ranks than GPUs under NCCL: each its own.
  CHECK(choose_device("cuda", "nccl", torchrun(2, 3), 8).device == torch::Device(torch::kCUDA, 2));
}

TEST_CASE("choose_device: cuda:N is GPU N, and N must be visible", "[device]") {
  const DeviceChoice one = choose_device("cuda:1", "gloo", torchrun(0, 2), 2);
  CHECK(one.device == torch::Device(torch::kCUDA, 1));
  CHECK(one.why == "train.device: cuda:1, 2 visible GPUs");
  CHECK(choose_device("cuda:3", "nccl", LocalRank{}, 4).device == torch::Device(torch::kCUDA, 3));
  CHECK(error_of("cuda:2", "gloo", LocalRank{}, 2) ==
        "train.device: cuda:2, but this process sees 2 visible GPUs (cuda:0 to cuda:1; "
        "CUDA_VISIBLE_DEVICES numbers the GPUs it lists from 0)");
  CHECK_THAT(error_of("cuda:1", "gloo", LocalRank{}, 1), Contains("1 visible GPU ("));
  for (const char* bad : {"cuda:", "cuda:01", "cuda:-1", "cuda:x", "tpu", "CUDA"}) {
    INFO(bad);
    CHECK(error_of(bad, "gloo", LocalRank{}, 2) ==
          "train.device: expected auto, cpu, cuda or cuda:N, got '" + std::string(bad) + "'");
  }
}

TEST_CASE("choose_device: NCCL with more local ranks than GPUs is a config error", "[device]") {
  const std::string nccl = error_of("cuda", "nccl", torchrun(0, 3), 2);
  CHECK_THAT(nccl, Contains("distributed.backend: nccl needs a GPU for each process") &&
                       Contains("runs 3 local ranks (LOCAL_RANK=0 of LOCAL_WORLD_SIZE=3)") &&
                       Contains("sees 2 visible GPUs") && Contains("distributed.backend: gloo"));
  // auto is NCCL on GPUs.
  CHECK_THAT(error_of("auto", "auto", torchrun(1, 2), 1),
             Contains("distributed.backend: auto (NCCL on GPUs)") &&
                 Contains("runs 2 local ranks") && Contains("sees 1 visible GPU;"));
  // An unknown count is at least this rank's index + 1.
  LocalRank slurm;
  slurm.index = 2;
  slurm.world_size = 0;
  slurm.source = "SLURM_LOCALID=2";
  CHECK_THAT(error_of("cuda", "nccl", slurm, 2), Contains("runs 3 local ranks (SLURM_LOCALID=2)"));
  // Several local ranks on one cuda:N cannot use NCCL either.
  CHECK_THAT(
      error_of("cuda:0", "nccl", torchrun(0, 2), 2),
      Contains("train.device: cuda:0 puts all 2 local ranks") && Contains("train.device: cuda"));
  // Gloo takes the same layouts.
  CHECK(error_of("cuda", "gloo", torchrun(0, 3), 2) == "(no error)");
  CHECK(error_of("cuda:0", "gloo", torchrun(0, 2), 2) == "(no error)");
  // And NCCL is not asked about on the CPU.
  CHECK(error_of("auto", "auto", torchrun(0, 3), 0) == "(no error)");
}

TEST_CASE("resolve_device: train.device cpu asks LibTorch nothing", "[device]") {
  const DeviceChoice c = trainer::train::resolve_device("cpu", "nccl", LocalRank{});
  CHECK(c.device == torch::Device(torch::kCPU));
  trainer::train::activate_device(c.device);  // a no-op for the CPU
}
