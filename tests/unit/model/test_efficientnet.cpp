// EfficientNet B0-B4 (model/efficientnet.cpp): torchvision's initialisation, the classifier and
// backbone split, and the per-example draws of stochastic depth and dropout (model/row_noise.h):
// a batch split into parts, with each row's seed, computes what the whole batch computes.
// Sizes and state-dict names are in test_resnet.cpp's family-wide cases, parity with torchvision
// in test_parity.cpp, the ONNX graph in test_onnx_export.cpp.
#include "common/catch.h"

#include <cmath>

#include "model_test_util.h"
#include "trainer/model/net.h"
#include "trainer/util/error.h"
#include "trainer/util/torch_compat.h"

using namespace trainer::model;
using trainer::model::testing::calibrate_batchnorm;
using trainer::model::testing::seeded_input;

namespace {

std::vector<uint64_t> seeds(std::initializer_list<uint64_t> s) { return s; }

}  // namespace

TEST_CASE("EfficientNet initialisation follows torchvision", "[efficientnet]") {
  torch::manual_seed(3);
  Net net = make_net({"efficientnet_b0", 1000, 0});
  CHECK(net->family() == "efficientnet");
  auto params = net->named_parameters();
  // kaiming_normal_(fan_out): std = sqrt(2 / (out_channels * kh * kw)); depthwise too.
  for (const std::string name : {"features.0.0.weight", "features.2.0.block.0.0.weight",
                                 "features.6.1.block.1.0.weight", "features.8.0.weight"}) {
    INFO(name);
    const torch::Tensor w = params[name];
    const double fan_out = static_cast<double>(w.size(0) * w.size(2) * w.size(3));
    CHECK(w.std().item<double>() == Approx(std::sqrt(2.0 / fan_out)).epsilon(0.1));
  }
  // Squeeze-and-excitation's convolutions have zero biases; BN weight 1, bias 0.
  CHECK(torch::all(params["features.3.0.block.2.fc1.bias"] == 0).item<bool>());
  CHECK(torch::all(params["features.3.0.block.2.fc2.bias"] == 0).item<bool>());
  CHECK(torch::all(params["features.3.0.block.0.1.weight"] == 1).item<bool>());
  // Linear: uniform(+-1 / sqrt(out_features)), zero bias.
  const double bound = 1.0 / std::sqrt(1000.0);
  CHECK(params["classifier.1.weight"].abs().max().item<double>() <= bound);
  CHECK(params["classifier.1.weight"].abs().max().item<double>() > 0.99 * bound);
  CHECK(torch::all(params["classifier.1.bias"] == 0).item<bool>());
}

TEST_CASE("EfficientNet: the classifier is classifier.*, the backbone all of features",
          "[efficientnet]") {
  CHECK(is_classifier_key("classifier.1.weight"));
  CHECK(is_classifier_key("fc.weight"));
  CHECK_FALSE(is_classifier_key("features.8.0.weight"));
  Net net = make_net({"efficientnet_b0", 5, 32});
  freeze_backbone(*net);
  std::vector<std::string> trainable;
  for (const auto& p : net->named_parameters()) {
    if (p.value().requires_grad()) trainable.push_back(p.key());
  }
  CHECK(trainable == std::vector<std::string>{"classifier.1.weight", "classifier.1.bias",
                                              "classifier.3.weight", "classifier.3.bias"});
  CHECK(net->forward(seeded_input({2, 3, 32, 32}, 1)).sizes() == torch::IntArrayRef({2, 5}));
}

