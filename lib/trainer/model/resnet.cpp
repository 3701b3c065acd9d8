#include "trainer/model/max_pool.h"
#include "trainer/model/named_part.h"
#include "trainer/model/net.h"

#include <algorithm>
#include <cmath>

#include "trainer/util/error.h"

namespace trainer::model {

namespace nn = torch::nn;

namespace {

constexpr double kBnEps = 1e-5;
constexpr double kBnMomentum = 0.1;

nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride, int64_t groups = 1) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).groups(groups).bias(false));
}

nn::Conv2d conv1x1(int64_t in, int64_t out, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

BatchNorm batch_norm(int64_t features) { return BatchNorm(features, kBnEps, kBnMomentum); }

// torchvision.models.resnet.BasicBlock (expansion 1; groups 1 and width 64 only, as there).
class BasicBlockImpl : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;

  BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride, nn::Sequential downsample,
                 int64_t /*groups*/, int64_t /*base_width*/)
      : conv1_(register_module("conv1", conv3x3(inplanes, planes, stride))),
        bn1_(register_module("bn1", batch_norm(planes))),
        relu_(register_module("relu", nn::ReLU(nn::ReLUOptions(true)))),
        conv2_(register_module("conv2", conv3x3(planes, planes, 1))),
        bn2_(register_module("bn2", batch_norm(planes))) {
    if (downsample) downsample_ = register_module("downsample", downsample);
  }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor identity = downsample_ ? downsample_->forward(x) : x;
    torch::Tensor out = bn1_->forward_relu(conv1_(x));
    // bn2, `out += identity` and relu as one pass (relu stays registered, as in torchvision).
    return bn2_->forward_add_relu(conv2_(out), identity);
  }

 private:
  nn::Conv2d conv1_;
  BatchNorm bn1_;
  nn::ReLU relu_;
  nn::Conv2d conv2_;
  BatchNorm bn2_;
  nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(BasicBlock);

// torchvision.models.resnet.Bottleneck (expansion 4, ResNet v1.5: the stride sits on conv2).
// ResNeXt and Wide ResNet are this block with `groups` and `base_width` (torchvision's
// width_per_group): the inner width is int(planes * base_width / 64) * groups, and conv2 is a
// grouped convolution.
class BottleneckImpl : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;

  BottleneckImpl(int64_t inplanes, int64_t planes, int64_t stride, nn::Sequential downsample,
                 int64_t groups, int64_t base_width)
      : width_(static_cast<int64_t>(static_cast<double>(planes) *
                                    (static_cast<double>(base_width) / 64.0)) *
               groups),
        conv1_(register_module("conv1", conv1x1(inplanes, width_, 1))),
        bn1_(register_module("bn1", batch_norm(width_))),
        conv2_(register_module("conv2", conv3x3(width_, width_, stride, groups))),
        bn2_(register_module("bn2", batch_norm(width_))),
        conv3_(register_module("conv3", conv1x1(width_, planes * kExpansion, 1))),
        bn3_(register_module("bn3", batch_norm(planes * kExpansion))),
        relu_(register_module("relu", nn::ReLU(nn::ReLUOptions(true)))) {
    if (downsample) downsample_ = register_module("downsample", downsample);
  }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor identity = downsample_ ? downsample_->forward(x) : x;
    torch::Tensor out = bn1_->forward_relu(conv1_(x));
    out = bn2_->forward_relu(conv2_(out));
    // bn3, `out += identity` and relu as one pass (relu stays registered, as in torchvision).
    return bn3_->forward_add_relu(conv3_(out), identity);
  }

 private:
  int64_t width_;
  nn::Conv2d conv1_;
  BatchNorm bn1_;
  nn::Conv2d conv2_;
  BatchNorm bn2_;
  nn::Conv2d conv3_;
  BatchNorm bn3_;
  nn::ReLU relu_;
  nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(Bottleneck);

struct ArchSpec {
  const char* name;
  bool bottleneck;
  int64_t blocks[4];
  int64_t groups = 1;       // torchvision's groups (ResNeXt: 32 or 64)
  int64_t base_width = 64;  // torchvision's width_per_group (ResNeXt: 4 or 8; Wide: 128)
};

