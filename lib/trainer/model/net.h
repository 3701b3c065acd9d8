// The image classifiers, torchvision-exact in LibTorch: the ResNet family (resnet18-152,
// ResNeXt, Wide ResNet; model/resnet.cpp) and EfficientNet B0-B4 (model/efficientnet.cpp).
// Children are registered under torchvision's names, in its order, so state dicts are
// interchangeable with torchvision.models.<arch>():
//   ResNet family: conv1, bn1, relu, maxpool, layer1..layer4, avgpool, fc
//   EfficientNet:  features (features.0 ... features.8), avgpool, classifier (classifier.1: the
//                  Linear after the Dropout at classifier.0)
// A Net is a trunk (modules in forward order), a global average pool, a flatten and a head (the
// classifier, fc or classifier). Initialisation follows torchvision's classes. The layers that
// draw random numbers in training (EfficientNet's stochastic depth and dropout) take them per
// example from seeds the trainer sets (set_row_seeds), so a result does not depend on how a
// batch is split into replicas and micro-batches; without seeds they draw from torch's default
// generator, as torchvision does. A module is not thread-safe; the factory is.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/model/batch_norm.h"
#include "trainer/model/row_noise.h"

namespace trainer::model {

struct NetOptions {
  std::string arch = "resnet50";  // one of supported_archs()
  int64_t num_classes = 1000;
  // 0: the classifier is torchvision's (fc = Linear; classifier = Dropout, Linear); N: a hidden
  // layer, Linear(features, N), ReLU, Linear(N, classes): fc.0 / fc.2 (ResNet family) or
  // classifier.1 / classifier.3 after the same Dropout (EfficientNet).
  int64_t head_hidden = 0;
};

// One child of a Net, named as torchvision names it, and its forward.
struct NamedPart {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(torch::Tensor)> forward;
};

// What a family's builder hands the Net: the trunk in forward order, the head, and the width
// between them. Built and initialised as torchvision does (the Net only registers them).
struct NetParts {
  std::vector<NamedPart> trunk;
  NamedPart head;
  int64_t feature_dim = 0;
};

class NetImpl : public torch::nn::Module {
 public:
  explicit NetImpl(const NetOptions& options);
  torch::Tensor forward(torch::Tensor x);  // [N,3,H,W] float -> [N, num_classes] logits

  const NetOptions& options() const { return options_; }
  // Number of features entering the classifier (512 for resnet18/34, 2048 for resnet50,
  // 1280 for efficientnet_b0, ...).
  int64_t feature_dim() const { return feature_dim_; }
  // "resnet" (the ResNet family) or "efficientnet".
  const std::string& family() const { return family_; }

  // One seed per row of the next training-mode forwards (the trainer: per example, a function
  // of the data seed, the epoch and the example); {} = torch's default generator.
  void set_row_seeds(std::vector<uint64_t> seeds) { noise_->set_rows(std::move(seeds)); }

 private:
  NetOptions options_;
  std::string family_;
  int64_t feature_dim_ = 0;
  std::shared_ptr<RowNoise> noise_;
  std::vector<std::function<torch::Tensor(torch::Tensor)>> trunk_;
  torch::nn::AdaptiveAvgPool2d avgpool_{nullptr};
  std::function<torch::Tensor(torch::Tensor)> head_;
};
TORCH_MODULE(Net);

// The supported arch names, in order (the ResNet family, then EfficientNet).
const std::vector<std::string>& supported_archs();

// Builds a freshly initialised model (from torch's default generator: torch::manual_seed makes
// it reproducible); throws ConfigError for an unknown arch or a bad size. The constructor
// validates the same way.
Net make_net(const NetOptions& options);

// Total number of parameter elements (trainable or not).
int64_t count_parameters(const torch::nn::Module& module);

// True for parameter/buffer names of the classifier (`fc`, `fc.*`, `classifier`,
// `classifier.*`).
bool is_classifier_key(const std::string& name);

// Puts every BatchNorm layer in eval mode (frozen statistics) while the rest trains. Call it
// after module.train(), which switches every layer back to training mode.
void set_batchnorm_eval(torch::nn::Module& module);

// freeze_backbone: requires_grad(false) on every parameter that is not the classifier's (the
// ResNet family: all but fc; EfficientNet: all of `features`).
void freeze_backbone(torch::nn::Module& module);

// The families' builders (model/resnet.cpp, model/efficientnet.cpp), for an arch of theirs and
// validated options. `noise` feeds the layers that draw in training.
bool is_resnet_arch(const std::string& arch);
bool is_efficientnet_arch(const std::string& arch);
NetParts build_resnet(const NetOptions& options);
NetParts build_efficientnet(const NetOptions& options, const std::shared_ptr<RowNoise>& noise);
const std::vector<std::string>& resnet_archs();
const std::vector<std::string>& efficientnet_archs();

}  // namespace trainer::model
