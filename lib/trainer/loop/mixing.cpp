#include "trainer/loop/mixing.h"

#include <algorithm>
#include <cmath>

#include "trainer/data/random.h"
#include "trainer/util/error.h"
#include "trainer/util/rng.h"

namespace trainer::train {

uint64_t batch_mix_seed(int64_t data_seed, int64_t epoch, int64_t batch, int worker) {
  constexpr uint64_t kMixStream = 0x6d69786375746d78ULL;  // "mixcutmx"
  return util::mix_seed(static_cast<uint64_t>(data_seed),
                        {static_cast<uint64_t>(epoch), static_cast<uint64_t>(batch),
                         static_cast<uint64_t>(worker), kMixStream});
}

MixDraw draw_mix(const MixOptions& o, int64_t height, int64_t width, uint64_t seed) {
  MixDraw d;
  if (!o.enabled()) return d;
  data::Rng rng(seed);
  bool cutmix = o.cutmix_alpha > 0;
  if (o.mixup_alpha > 0 && o.cutmix_alpha > 0) cutmix = data::uniform01(rng) >= 0.5;
  const double alpha = cutmix ? o.cutmix_alpha : o.mixup_alpha;
  const double lambda = data::beta_sample(rng, alpha, alpha);
  if (!cutmix) {
    d.kind = "mixup";
    d.lambda = lambda;
    return d;
  }
  d.kind = "cutmix";
  const int64_t rx = data::uniform_int(rng, 0, width);
  const int64_t ry = data::uniform_int(rng, 0, height);
  const double r = 0.5 * std::sqrt(1.0 - lambda);
  const auto half_w = static_cast<int64_t>(r * static_cast<double>(width));
  const auto half_h = static_cast<int64_t>(r * static_cast<double>(height));
  d.x1 = std::max<int64_t>(rx - half_w, 0);
  d.y1 = std::max<int64_t>(ry - half_h, 0);
  d.x2 = std::min<int64_t>(rx + half_w, width);
  d.y2 = std::min<int64_t>(ry + half_h, height);
  d.lambda = 1.0 - static_cast<double>((d.x2 - d.x1) * (d.y2 - d.y1)) /
                       static_cast<double>(width * height);
  return d;
}

Mixed apply_mix_rows(const torch::Tensor& images, const torch::Tensor& partners,
                     const torch::Tensor& labels, const torch::Tensor& partner_labels,
                     int64_t num_classes, const MixDraw& d) {
  if (images.dim() != 4 || labels.dim() != 1 || labels.size(0) != images.size(0) ||
      partners.sizes() != images.sizes() || partner_labels.sizes() != labels.sizes()) {
    throw Error(ErrorKind::kInternal,
                "apply_mix: expected [B, C, H, W] images and [B] labels, and partners alike");
  }
  Mixed out;
  out.targets = torch::nn::functional::one_hot(labels, num_classes).to(torch::kFloat32);
  if (d.kind == "none" || images.size(0) == 0) {
    out.images = images;
    return out;
  }
  const torch::Tensor partner_targets =
      torch::nn::functional::one_hot(partner_labels, num_classes).to(torch::kFloat32);
  out.targets = partner_targets * (1.0 - d.lambda) + out.targets * d.lambda;
  if (d.kind == "mixup") {
    out.images = partners * (1.0 - d.lambda) + images * d.lambda;
    return out;
  }
  out.images = images.clone(images.suggest_memory_format());
  using torch::indexing::Slice;
  out.images.index_put_({Slice(), Slice(), Slice(d.y1, d.y2), Slice(d.x1, d.x2)},
                        partners.index({Slice(), Slice(), Slice(d.y1, d.y2), Slice(d.x1, d.x2)}));
  return out;
}

Mixed apply_mix(const torch::Tensor& images, const torch::Tensor& labels, int64_t num_classes,
                const MixDraw& d) {
  if (images.dim() != 4 || labels.dim() != 1) {
    throw Error(ErrorKind::kInternal, "apply_mix: expected [B, C, H, W] images and [B] labels");
  }
  return apply_mix_rows(images, images.roll(1, 0), labels, labels.roll(1, 0), num_classes, d);
}

}  // namespace trainer::train
