// TRAINER_ATEN_KERNELS=1 turns the trainer's own CPU kernels off: BatchNorm's training forward
// (model/batch_norm.cpp) goes back to ATen's batch_norm (and ReLU, and the residual addition),
// the stem's max pool (model/max_pool.cpp) to ATen's, and the optimizers to LibTorch's
// per-tensor step (loop/optimizer.cpp), so a benchmark can time both on one build, alternating
// (docs/performance.md). Read once per process; thread-safe.
#pragma once

#include <cstdlib>
#include <cstring>

namespace trainer::util {

inline bool aten_kernels_only() {
  static const bool only = [] {
    const char* v = std::getenv("TRAINER_ATEN_KERNELS");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return only;
}

}  // namespace trainer::util
