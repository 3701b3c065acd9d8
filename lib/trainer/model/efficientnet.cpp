// torchvision.models.efficientnet's EfficientNet V1 (B0-B4): MBConv blocks (1x1 expansion,
// depthwise k x k, squeeze-and-excitation, 1x1 projection; SiLU), stochastic depth on the
// residual branches, dropout before the classifier, nn.BatchNorm2d's defaults (eps 1e-5,
// momentum 0.1: torchvision passes no norm_layer for B0-B4), and torchvision's initialisation.
// Names follow torchvision: features.<stage>.<block>.block.<i>.{0,1} (conv, BN),
// ...block.<i>.fc1/fc2 (SE), classifier.1 (Linear).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "trainer/model/named_part.h"
#include "trainer/model/net.h"

namespace trainer::model {

namespace nn = torch::nn;

namespace {

constexpr double kBnEps = 1e-5;
constexpr double kBnMomentum = 0.1;
constexpr double kStochasticDepth = 0.2;    // torchvision's stochastic_depth_prob
constexpr int64_t kDropoutLayer = 1 << 20;  // RowNoise's layer id of the classifier's dropout

struct Variant {
  const char* name;
  double width_mult, depth_mult, dropout;
};

constexpr Variant kVariants[] = {
    {"efficientnet_b0", 1.0, 1.0, 0.2}, {"efficientnet_b1", 1.0, 1.1, 0.2},
    {"efficientnet_b2", 1.1, 1.2, 0.3}, {"efficientnet_b3", 1.2, 1.4, 0.3},
    {"efficientnet_b4", 1.4, 1.8, 0.4},
};

// (expand_ratio, kernel, stride, input_channels, out_channels, num_layers) before scaling.
struct Stage {
  double expand;
  int64_t kernel, stride, in, out, layers;
};
constexpr Stage kStages[] = {
    {1, 3, 1, 32, 16, 1},  {6, 3, 2, 16, 24, 2},   {6, 5, 2, 24, 40, 2},   {6, 3, 2, 40, 80, 3},
    {6, 5, 1, 80, 112, 3}, {6, 5, 2, 112, 192, 4}, {6, 3, 1, 192, 320, 1},
};

// torchvision.models._utils._make_divisible (divisor 8, min_value = divisor).
int64_t make_divisible(double v, int64_t divisor = 8) {
  int64_t new_v = std::max<int64_t>(
      divisor, static_cast<int64_t>(v + static_cast<double>(divisor) / 2) / divisor * divisor);
  if (static_cast<double>(new_v) < 0.9 * v) new_v += divisor;
  return new_v;
}

const Variant* find_variant(const std::string& arch) {
  for (const Variant& v : kVariants) {
    if (arch == v.name) return &v;
  }
  return nullptr;
}

// nn::Sequential with a plain forward, so that it can sit inside another Sequential (as
// torchvision's nested nn.Sequential do: features.<stage>, ...block, Conv2dNormActivation).
class ChainImpl : public nn::SequentialImpl {
 public:
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(x); }
};
TORCH_MODULE(Chain);

// torchvision.ops.Conv2dNormActivation: Conv2d (no bias, padding (k - 1) / 2), BatchNorm2d,
// then SiLU unless `activation` is false.
Chain conv_norm_act(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups,
                    bool activation) {
  Chain s(nn::Conv2d(nn::Conv2dOptions(in, out, kernel)
                         .stride(stride)
                         .padding((kernel - 1) / 2)
                         .groups(groups)
                         .bias(false)),
          BatchNorm(out, kBnEps, kBnMomentum));
  if (activation) s->push_back(nn::SiLU());
  return s;
}

// torchvision.ops.SqueezeExcitation with SiLU and Sigmoid: x * sigmoid(fc2(silu(fc1(pool(x))))).
class SqueezeExcitationImpl : public nn::Module {
 public:
  SqueezeExcitationImpl(int64_t channels, int64_t squeeze)
      : avgpool_(
            register_module("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)))),
        fc1_(register_module("fc1", nn::Conv2d(nn::Conv2dOptions(channels, squeeze, 1)))),
        fc2_(register_module("fc2", nn::Conv2d(nn::Conv2dOptions(squeeze, channels, 1)))),
        activation_(register_module("activation", nn::SiLU())),
        scale_activation_(register_module("scale_activation", nn::Sigmoid())) {}

  torch::Tensor forward(torch::Tensor x) {
    const torch::Tensor scale = scale_activation_(fc2_(activation_(fc1_(avgpool_(x)))));
    return scale * x;
  }

 private:
  nn::AdaptiveAvgPool2d avgpool_;
  nn::Conv2d fc1_, fc2_;
  nn::SiLU activation_;
  nn::Sigmoid scale_activation_;
};
TORCH_MODULE(SqueezeExcitation);

// torchvision.models.efficientnet.MBConv. Its StochasticDepth holds no state, so it is no child
// here: the draw is made in forward, from the Net's RowNoise.
class MBConvImpl : public nn::Module {
 public:
  MBConvImpl(double expand, int64_t kernel, int64_t stride, int64_t in, int64_t out, double sd_prob,
             int64_t layer_id, std::shared_ptr<RowNoise> noise)
      : residual_(stride == 1 && in == out),
        sd_prob_(sd_prob),
        layer_id_(layer_id),
        noise_(std::move(noise)) {
    const int64_t expanded = make_divisible(static_cast<double>(in) * expand);
    Chain block;
    if (expanded != in) block->push_back(conv_norm_act(in, expanded, 1, 1, 1, true));
    block->push_back(conv_norm_act(expanded, expanded, kernel, stride, expanded, true));
    block->push_back(SqueezeExcitation(expanded, std::max<int64_t>(1, in / 4)));
    block->push_back(conv_norm_act(expanded, out, 1, 1, 1, false));
    block_ = register_module("block", block);
  }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor result = block_->forward(x);
    if (residual_) {
      if (is_training() && sd_prob_ > 0.0) {
        result = result * noise_->row_scale(result, layer_id_, sd_prob_);
      }
      result += x;
    }
    return result;
  }

 private:
  bool residual_;
  double sd_prob_;
  int64_t layer_id_;
  std::shared_ptr<RowNoise> noise_;
  Chain block_{nullptr};
};
TORCH_MODULE(MBConv);

// nn.Dropout(p, inplace=True) before the classifier, drawing from the Net's RowNoise.
class NoiseDropoutImpl : public nn::Module {
 public:
  NoiseDropoutImpl(double p, std::shared_ptr<RowNoise> noise) : p_(p), noise_(std::move(noise)) {}
  torch::Tensor forward(torch::Tensor x) {
    if (!is_training() || p_ == 0.0) return x;
    return x * noise_->element_scale(x, kDropoutLayer, p_);
  }

