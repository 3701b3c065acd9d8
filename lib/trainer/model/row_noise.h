// Per-example randomness for the layers that draw in training (EfficientNet's stochastic depth
// and the dropout before its classifier). torchvision draws these from torch's generator over
// the batch at hand, so a replica's draws depend on how the global batch was split; here each
// row of the batch draws from its own seed (the trainer sets one per example), and a layer's
// draws for a row are a fixed function of (row seed, layer, element): 1 x 8 and 2 x 4 replicas,
// micro-batches and a resumed job all see the same masks. Without row seeds (a plain forward in
// training mode) the masks come from torch's default generator, as torchvision's do. One per
// Net, shared by its layers; not thread-safe (a module's state).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace trainer::model {

class RowNoise {
 public:
  // The seeds of the rows of the next forwards ({} = torch's generator).
  void set_rows(std::vector<uint64_t> seeds) { seeds_ = std::move(seeds); }
  const std::vector<uint64_t>& rows() const { return seeds_; }

  // Stochastic depth, mode "row" (torchvision.ops.stochastic_depth): a [N, 1, ..., 1] tensor of
  // 0 or 1 / (1 - p) in x's dtype and device, one draw per row. `layer` tells the layers apart.
  torch::Tensor row_scale(const torch::Tensor& x, int64_t layer, double p) const;
  // Dropout (torch.nn.functional.dropout): a tensor of x's shape of 0 or 1 / (1 - p), one draw
  // per element.
  torch::Tensor element_scale(const torch::Tensor& x, int64_t layer, double p) const;

 private:
  // The keep (1) / drop (0) pattern, [rows, per_row] float32 on the CPU.
  torch::Tensor keep(int64_t rows, int64_t per_row, int64_t layer, double p) const;
  std::vector<uint64_t> seeds_;
};

}  // namespace trainer::model
