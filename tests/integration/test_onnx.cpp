// `trainer export --format onnx` checked by an independent runtime: OpenCV's DNN module runs
// the file on real photos (../shared/realdata's hymenoptera images where present, else
// generated JPEGs) and must agree with `trainer predict` (max |probability difference| <= 1e-4)
// for resnet18 and resnet50, with the plain fc and with the hidden head, at batch 1 and 8.
#include "common/catch.h"

#include <cstdio>

#include "harness.h"
#include "onnx_check.h"
#include "trainer/loop/model_dir.h"
#include "trainer/model/net.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

const fs::path kPhotos = fs::path(TRAINER_SOURCE_DIR) / ".." / "shared" / "realdata" /
                         "zhangtao7750-syn" / "hymenoptera_data";

// Eight images: real photos (progressive JPEGs, a name with a space, a .jpeg, 193x130 to 800x533)
// where ../shared/realdata exists, else generated ones.
std::vector<std::string> test_images(const TempDir& dir) {
  std::vector<std::string> out;
  if (fs::is_directory(kPhotos)) {
    for (const char* f : {"val/ants/10308379_1b6c72e180.jpg", "val/ants/1053149811_f62a3410d3.jpg",
                          "val/ants/1073564163_225a64f170.jpg",
                          "val/bees/1032546534_06907fe3b3.jpg", "val/bees/10870992_eebeeb3a12.jpg",
                          "val/bees/6a00d8341c630a53ef00e553d0beb18834-800wi.jpg",
                          "train/ants/ant photos.jpg", "train/ants/formica.jpeg"}) {
      out.push_back(fs::canonical(kPhotos / f).string());
    }
    return out;
  }
  WARN("real photos skipped: ../shared/realdata not found; using generated JPEGs");
  make_dataset(dir.path(), "gen", 4, 96, 2);
  for (const auto& cls : {"cbb", "cbsd"}) {
    for (const auto& e : fs::directory_iterator(dir / "gen" / "train" / cls)) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  out.resize(8);
  return out;
}

// A model directory as `trainer train` writes it, for a model with BatchNorm statistics and
// affine parameters away from their initial values (so that folding them is tested), and the
// classifier scaled so the logits on these images span a few units (so the probabilities are
// not saturated at 0 and 1).
void write_model_dir(const fs::path& dir, const std::string& arch, int64_t hidden, int size,
                     const torch::Tensor& images) {
  torch::manual_seed(11);
  trainer::model::Net net = trainer::model::make_net({arch, 3, hidden});
  torch::NoGradGuard no_grad;
  for (auto& item : net->named_buffers()) {
    if (item.key().find("running_mean") != std::string::npos) item.value().uniform_(-0.1, 0.1);
    if (item.key().find("running_var") != std::string::npos) item.value().uniform_(0.5, 1.5);
  }
  for (auto& item : net->named_parameters()) {
    const std::string& k = item.key();
    if (k.rfind("fc", 0) == 0) continue;
    if (k.find("bn") != std::string::npos || k.find("downsample.1") != std::string::npos) {
      if (k.find("weight") != std::string::npos) item.value().uniform_(0.8, 1.2);
      if (k.find("bias") != std::string::npos) item.value().uniform_(-0.1, 0.1);
    }
  }
  net->eval();
  const torch::Tensor x =
      trainer::data::normalize_images(images, trainer::data::Normalize::kImagenet, false);
  const double spread = net->forward(x).abs().max().item<double>();
  auto last = net->named_parameters();
  const std::string w = hidden > 0 ? "fc.2.weight" : "fc.weight";
  const std::string b = hidden > 0 ? "fc.2.bias" : "fc.bias";
  last[w].mul_(3.0 / std::max(spread, 1e-6));
  last[b].mul_(3.0 / std::max(spread, 1e-6));

  trainer::train::ModelInfo info;
  info.arch = arch;
  info.num_classes = 3;
  info.head_hidden = hidden;
  info.class_names = {"ants", "bees", "wasps"};
  info.image_size = size;
  info.normalize = "imagenet";
  info.batch_size = 8;
  trainer::train::export_model(dir, net, info);
}

}  // namespace

