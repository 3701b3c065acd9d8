#include "trainer/model/net.h"

#include "trainer/util/error.h"

namespace trainer::model {

namespace nn = torch::nn;

namespace {

void validate(const NetOptions& options) {
  if (!is_resnet_arch(options.arch) && !is_efficientnet_arch(options.arch)) {
    std::string names;
    for (const std::string& name : supported_archs()) names += (names.empty() ? "" : "|") + name;
    throw ConfigError("model.arch: expected one of " + names + ", got '" + options.arch + "'");
  }
  if (options.num_classes < 1) {
    throw ConfigError("model.num_classes: expected >= 1, got " +
                      std::to_string(options.num_classes));
  }
  if (options.head_hidden < 0) {
    throw ConfigError("model.head_hidden: expected >= 0 (0: torchvision's classifier), got " +
                      std::to_string(options.head_hidden));
  }
}

}  // namespace

NetImpl::NetImpl(const NetOptions& options)
    : options_(options), noise_(std::make_shared<RowNoise>()) {
  validate(options_);
  const bool efficientnet = is_efficientnet_arch(options_.arch);
  family_ = efficientnet ? "efficientnet" : "resnet";
  NetParts parts = efficientnet ? build_efficientnet(options_, noise_) : build_resnet(options_);
  feature_dim_ = parts.feature_dim;
  for (NamedPart& p : parts.trunk) {
    register_module(p.name, p.module);
    trunk_.push_back(std::move(p.forward));
  }
  avgpool_ = register_module("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)));
  register_module(parts.head.name, parts.head.module);
  head_ = std::move(parts.head.forward);
}

torch::Tensor NetImpl::forward(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) == 3, options_.arch, ".forward: expected [N,3,H,W], got ",
              x.sizes());
  for (const auto& part : trunk_) x = part(x);
  x = torch::flatten(avgpool_(x), 1);
  return head_(x);
}

const std::vector<std::string>& supported_archs() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out = resnet_archs();
    for (const std::string& name : efficientnet_archs()) out.push_back(name);
    return out;
  }();
  return names;
}

Net make_net(const NetOptions& options) {
  validate(options);
  return Net(options);
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const torch::Tensor& p : module.parameters()) total += p.numel();
  return total;
}

bool is_classifier_key(const std::string& name) {
  for (const char* head : {"fc", "classifier"}) {
    const std::string h = head;
    if (name == h || name.rfind(h + ".", 0) == 0) return true;
  }
  return false;
}

void set_batchnorm_eval(torch::nn::Module& module) {
  module.apply([](nn::Module& m) {
    if (dynamic_cast<BatchNormImpl*>(&m) || dynamic_cast<nn::BatchNorm1dImpl*>(&m) ||
        dynamic_cast<nn::BatchNorm2dImpl*>(&m) || dynamic_cast<nn::BatchNorm3dImpl*>(&m)) {
      m.eval();
    }
  });
}

void freeze_backbone(torch::nn::Module& module) {
  for (auto& item : module.named_parameters()) {
    if (!is_classifier_key(item.key())) item.value().set_requires_grad(false);
  }
}

}  // namespace trainer::model
