// Shared helpers of the model tests: a self-removing temp dir, a seeded input, the DataError
// message of a call. Header-only; not thread-safe (tests run sequentially).
#pragma once

#include "common/run_command.h"

#include "common/temp_dir.h"

#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>
#include "common/catch.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include "trainer/model/safetensors.h"
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

// The tensor called `name` in a state dict; fails the test when there is none.
inline const torch::Tensor& find(const StateDict& sd, const std::string& name) {
  for (const auto& [key, tensor] : sd) {
    if (key == name) return tensor;
  }
  FAIL("no tensor '" << name << "'");
  static torch::Tensor none;
  return none;
}

using trainer::test_support::Run;
using trainer::test_support::run_command;

inline std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Fails the test, saying how to install them, when TRAINER_PYTHON lacks torch or torchvision.
inline void require_torchvision() {
  const Run probe =
      run_command(std::string(TRAINER_PYTHON) + " -c 'import torch, torchvision, numpy'");
  if (probe.rc != 0) {
    FAIL("this test needs torch, torchvision and numpy for " TRAINER_PYTHON
         " (Debian: python3-torch python3-torchvision python3-numpy); run scripts/install-deps.sh "
         "as root. Import failed with:\n"
         << probe.output);
  }
}

}  // namespace trainer::model::testing