TEST_CASE("ONNX export: OpenCV's DNN agrees with trainer predict within 1e-4", "[onnx]") {
  TempDir dir("onnx");
  const std::vector<std::string> images = test_images(dir);
  std::string args;
  for (const auto& p : images) args += " " + quote(p);

  struct Case {
    const char* arch;
    int64_t hidden;
    int size;
  };
  for (const Case c : {Case{"resnet18", 0, 64}, Case{"resnet18", 1016, 64},
                       Case{"resnet50", 0, 224}, Case{"resnet50", 256, 64}}) {
    DYNAMIC_SECTION(c.arch << " head_hidden " << c.hidden << " at " << c.size << " px") {
      const torch::Tensor pixels = decoded_images(images, c.size);
      write_model_dir(dir / "model", c.arch, c.hidden, c.size, pixels);
      const Result exported =
          run_trainer(dir.path(), "export --model model --format onnx --out model.onnx");
      INFO(exported.err);
      REQUIRE(exported.code == 0);
      const auto summary = nlohmann::json::parse(exported.out);
      CHECK(summary["opset"] == 13);
      CHECK(summary["inputs"][0]["name"] == "input");
      CHECK(summary["inputs"][0]["shape"] == nlohmann::json::array({"batch", 3, c.size, c.size}));
      CHECK(summary["outputs"][0]["name"] == "logits");
      CHECK(summary["outputs"][1]["name"] == "probabilities");
      CHECK(summary["ops"].count("BatchNormalization") == 0);  // folded into the convolutions
      CHECK(summary["bytes"] == fs::file_size(dir / "model.onnx"));

      double worst = 0;
      for (const int64_t batch : {1, 8}) {
        const Result pred = run_trainer(
            dir.path(), "predict --model model --batch-size " + std::to_string(batch) + args);
        INFO(pred.err);
        REQUIRE(pred.code == 0);
        const auto by_predict = predicted(pred.out);
        const torch::Tensor by_opencv =
            opencv_probabilities((dir / "model.onnx").string(), pixels, batch, "imagenet", false);
        const double diff = max_difference(by_opencv, images, by_predict);
        INFO("batch " << batch << ": max |OpenCV - predict| = " << diff);
        CHECK(diff <= 1e-4);
        worst = std::max(worst, diff);
      }
      std::fprintf(stderr, "onnx parity: %s head_hidden %lld %d px: %zu bytes, max |dp| %.3g\n",
                   c.arch, static_cast<long long>(c.hidden), c.size,
                   static_cast<size_t>(fs::file_size(dir / "model.onnx")), worst);

      if (c.size == 64 && c.hidden == 0 && std::string(c.arch) == "resnet18") {
        // --include-preprocessing: uint8 NHWC RGB in, the normalisation inside the graph.
        const Result pre = run_trainer(
            dir.path(), "export --model model --out pre.onnx --include-preprocessing --opset 17");
        INFO(pre.err);
        REQUIRE(pre.code == 0);
        const auto s = nlohmann::json::parse(pre.out);
        CHECK(s["opset"] == 17);
        CHECK(s["inputs"][0]["name"] == "image");
        CHECK(s["inputs"][0]["dtype"] == "uint8");
        CHECK(s["inputs"][0]["shape"] == nlohmann::json::array({"batch", 64, 64, 3}));
        const Result pred = run_trainer(dir.path(), "predict --model model" + args);
        REQUIRE(pred.code == 0);
        const torch::Tensor by_opencv =
            opencv_probabilities((dir / "pre.onnx").string(), pixels, 8, "imagenet", true);
        CHECK(max_difference(by_opencv, images, predicted(pred.out)) <= 1e-4);
      }
    }
  }
}

TEST_CASE("ONNX export refuses a damaged model (exit 3) and an existing --out (exit 2)", "[onnx]") {
  TempDir dir("onnx-bad");
  torch::manual_seed(1);
  trainer::train::ModelInfo info;
  info.arch = "resnet18";
  info.num_classes = 2;
  info.class_names = {"a", "b"};
  info.image_size = 32;
  trainer::train::export_model(dir / "model", trainer::model::make_net({"resnet18", 2, 0}), info);
  const std::string weights = slurp(dir / "model" / "model.safetensors");
  const auto refused_as_damaged = [&](const std::string& bytes) {
    write_text(dir / "model" / "model.safetensors", bytes);
    const Result damaged = run_trainer(dir.path(), "export --model model --out new.onnx");
    CHECK(damaged.code == 3);
    CHECK_THAT(damaged.err, Contains("model.safetensors"));
    CHECK_FALSE(fs::exists(dir / "new.onnx"));
  };
  SECTION("an existing --out is kept unless --overwrite") {
    write_text(dir / "taken.onnx", "keep me");
    const Result taken = run_trainer(dir.path(), "export --model model --out taken.onnx");
    CHECK(taken.code == 2);
    CHECK_THAT(taken.err, Contains("taken.onnx") && Contains("--overwrite"));
    CHECK(slurp(dir / "taken.onnx") == "keep me");
    CHECK(run_trainer(dir.path(), "export --model model --out taken.onnx --overwrite").code == 0);
    CHECK(fs::file_size(dir / "taken.onnx") > 1000000);
  }
  SECTION("truncated") { refused_as_damaged(weights.substr(0, weights.size() / 2)); }
  SECTION("a corrupt header") {
    std::string bad = weights;
    for (size_t i = 8; i < 40; ++i) bad[i] = '#';
    refused_as_damaged(bad);
  }
}
