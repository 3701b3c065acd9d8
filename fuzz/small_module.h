// A small module with the kinds of tensors a ResNet state dict holds (conv and linear weights,
// BatchNorm buffers including an int64 counter, classifier keys "fc.*"): the module the
// safetensors target loads into, and whose state dict seeds it.
#pragma once

#include <torch/torch.h>

namespace trainer::fuzz {

struct SmallModule : torch::nn::Module {
  SmallModule() {
    register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)));
    register_module("bn1", torch::nn::BatchNorm2d(4));
    register_module("fc", torch::nn::Linear(4, 2));
  }
};

}  // namespace trainer::fuzz
