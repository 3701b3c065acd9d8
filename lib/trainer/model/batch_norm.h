// BatchNorm2d that can compute its training-mode statistics over every replica (SyncBatchNorm,
// as torch.nn.SyncBatchNorm and TF's SyncBatchNormalization): in forward one sum of the
// per-channel sum, sum of squares and count, in backward one sum of the per-channel sums of the
// gradient and of gradient x (x - mean). It is a torch::nn::BatchNorm2dImpl (the same parameters,
// buffers and names, so checkpoints and torchvision state dicts are unchanged); without a
// reducer, in eval mode, or with one replica it is exactly torch::nn::BatchNorm2d. The model
// module does not know the process group: the trainer installs a StatsReducer. Not thread-safe
// (a module).
#pragma once

#include <torch/torch.h>

#include <memory>

namespace trainer::model {

// Sums a tensor in place over the replicas (every replica calls it in the same order).
class StatsReducer {
 public:
  virtual ~StatsReducer() = default;
  virtual void sum_(torch::Tensor& t) = 0;
};

class BatchNormImpl : public torch::nn::Module {
 public:
  BatchNormImpl(int64_t features, double eps, double momentum);
  torch::Tensor forward(const torch::Tensor& input);
  // relu(forward(input)), as torchvision's blocks follow a BatchNorm2d with ReLU(inplace=True).
  // In training mode on a CPU tensor, float32 contiguous NCHW or float32/bfloat16 channels_last,
  // without a reducer, forward and forward_relu run the trainer's own kernel: the statistics in
  // one pass and the normalisation (and ReLU) in a second, against ATen's four (two for the
  // statistics, one to normalise, one for ReLU); backward too is the trainer's (ReLU's mask with
  // the sums, then dx). Otherwise forward() is torch.batch_norm (or SyncBN) and forward_relu adds
  // relu_().
  torch::Tensor forward_relu(const torch::Tensor& input);
  // relu(forward(input) + residual): the end of torchvision's BasicBlock and Bottleneck
  // (`out += identity; out = relu(out)`). Where the own kernel applies (and `residual` is a
  // CPU tensor of input's dtype, shape and layout) the addition and ReLU happen in the
  // normalising pass, with the same roundings as the three steps; otherwise it is those steps.
  torch::Tensor forward_add_relu(const torch::Tensor& input, const torch::Tensor& residual);
  void set_reducer(std::shared_ptr<StatsReducer> reducer) { reducer_ = std::move(reducer); }
  bool synced() const { return reducer_ != nullptr; }
  double eps() const { return eps_; }
  double momentum() const { return momentum_; }

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  bool fused_kernel_applies(const torch::Tensor& input) const;
  // residual: undefined, or added before the ReLU (then relu is true).
  torch::Tensor fused_forward(const torch::Tensor& input, const torch::Tensor& residual, bool relu);

  double eps_;
  double momentum_;
  std::shared_ptr<StatsReducer> reducer_;
};
TORCH_MODULE(BatchNorm);

// Installs `reducer` in every BatchNorm of `module` (nullptr: back to per-replica statistics).
void set_batchnorm_reducer(torch::nn::Module& module, const std::shared_ptr<StatsReducer>& reducer);

}  // namespace trainer::model
