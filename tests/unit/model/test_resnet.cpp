// ResNet family: sizes, names, initialisation, options errors and the training helpers.
#include "common/catch.h"

#include <ATen/record_function.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "model_test_util.h"
#include "trainer/model/net.h"
#include "trainer/model/safetensors.h"
#include "trainer/util/error.h"
#include "trainer/util/torch_compat.h"

using namespace trainer::model;
using trainer::model::testing::calibrate_batchnorm;
using trainer::model::testing::seeded_input;

namespace {

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> state_dict_keys(const torch::nn::Module& module) {
  std::vector<std::string> keys;
  for (const auto& [name, tensor] : state_dict(module)) keys.push_back(name);
  return keys;
}

std::string config_error_of(const NetOptions& options) {
  try {
    make_net(options);
  } catch (const trainer::ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError");
  return {};
}

}  // namespace

TEST_CASE("parameter counts equal torchvision's", "[resnet]") {
  // sum(p.numel() for p in torchvision.models.resnetXX().parameters()), torchvision 0.14.
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"resnet18", 11689512},         {"resnet34", 21797672},
      {"resnet50", 25557032},         {"resnet101", 44549160},
      {"resnet152", 60192808},        {"resnext50_32x4d", 25028904},
      {"resnext101_32x8d", 88791336}, {"resnext101_64x4d", 83455272},
      {"wide_resnet50_2", 68883240},  {"wide_resnet101_2", 126886696},
      {"efficientnet_b0", 5288548},   {"efficientnet_b1", 7794184},
      {"efficientnet_b2", 9109994},   {"efficientnet_b3", 12233232},
      {"efficientnet_b4", 19341616},
  };
  REQUIRE(supported_archs() ==
          std::vector<std::string>{"resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
                                   "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d",
                                   "wide_resnet50_2", "wide_resnet101_2", "efficientnet_b0",
                                   "efficientnet_b1", "efficientnet_b2", "efficientnet_b3",
                                   "efficientnet_b4"});
  // torchvision's classifier widths (EfficientNet: 4 x the last stage's width, scaled).
  const std::map<std::string, int64_t> widths = {
      {"resnet18", 512},         {"resnet34", 512},         {"efficientnet_b0", 1280},
      {"efficientnet_b1", 1280}, {"efficientnet_b2", 1408}, {"efficientnet_b3", 1536},
      {"efficientnet_b4", 1792}};
  for (const auto& [arch, count] : expected) {
    INFO(arch);
    Net net = make_net({arch, 1000, 0});
    CHECK(count_parameters(*net) == count);
    CHECK(net->feature_dim() == (widths.count(arch) ? widths.at(arch) : 2048));
    CHECK(net->options().arch == arch);
  }
}

TEST_CASE("head_hidden replaces fc by Linear-ReLU-Linear", "[resnet]") {
  Net net = make_net({"resnet50", 5, 1016});
  const int64_t expected = 25557032 - (2048 * 1000 + 1000) + (2048 * 1016 + 1016) + (1016 * 5 + 5);
  CHECK(count_parameters(*net) == expected);
  std::vector<std::string> fc_keys;
  for (const auto& item : net->named_parameters()) {
    if (is_classifier_key(item.key())) fc_keys.push_back(item.key());
  }
  CHECK(fc_keys ==
        std::vector<std::string>{"fc.0.weight", "fc.0.bias", "fc.2.weight", "fc.2.bias"});
  CHECK(net->named_parameters()["fc.0.weight"].sizes() == torch::IntArrayRef({1016, 2048}));
  CHECK(net->named_parameters()["fc.2.weight"].sizes() == torch::IntArrayRef({5, 1016}));
}