 private:
  double p_;
  std::shared_ptr<RowNoise> noise_;
};
TORCH_MODULE(NoiseDropout);

}  // namespace

bool is_efficientnet_arch(const std::string& arch) { return find_variant(arch) != nullptr; }

const std::vector<std::string>& efficientnet_archs() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Variant& v : kVariants) out.emplace_back(v.name);
    return out;
  }();
  return names;
}

NetParts build_efficientnet(const NetOptions& options, const std::shared_ptr<RowNoise>& noise) {
  const Variant& v = *find_variant(options.arch);
  auto width = [&](int64_t c) { return make_divisible(static_cast<double>(c) * v.width_mult); };
  auto depth = [&](int64_t n) {
    return static_cast<int64_t>(std::ceil(static_cast<double>(n) * v.depth_mult));
  };

  Chain features;
  features->push_back(conv_norm_act(3, width(kStages[0].in), 3, 2, 1, true));
  int64_t total_blocks = 0;
  for (const Stage& s : kStages) total_blocks += depth(s.layers);
  int64_t block_id = 0;
  for (const Stage& s : kStages) {
    Chain stage;
    for (int64_t i = 0; i < depth(s.layers); ++i) {
      const int64_t in = i == 0 ? width(s.in) : width(s.out);
      const double sd_prob =
          kStochasticDepth * static_cast<double>(block_id) / static_cast<double>(total_blocks);
      stage->push_back(MBConv(s.expand, s.kernel, i == 0 ? s.stride : 1, in, width(s.out), sd_prob,
                              block_id, noise));
      ++block_id;
    }
    features->push_back(stage);
  }
  const int64_t last_in = width(kStages[std::size(kStages) - 1].out);
  const int64_t last_out = 4 * last_in;
  features->push_back(conv_norm_act(last_in, last_out, 1, 1, 1, true));

  nn::Sequential classifier(NoiseDropout(v.dropout, noise));
  if (options.head_hidden == 0) {
    classifier->push_back(nn::Linear(last_out, options.num_classes));
  } else {
    classifier->push_back(nn::Linear(last_out, options.head_hidden));
    classifier->push_back(nn::ReLU());
    classifier->push_back(nn::Linear(options.head_hidden, options.num_classes));
  }

  // torchvision's EfficientNet.__init__: convs kaiming_normal_(fan_out) and zero biases, BN
  // weight 1 / bias 0, Linear uniform(+-1 / sqrt(out_features)) and zero bias, in
  // self.modules() order.
  auto init = [](nn::Module& m) {
    if (auto* conv = dynamic_cast<nn::Conv2dImpl*>(&m)) {
      nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut);
      if (conv->bias.defined()) nn::init::zeros_(conv->bias);
    } else if (auto* bn = dynamic_cast<BatchNormImpl*>(&m)) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    } else if (auto* fc = dynamic_cast<nn::LinearImpl*>(&m)) {
      const double range = 1.0 / std::sqrt(static_cast<double>(fc->weight.size(0)));
      nn::init::uniform_(fc->weight, -range, range);
      nn::init::zeros_(fc->bias);
    }
  };
  features->apply(init);
  classifier->apply(init);

  NetParts parts;
  parts.trunk.push_back(named_part("features", features));
  parts.head = named_part("classifier", classifier);
  parts.feature_dim = last_out;
  return parts;
}

}  // namespace trainer::model
