// The training augmentation (data/augment.h) and its place in ImagePipeline: bounds of what is
// drawn, determinism per seed, bit-identity with every new option off, the cache invariant
// (augment(decode_resized(x)) == decode(x) without RandomResizedCrop), exact flips and rotations
// by 90 degrees, the erasing fill, the drawn-parameter record and the option errors.
// Parity with torchvision itself: augment_parity_test.cpp.
#include "common/catch.h"

#include <opencv2/imgproc.hpp>

#include <nlohmann/json.hpp>

#include <set>

#include "fixtures.h"
#include "trainer/data/augment.h"
#include "trainer/data/image.h"
#include "trainer/data/transforms.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::data;
using namespace trainer::data::augment;
using trainer::test::Contains;

namespace {

constexpr int kSize = 64;

std::string jpeg_bytes() { return testing::encode(testing::pattern_image(120, 90, 3), ".jpg"); }

PreprocessOptions train_options() {
  PreprocessOptions o;
  o.image_size = kSize;
  o.train = true;
  o.horizontal_flip = true;
  return o;
}

PreprocessOptions everything_on() {
  PreprocessOptions o = train_options();
  o.vertical_flip = true;
  o.rotate90 = true;
  o.rotate_degrees = 15;
  o.color_jitter = {0.4, 0.4, 0.4, 0.1};
  o.policy = "trivial_augment_wide";
  o.random_erasing = 0.5;
  return o;
}

bool same(const torch::Tensor& a, const torch::Tensor& b) { return torch::equal(a, b); }

std::string config_error(const PreprocessOptions& o) {
  try {
    ImagePipeline pipeline(o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

// A textured image that no flip or rotation maps onto itself.
cv::Mat asymmetric(int w, int h) {
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      m.at<cv::Vec3b>(y, x) =
          cv::Vec3b(static_cast<uint8_t>(x * 3 + y), static_cast<uint8_t>(y * 5),
                    static_cast<uint8_t>((x * y) % 251));
    }
  }
  return m;
}

bool mat_equal(const cv::Mat& a, const cv::Mat& b) {
  return a.size() == b.size() && a.type() == b.type() && cv::norm(a, b, cv::NORM_INF) == 0;
}

}  // namespace

TEST_CASE("with every new option off the pipeline gives yesterday's pixels", "[data][augment]") {
  const std::string bytes = jpeg_bytes();
  for (const bool crop : {false, true}) {
    PreprocessOptions o = train_options();
    o.random_resized_crop = crop;
    const ImagePipeline pipeline(o);
    for (uint64_t seed = 0; seed < 8; ++seed) {
      // The pipeline as it was: RandomResizedCrop or Resize, then HorizontalFlip, nothing else.
      cv::Mat image =
          crop ? transforms::decode_bgr(bytes, "x")
               : transforms::decode_bgr(bytes, "x", transforms::jpeg_reduction_for(bytes, kSize));
      Rng rng(seed);
      image = crop ? transforms::RandomResizedCrop(kSize, o.crop_scale_min)(image, rng)
                   : transforms::Resize(kSize)(image);
      image = transforms::HorizontalFlip(0.5)(image, rng);
      const torch::Tensor expected = transforms::to_tensor(image);
      CHECK(same(pipeline.decode(bytes, "x", seed), expected));
      const torch::Tensor cached = pipeline.augment(pipeline.decode_resized(bytes, "x"), seed);
      if (!crop) CHECK(same(cached, expected));
    }
  }
}

TEST_CASE("augmentation is a function of the seed", "[data][augment]") {
  const std::string bytes = jpeg_bytes();
  for (const std::string policy :
       {"trivial_augment_wide", "rand_augment", "auto_augment", "augmix"}) {
    INFO(policy);
    PreprocessOptions o = everything_on();
    o.policy = policy;
    const ImagePipeline pipeline(o);
    std::set<std::string> distinct;
    for (uint64_t seed = 0; seed < 6; ++seed) {
      const torch::Tensor a = pipeline.decode(bytes, "x", seed);
      const torch::Tensor b = pipeline.decode(bytes, "x", seed);
      CHECK(same(a, b));
      CHECK(a.sizes() == torch::IntArrayRef({kSize, kSize, 3}));
      distinct.insert(std::string(reinterpret_cast<const char*>(a.data_ptr<uint8_t>()),
                                  static_cast<size_t>(a.numel())));
    }
    CHECK(distinct.size() == 6);  // different seeds, different images
  }
}

TEST_CASE("the cache path equals the decode path without RandomResizedCrop", "[data][augment]") {
  const std::string bytes = jpeg_bytes();
  for (const std::string policy :
       {"none", "trivial_augment_wide", "rand_augment", "auto_augment", "augmix"}) {
    INFO(policy);
    PreprocessOptions o = everything_on();
    o.policy = policy;
    o.random_erasing = 1.0;
    const ImagePipeline pipeline(o);
    const torch::Tensor resized = pipeline.decode_resized(bytes, "x");
    const torch::Tensor before = resized.clone();
    for (uint64_t seed = 0; seed < 10; ++seed) {
      nlohmann::json from_decode, from_cache;
      const torch::Tensor a = pipeline.decode(bytes, "x", seed, &from_decode);
      const torch::Tensor b = pipeline.augment(resized, seed, &from_cache);
      CHECK(same(a, b));
      CHECK(from_decode == from_cache);
    }
    CHECK(same(resized, before));  // augment() never writes into the cached image
  }
}

TEST_CASE("drawn parameters stay in their ranges and name only what is on", "[data][augment]") {
  const std::string bytes = jpeg_bytes();
  PreprocessOptions o = everything_on();
  o.random_resized_crop = true;
  const ImagePipeline pipeline(o);
  std::set<int> k90;
  int erased = 0;
  std::set<std::string> ops;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    nlohmann::json d;
    pipeline.decode(bytes, "x", seed, &d);
    const std::set<std::string> keys = {"crop",   "hflip",        "vflip",  "rotate90",
                                        "rotate", "color_jitter", "policy", "erase"};
    for (const auto& [key, value] : d.items()) CHECK(keys.count(key) == 1);
    REQUIRE(d.size() == keys.size());
    const auto crop = d["crop"].get<std::vector<int>>();
    CHECK(crop[0] >= 0);
    CHECK(crop[1] >= 0);
    CHECK(crop[0] + crop[2] <= 120);
    CHECK(crop[1] + crop[3] <= 90);
    k90.insert(d["rotate90"].get<int>());
    CHECK(std::abs(d["rotate"].get<double>()) <= 15);
    const auto& j = d["color_jitter"];
    CHECK(j["order"].size() == 4);
    for (const char* part : {"brightness", "contrast", "saturation"}) {
      CHECK(j[part].get<double>() >= 0.6);
      CHECK(j[part].get<double>() <= 1.4);
    }
    CHECK(std::abs(j["hue"].get<double>()) <= 0.1);
    REQUIRE(d["policy"].size() == 1);
    ops.insert(d["policy"][0]["op"].get<std::string>());
    if (!d["erase"].is_null()) {
      ++erased;
      const auto e = d["erase"].get<std::vector<int>>();
      CHECK(e[0] >= 0);
      CHECK(e[1] >= 0);
      CHECK(e[2] >= 1);
      CHECK(e[3] >= 1);
      CHECK(e[0] + e[2] <= kSize);
      CHECK(e[1] + e[3] <= kSize);
      CHECK(e[2] * e[3] <= 0.33 * kSize * kSize * 1.2);
    }
  }
  CHECK(k90 == std::set<int>{0, 1, 2, 3});
  CHECK(ops.size() == 14);  // every TrivialAugmentWide op appears
  CHECK(erased > 100);      // p = 0.5 of 300
  CHECK(erased < 200);