TEST_CASE("output shapes", "[resnet]") {
  torch::NoGradGuard no_grad;
  struct Case {
    std::string arch;
    int64_t num_classes, head_hidden;
    std::vector<int64_t> input;
  };
  const std::vector<Case> cases = {
      {"resnet18", 10, 0, {2, 3, 64, 64}}, {"resnet18", 1000, 0, {1, 3, 224, 224}},
      {"resnet34", 3, 0, {1, 3, 32, 32}},  {"resnet50", 7, 16, {2, 3, 80, 48}},
      {"resnet101", 2, 0, {1, 3, 33, 47}},
  };
  for (const Case& c : cases) {
    INFO(c.arch << " classes " << c.num_classes << " input " << torch::IntArrayRef(c.input));
    Net net = make_net({c.arch, c.num_classes, c.head_hidden});
    net->eval();
    torch::Tensor y = net->forward(seeded_input(c.input, 1));
    CHECK(y.sizes() == torch::IntArrayRef({c.input[0], c.num_classes}));
    CHECK(y.scalar_type() == torch::kFloat);
    CHECK(torch::isfinite(y).all().item<bool>());
  }
}

TEST_CASE("state-dict keys and order equal torchvision's", "[resnet]") {
  for (const std::string arch : {"resnet18", "resnet50", "efficientnet_b0"}) {
    INFO(arch);
    const auto expected =
        read_lines(std::string(TRAINER_SOURCE_DIR) + "/tests/data/" + arch + "_keys.txt");
    Net net = make_net({arch, 1000, 0});
    const auto keys = state_dict_keys(*net);
    CHECK(std::set<std::string>(keys.begin(), keys.end()) ==
          std::set<std::string>(expected.begin(), expected.end()));
    CHECK(keys == expected);

    // named_parameters() + named_buffers() give the same names.
    std::set<std::string> named;
    for (const auto& item : net->named_parameters()) named.insert(item.key());
    for (const auto& item : net->named_buffers()) named.insert(item.key());
    CHECK(named == std::set<std::string>(expected.begin(), expected.end()));
  }
}

TEST_CASE("initialisation follows torchvision", "[resnet]") {
  torch::manual_seed(3);
  Net net = make_net({"resnet50", 1000, 0});
  auto params = net->named_parameters();
  // kaiming_normal_(fan_out, relu): std = sqrt(2 / (out_channels * kh * kw)).
  for (const std::string name :
       {"conv1.weight", "layer3.0.conv2.weight", "layer4.2.conv3.weight"}) {
    INFO(name);
    torch::Tensor w = params[name];
    const double fan_out = static_cast<double>(w.size(0) * w.size(2) * w.size(3));
    CHECK(w.std().item<double>() == Approx(std::sqrt(2.0 / fan_out)).epsilon(0.05));
    CHECK(std::abs(w.mean().item<double>()) < 0.1 * std::sqrt(2.0 / fan_out));
  }
  // nn.Linear default: weight and bias within +-1/sqrt(fan_in).
  const double bound = 1.0 / std::sqrt(2048.0);
  CHECK(params["fc.weight"].abs().max().item<double>() <= bound);
  CHECK(params["fc.bias"].abs().max().item<double>() <= bound);
  CHECK(params["fc.weight"].abs().max().item<double>() > 0.9 * bound);
  auto buffers = net->named_buffers();
  CHECK(torch::all(buffers["bn1.running_mean"] == 0).item<bool>());
  CHECK(torch::all(buffers["bn1.running_var"] == 1).item<bool>());
  CHECK(buffers["bn1.num_batches_tracked"].scalar_type() == torch::kLong);

  // BN weight 1, bias 0, eps 1e-5 and momentum 0.1 as torchvision.
  bool saw_bn = false;
  net->apply([&](torch::nn::Module& m) {
    if (auto* bn = dynamic_cast<trainer::model::BatchNormImpl*>(&m)) {
      saw_bn = true;
      CHECK(bn->eps() == 1e-5);
      CHECK(bn->momentum() == 0.1);
      CHECK(torch::all(bn->weight == 1).item<bool>());
      CHECK(torch::all(bn->bias == 0).item<bool>());
    }
  });
  CHECK(saw_bn);
}

