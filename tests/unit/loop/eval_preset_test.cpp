// The evaluation preprocessing in model.json (interpolation, eval_resize, eval_resize_size,
// eval_crop_size): round trip, an older model.json without them, what inference_preprocess
// and the contract make of them; and test-time augmentation (tta_views,
// tta_log_probabilities, evaluate with TTA) on a tiny ResNet.
#include "common/catch.h"

#include <nlohmann/json.hpp>

#include "train_test_util.h"
#include "trainer/data/image.h"
#include "trainer/data/loader.h"
#include "trainer/data/source.h"
#include "trainer/loop/evaluate.h"
#include "trainer/loop/model_dir.h"
#include "trainer/model/net.h"
#include "trainer/synth/synthetic.h"
#include "trainer/util/error.h"

using namespace trainer::train;
using namespace trainer::train::testing;
using trainer::test::Contains;

namespace {

ModelInfo sample_info() {
  ModelInfo info;
  info.arch = "resnet18";
  info.num_classes = 3;
  info.class_names = {"a", "b", "c"};
  info.image_size = 64;
  return info;
}

trainer::model::Net tiny_net() {
  torch::manual_seed(11);
  trainer::model::Net net = trainer::model::make_net({"resnet18", 3, 0});
  torch::NoGradGuard no_grad;
  net->train();
  net->forward(seeded_input({4, 3, 32, 32}, 2));  // BatchNorm statistics that are not trivial
  net->eval();
  return net;
}

}  // namespace

TEST_CASE("model.json records the evaluation preprocessing and reads it back", "[model_dir]") {
  TempDir tmp;
  ModelInfo info = sample_info();
  info.interpolation = "bicubic";
  info.eval_resize = "shorter_side";
  info.eval_resize_size = 0;  // auto: round(56 / 0.875) = 64
  info.eval_crop_size = 56;
  CHECK(info.input_size() == 56);
  const nlohmann::json j = info.to_json();
  CHECK(j.at("interpolation") == "bicubic");
  CHECK(j.at("eval_resize") == "shorter_side");
  CHECK(j.at("eval_resize_size") == 64);  // resolved
  CHECK(j.at("eval_crop_size") == 56);
  CHECK(j.at("image_size") == 64);  // the training crop
  const nlohmann::json& contract = j.at("preprocessing");
  CHECK(contract.at("image_size") == 56);  // the model's input
  CHECK(contract.at("resize_size") == 64);
  CHECK(contract.at("eval_resize") == "shorter_side");
  CHECK(contract.at("interpolation") == "bicubic");
  CHECK_THAT(contract.at("resize").get<std::string>(),
             Contains("shorter side to 64") && Contains("central 56x56 crop") &&
                 Contains("bicubic") && Contains("antialiasing"));

  export_model(tmp / "model", tiny_net(), info);
  const ModelInfo got = read_model_info(tmp / "model" / "model.json");
  CHECK(got.interpolation == "bicubic");
  CHECK(got.eval_resize == "shorter_side");
  CHECK(got.eval_resize_size == 64);
  CHECK(got.eval_crop_size == 56);
  CHECK(got.to_json() == info.to_json());

  const trainer::data::PreprocessOptions p = inference_preprocess(got);
  CHECK_FALSE(p.train);
  CHECK(p.image_size == 64);
  CHECK(p.interpolation == "bicubic");
  CHECK(p.eval_resize == "shorter_side");
  CHECK(p.eval_resize_side() == 64);
  CHECK(p.output_size() == 56);
}