  // Only the keys of the operations that are on.
  PreprocessOptions some = train_options();
  some.rotate90 = true;
  nlohmann::json d;
  ImagePipeline(some).decode(bytes, "x", 1, &d);
  CHECK(d.size() == 2);
  CHECK(d.contains("hflip"));
  CHECK(d.contains("rotate90"));
}

TEST_CASE("vertical flip and rotations by 90 degrees are exact", "[data][augment]") {
  const cv::Mat m = asymmetric(7, 5);
  const cv::Mat v = vflip(m);
  for (int y = 0; y < 5; ++y) {
    for (int x = 0; x < 7; ++x) REQUIRE(v.at<cv::Vec3b>(y, x) == m.at<cv::Vec3b>(4 - y, x));
  }
  // torch.rot90(img, 1, dims=(-2, -1)): out[r][c] = in[c][W - 1 - r] (counter-clockwise).
  const cv::Mat r1 = rot90(m, 1);
  REQUIRE(r1.rows == 7);
  REQUIRE(r1.cols == 5);
  for (int r = 0; r < 7; ++r) {
    for (int c = 0; c < 5; ++c) REQUIRE(r1.at<cv::Vec3b>(r, c) == m.at<cv::Vec3b>(c, 6 - r));
  }
  cv::Mat hv;
  cv::flip(m, hv, -1);
  CHECK(mat_equal(rot90(m, 2), hv));
  CHECK(mat_equal(rot90(rot90(m, 1), 3), m));
  CHECK(mat_equal(rot90(m, 0), m));
  // A rotation by 90 degrees through the affine path lands on the same pixels.
  const cv::Mat sq = asymmetric(9, 9);
  CHECK(mat_equal(rotate(sq, 90.0, Interp::kNearest), rot90(sq, 1)));
}