TEST_CASE("make_net rejects bad options with ConfigError", "[resnet]") {
  CHECK(config_error_of({"resnet51", 10, 0}) ==
        "model.arch: expected one of resnet18|resnet34|resnet50|resnet101|resnet152|"
        "resnext50_32x4d|resnext101_32x8d|resnext101_64x4d|wide_resnet50_2|wide_resnet101_2|"
        "efficientnet_b0|efficientnet_b1|efficientnet_b2|efficientnet_b3|efficientnet_b4, got "
        "'resnet51'");
  CHECK_THAT(config_error_of({"resnet18", 0, 0}),
             trainer::test::Contains("model.num_classes") && trainer::test::Contains("got 0"));
  CHECK_THAT(config_error_of({"resnet18", 10, -1}),
             trainer::test::Contains("model.head_hidden") && trainer::test::Contains("got -1"));
  CHECK_THROWS_AS(Net(NetOptions{"", 10, 0}), trainer::ConfigError);
}

TEST_CASE("is_classifier_key", "[resnet]") {
  CHECK(is_classifier_key("fc"));
  CHECK(is_classifier_key("fc.weight"));
  CHECK(is_classifier_key("fc.2.bias"));
  CHECK_FALSE(is_classifier_key("fcx.weight"));
  CHECK_FALSE(is_classifier_key("conv1.weight"));
  CHECK_FALSE(is_classifier_key("layer4.1.bn2.fc"));
}

TEST_CASE("freeze_backbone leaves only the classifier trainable", "[resnet]") {
  Net net = make_net({"resnet18", 4, 8});
  freeze_backbone(*net);
  int64_t trainable = 0;
  for (const auto& item : net->named_parameters()) {
    INFO(item.key());
    CHECK(item.value().requires_grad() == is_classifier_key(item.key()));
    if (item.value().requires_grad()) trainable += item.value().numel();
  }
  CHECK(trainable == 512 * 8 + 8 + 8 * 4 + 4);

  // A backward pass reaches only the classifier.
  net->train();
  net->forward(seeded_input({2, 3, 32, 32}, 5)).sum().backward();
  CHECK(net->named_parameters()["fc.2.weight"].grad().defined());
  CHECK_FALSE(net->named_parameters()["conv1.weight"].grad().defined());
}

TEST_CASE("set_batchnorm_eval freezes statistics while the rest trains", "[resnet]") {
  Net net = make_net({"resnet18", 4, 0});
  net->train();
  set_batchnorm_eval(*net);
  CHECK(net->is_training());
  int bn_count = 0;
  net->apply([&](torch::nn::Module& m) {
    if (dynamic_cast<trainer::model::BatchNormImpl*>(&m)) {
      ++bn_count;
      CHECK_FALSE(m.is_training());
    } else {
      CHECK(m.is_training());
    }
  });
  CHECK(bn_count == 20);  // bn1 + 8 blocks x 2 + 3 downsample BNs
  const torch::Tensor before = net->named_buffers()["layer2.0.bn1.running_mean"].clone();
  net->forward(seeded_input({2, 3, 32, 32}, 6)).sum().backward();
  CHECK(torch::equal(before, net->named_buffers()["layer2.0.bn1.running_mean"]));
  CHECK(net->named_buffers()["bn1.num_batches_tracked"].item<int64_t>() == 0);
}

