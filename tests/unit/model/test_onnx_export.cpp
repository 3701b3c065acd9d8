// model::export_onnx for every depth and both heads: the ONNX checker accepts the file, its
// graph has one Conv per convolution (BatchNorm folded), a dynamic batch, and OpenCV's DNN
// (an independent importer and kernels) computes the module's eval-mode logits from it.
// The graph writer's own refusals (opset range, bad initializers, bytes that are not ONNX).
#include "common/catch.h"

#include <opencv2/dnn.hpp>

#include "trainer/model/onnx/graph.h"
#include "trainer/model/onnx_export.h"
#include "trainer/model/resnet.h"
#include "trainer/util/error.h"

using namespace trainer::model;

namespace {

void perturb_batchnorm(ResNetImpl& net) {
  torch::NoGradGuard no_grad;
  for (auto& item : net.named_buffers()) {
    if (item.key().find("running_mean") != std::string::npos) item.value().uniform_(-0.1, 0.1);
    if (item.key().find("running_var") != std::string::npos) item.value().uniform_(0.5, 1.5);
  }
  for (auto& item : net.named_parameters()) {
    const std::string& k = item.key();
    const bool bn =
        k.find("bn") != std::string::npos || k.find("downsample.1") != std::string::npos;
    if (bn && k.find("weight") != std::string::npos) item.value().uniform_(0.8, 1.2);
    if (bn && k.find("bias") != std::string::npos) item.value().uniform_(-0.1, 0.1);
  }
}

int64_t conv_count(ResNetImpl& net) {
  int64_t n = 0;
  for (const auto& m : net.modules(false)) n += m->as<torch::nn::Conv2d>() != nullptr;
  return n;
}

}  // namespace

TEST_CASE("export_onnx: every depth and both heads, checked, and OpenCV computes the logits",
          "[onnx]") {
  // Every depth of the family, and one ResNeXt (grouped convolutions) and one Wide ResNet; the
  // 101-layer ResNeXt and Wide variants differ from these only in width and depth.
  for (const std::string& arch : supported_archs()) {
    if (arch == "resnext101_32x8d" || arch == "resnext101_64x4d" || arch == "wide_resnet101_2")
      continue;
    for (const int64_t hidden : {int64_t{0}, int64_t{64}}) {
      DYNAMIC_SECTION(arch << " head_hidden " << hidden) {
        torch::manual_seed(5);
        ResNet net = make_resnet({arch, 5, hidden});
        perturb_batchnorm(*net);
        net->eval();
        OnnxExportOptions o;
        o.image_size = 32;
        const std::string bytes = export_onnx(*net, o);

        const onnx::ModelSummary s = onnx::summarize(bytes);
        CHECK(s.opset == 13);
        CHECK(s.ir_version == 7);
        CHECK(s.producer_name == "trainer");
        CHECK(s.op_counts.at("Conv") == conv_count(*net));
        CHECK(s.op_counts.count("BatchNormalization") == 0);
        CHECK(s.op_counts.at("Gemm") == (hidden > 0 ? 2 : 1));
        CHECK(s.op_counts.at("Softmax") == 1);
        REQUIRE(s.inputs.size() == 1);
        CHECK(s.inputs[0].name == "input");
        CHECK(s.inputs[0].dims == std::vector<int64_t>{-1, 3, 32, 32});
        REQUIRE(s.outputs.size() == 2);
        CHECK(s.outputs[0].name == "logits");
        CHECK(s.outputs[0].dims == std::vector<int64_t>{-1, 5});
        CHECK(s.outputs[1].name == "probabilities");
        // BatchNorm folded: every parameter but the BN ones, plus one bias per convolution.
        int64_t expected = 0;
        for (const auto& p : net->named_parameters()) {
          const bool bn = p.key().find("bn") != std::string::npos ||
                          p.key().find("downsample.1") != std::string::npos;
          if (!bn) expected += p.value().numel();
        }
        for (const auto& m : net->modules(false)) {
          if (auto* conv = m->as<torch::nn::Conv2d>()) expected += conv->weight.size(0);
        }
        CHECK(s.parameters == expected);

        const torch::Tensor x = torch::randn({2, 3, 32, 32});
        const torch::Tensor want = net->forward(x);
        cv::dnn::Net cvnet = cv::dnn::readNetFromONNX(bytes.data(), bytes.size());
        std::vector<int> dims{2, 3, 32, 32};
        cvnet.setInput(cv::Mat(4, dims.data(), CV_32F, x.data_ptr<float>()).clone(), "input");
        const cv::Mat got = cvnet.forward("logits");
        REQUIRE(got.total() == 10);
        const torch::Tensor got_t =
            torch::from_blob(const_cast<float*>(got.ptr<float>()), {2, 5}, torch::kFloat);
        const double scale = std::max(1.0, want.abs().max().item<double>());
        const double diff = (got_t - want).abs().max().item<double>();
        INFO("max |OpenCV - LibTorch| logits " << diff << " (largest logit " << scale << ")");
        CHECK(diff <= 1e-4 * scale);
      }
    }
  }
}

TEST_CASE("export_onnx refuses an opset it does not know", "[onnx]") {
  ResNet net = make_resnet({"resnet18", 2, 0});
  OnnxExportOptions o;
  o.image_size = 32;
  for (const int opset : {12, 18}) {
    o.opset = opset;
    CHECK_THROWS_AS(export_onnx(*net, o), trainer::ConfigError);
  }
  o.opset = 17;
  CHECK(onnx::summarize(export_onnx(*net, o)).opset == 17);
}

TEST_CASE("the ONNX graph writer refuses bad initializers, unknown ops and non-ONNX bytes",
          "[onnx]") {
  onnx::Graph g;
  CHECK_THROWS_AS(g.add_initializer("w", {2, 2}, {1, 2, 3}), onnx::GraphError);
  g.add_input({"x", onnx::ElemType::kFloat, {-1, 4}, ""});
  g.add_output({"y", onnx::ElemType::kFloat, {-1, 4}, ""});
  g.add_node("NoSuchOp", {"x"}, {"y"});
  onnx::ModelMeta meta;
  meta.graph_name = "g";
  CHECK_THROWS_AS(g.serialize(13, meta), onnx::GraphError);

  onnx::Graph ok;
  ok.add_input({"x", onnx::ElemType::kFloat, {-1, 4}, ""});
  ok.add_output({"y", onnx::ElemType::kFloat, {-1, 4}, ""});
  ok.add_node("Relu", {"x"}, {"y"});
  meta.properties = {{"k", "v"}};
  const onnx::ModelSummary s = onnx::summarize(ok.serialize(13, meta));
  CHECK(s.properties.at("k") == "v");
  CHECK(s.inputs[0].dims == std::vector<int64_t>{-1, 4});

  CHECK_THROWS_AS(onnx::summarize("not a model"), onnx::GraphError);
}