TEST_CASE("random erasing fills with the pixel that normalises to zero", "[data][augment]") {
  const std::string bytes = jpeg_bytes();
  for (const std::string normalize : {"imagenet", "unit"}) {
    INFO(normalize);
    PreprocessOptions o = train_options();
    o.random_erasing = 1.0;
    o.normalize = normalize;
    const ImagePipeline pipeline(o);
    int checked = 0;
    for (uint64_t seed = 0; seed < 20; ++seed) {
      nlohmann::json d;
      const torch::Tensor out = pipeline.decode(bytes, "x", seed, &d);
      if (d["erase"].is_null()) continue;  // ten failed attempts: nothing erased
      const auto e = d["erase"].get<std::vector<int>>();
      const torch::Tensor box = out.slice(0, e[1], e[1] + e[3]).slice(1, e[0], e[0] + e[2]);
      const torch::Tensor fill = normalize == "imagenet"
                                     ? torch::tensor({124, 116, 104}, torch::kUInt8)
                                     : torch::zeros({3}, torch::kUInt8);
      CHECK(torch::equal(box, fill.view({1, 1, 3}).expand_as(box)));
      // ... and only there: the same seed without erasing differs exactly inside the box.
      PreprocessOptions plain = o;
      plain.random_erasing = 0;
      const torch::Tensor un = ImagePipeline(plain).decode(bytes, "x", seed);
      torch::Tensor mask = torch::zeros({kSize, kSize}, torch::kBool);
      mask.slice(0, e[1], e[1] + e[3]).slice(1, e[0], e[0] + e[2]).fill_(true);
      const torch::Tensor outside = (out != un).any(2).logical_and(mask.logical_not());
      CHECK(outside.sum().item<int64_t>() == 0);
      ++checked;
    }
    CHECK(checked >= 15);
  }
}

TEST_CASE("point ops give torchvision's values on known pixels", "[data][augment]") {
  cv::Mat m(1, 4, CV_8UC3);
  m.at<cv::Vec3b>(0, 0) = {0, 100, 255};
  m.at<cv::Vec3b>(0, 1) = {10, 128, 200};
  m.at<cv::Vec3b>(0, 2) = {37, 64, 90};
  m.at<cv::Vec3b>(0, 3) = {250, 1, 129};
  CHECK(posterize(m, 2).at<cv::Vec3b>(0, 1) == cv::Vec3b(0, 128, 192));
  CHECK(solarize(m, 128).at<cv::Vec3b>(0, 1) == cv::Vec3b(10, 127, 55));
  CHECK(invert(m).at<cv::Vec3b>(0, 0) == cv::Vec3b(255, 155, 0));
  // Brightness 0.5 truncates: 255 * 0.5 = 127.5 -> 127.
  CHECK(adjust_brightness(m, 0.5).at<cv::Vec3b>(0, 0) == cv::Vec3b(0, 50, 127));
  // Autocontrast stretches each channel to 0..255.
  const cv::Mat a = autocontrast(m);
  double lo, hi;
  for (int c = 0; c < 3; ++c) {
    std::vector<cv::Mat> ch;
    cv::split(a, ch);
    cv::minMaxLoc(ch[c], &lo, &hi);
    CHECK(lo == 0);
    CHECK(hi == 255);
  }
  // Saturation 0 is torchvision's grey: trunc(0.2989 R + 0.587 G + 0.114 B), BGR order here.
  const cv::Vec3b g = adjust_saturation(m, 0.0).at<cv::Vec3b>(0, 0);
  CHECK(g == cv::Vec3b(134, 134, 134));  // 0.2989 * 255 + 0.587 * 100 = 134.9
}

TEST_CASE("Dirichlet draws lie on the simplex with the right means", "[data][augment]") {
  Rng rng(3);
  double mean0 = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const std::vector<double> d = dirichlet(rng, {1.0, 1.0, 1.0});
    REQUIRE(d.size() == 3);
    CHECK(std::abs(d[0] + d[1] + d[2] - 1.0) < 1e-12);
    for (const double x : d) REQUIRE(x >= 0);
    mean0 += d[0] / n;
  }
  CHECK(std::abs(mean0 - 1.0 / 3.0) < 0.02);
}

TEST_CASE("bad augmentation options are errors naming the field", "[data][augment]") {
  PreprocessOptions o = train_options();
  o.policy = "trivial";
  CHECK_THAT(config_error(o), Contains("data.augment.policy") && Contains("'trivial'"));
  o = train_options();
  o.color_jitter.hue = 0.7;
  CHECK_THAT(config_error(o), Contains("data.augment.color_jitter.hue"));
  o = train_options();
  o.color_jitter.brightness = -1;
  CHECK_THAT(config_error(o), Contains("data.augment.color_jitter.brightness"));
  o = train_options();
  o.random_erasing = 1.5;
  CHECK_THAT(config_error(o), Contains("data.augment.random_erasing"));
  o = train_options();
  o.rotate_degrees = -3;
  CHECK_THAT(config_error(o), Contains("data.augment.rotate_degrees"));
  o = train_options();
  o.policy = "rand_augment";
  o.magnitude = 31;
  CHECK_THAT(config_error(o), Contains("data.augment.magnitude"));
  o.policy = "augmix";
  o.magnitude = 11;
  CHECK_THAT(config_error(o), Contains("data.augment.magnitude"));
  o = train_options();
  o.num_ops = -1;
  CHECK_THAT(config_error(o), Contains("data.augment.num_ops"));
  o = train_options();
  o.normalize = "zero";
  CHECK_THAT(config_error(o), Contains("data.normalize"));
  CHECK(config_error(everything_on()) == "(no ConfigError)");
}
