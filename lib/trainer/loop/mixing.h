// Mixup and CutMix on one replica's batch (train.mixup_alpha, train.cutmix_alpha), as
// torchvision's reference (RandomMixup/RandomCutmix, and transforms.v2.MixUp/CutMix) mixes: each
// example with the one before it in the batch (batch.roll(1, 0)), lambda ~ Beta(alpha, alpha);
// with both set, one of the two per batch, half and half. CutMix pastes the rolled batch into a
// box around a uniform centre whose half-sides are int(W/2 sqrt(1 - lambda)) and
// int(H/2 sqrt(1 - lambda)), clamped to the image, and sets lambda to the unpasted fraction.
// Targets are one-hot rows mixed with the same lambda. Pairs are drawn within a replica, so a
// job's results depend on how the global batch is split into replicas (1 x 8 != 2 x 4).
// All randomness comes from the seed. Stateless; thread-safe.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace trainer::train {

struct MixOptions {
  double mixup_alpha = 0;
  double cutmix_alpha = 0;
  bool enabled() const { return mixup_alpha > 0 || cutmix_alpha > 0; }
};

// What was drawn for one batch.
struct MixDraw {
  std::string kind = "none";               // none | mixup | cutmix
  double lambda = 1.0;                     // the weight of each example's own image and target
  int64_t x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // cutmix: the pasted box [x1, x2) x [y1, y2)
};

// The seed of the mixing of batch `batch` of epoch `epoch` on replica `worker`: a function of the
// position (a resumed job mixes alike; `trainer preview` shows the same mixing).
uint64_t batch_mix_seed(int64_t data_seed, int64_t epoch, int64_t batch, int worker);

// Draws the mixing of a batch of [B, C, H, W] images.
MixDraw draw_mix(const MixOptions& options, int64_t height, int64_t width, uint64_t seed);

struct Mixed {
  torch::Tensor images;   // [B, C, H, W], the input's dtype, device and memory format
  torch::Tensor targets;  // [B, classes] float32
};

// Applies `draw` to float images [B, C, H, W] and int64 labels [B] (one-hot over num_classes),
// each example mixed with the one before it (the batch rolled by one). kind none returns the
// images untouched and the one-hot targets.
Mixed apply_mix(const torch::Tensor& images, const torch::Tensor& labels, int64_t num_classes,
                const MixDraw& draw);

// The same for some rows of a batch: `images`/`labels` are the rows, `partners`/`partner_labels`
// the rows before each of them in the whole batch (apply_mix of a batch equals apply_mix_rows of
// any split of it with those partners: the step mixes micro-batch by micro-batch).
Mixed apply_mix_rows(const torch::Tensor& images, const torch::Tensor& partners,
                     const torch::Tensor& labels, const torch::Tensor& partner_labels,
                     int64_t num_classes, const MixDraw& draw);

}  // namespace trainer::train
