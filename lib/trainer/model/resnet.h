// torchvision-exact ResNet family (v1.5: stride in the 3x3 conv of Bottleneck) in LibTorch.
// Children are registered under torchvision's names (conv1, bn1, layer1.0.conv1,
// layer1.0.downsample.0, ..., fc) so state dicts are interchangeable with
// torchvision.models.resnetXX(). Initialisation follows torchvision (kaiming_normal_ fan_out for
// convs, BN weight 1 / bias 0, nn.Linear defaults). A module is not thread-safe; the factory is.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "trainer/model/batch_norm.h"

namespace trainer::model {

struct ResNetOptions {
  std::string arch = "resnet50";  // resnet18 | resnet34 | resnet50 | resnet101 | resnet152
  int64_t num_classes = 1000;
  int64_t head_hidden = 0;  // 0: fc = Linear(features, classes); N: fc = Sequential(
                            //    Linear(features, N), ReLU, Linear(N, classes)) (fc.0, fc.2)
};

class ResNetImpl : public torch::nn::Module {
 public:
  explicit ResNetImpl(const ResNetOptions& options);
  torch::Tensor forward(torch::Tensor x);  // [N,3,H,W] float -> [N, num_classes] logits

  const ResNetOptions& options() const { return options_; }
  // Number of features entering the classifier (512 for 18/34, 2048 for 50/101/152).
  int64_t feature_dim() const { return feature_dim_; }

 private:
  ResNetOptions options_;
  int64_t feature_dim_ = 0;
  // Registered in torchvision's order and under its names (the state-dict order follows).
  torch::nn::Conv2d conv1_{nullptr};
  BatchNorm bn1_{nullptr};
  torch::nn::ReLU relu_{nullptr};
  torch::nn::MaxPool2d maxpool_{nullptr};
  torch::nn::Sequential layer1_{nullptr}, layer2_{nullptr}, layer3_{nullptr}, layer4_{nullptr};
  torch::nn::AdaptiveAvgPool2d avgpool_{nullptr};
  // "fc": a Linear when head_hidden == 0 (fc_linear_), else Sequential(Linear, ReLU, Linear).
  torch::nn::Linear fc_linear_{nullptr};
  torch::nn::Sequential fc_head_{nullptr};
};
TORCH_MODULE(ResNet);

// The supported arch names, in order.
const std::vector<std::string>& supported_archs();

// Builds a freshly initialised model (from torch's default generator: torch::manual_seed makes
// it reproducible); throws ConfigError for an unknown arch or a bad size. The constructor
// validates the same way.
ResNet make_resnet(const ResNetOptions& options);

// Total number of parameter elements (trainable or not).
int64_t count_parameters(const torch::nn::Module& module);

// True for parameter/buffer names of the classifier (`fc`, `fc.*`).
bool is_classifier_key(const std::string& name);

// Puts every BatchNorm layer in eval mode (frozen statistics) while the rest trains. Call it
// after module.train(), which switches every layer back to training mode.
void set_batchnorm_eval(torch::nn::Module& module);

// freeze_backbone: requires_grad(false) on every parameter that is not the classifier's.
void freeze_backbone(torch::nn::Module& module);

}  // namespace trainer::model
