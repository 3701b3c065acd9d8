// Run-time set-up shared by train, evaluate and predict: the device from train.device, the
// intra-op thread count, and the model built from the spec (ResNet + pretrained weights +
// freezing + memory format). Not thread-safe (configures process-wide LibTorch state).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "trainer/config/job_spec.h"
#include "trainer/model/resnet.h"

namespace trainer::train {

// auto = CUDA when LibTorch sees a GPU, else CPU. Throws ConfigError when cuda is asked for and
// none is available.
torch::Device resolve_device(const std::string& device);

// Sets LibTorch's intra-op threads (0 = all cores) and returns the count in force.
int configure_threads(int threads);

struct ModelSettings {
  torch::Device device = torch::kCPU;
  bool channels_last = false;
  bool bf16 = false;
};

// Moves the model to the device (and channels_last memory format when asked).
void place_model(model::ResNet& net, const ModelSettings& settings);

// Builds the ResNet of `spec` for `num_classes`, seeded with `seed`, loads `spec.pretrained`
// (classifier may differ in shape: freshly initialised, logged), applies freeze_backbone.
model::ResNet build_model(const config::ModelSpec& spec, int64_t num_classes, int64_t seed);

// Moves a batch of images to the model's device and memory format.
torch::Tensor prepare_input(const torch::Tensor& images, const ModelSettings& settings);

// Forward pass under bf16 autocast when settings.bf16; returns float32 logits.
torch::Tensor forward_logits(model::ResNet& net, const torch::Tensor& input,
                             const ModelSettings& settings);

}  // namespace trainer::train
