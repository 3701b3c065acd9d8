// The ResNet stem's max pool (torchvision: MaxPool2d(kernel_size=3, stride=2, padding=1)) as the
// trainer's own CPU kernel. ATen's NCHW kernel compares one window element at a time; this one
// takes four neighbouring outputs at once (vector extensions), with ATen's exact semantics: the
// same maxima, the same argmax indices (the first maximum in row-major window order, a NaN taken
// as the maximum and the last NaN kept), so ATen's max_pool2d_with_indices_backward routes the
// gradient exactly as before. Stateless; thread-safe.
#pragma once

#include <torch/torch.h>

namespace trainer::model {

// max_pool2d(x, 3, 2, 1) with autograd. The own kernel for a contiguous (NCHW) 4-D float32 CPU
// tensor (unless TRAINER_ATEN_KERNELS=1); ATen's max_pool2d otherwise.
torch::Tensor max_pool_3x3_s2(const torch::Tensor& x);

// Forward only: (output, int64 indices into each H*W plane), as at::max_pool2d_with_indices(x,
// 3, 2, 1) returns them; the own kernel where it applies, else ATen's.
std::tuple<torch::Tensor, torch::Tensor> max_pool_3x3_s2_with_indices(const torch::Tensor& x);

}  // namespace trainer::model
