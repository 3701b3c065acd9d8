#include "trainer/model/onnx_export.h"

#include <cmath>
#include <map>
#include <memory>

#include "trainer/model/batch_norm.h"
#include "trainer/model/onnx/graph.h"
#include "trainer/util/error.h"

namespace trainer::model {

namespace {

namespace nn = torch::nn;
using onnx::Attribute;

[[noreturn]] void not_resnet(const std::string& what) {
  throw Error(ErrorKind::kInternal,
              "ONNX export: the module is not torchvision's layout (" + what + ")");
}

std::vector<float> to_floats(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

std::vector<int64_t> dims_of(const torch::Tensor& t) { return t.sizes().vec(); }

// Walks the module in forward order and writes the nodes; each emit returns its output's name.
class Writer {
 public:
  explicit Writer(NetImpl& net) {
    for (const auto& item : net.named_modules("", /*include_self=*/false)) {
      modules_[item.key()] = item.value();
      if (item.value()->as<nn::Conv2d>()) ++convs_total_;
    }
  }

  bool has(const std::string& name) const { return modules_.count(name) > 0; }

  // conv (no bias) + the BatchNorm after it, folded: w' = w * g / sqrt(var + eps),
  // b' = beta - mean * g / sqrt(var + eps), in double.
  std::string conv_bn(const std::string& input, const std::string& conv_name,
                      const std::string& bn_name, bool relu) {
    auto* conv = module<nn::Conv2dImpl>(conv_name);
    auto* bn = module<BatchNormImpl>(bn_name);
    const auto& o = conv->options;
    if (conv->bias.defined()) not_resnet(conv_name + ": a bias");
    const auto kernel = std::vector<int64_t>(o.kernel_size()->begin(), o.kernel_size()->end());
    const auto stride = std::vector<int64_t>(o.stride()->begin(), o.stride()->end());
    const auto dilation = std::vector<int64_t>(o.dilation()->begin(), o.dilation()->end());
    if (dilation != std::vector<int64_t>{1, 1}) not_resnet(conv_name + ": dilation");
    // torchvision pads every convolution by (kernel - 1) / 2 (7 -> 3, 5 -> 2, 3 -> 1, 1 -> 0).
    const int64_t ph = kernel[0] / 2;
    const int64_t pw = kernel[1] / 2;

    const torch::Tensor w = conv->weight.detach().to(torch::kCPU, torch::kDouble);
    const torch::Tensor scale =
        bn->weight.detach().to(torch::kCPU, torch::kDouble) /
        torch::sqrt(bn->running_var.detach().to(torch::kCPU, torch::kDouble) + bn->eps());
    const torch::Tensor folded_w = w * scale.view({-1, 1, 1, 1});
    const torch::Tensor folded_b =
        bn->bias.detach().to(torch::kCPU, torch::kDouble) -
        bn->running_mean.detach().to(torch::kCPU, torch::kDouble) * scale;
    const std::string wn = conv_name + ".weight";
    const std::string bname = conv_name + ".bias";
    graph_.add_initializer(wn, dims_of(folded_w), to_floats(folded_w));
    graph_.add_initializer(bname, dims_of(folded_b), to_floats(folded_b));
    std::string out = conv_name;
    graph_.add_node("Conv", {input, wn, bname}, {out},
                    {Attribute::list("kernel_shape", kernel), Attribute::list("strides", stride),
                     Attribute::list("pads", {ph, pw, ph, pw}),
                     Attribute::list("dilations", {1, 1}), Attribute::of("group", o.groups())});
    ++convs_written_;
    if (relu) out = this->relu(out, conv_name + ".relu");
    return out;
  }

  std::string relu(const std::string& input, const std::string& out) {
    graph_.add_node("Relu", {input}, {out});
    return out;
  }

  // SiLU as x * Sigmoid(x) (ONNX has no SiLU operator before opset 24).
  std::string silu(const std::string& input, const std::string& out) {
    graph_.add_node("Sigmoid", {input}, {out + ".sigmoid"});
    graph_.add_node("Mul", {input, out + ".sigmoid"}, {out});
    return out;
  }

  // A convolution with its own bias and no BatchNorm (squeeze-and-excitation's 1x1 fc1, fc2).
  std::string conv(const std::string& input, const std::string& conv_name) {
    auto* c = module<nn::Conv2dImpl>(conv_name);
    const auto& o = c->options;
    if (!c->bias.defined()) not_resnet(conv_name + ": no bias");
    const auto kernel = std::vector<int64_t>(o.kernel_size()->begin(), o.kernel_size()->end());
    if (kernel != std::vector<int64_t>{1, 1}) not_resnet(conv_name + ": not 1x1");
    graph_.add_initializer(conv_name + ".weight", dims_of(c->weight), to_floats(c->weight));
    graph_.add_initializer(conv_name + ".bias", dims_of(c->bias), to_floats(c->bias));
    graph_.add_node("Conv", {input, conv_name + ".weight", conv_name + ".bias"}, {conv_name},
                    {Attribute::list("kernel_shape", kernel)});
    ++convs_written_;
    return conv_name;
  }

  // The convolution's stride, input and output channels.
  int64_t stride(const std::string& conv_name) {
    return module<nn::Conv2dImpl>(conv_name)->options.stride()->at(0);
  }
  int64_t in_channels(const std::string& conv_name) {
    return module<nn::Conv2dImpl>(conv_name)->options.in_channels();
  }
  int64_t out_channels(const std::string& conv_name) {
    return module<nn::Conv2dImpl>(conv_name)->options.out_channels();
  }

  // y = x W^T + b (nn::Linear), as Gemm(transB = 1).
  std::string linear(const std::string& input, const std::string& name, const std::string& out) {
    auto* fc = module<nn::LinearImpl>(name);
    graph_.add_initializer(name + ".weight", dims_of(fc->weight), to_floats(fc->weight));
    graph_.add_initializer(name + ".bias", dims_of(fc->bias), to_floats(fc->bias));
    graph_.add_node("Gemm", {input, name + ".weight", name + ".bias"}, {out},
                    {Attribute::real("alpha", 1.0f), Attribute::real("beta", 1.0f),
                     Attribute::of("transB", 1)});
    return out;
  }

  onnx::Graph& graph() { return graph_; }
  void check_complete() const {
    if (convs_written_ != convs_total_) {
      not_resnet("wrote " + std::to_string(convs_written_) + " of its " +
                 std::to_string(convs_total_) + " convolutions");
    }
  }

 private:
  template <typename M>
  M* module(const std::string& name) {
    const auto it = modules_.find(name);
    M* m = it == modules_.end() ? nullptr : it->second->template as<M>();
    if (!m) not_resnet("no " + name);
    return m;
  }

  std::map<std::string, std::shared_ptr<nn::Module>> modules_;
  onnx::Graph graph_;
  int convs_total_ = 0;
  int convs_written_ = 0;
};

// uint8 NHWC -> float NCHW, / 255, (- mean) / std: data::normalize_images's float32 operations
// in its order, so the graph's input to conv1 is bit-for-bit the trainer's.
std::string preprocess(onnx::Graph& g, const OnnxExportOptions& o) {
  g.add_node("Cast", {kOnnxImageInput}, {"image_float"},
             {Attribute::of("to", 1 /* TensorProto.FLOAT */)});
  g.add_node("Transpose", {"image_float"}, {"image_nchw"}, {Attribute::list("perm", {0, 3, 1, 2})});
  g.add_initializer("pixel_max", {1}, {255.0f});
  g.add_node("Div", {"image_nchw", "pixel_max"}, {"image_unit"});
  if (o.mean.empty()) return "image_unit";
  // [3, 1, 1] (broadcast over the channel axis): OpenCV 4.6 refuses [1, 3, 1, 1] constants in
  // Sub and Div, and [] in Div.
  g.add_initializer("mean", {3, 1, 1}, o.mean);
  g.add_initializer("std", {3, 1, 1}, o.std);
  g.add_node("Sub", {"image_unit", "mean"}, {"image_centred"});
  g.add_node("Div", {"image_centred", "std"}, {kOnnxInput});
  return kOnnxInput;
}

// The ResNet family's trunk: conv1, bn1, relu, maxpool, layer1..4.
std::string resnet_trunk(Writer& w, std::string x) {
  onnx::Graph& g = w.graph();
  x = w.conv_bn(x, "conv1", "bn1", /*relu=*/true);
  g.add_node("MaxPool", {x}, {"maxpool"},
             {Attribute::list("kernel_shape", {3, 3}), Attribute::list("strides", {2, 2}),
              Attribute::list("pads", {1, 1, 1, 1})});
  x = "maxpool";
  for (int layer = 1; layer <= 4; ++layer) {
    for (int b = 0; w.has("layer" + std::to_string(layer) + "." + std::to_string(b)); ++b) {
      const std::string p = "layer" + std::to_string(layer) + "." + std::to_string(b) + ".";
      const bool bottleneck = w.has(p + "conv3");
      std::string y = w.conv_bn(x, p + "conv1", p + "bn1", true);
      y = w.conv_bn(y, p + "conv2", p + "bn2", bottleneck);
      if (bottleneck) y = w.conv_bn(y, p + "conv3", p + "bn3", false);
      const std::string identity =
          w.has(p + "downsample") ? w.conv_bn(x, p + "downsample.0", p + "downsample.1", false) : x;
      g.add_node("Add", {y, identity}, {p + "add"});
      x = w.relu(p + "add", p + "out");
    }
  }
  return x;
}

// torchvision's Conv2dNormActivation at `p` (p.0 conv, p.1 BN, p.2 SiLU when present).
std::string conv_norm_act(Writer& w, const std::string& x, const std::string& p) {
  const std::string y = w.conv_bn(x, p + ".0", p + ".1", false);
  return w.has(p + ".2") ? w.silu(y, p + ".2") : y;
}

// EfficientNet's features: the stem, the MBConv stages (expansion, depthwise, squeeze-and-
// excitation, projection; the residual add where stride 1 keeps the width; stochastic depth is
// the identity in eval mode) and the last 1x1 convolution.
std::string efficientnet_trunk(Writer& w, std::string x) {
  onnx::Graph& g = w.graph();
  int stage = 0;
  for (; w.has("features." + std::to_string(stage)); ++stage) {
    const std::string s = "features." + std::to_string(stage);
    if (!w.has(s + ".0.block")) {  // the stem and the last convolution
      x = conv_norm_act(w, x, s);
      continue;
    }
    for (int b = 0; w.has(s + "." + std::to_string(b)); ++b) {
      const std::string p = s + "." + std::to_string(b) + ".block.";
      std::string y = x;
      int64_t stride = 1;
      int last = 0;
      for (int i = 0; w.has(p + std::to_string(i)); ++i) {
        const std::string q = p + std::to_string(i);
        last = i;
        if (w.has(q + ".fc1")) {  // squeeze-and-excitation: y * sigmoid(fc2(silu(fc1(pool(y)))))
          g.add_node("GlobalAveragePool", {y}, {q + ".avgpool"});
          std::string z = w.silu(w.conv(q + ".avgpool", q + ".fc1"), q + ".activation");
          z = w.conv(z, q + ".fc2");
          g.add_node("Sigmoid", {z}, {q + ".scale"});
          g.add_node("Mul", {y, q + ".scale"}, {q + ".out"});
          y = q + ".out";
        } else {
          stride = std::max(stride, w.stride(q + ".0"));
          y = conv_norm_act(w, y, q);
        }
      }
      const std::string first = p + "0.0";
      const std::string projection = p + std::to_string(last) + ".0";
      if (stride == 1 && w.in_channels(first) == w.out_channels(projection)) {
        g.add_node("Add", {y, x}, {p + "add"});
        y = p + "add";
      }
      x = y;
    }
  }
  return x;
}

}  // namespace

std::string export_onnx(NetImpl& net, const OnnxExportOptions& options) {
  if (options.opset < onnx::kMinOpset || options.opset > onnx::kMaxOpset) {
    throw ConfigError("--opset: expected " + std::to_string(onnx::kMinOpset) + " to " +
                      std::to_string(onnx::kMaxOpset) + ", got " + std::to_string(options.opset));
  }
  if (!options.mean.empty() && (options.mean.size() != 3 || options.std.size() != 3)) {
    throw Error(ErrorKind::kInternal, "ONNX export: mean and std need 3 values each");
  }
  torch::NoGradGuard no_grad;
  Writer w(net);
  onnx::Graph& g = w.graph();
  const int64_t s = options.image_size;
  const int64_t classes = net.options().num_classes;
  std::string x;
  if (options.include_preprocessing) {
    g.add_input({kOnnxImageInput,
                 onnx::ElemType::kUint8,
                 {-1, s, s, 3},
                 "RGB pixels, [batch, height, width, 3] uint8, resized to the model's size"});
    x = preprocess(g, options);
  } else {
    g.add_input({kOnnxInput,
                 onnx::ElemType::kFloat,
                 {-1, 3, s, s},
                 "RGB, [batch, 3, height, width] float32, x / 255 then normalised (metadata)"});
    x = kOnnxInput;
  }

  x = net.family() == "efficientnet" ? efficientnet_trunk(w, x) : resnet_trunk(w, x);
  w.check_complete();
  g.add_node("GlobalAveragePool", {x}, {"avgpool"});
  g.add_node("Flatten", {"avgpool"}, {"features"}, {Attribute::of("axis", 1)});
  // The head; EfficientNet's Dropout (classifier.0) is the identity in eval mode.
  const std::string head = net.family() == "efficientnet" ? "classifier" : "fc";
  const int first = net.family() == "efficientnet" ? 1 : 0;
  const std::string hidden = head + "." + std::to_string(first);
  if (w.has(head + "." + std::to_string(first + 2))) {  // the hidden head: Linear, ReLU, Linear
    x = w.linear("features", hidden, hidden + ".out");
    x = w.relu(x, head + "." + std::to_string(first + 1) + ".out");
    w.linear(x, head + "." + std::to_string(first + 2), kOnnxLogits);
  } else {
    w.linear("features", net.family() == "efficientnet" ? hidden : head, kOnnxLogits);
  }
  g.add_node("Softmax", {kOnnxLogits}, {kOnnxProbabilities}, {Attribute::of("axis", 1)});
  g.add_output({kOnnxLogits, onnx::ElemType::kFloat, {-1, classes}, "class scores"});
  g.add_output({kOnnxProbabilities,
                onnx::ElemType::kFloat,
                {-1, classes},
                "softmax of the logits over the classes"});

  onnx::ModelMeta meta;
  meta.producer_name = "trainer";
  meta.producer_version = TRAINER_VERSION;
  meta.graph_name = options.graph_name;
  meta.doc = options.doc;
  meta.model_version = options.model_version;
  meta.properties = options.properties;
  try {
    return g.serialize(options.opset, meta);
  } catch (const onnx::GraphError& e) {
    throw Error(ErrorKind::kInternal, std::string("ONNX export: ") + e.what());
  }
}

}  // namespace trainer::model
