// Run-time set-up shared by train, evaluate and predict: the device from train.device, the
// intra-op thread count, and the model built from the spec (ResNet + pretrained weights +
// freezing + memory format). Not thread-safe (configures process-wide LibTorch state).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "trainer/config/job_spec.h"
#include "trainer/data/image.h"
#include "trainer/model/resnet.h"

namespace trainer::train {

// auto = CUDA when LibTorch sees a GPU, else CPU. Throws ConfigError when cuda is asked for and
// none is available.
torch::Device resolve_device(const std::string& device);

// How this process spends the cores it may use (its CPU affinity mask), decided once from
// train.threads and data.num_workers (0 = auto) and logged once:
//  - decode threads: data.num_workers, or auto = 1 per 8 cores (at least 1);
//  - intra-op threads: train.threads, or auto = the cores less the decode threads once there are
//    8 or more cores (below that the decode threads, which wait on a full prefetch queue most of
//    the step, share the cores with compute);
//  - inter-op threads: 1 (the step runs no parallel graph branches);
//  - the record reader: 1 thread for tfrecord sources (mostly blocked on reads);
//  - Gloo: 1 thread below 8 cores, else 2 (c10d's default), for multi-worker jobs.
struct ThreadBudget {
  int cores = 1;
  int intra_op = 1;
  int inter_op = 1;
  int decode = 1;
  int record_reader = 0;
  int gloo = 0;  // 0 = not distributed
  std::string describe() const;
};

ThreadBudget plan_threads(int threads, int num_workers, int cores, bool records, bool distributed);

// plan_threads for `spec` on the cores of this process's affinity mask, in a job of
// `world_size` training processes.
ThreadBudget plan_threads(const config::JobSpec& spec, int world_size);

// Sets LibTorch's intra-op threads and, once per process, its inter-op threads; returns the
// intra-op count in force.
int apply_threads(const ThreadBudget& budget);

// Sets LibTorch's intra-op threads (0 = the cores of the affinity mask) and returns the count in
// force (evaluate, predict).
int configure_threads(int threads);

// train.precision resolved for this device and CPU: "fp32" or "bf16" (auto = bf16 where it is
// computed natively: a CPU with AVX512_BF16 or AMX-BF16, a CUDA GPU of compute capability 8+).
std::string effective_precision(const std::string& precision, const torch::Device& device);

// Seconds of one bf16 and one fp32 convolution step (forward + backward of a 3x3 conv) on this
// CPU, for the warning that bf16 is emulated here.
std::pair<double, double> measure_bf16_cost();

// How the model runs and what its input is: device, precision, layout, and how the uint8 pixels
// of a batch become the float input (data.normalize).
struct ModelSettings {
  torch::Device device = torch::kCPU;
  bool channels_last = false;
  bool bf16 = false;
  data::Normalize normalize = data::Normalize::kImagenet;
};

// The device, effective precision and layout of spec.train, the normalisation of spec.data.
// When bf16 is requested explicitly on a CPU that only emulates it, logs a warning with the
// measured cost (warn_emulated_bf16).
ModelSettings model_settings(const config::JobSpec& spec, bool warn_emulated_bf16 = true);

// Moves the model to the device (and channels_last memory format when asked).
void place_model(model::ResNet& net, const ModelSettings& settings);

// Builds the ResNet of `spec` for `num_classes`, seeded with `seed`, loads `spec.pretrained`
// (classifier may differ in shape: freshly initialised, logged), applies freeze_backbone.
model::ResNet build_model(const config::ModelSpec& spec, int64_t num_classes, int64_t seed);

// The model's input from a loader batch ([B, S, S, 3] uint8): moved to the model's device as
// uint8, then normalised there into float32 in the model's memory format (normalize_images).
torch::Tensor prepare_input(const torch::Tensor& images, const ModelSettings& settings);

// Forward pass under bf16 autocast when settings.bf16; returns float32 logits.
torch::Tensor forward_logits(model::ResNet& net, const torch::Tensor& input,
                             const ModelSettings& settings);

}  // namespace trainer::train