TEST_CASE("channels_last gives the same logits as contiguous", "[resnet]") {
  torch::NoGradGuard no_grad;
  torch::manual_seed(11);
  Net net = make_net({"resnet18", 6, 0});
  calibrate_batchnorm(
      *net, [&](torch::Tensor x) { return net->forward(x); }, 12);
  const torch::Tensor x = seeded_input({2, 3, 64, 64}, 13);
  const torch::Tensor reference = net->forward(x);

  const torch::Tensor y = net->forward(x.contiguous(torch::MemoryFormat::ChannelsLast));
  CHECK((y - reference).abs().max().item<float>() < 1e-4);

  // Weights in channels_last as well (what the train runtime does).
  for (auto& p : net->parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  const torch::Tensor z = net->forward(x.contiguous(torch::MemoryFormat::ChannelsLast));
  CHECK((z - reference).abs().max().item<float>() < 1e-4);
}

TEST_CASE("forward and backward under bf16 CPU autocast with channels_last", "[resnet]") {
  torch::manual_seed(21);
  Net net = make_net({"resnet18", 5, 0});
  net->train();
  const torch::Tensor x =
      seeded_input({2, 3, 64, 64}, 22).contiguous(torch::MemoryFormat::ChannelsLast);
  const torch::Tensor target = torch::tensor({1, 3}, torch::kLong);
  torch::Tensor logits;
  {
    trainer::compat::AutocastGuard autocast(true, torch::Device(torch::kCPU));
    CHECK(trainer::compat::autocast_enabled(torch::kCPU));
    CHECK(trainer::compat::autocast_dtype(torch::kCPU) == torch::kBFloat16);
    logits = net->forward(x);
  }
  CHECK_FALSE(trainer::compat::autocast_enabled(torch::kCPU));
  CHECK(logits.scalar_type() == torch::kBFloat16);  // fc ran in bf16
  CHECK(logits.sizes() == torch::IntArrayRef({2, 5}));
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), target);
  loss.backward();
  CHECK(std::isfinite(loss.item<float>()));
  for (const std::string name : {"conv1.weight", "layer4.1.conv2.weight", "fc.weight"}) {
    INFO(name);
    torch::Tensor g = net->named_parameters()[name].grad();
    REQUIRE(g.defined());
    CHECK(g.scalar_type() == torch::kFloat);  // master weights stay fp32
    CHECK(torch::isfinite(g).all().item<bool>());
    CHECK(g.abs().sum().item<float>() > 0);
  }

  // A disabled guard changes nothing.
  {
    trainer::compat::AutocastGuard off(false, torch::Device(torch::kCPU));
    CHECK_FALSE(trainer::compat::autocast_enabled(torch::kCPU));
    torch::NoGradGuard no_grad;
    CHECK(net->forward(x).scalar_type() == torch::kFloat);
  }
}

namespace {

// The operator names a forward records on this thread (RecordFunction, as profilers see them).
std::map<std::string, int> recorded_ops;
std::unique_ptr<at::ObserverContext> count_op(const at::RecordFunction& fn) {
  ++recorded_ops[fn.name()];
  return nullptr;
}

std::map<std::string, int> ops_of_training_forward(const char* arch, bool channels_last) {
  torch::manual_seed(3);
  Net net = make_net({arch, 5, 0});
  net->train();
  // 64 px: layer4's 2x2 planes (at 1x1 a channels_last tensor is also contiguous).
  torch::Tensor x = torch::randn({2, 3, 64, 64});
  if (channels_last) {
    x = x.contiguous(at::MemoryFormat::ChannelsLast);
    for (auto& p : net->parameters()) {
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
  recorded_ops.clear();
  const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(count_op));
  net->forward(x);
  at::removeCallback(handle);
  return recorded_ops;
}

}  // namespace

TEST_CASE(
    "a ResNet's training forward runs every BatchNorm in the trainer's kernel, NCHW and "
    "channels_last",
    "[resnet][bn_relu]") {
  // resnet18: the stem's BN + ReLU, 8 blocks of bn1 + ReLU and bn2 + residual + ReLU, 3
  // downsample BNs; resnet50: the stem, 16 blocks of two BN + ReLU and one BN + residual + ReLU,
  // 4 downsample BNs. No ATen batch norm, ReLU or residual addition is left, in either layout.
  for (const auto& [arch, bn_relu, bn_add_relu, bn] :
       {std::tuple<const char*, int, int, int>{"resnet18", 9, 8, 3}, {"resnet50", 33, 16, 4}}) {
    for (const bool channels_last : {false, true}) {
      INFO(arch << ", channels_last " << channels_last);
      auto ops = ops_of_training_forward(arch, channels_last);
      CHECK(ops["trainer::batch_norm_relu"] == bn_relu);
      CHECK(ops["trainer::batch_norm_add_relu"] == bn_add_relu);
      CHECK(ops["trainer::batch_norm"] == bn);
      CHECK(ops["aten::batch_norm"] == 0);
      CHECK(ops["aten::relu_"] == 0);
      CHECK(ops["aten::relu"] == 0);
    }
  }
}
