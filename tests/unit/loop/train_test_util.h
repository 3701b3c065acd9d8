// Shared helpers of the train-module tests: a self-removing temp dir, file byte helpers, a tiny
// module with BatchNorm buffers, and bit-exact state comparison. Header-only; not thread-safe
// (tests run sequentially).
#pragma once

#include "common/temp_dir.h"

#include <torch/torch.h>
#include <unistd.h>
#include "common/catch.h"

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "trainer/config/job_spec.h"
#include "trainer/data/source.h"
#include "trainer/model/safetensors.h"
#include "trainer/synth/synthetic.h"

namespace trainer::train::testing {

namespace fs = std::filesystem;

// Adam at `learning_rate`, the optimizer of the tests that train a few steps.
inline config::OptimizerSpec adam_spec(double learning_rate = 1e-3) {
  config::OptimizerSpec s;
  s.name = "adam";
  s.learning_rate = learning_rate;
  return s;
}

using trainer::test_support::TempDir;  // tests/common/temp_dir.h

// A listing of six generated 32x32 JPEGs in three classes under `tmp`/data/train.
inline data::Listing six_images(const TempDir& tmp) {
  synth::SyntheticOptions synth;
  synth.out_dir = (tmp.path() / "data").string();
  synth.classes = 3;
  synth.per_class = 2;
  synth.image_size = 32;
  synth.splits = {"train"};
  synth::make_synthetic_dataset(synth);
  data::SourceOptions source;
  source.path = {(tmp.path() / "data" / "train").string()};
  return data::list_source(source, "data.train");
}

inline std::string read_bytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
  REQUIRE(f.good());
}

// The lines of a text file, the last one included even without its newline.
inline std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Conv + BatchNorm (running_mean/var, num_batches_tracked) + Linear: the shape of a ResNet's
// state in a few hundred numbers, for tests that write many checkpoints.
struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(4))),
        fc(register_module("fc", torch::nn::Linear(4, 3))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1(conv1(x)));
    return fc(x.mean({2, 3}));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Linear fc;
};
TORCH_MODULE(TinyNet);

// N(0, 1) values from their own generator, so a test's input does not depend on test order.
inline torch::Tensor seeded_input(std::vector<int64_t> sizes, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(sizes, gen);
}

// Bit-exact equality of two tensors: same dtype, shape and bytes (NaN-safe).
inline bool bit_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const torch::Tensor ca = a.detach().cpu().contiguous();
  const torch::Tensor cb = b.detach().cpu().contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// Every state-dict entry (parameters and buffers) of `a` and `b` under the same name, bit-equal.
inline void require_same_state(const torch::nn::Module& a, const torch::nn::Module& b) {
  const model::StateDict sa = model::state_dict(a);
  const model::StateDict sb = model::state_dict(b);
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO("state-dict entry " << sa[i].first);
    REQUIRE(sa[i].first == sb[i].first);
    REQUIRE(bit_equal(sa[i].second, sb[i].second));
  }
}

// True when at least one state-dict entry of `a` and `b` differs (the test is not vacuous).
inline bool any_state_differs(const torch::nn::Module& a, const torch::nn::Module& b) {
  const model::StateDict sa = model::state_dict(a);
  const model::StateDict sb = model::state_dict(b);
  for (size_t i = 0; i < sa.size() && i < sb.size(); ++i) {
    if (!bit_equal(sa[i].second, sb[i].second)) return true;
  }
  return sa.size() != sb.size();
}

}  // namespace trainer::train::testing
