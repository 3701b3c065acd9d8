#include "trainer/model/row_noise.h"

#include <string>

#include "trainer/util/error.h"

namespace trainer::model {

namespace {

// splitmix64's finaliser: a bijective mix of 64 bits (Steele, Lea and Flood 2014).
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A mask made on the CPU, on x's device and in its dtype. To a GPU from page-locked memory and
// without waiting (a pageable copy would make the host wait for the GPU at every layer); the
// caching host allocator keeps the pinned block until the copy is done.
torch::Tensor like(const torch::Tensor& mask, const torch::Tensor& x) {
  if (x.is_cuda()) {
    return mask.pin_memory().to(x.device(), /*non_blocking=*/true).to(x.scalar_type());
  }
  return mask.to(x.scalar_type());
}

}  // namespace

torch::Tensor RowNoise::keep(int64_t rows, int64_t per_row, int64_t layer, double p) const {
  if (static_cast<int64_t>(seeds_.size()) != rows) {
    throw Error(ErrorKind::kInternal, "RowNoise: " + std::to_string(seeds_.size()) +
                                          " row seeds for a batch of " + std::to_string(rows) +
                                          " (layer " + std::to_string(layer) + ")");
  }
  torch::Tensor out = torch::empty({rows, per_row}, torch::kFloat);
  float* o = out.data_ptr<float>();
  const double survival = 1.0 - p;
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t base = mix64(seeds_[static_cast<size_t>(r)] ^
                                mix64(0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(layer + 1)));
    for (int64_t j = 0; j < per_row; ++j) {
      const uint64_t bits = mix64(base + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(j + 1));
      const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;  // uniform in [0, 1)
      o[r * per_row + j] = u < survival ? 1.0f : 0.0f;
    }
  }
  return out;
}

torch::Tensor RowNoise::row_scale(const torch::Tensor& x, int64_t layer, double p) const {
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[0] = x.size(0);
  const double survival = 1.0 - p;
  torch::Tensor noise;
  if (seeds_.empty()) {  // torchvision.ops.stochastic_depth
    noise = torch::empty(shape, x.options()).bernoulli_(survival);
  } else {
    noise = like(keep(x.size(0), 1, layer, p).view(shape), x);
  }
  if (survival > 0.0) noise.div_(survival);
  return noise;
}

torch::Tensor RowNoise::element_scale(const torch::Tensor& x, int64_t layer, double p) const {
  const double survival = 1.0 - p;
  torch::Tensor noise;
  if (seeds_.empty()) {  // ATen's dropout: bernoulli_(1 - p), then / (1 - p)
    noise = torch::empty_like(x, at::MemoryFormat::Contiguous).bernoulli_(survival);
  } else {
    const int64_t rows = x.size(0);
    noise = like(keep(rows, rows == 0 ? 0 : x.numel() / rows, layer, p).view(x.sizes()), x);
  }
  if (survival > 0.0) {
    noise.div_(survival);
  } else {
    noise.zero_();
  }
  return noise;
}

}  // namespace trainer::model
