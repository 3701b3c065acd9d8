// Shared helpers of the model tests: a self-removing temp dir, a seeded input, the DataError
// message of a call. Header-only; not thread-safe (tests run sequentially).
#pragma once

#include "common/temp_dir.h"

#include <torch/torch.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <functional>
#include <string>

#include "trainer/util/error.h"

namespace trainer::model::testing {

namespace fs = std::filesystem;

using trainer::test_support::TempDir;  // tests/common/temp_dir.h

// N(0, 1) images from their own generator, so a test's input does not depend on test order.
inline torch::Tensor seeded_input(std::vector<int64_t> sizes, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(sizes, gen);
}

// The message of the DataError that `f` throws; fails the test when it throws none.
inline std::string data_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const trainer::DataError& e) {
    return e.what();
  }
  FAIL("expected a trainer::DataError, none was thrown");
  return {};
}

// One forward pass in training mode without autograd, so BatchNorm running statistics (and
// num_batches_tracked) are no longer the trivial 0 / 1 / 0 of a fresh model.
inline void calibrate_batchnorm(torch::nn::Module& module,
                                const std::function<torch::Tensor(torch::Tensor)>& forward,
                                uint64_t seed) {
  torch::NoGradGuard no_grad;
  module.train();
  forward(seeded_input({4, 3, 64, 64}, seed));
  module.eval();
}

}  // namespace trainer::model::testing
