// Evaluation preprocessing (data.eval_resize, data.eval_resize_size, data.eval_crop_size,
// data.interpolation): torchvision's shorter-side Resize and CenterCrop geometry, Pillow's
// resampler on known inputs, the default path bit-identical to the plain Resize it always was,
// output_size(), and eval loaders (cached or not) batching at the eval crop.
#include "common/catch.h"

#include <opencv2/imgproc.hpp>

#include "fixtures.h"
#include "loader_fixtures.h"
#include "trainer/data/image.h"
#include "trainer/data/loader.h"
#include "trainer/data/transforms.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::data;
using trainer::test::Contains;
namespace fs = std::filesystem;
using testing::TempDir;
using testing::whole_epoch;

namespace {

PreprocessOptions shorter_side(int image_size, int resize, int crop) {
  PreprocessOptions o;
  o.image_size = image_size;
  o.eval_resize = "shorter_side";
  o.eval_resize_size = resize;
  o.eval_crop_size = crop;
  return o;
}

std::string config_error(const PreprocessOptions& o) {
  try {
    ImagePipeline pipe(o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

}  // namespace

TEST_CASE("ResizeShorterSide: the shorter side to size, the longer as torchvision truncates",
          "[data][image][eval]") {
  const transforms::ResizeShorterSide r256(256);
  CHECK(r256.output_size(500, 333) == cv::Size(384, 256));  // int(256 * 500 / 333) = 384
  CHECK(r256.output_size(333, 500) == cv::Size(256, 384));  // portrait
  CHECK(r256.output_size(256, 256) == cv::Size(256, 256));
  CHECK(r256.output_size(640, 480) == cv::Size(341, 256));  // 341.33 truncated
  const transforms::ResizeShorterSide r17(17);
  CHECK(r17.output_size(101, 37) == cv::Size(46, 17));  // 46.41
  CHECK(r17.output_size(37, 101) == cv::Size(17, 46));
  CHECK(r17.output_size(10, 10) == cv::Size(17, 17));                           // upscaling too
  CHECK(transforms::ResizeShorterSide(5).output_size(3, 2) == cv::Size(7, 5));  // 7.5

  // The functor: that size; an image already there is returned as it is (torchvision's no-op).
  const cv::Mat img = testing::pattern_image(101, 37, 1);
  const cv::Mat out = r17(img);
  CHECK(out.cols == 46);
  CHECK(out.rows == 17);
  const cv::Mat same = transforms::ResizeShorterSide(37)(img);
  CHECK(same.data == img.data);
}

TEST_CASE("CenterCrop: torchvision's offsets (half to even) and its zero padding",
          "[data][image][eval]") {
  const transforms::CenterCrop c224(224);
  CHECK(c224.window(256, 256) == cv::Rect(16, 16, 224, 224));
  CHECK(c224.window(257, 300) == cv::Rect(16, 38, 224, 224));  // round(16.5) = 16
  CHECK(c224.window(259, 224) == cv::Rect(18, 0, 224, 224));   // round(17.5) = 18
  CHECK(c224.window(224, 341) == cv::Rect(0, 58, 224, 224));   // round(58.5) = 58
  CHECK(c224.window(384, 256) == cv::Rect(80, 16, 224, 224));

  // The crop is the window's pixels.
  const cv::Mat img = testing::pattern_image(47, 31, 2);
  const cv::Mat crop = transforms::CenterCrop(9)(img);
  REQUIRE(crop.cols == 9);
  REQUIRE(crop.rows == 9);
  CHECK(cv::norm(crop, img(cv::Rect(19, 11, 9, 9)), cv::NORM_INF) == 0);  // 19, round(11)

  // Smaller than the crop: padded with zeros, left/top (d // 2), right/bottom the rest.
  const cv::Mat small = testing::pattern_image(5, 7, 3);
  const cv::Mat padded = transforms::CenterCrop(8)(small);
  REQUIRE(padded.cols == 8);
  REQUIRE(padded.rows == 8);
  CHECK(cv::norm(padded(cv::Rect(1, 0, 5, 7)), small, cv::NORM_INF) == 0);
  CHECK(cv::countNonZero(padded.reshape(1).colRange(0, 3)) == 0);  // column 0 (3 channels)
  CHECK(cv::countNonZero(padded.row(7).reshape(1)) == 0);
}

TEST_CASE("resize_antialiased: Pillow's filters on known inputs", "[data][image][eval]") {
  // A constant image stays constant (the taps sum to one) whatever the scale or filter.
  const cv::Mat grey(37, 53, CV_8UC3, cv::Scalar(200, 100, 7));
  for (const auto interp :
       {transforms::Interpolation::kBilinear, transforms::Interpolation::kBicubic}) {
    for (const cv::Size size : {cv::Size(5, 3), cv::Size(53, 20), cv::Size(90, 61)}) {
      const cv::Mat out = transforms::resize_antialiased(grey, size, interp);
      REQUIRE(out.size() == size);
      CHECK(cv::norm(out, cv::Mat(size, CV_8UC3, cv::Scalar(200, 100, 7)), cv::NORM_INF) == 0);
    }
  }
  // Halving with PIL's bilinear filter: support 2 (scaled), taps 1/8 3/8 3/8 1/8 around each
  // output pixel, renormalised at the border. A row 0 0 0 0 255 255 255 255 -> 0 32 223 255
  // (Pillow 9.4: Image.new("RGB", (8, 1)), pixels set, .resize((4, 1), Image.BILINEAR) agrees).
  cv::Mat row(1, 8, CV_8UC3, cv::Scalar::all(0));
  row.colRange(4, 8).setTo(cv::Scalar::all(255));
  const cv::Mat half =
      transforms::resize_antialiased(row, cv::Size(4, 1), transforms::Interpolation::kBilinear);
  CHECK(half.at<cv::Vec3b>(0, 0)[0] == 0);
  CHECK(half.at<cv::Vec3b>(0, 1)[0] == 32);
  CHECK(half.at<cv::Vec3b>(0, 2)[0] == 223);
  CHECK(half.at<cv::Vec3b>(0, 3)[0] == 255);
  // Same size: a copy.
  CHECK(
      cv::norm(transforms::resize_antialiased(row, row.size(), transforms::Interpolation::kBicubic),
               row, cv::NORM_INF) == 0);
}

TEST_CASE("PreprocessOptions: output_size, eval_crop and eval_resize_side", "[data][image][eval]") {
  PreprocessOptions o;
  o.image_size = 224;
  CHECK(o.output_size() == 224);
  CHECK(o.eval_crop() == 224);
  CHECK(o.eval_resize_side() == 256);  // round(224 / 0.875)
  o.eval_crop_size = 129;
  CHECK(o.output_size() == 129);
  CHECK(o.eval_resize_side() == 147);  // round(147.43)
  o.eval_resize_size = 150;
  CHECK(o.eval_resize_side() == 150);
  o.train = true;
  CHECK(o.output_size() == 224);  // training: the training crop
  o.train = false;
  o.eval_crop_size = 0;
  o.image_size = 100;
  CHECK(o.output_size() == 100);
  CHECK(transforms::parse_interpolation("bicubic") == transforms::Interpolation::kBicubic);

  o = PreprocessOptions{};
  o.interpolation = "nearest";
  CHECK_THAT(config_error(o), Contains("data.interpolation") && Contains("bilinear|bicubic") &&
                                  Contains("'nearest'"));
  o = PreprocessOptions{};
  o.eval_resize = "shorter";
  CHECK_THAT(config_error(o), Contains("data.eval_resize") && Contains("square|shorter_side"));
}

TEST_CASE("eval defaults are bit-identical to the plain Resize (reduced decode included)",
          "[data][image][eval]") {
  TempDir tmp;
  // 150 x 100: at size 24 the JPEG is decoded at 1/4 (38 x 25) first.
  const std::string bytes = testing::encode(testing::pattern_image(150, 100, 4));
  REQUIRE(transforms::jpeg_reduction_for(bytes, 24) == 4);
  for (const bool reduced : {true, false}) {
    PreprocessOptions o;
    o.image_size = 24;
    o.reduced_decode = reduced;
    const ImagePipeline pipe(o);
    cv::Mat expected;
    cv::resize(transforms::decode_bgr(bytes, "p", reduced ? 4 : 1), expected, cv::Size(24, 24), 0,
               0, cv::INTER_LINEAR);
    const torch::Tensor want = transforms::to_tensor(expected);
    const torch::Tensor got = pipe.decode(bytes, "p", 7);
    CHECK(torch::equal(got, want));
    CHECK(torch::equal(pipe.augment(pipe.decode_resized(bytes, "p"), 3), want));
    // The same spelled out: square, bilinear, the crop = image_size.
    PreprocessOptions explicit_ = o;
    explicit_.eval_crop_size = 24;
    explicit_.interpolation = "bilinear";
    explicit_.eval_resize = "square";
    CHECK(torch::equal(ImagePipeline(explicit_).decode(bytes, "p", 7), want));
  }
  // square with bicubic: cv::INTER_CUBIC of the whole image, at the eval crop.
  PreprocessOptions cubic;
  cubic.image_size = 32;
  cubic.eval_crop_size = 20;
  cubic.interpolation = "bicubic";
  cubic.reduced_decode = false;
  cv::Mat expected;
  cv::resize(transforms::decode_bgr(bytes, "p"), expected, cv::Size(20, 20), 0, 0, cv::INTER_CUBIC);
  CHECK(torch::equal(ImagePipeline(cubic).decode(bytes, "p", 0), transforms::to_tensor(expected)));
}

TEST_CASE("shorter_side eval: resize then centre crop, landscape and portrait, odd sizes",
          "[data][image][eval]") {
  for (const cv::Size source : {cv::Size(61, 40), cv::Size(40, 61), cv::Size(33, 33)}) {
    INFO(source.width << " x " << source.height);
    const std::string bytes =
        testing::encode(testing::pattern_image(source.width, source.height, 5), ".png");
    for (const std::string interp : {"bilinear", "bicubic"}) {
      PreprocessOptions o = shorter_side(64, 23, 19);
      o.interpolation = interp;
      const ImagePipeline pipe(o);
      const torch::Tensor got = pipe.decode(bytes, "p", 1);
      REQUIRE(got.sizes() == torch::IntArrayRef({19, 19, 3}));
      const auto interpolation = transforms::parse_interpolation(interp);
      const cv::Mat resized =
          transforms::ResizeShorterSide(23, interpolation)(transforms::decode_bgr(bytes, "p"));
      CHECK(std::min(resized.cols, resized.rows) == 23);
      const cv::Mat want = transforms::CenterCrop(19)(resized);
      CHECK(torch::equal(got, transforms::to_tensor(want)));
      // The cached stage is the final image; augment() only converts it.
      const torch::Tensor cached = pipe.decode_resized(bytes, "p");
      CHECK(cached.sizes() == torch::IntArrayRef({19, 19, 3}));
      CHECK(torch::equal(pipe.augment(cached, 9), got));
    }
  }
  // Auto sizes: crop = image_size, resize = round(crop / 0.875).
  const std::string bytes = testing::encode(testing::pattern_image(90, 70, 6), ".png");
  const torch::Tensor got = ImagePipeline(shorter_side(28, 0, 0)).decode(bytes, "p", 1);
  CHECK(got.sizes() == torch::IntArrayRef({28, 28, 3}));
  const cv::Mat want = transforms::CenterCrop(28)(
      transforms::ResizeShorterSide(32)(transforms::decode_bgr(bytes, "p")));
  CHECK(torch::equal(got, transforms::to_tensor(want)));
}

TEST_CASE("shorter_side eval with the reduced decode keeps the original's geometry",
          "[data][image][eval]") {
  // 400 x 300 at resize 40: 1/4 (100 x 75) still covers twice the resize; the output has the
  // size computed from 400 x 300 and stays close to the full decode's.
  const std::string bytes = testing::encode(testing::pattern_image(400, 300, 7));
  PreprocessOptions o = shorter_side(32, 40, 32);
  const torch::Tensor reduced = ImagePipeline(o).decode(bytes, "p", 0);
  o.reduced_decode = false;
  const torch::Tensor full = ImagePipeline(o).decode(bytes, "p", 0);
  REQUIRE(reduced.sizes() == full.sizes());
  const double mean_diff =
      (reduced.to(torch::kFloat) - full.to(torch::kFloat)).abs().mean().item<double>();
  INFO("mean |reduced - full| = " << mean_diff);
  CHECK(mean_diff < 4.0);
  CHECK(!torch::equal(reduced, full));  // the reduced decode did happen

  // The functor itself: an image decoded at 1/4 of 401 x 301 (101 x 76) gives 401 x 301's size.
  const cv::Mat quarter =
      transforms::decode_bgr(testing::encode(testing::pattern_image(401, 301, 8)), "q", 4);
  REQUIRE(quarter.size() == cv::Size(101, 76));
  const cv::Mat out = transforms::ResizeShorterSide(40)(quarter, 401, 301, 4);
  CHECK(out.size() == cv::Size(53, 40));  // int(40 * 401 / 301) = 53
}

TEST_CASE("eval loaders batch at the eval crop, cached or not", "[data][image][eval][loader]") {
  TempDir tmp;
  std::vector<Example> examples;
  for (int i = 0; i < 5; ++i) {
    const fs::path p = tmp / ("img_" + std::to_string(i) + ".jpg");
    testing::write_jpeg(p, testing::pattern_image(30 + i * 3, 22 + (i % 2) * 15, i));
    examples.push_back(Example{p.string(), i % 2});
  }
  LoaderOptions o;
  o.preprocess = shorter_side(32, 0, 20);  // training crop 32; eval 23 -> 20
  o.batch_size = 2;
  o.num_workers = 2;
  Loader plain(examples, o);
  const std::vector<Batch> a = whole_epoch(plain, 0);
  REQUIRE(a.size() == 3);
  CHECK(a[0].images.sizes() == torch::IntArrayRef({2, 20, 20, 3}));
  CHECK(a[2].images.sizes() == torch::IntArrayRef({1, 20, 20, 3}));

  o.cache = true;
  Loader cached(examples, o);
  for (int epoch = 0; epoch < 2; ++epoch) {
    const std::vector<Batch> b = whole_epoch(cached, epoch);
    REQUIRE(b.size() == a.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].images, b[i].images));
  }
  CHECK(cached.cached_examples() == 5);
  CHECK(cached.cached_bytes() >= 5 * 20 * 20 * 3);

  // Training loaders keep image_size.
  LoaderOptions t = o;
  t.cache = false;
  t.preprocess.train = true;
  Loader train(examples, t);
  CHECK(whole_epoch(train, 0)[0].images.sizes() == torch::IntArrayRef({2, 32, 32, 3}));
}