// torchvision.models' ResNet family, with its builders' groups and width_per_group.
constexpr ArchSpec kArchs[] = {
    {"resnet18", false, {2, 2, 2, 2}},
    {"resnet34", false, {3, 4, 6, 3}},
    {"resnet50", true, {3, 4, 6, 3}},
    {"resnet101", true, {3, 4, 23, 3}},
    {"resnet152", true, {3, 8, 36, 3}},
    {"resnext50_32x4d", true, {3, 4, 6, 3}, 32, 4},
    {"resnext101_32x8d", true, {3, 4, 23, 3}, 32, 8},
    {"resnext101_64x4d", true, {3, 4, 23, 3}, 64, 4},
    {"wide_resnet50_2", true, {3, 4, 6, 3}, 1, 128},
    {"wide_resnet101_2", true, {3, 4, 23, 3}, 1, 128},
};

const ArchSpec* find_arch(const std::string& arch) {
  for (const ArchSpec& spec : kArchs) {
    if (arch == spec.name) return &spec;
  }
  return nullptr;
}

// torchvision's ResNet._make_layer; `inplanes` is updated to the layer's output width.
template <typename Block>
nn::Sequential make_layer(int64_t& inplanes, int64_t planes, int64_t blocks, int64_t stride,
                          const ArchSpec& arch) {
  nn::Sequential downsample{nullptr};
  if (stride != 1 || inplanes != planes * Block::Impl::kExpansion) {
    downsample = nn::Sequential(conv1x1(inplanes, planes * Block::Impl::kExpansion, stride),
                                batch_norm(planes * Block::Impl::kExpansion));
  }
  nn::Sequential layer;
  layer->push_back(Block(inplanes, planes, stride, downsample, arch.groups, arch.base_width));
  inplanes = planes * Block::Impl::kExpansion;
  for (int64_t i = 1; i < blocks; ++i) {
    layer->push_back(
        Block(inplanes, planes, 1, nn::Sequential{nullptr}, arch.groups, arch.base_width));
  }
  return layer;
}

}  // namespace

bool is_resnet_arch(const std::string& arch) { return find_arch(arch) != nullptr; }

const std::vector<std::string>& resnet_archs() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ArchSpec& spec : kArchs) out.emplace_back(spec.name);
    return out;
  }();
  return names;
}

NetParts build_resnet(const NetOptions& options) {
  const ArchSpec& spec = *find_arch(options.arch);
  NetParts parts;
  int64_t inplanes = 64;
  parts.trunk.push_back(named_part(
      "conv1", nn::Conv2d(nn::Conv2dOptions(3, inplanes, 7).stride(2).padding(3).bias(false))));
  // bn1 and relu run as one (BatchNormImpl::forward_relu); relu stays registered, as in
  // torchvision, with nothing left to do.
  BatchNorm stem_bn = batch_norm(inplanes);
  parts.trunk.push_back({"bn1", stem_bn.ptr(),
                         [stem_bn](torch::Tensor x) mutable { return stem_bn->forward_relu(x); }});
  parts.trunk.push_back(
      {"relu", nn::ReLU(nn::ReLUOptions(true)).ptr(), [](torch::Tensor x) { return x; }});
  // torchvision's MaxPool2d(3, 2, 1), registered as there; its forward is the own kernel.
  parts.trunk.push_back({"maxpool",
                         nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)).ptr(),
                         [](torch::Tensor x) { return max_pool_3x3_s2(x); }});
  const int64_t planes[4] = {64, 128, 256, 512};
  for (int i = 0; i < 4; ++i) {
    const int64_t stride = i == 0 ? 1 : 2;
    nn::Sequential layer =
        spec.bottleneck ? make_layer<Bottleneck>(inplanes, planes[i], spec.blocks[i], stride, spec)
                        : make_layer<BasicBlock>(inplanes, planes[i], spec.blocks[i], stride, spec);
    parts.trunk.push_back(named_part("layer" + std::to_string(i + 1), layer));
  }
  parts.feature_dim = inplanes;
  if (options.head_hidden == 0) {
    parts.head = named_part("fc", nn::Linear(parts.feature_dim, options.num_classes));
  } else {
    parts.head = named_part(
        "fc", nn::Sequential(nn::Linear(parts.feature_dim, options.head_hidden), nn::ReLU(),
                             nn::Linear(options.head_hidden, options.num_classes)));
  }

  // As torchvision: convs kaiming_normal_(fan_out, relu), BN weight 1 / bias 0, Linear keeps
  // its nn.Linear default (done by its constructor). Module order follows self.modules().
  for (NamedPart& p : parts.trunk) {
    p.module->apply([](nn::Module& module) {
      if (auto* conv = dynamic_cast<nn::Conv2dImpl*>(&module)) {
        nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      } else if (auto* bn = dynamic_cast<BatchNormImpl*>(&module)) {
        nn::init::ones_(bn->weight);
        nn::init::zeros_(bn->bias);
      }
    });
  }
  return parts;
}

}  // namespace trainer::model