TEST_CASE("a model.json from before the evaluation fields loads as square, bilinear, image_size",
          "[model_dir]") {
  TempDir tmp;
  const ModelInfo info = sample_info();
  export_model(tmp / "model", tiny_net(), info);
  // Today's defaults write the old contract's resize text, word for word.
  nlohmann::json j = nlohmann::json::parse(read_bytes(tmp / "model" / "model.json"));
  CHECK(j.at("preprocessing").at("resize") ==
        "the whole image to 64x64 pixels, bilinear (OpenCV INTER_LINEAR), aspect ratio not kept, "
        "no crop; a JPEG at least twice that size is first decoded at 1/2, 1/4 or 1/8 scale "
        "(libjpeg DCT scaling)");
  CHECK(j.at("eval_crop_size") == 64);
  CHECK(j.at("eval_resize_size") == 0);
  for (const char* key : {"interpolation", "eval_resize", "eval_resize_size", "eval_crop_size"}) {
    j.erase(key);
  }
  write_bytes(tmp / "model" / "model.json", j.dump(2));
  const LoadedModel loaded = load_model_dir(tmp / "model");
  CHECK(loaded.info.interpolation == "bilinear");
  CHECK(loaded.info.eval_resize == "square");
  CHECK(loaded.info.eval_crop_size == 0);
  CHECK(loaded.info.input_size() == 64);
  const trainer::data::PreprocessOptions p = inference_preprocess(loaded.info);
  const trainer::data::PreprocessOptions defaults;
  CHECK(p.output_size() == 64);
  CHECK(p.eval_resize == defaults.eval_resize);
  CHECK(p.interpolation == defaults.interpolation);
  CHECK(p.eval_crop_size == 0);
  CHECK(p.eval_resize_size == 0);

  // Damaged values are this file's fault: DataErrors naming the field.
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"interpolation", "nearest"}, {"eval_resize", "crop"}, {"eval_crop_size", -1}}) {
    nlohmann::json bad = j;
    bad[key] = value;
    write_bytes(tmp / "model" / "model.json", bad.dump(2));
    try {
      read_model_info(tmp / "model" / "model.json");
      FAIL("no DataError for " << key);
    } catch (const trainer::DataError& e) {
      CHECK_THAT(std::string(e.what()), Contains(key));
    }
  }
}

TEST_CASE("tta: parse, views, and the averaged softmax", "[evaluate][tta]") {
  CHECK(parse_tta("none") == Tta::kNone);
  CHECK(parse_tta("flip") == Tta::kFlip);
  CHECK(parse_tta("dihedral") == Tta::kDihedral);
  try {
    parse_tta("bogus");
    FAIL("no UsageError");
  } catch (const trainer::UsageError& e) {
    CHECK_THAT(std::string(e.what()),
               Contains("--tta") && Contains("none|flip|dihedral") && Contains("'bogus'"));
  }

  const torch::Tensor x = seeded_input({2, 3, 32, 32}, 5);
  CHECK(tta_views(x, Tta::kNone).size() == 1);
  const auto flip = tta_views(x, Tta::kFlip);
  REQUIRE(flip.size() == 2);
  CHECK(torch::equal(flip[0], x));
  CHECK(torch::equal(flip[1].select(3, 0), x.select(3, 31)));
  const auto d8 = tta_views(x, Tta::kDihedral);
  REQUIRE(d8.size() == 8);
  for (size_t a = 0; a < d8.size(); ++a) {  // 8 distinct views of a generic input
    for (size_t b = a + 1; b < d8.size(); ++b) CHECK_FALSE(torch::equal(d8[a], d8[b]));
  }
  CHECK_THROWS_AS(tta_views(seeded_input({1, 3, 8, 6}, 1), Tta::kDihedral), trainer::Error);

  trainer::model::Net net = tiny_net();
  torch::NoGradGuard no_grad;
  const ModelSettings settings;
  const torch::Tensor plain = torch::log_softmax(net->forward(x), 1);
  CHECK(torch::equal(tta_log_probabilities(net, x, settings, Tta::kNone), plain));

  // dihedral = the mean of 8 explicit forwards' softmax.
  std::vector<torch::Tensor> views;
  for (int64_t k = 0; k < 4; ++k) views.push_back(torch::rot90(x, k, {2, 3}));
  for (int64_t k = 0; k < 4; ++k) views.push_back(torch::rot90(x.flip({3}), k, {2, 3}));
  torch::Tensor mean = torch::zeros({2, 3});
  for (const auto& v : views) mean += torch::softmax(net->forward(v.contiguous()), 1);
  mean /= 8.0;
  const torch::Tensor got = tta_log_probabilities(net, x, settings, Tta::kDihedral).exp();
  CHECK(torch::allclose(got, mean, 1e-5, 1e-6));
  CHECK(torch::allclose(got.sum(1), torch::ones({2}), 1e-5, 1e-6));
  CHECK_FALSE(torch::allclose(got, plain.exp(), 1e-5, 1e-6));

  // A left-right symmetric input: its mirror is itself, so flip changes nothing.
  const torch::Tensor half = seeded_input({2, 3, 32, 16}, 6);
  const torch::Tensor symmetric = torch::cat({half, half.flip({3})}, 3);
  CHECK(torch::allclose(tta_log_probabilities(net, symmetric, settings, Tta::kFlip).exp(),
                        torch::softmax(net->forward(symmetric), 1), 1e-5, 1e-6));

  // channels_last settings: the same numbers.
  ModelSettings cl;
  cl.channels_last = true;
  trainer::model::Net net_cl = tiny_net();
  place_model(net_cl, cl);
  CHECK(torch::allclose(tta_log_probabilities(net_cl, x.contiguous(at::MemoryFormat::ChannelsLast),
                                              cl, Tta::kDihedral)
                            .exp(),
                        mean, 1e-4, 1e-5));
}

