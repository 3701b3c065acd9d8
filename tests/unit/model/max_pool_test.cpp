// model::max_pool_3x3_s2: the ResNet stem's max pool as the trainer's own kernel gives ATen's
// max_pool2d_with_indices bits (maxima and argmax indices: ties, NaN, -inf, every border) and so
// the same gradient.
#include "common/catch.h"

#include <limits>

#include "trainer/model/max_pool.h"

using namespace trainer::model;

namespace {

// Values with many ties (ReLU'd zeros and a few levels, as after the stem's BN + ReLU).
torch::Tensor tied(std::vector<int64_t> sizes) {
  return torch::randint(-3, 4, sizes).to(torch::kFloat).clamp_min(0) * 0.5;
}

void check_same_as_aten(const torch::Tensor& x) {
  const auto [out, index] = max_pool_3x3_s2_with_indices(x);
  const auto [aten_out, aten_index] = at::max_pool2d_with_indices(x, {3, 3}, {2, 2}, {1, 1});
  REQUIRE(out.sizes() == aten_out.sizes());
  CHECK(torch::equal(index, aten_index));
  // NaN != NaN: compare the bits.
  CHECK(torch::equal(out.view(torch::kInt), aten_out.view(torch::kInt)));
}

}  // namespace

TEST_CASE("max_pool_3x3_s2 gives ATen's maxima and indices", "[model][max_pool]") {
  torch::manual_seed(11);
  // Sizes around the vector groups' bounds (a group needs 9 columns), odd and even, and the
  // ResNet stem's 112x112.
  for (const int64_t w : {1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 25, 26, 112}) {
    for (const int64_t h : {1, 2, 5, 8}) {
      INFO("h " << h << ", w " << w);
      check_same_as_aten(tied({2, 3, h, w}));
      check_same_as_aten(torch::randn({2, 3, h, w}));
    }
  }
  check_same_as_aten(tied({2, 4, 112, 112}));
}

TEST_CASE("max_pool_3x3_s2 keeps ATen's NaN and -inf rules", "[model][max_pool]") {
  torch::manual_seed(12);
  torch::Tensor x = tied({1, 2, 9, 21});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  x[0][0][2][4] = nan;   // inside a vector group's window
  x[0][0][2][5] = nan;   // a second NaN in the same window: the last one is kept
  x[0][0][0][0] = nan;   // the first (scalar) column
  x[0][1].fill_(-inf);   // all -inf: the index stays at the window's first element
  x[0][1][4][20] = nan;  // the last column
  check_same_as_aten(x);
}

TEST_CASE("max_pool_3x3_s2's gradient equals max_pool2d's", "[model][max_pool]") {
  torch::manual_seed(13);
  const torch::Tensor x0 = tied({2, 3, 20, 23});
  const torch::Tensor g = torch::randn({2, 3, 10, 12});
  torch::Tensor xa = x0.clone().requires_grad_(true), xb = x0.clone().requires_grad_(true);
  const torch::Tensor ya = torch::max_pool2d(xa, {3, 3}, {2, 2}, {1, 1});
  const torch::Tensor yb = max_pool_3x3_s2(xb);
  CHECK(torch::equal(yb, ya));
  (ya * g).sum().backward();
  (yb * g).sum().backward();
  CHECK(torch::equal(xb.grad(), xa.grad()));
  // channels_last and float64 take ATen's path: the same values.
  const torch::Tensor cl = x0.contiguous(at::MemoryFormat::ChannelsLast);
  CHECK(torch::equal(max_pool_3x3_s2(cl), ya.detach()));
  CHECK(torch::equal(max_pool_3x3_s2(x0.to(torch::kDouble)), ya.detach().to(torch::kDouble)));
}