TEST_CASE("EfficientNet's draws are per example: any split of a batch computes the same",
          "[efficientnet]") {
  torch::manual_seed(5);
  Net net = make_net({"efficientnet_b0", 4, 0});
  // Running statistics of real activations (at their initial values the activations fade to
  // 1e-14 through the 16 blocks), then BN frozen: batch statistics would tie the rows together.
  for (uint64_t seed = 17; seed < 47; ++seed) {
    calibrate_batchnorm(
        *net, [&](torch::Tensor in) { return net->forward(in); }, seed);
  }
  net->train();
  set_batchnorm_eval(*net);
  const torch::Tensor x = seeded_input({4, 3, 32, 32}, 6);
  const auto forward = [&](const torch::Tensor& in, std::vector<uint64_t> s) {
    net->set_row_seeds(std::move(s));
    torch::NoGradGuard no_grad;
    return net->forward(in);
  };
  const torch::Tensor whole = forward(x, seeds({11, 12, 13, 14}));
  const torch::Tensor halves = torch::cat(
      {forward(x.narrow(0, 0, 2), seeds({11, 12})), forward(x.narrow(0, 2, 2), seeds({13, 14}))});
  // The same masks: equal up to the convolutions' batch-size-dependent summation order.
  const double scale = whole.abs().max().item<double>();
  INFO("largest logit " << scale);
  REQUIRE(scale > 1e-2);
  CHECK((whole - halves).abs().max().item<double>() <= 1e-5 * scale);
  CHECK(torch::equal(whole, forward(x, seeds({11, 12, 13, 14}))));  // no hidden state
  // Other seeds, other masks (dropout 0.2 on 1280 features: never all alike).
  const torch::Tensor other = forward(x, seeds({21, 22, 23, 24}));
  CHECK((other - whole).abs().max().item<double>() > 1e-2 * scale);
  // Row seeds that do not match the batch are a bug, not a silent fallback.
  CHECK_THROWS_AS(forward(x, seeds({1, 2})), trainer::Error);
  // In eval mode nothing is drawn.
  net->eval();
  const torch::Tensor a = forward(x, seeds({11, 12, 13, 14}));
  const torch::Tensor b = forward(x, seeds({21, 22, 23, 24}));
  CHECK(torch::equal(a, b));
}

TEST_CASE("RowNoise: masks of 0 and 1 / (1 - p) at the rate p", "[efficientnet]") {
  RowNoise noise;
  std::vector<uint64_t> rows;
  for (uint64_t i = 0; i < 4000; ++i) rows.push_back(i * 7919);
  noise.set_rows(rows);
  const torch::Tensor x = torch::ones({4000, 8, 2, 2});
  const torch::Tensor r = noise.row_scale(x, 3, 0.25);
  CHECK(r.sizes() == torch::IntArrayRef({4000, 1, 1, 1}));
  const double kept = (r > 0).to(torch::kDouble).mean().item<double>();
  CHECK(kept == Approx(0.75).margin(0.03));
  CHECK(r.max().item<float>() == Approx(1.0 / 0.75));
  const torch::Tensor e = noise.element_scale(torch::ones({4000, 16}), 4, 0.4);
  CHECK(e.sizes() == torch::IntArrayRef({4000, 16}));
  CHECK((e > 0).to(torch::kDouble).mean().item<double>() == Approx(0.6).margin(0.01));
  // Layers and elements draw apart: the mask of one layer is not another's.
  CHECK_FALSE(torch::equal(noise.row_scale(x, 3, 0.25), noise.row_scale(x, 4, 0.25)));
  // Without row seeds, torch's generator (torchvision's behaviour).
  noise.set_rows({});
  torch::manual_seed(1);
  const torch::Tensor g1 = noise.row_scale(x, 3, 0.25);
  torch::manual_seed(1);
  CHECK(torch::equal(g1, noise.row_scale(x, 3, 0.25)));
}

TEST_CASE("EfficientNet trains under bf16 CPU autocast with channels_last", "[efficientnet]") {
  torch::manual_seed(21);
  Net net = make_net({"efficientnet_b0", 5, 0});
  net->train();
  for (auto& p : net->parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  const torch::Tensor x =
      seeded_input({2, 3, 32, 32}, 22).contiguous(torch::MemoryFormat::ChannelsLast);
  net->set_row_seeds({1, 2});
  torch::Tensor logits;
  {
    trainer::compat::AutocastGuard autocast(true, torch::Device(torch::kCPU));
    logits = net->forward(x);
  }
  CHECK(logits.scalar_type() == torch::kBFloat16);
  torch::nn::functional::cross_entropy(logits.to(torch::kFloat), torch::tensor({1, 3})).backward();
  const auto params = net->named_parameters();
  CHECK(params["features.0.0.weight"].grad().defined());
  CHECK(params["features.0.0.weight"].grad().abs().sum().item<double>() > 0);
}