TEST_CASE("evaluate with TTA: none is the plain evaluation, flip uses the averaged softmax",
          "[evaluate][tta]") {
  TempDir tmp;
  const trainer::data::Listing listing = trainer::train::testing::six_images(tmp);
  trainer::data::LoaderOptions options;
  options.preprocess.image_size = 32;
  options.batch_size = 4;
  options.num_workers = 1;
  trainer::model::Net net = tiny_net();

  const auto run = [&](Tta tta) {
    trainer::data::Loader loader(listing.examples, options);
    return evaluate(net, loader, 3, ModelSettings{}, tta);
  };
  const EvalCounts plain = run(Tta::kNone);
  const EvalCounts defaulted = [&] {
    trainer::data::Loader loader(listing.examples, options);
    return evaluate(net, loader, 3, ModelSettings{});
  }();
  CHECK(plain.loss_sum == defaulted.loss_sum);  // bit for bit
  CHECK(plain.confusion == defaulted.confusion);

  // flip by hand: -log of the mean of the two softmaxes at the true label; argmax of it.
  const EvalCounts flipped = run(Tta::kFlip);
  CHECK(flipped.num_examples == 6);
  trainer::data::Loader loader(listing.examples, options);
  loader.start_epoch(0);
  torch::NoGradGuard no_grad;
  double loss_sum = 0;
  std::vector<std::vector<int64_t>> confusion(3, std::vector<int64_t>(3, 0));
  while (auto batch = loader.next()) {
    const torch::Tensor x = trainer::data::normalize_images(
        batch->images, trainer::data::Normalize::kImagenet, /*channels_last=*/false);
    const torch::Tensor p =
        (torch::softmax(net->forward(x), 1) + torch::softmax(net->forward(x.flip({3})), 1)) / 2;
    for (int64_t i = 0; i < p.size(0); ++i) {
      const int64_t t = batch->labels[i].item<int64_t>();
      loss_sum -= std::log(p[i][t].item<double>());
      ++confusion[static_cast<size_t>(t)][static_cast<size_t>(p[i].argmax().item<int64_t>())];
    }
  }
  CHECK(flipped.loss_sum == Approx(loss_sum).epsilon(1e-5));
  CHECK(flipped.confusion == confusion);
}
