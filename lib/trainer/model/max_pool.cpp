#include "trainer/model/max_pool.h"

#include "trainer/model/vec4.h"
#include "trainer/util/kernel_switch.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace trainer::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using vec::load4;
using vec::Mask4;
using vec::select4;
using vec::splat4;
using vec::store4;
using vec::Vec4;

constexpr int64_t kKernel = 3, kStride = 2, kPad = 1;

int64_t pooled_size(int64_t n) { return (n + 2 * kPad - kKernel) / kStride + 1; }

// One output, as ATen's cpu_max_pool computes it: the window clipped to the plane, scanned row by
// row, a value replacing the maximum when greater or NaN; the index starts at the window's first
// element (an all -inf window keeps it).
inline void pool_one(const float* plane, int64_t h, int64_t w, int64_t oh, int64_t ow, float* out,
                     int64_t* index) {
  const int64_t ih0 = oh * kStride - kPad, iw0 = ow * kStride - kPad;
  const int64_t ih_end = std::min(ih0 + kKernel, h), iw_end = std::min(iw0 + kKernel, w);
  const int64_t ih_begin = std::max<int64_t>(ih0, 0), iw_begin = std::max<int64_t>(iw0, 0);
  float best = -std::numeric_limits<float>::infinity();
  int64_t best_index = ih_begin * w + iw_begin;
  for (int64_t ih = ih_begin; ih < ih_end; ++ih) {
    for (int64_t iw = iw_begin; iw < iw_end; ++iw) {
      const float v = plane[ih * w + iw];
      if (v > best || std::isnan(v)) {
        best = v;
        best_index = ih * w + iw;
      }
    }
  }
  *out = best;
  *index = best_index;
}

// Lanes take v where it is greater than the maximum so far or NaN (pool_one's rule).
inline void take4(Vec4 v, Mask4 index, Vec4* best, Mask4* best_index) {
  const Mask4 take = (v > *best) | (v != v);
  *best = select4(take, v, *best);
  *best_index = select4(take, index, *best_index);
}

// One plane. Outputs whose window lies inside the row's columns go four at a time: for outputs
// ow..ow+3 the window columns start at c = 2 ow - 1, and the three columns of each lane are the
// even, odd and shifted-even elements of the row from c; the rows go in the same order as
// pool_one's, so each lane makes the same comparisons in the same order. The rest (the first
// output column, the last few) goes one at a time.
void pool_plane(const float* plane, int64_t h, int64_t w, float* out, int64_t* index) {
  const int64_t oh_n = pooled_size(h), ow_n = pooled_size(w);
  // A group's last load reads column c + 9 = 2 ow + 8 (one past lane 3's window): the last
  // group starts where that is still inside the row, and ends inside the output row.
  const int64_t last_group = w >= 9 ? std::min((w - 9) / 2, ow_n - 4) : -1;
  for (int64_t oh = 0; oh < oh_n; ++oh) {
    float* o = out + oh * ow_n;
    int64_t* oi = index + oh * ow_n;
    const int64_t ih0 = oh * kStride - kPad;
    const int64_t ih_begin = std::max<int64_t>(ih0, 0), ih_end = std::min(ih0 + kKernel, h);
    int64_t ow = 0;
    pool_one(plane, h, w, oh, ow++, o, oi);
    for (; ow <= last_group; ow += 4) {
      const int64_t c = ow * kStride - kPad;
      Vec4 best = splat4(-std::numeric_limits<float>::infinity());
      const auto first = static_cast<int32_t>(ih_begin * w + c);
      Mask4 best_index = Mask4{first, first + 2, first + 4, first + 6};
      for (int64_t ih = ih_begin; ih < ih_end; ++ih) {
        const float* r = plane + ih * w + c;
        const Vec4 a0 = load4(r), a1 = load4(r + 4), b0 = load4(r + 2), b1 = load4(r + 6);
        const auto at = static_cast<int32_t>(ih * w + c);
        const Mask4 lanes = Mask4{at, at + 2, at + 4, at + 6};
        take4(__builtin_shufflevector(a0, a1, 0, 2, 4, 6), lanes, &best, &best_index);
        take4(__builtin_shufflevector(a0, a1, 1, 3, 5, 7), lanes + 1, &best, &best_index);
        take4(__builtin_shufflevector(b0, b1, 0, 2, 4, 6), lanes + 2, &best, &best_index);
      }
      store4(o + ow, best);
      for (int l = 0; l < 4; ++l) oi[ow + l] = best_index[l];
    }
    for (; ow < ow_n; ++ow) pool_one(plane, h, w, oh, ow, o + ow, oi + ow);
  }
}

bool own_kernel_applies(const torch::Tensor& x) {
  return !util::aten_kernels_only() && x.dim() == 4 && x.is_cpu() &&
         x.scalar_type() == torch::kFloat && x.is_contiguous() && x.size(2) > 0 && x.size(3) > 0 &&
         x.size(2) * x.size(3) < std::numeric_limits<int32_t>::max();
}

// The own kernel, for a tensor own_kernel_applies to.
std::tuple<torch::Tensor, torch::Tensor> own_pool(const torch::Tensor& x) {
  RECORD_FUNCTION("trainer::max_pool2d", std::vector<c10::IValue>({x}));
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = pooled_size(h), ow = pooled_size(w);
  torch::Tensor out = torch::empty({x.size(0), x.size(1), oh, ow}, x.options());
  torch::Tensor index =
      torch::empty({x.size(0), x.size(1), oh, ow}, x.options().dtype(torch::kLong));
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  int64_t* ip = index.data_ptr<int64_t>();
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      pool_plane(xp + p * h * w, h, w, op + p * oh * ow, ip + p * oh * ow);
    }
  });
  return {out, index};
}

// Forward: the own kernel; backward: ATen's, from the same indices.
struct MaxPoolFunction : public torch::autograd::Function<MaxPoolFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x) {
    auto [out, index] = own_pool(x);
    ctx->save_for_backward({x, index});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {at::max_pool2d_with_indices_backward(grads[0], saved[0], {kKernel, kKernel},
                                                 {kStride, kStride}, {kPad, kPad}, {1, 1},
                                                 /*ceil_mode=*/false, saved[1])};
  }
};

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> max_pool_3x3_s2_with_indices(const torch::Tensor& x) {
  if (!own_kernel_applies(x)) {
    return at::max_pool2d_with_indices(x, {kKernel, kKernel}, {kStride, kStride}, {kPad, kPad});
  }
  return own_pool(x);
}

torch::Tensor max_pool_3x3_s2(const torch::Tensor& x) {
  if (!own_kernel_applies(x)) {
    return torch::max_pool2d(x, {kKernel, kKernel}, {kStride, kStride}, {kPad, kPad});
  }
  return MaxPoolFunction::apply(x);
}

}  // namespace trainer::model
