// Decoding, transforms and normalisation of one image (real OpenCV encode/decode).
#include "common/catch.h"

#include <opencv2/imgproc.hpp>

#include "fixtures.h"
#include "trainer/data/image.h"
#include "trainer/data/transforms.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::data;
using trainer::test::Contains;
namespace fs = std::filesystem;
using testing::TempDir;

namespace {

PreprocessOptions eval_options(int size) {
  PreprocessOptions o;
  o.image_size = size;
  return o;
}

std::string data_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

}  // namespace

TEST_CASE("to_tensor converts BGR HWC uint8 to RGB HWC uint8", "[data][image]") {
  cv::Mat m(2, 3, CV_8UC3);
  for (int y = 0; y < 2; ++y) {
    for (int x = 0; x < 3; ++x) m.at<cv::Vec3b>(y, x) = cv::Vec3b(x, 10 * y, 100 + x + y);
  }
  const torch::Tensor t = transforms::to_tensor(m);
  REQUIRE(t.sizes() == torch::IntArrayRef({2, 3, 3}));
  CHECK(t.scalar_type() == torch::kUInt8);
  CHECK(t.is_contiguous());
  CHECK(t[1][2][0].item<int>() == 103);  // R = the third BGR byte
  CHECK(t[1][2][1].item<int>() == 10);   // G
  CHECK(t[1][2][2].item<int>() == 2);    // B
}

TEST_CASE("normalisation of a pure colour in the graph: unit and imagenet, RGB order, layouts",
          "[data][image]") {
  TempDir tmp;
  // BGR (10, 100, 200): R = 200, G = 100, B = 10. PNG keeps the values exact.
  const cv::Mat colour(20, 30, CV_8UC3, cv::Scalar(10, 100, 200));
  testing::write_text(tmp / "c.png", testing::encode(colour, ".png"));
  const int rgb[3] = {200, 100, 10};

  const torch::Tensor pixels = ImagePipeline(eval_options(8)).load((tmp / "c.png").string(), 0);
  REQUIRE(pixels.sizes() == torch::IntArrayRef({8, 8, 3}));
  CHECK(pixels.scalar_type() == torch::kUInt8);
  for (int c = 0; c < 3; ++c) {
    CHECK(pixels.select(2, c).min().item<int>() == rgb[c]);
    CHECK(pixels.select(2, c).max().item<int>() == rgb[c]);
  }
  const torch::Tensor batch = torch::stack({pixels, pixels});

  const torch::Tensor unit = normalize_images(batch, Normalize::kUnit, /*channels_last=*/false);
  REQUIRE(unit.sizes() == torch::IntArrayRef({2, 3, 8, 8}));
  CHECK(unit.scalar_type() == torch::kFloat32);
  CHECK(unit.is_contiguous());
  for (int c = 0; c < 3; ++c) {
    // Bit for bit what the per-pixel float loop computed: x / 255.0f.
    CHECK(unit[1][c].min().item<float>() == static_cast<float>(rgb[c]) / 255.0f);
    CHECK(unit[1][c].max().item<float>() == static_cast<float>(rgb[c]) / 255.0f);
  }

  const float mean[3] = {0.485f, 0.456f, 0.406f};
  const float std[3] = {0.229f, 0.224f, 0.225f};
  const torch::Tensor in = normalize_images(batch, Normalize::kImagenet, /*channels_last=*/false);
  for (int c = 0; c < 3; ++c) {
    const float expected = (static_cast<float>(rgb[c]) / 255.0f - mean[c]) / std[c];
    CHECK(in[0][c].min().item<float>() == expected);
    CHECK(in[0][c].max().item<float>() == expected);
  }
  // channels_last: the same values, in ChannelsLast memory format.
  const torch::Tensor cl = normalize_images(batch, Normalize::kImagenet, /*channels_last=*/true);
  CHECK(cl.is_contiguous(at::MemoryFormat::ChannelsLast));
  CHECK_FALSE(cl.is_contiguous());
  CHECK(torch::equal(cl, in));

  CHECK(parse_normalize("unit") == Normalize::kUnit);
  CHECK(parse_normalize("imagenet") == Normalize::kImagenet);
  CHECK_THROWS_WITH(parse_normalize("zscore"), Contains("data.normalize") && Contains("zscore"));
  CHECK_THROWS_AS(normalize_images(in, Normalize::kUnit, false), Error);  // float, not uint8
}

TEST_CASE("eval Resize gives S x S and decode() equals load()", "[data][image]") {
  TempDir tmp;
  const cv::Mat img = testing::pattern_image(40, 24, 3);
  testing::write_jpeg(tmp / "p.jpg", img);
  ImagePipeline pipe(eval_options(16));
  const torch::Tensor a = pipe.load((tmp / "p.jpg").string(), 1);
  const torch::Tensor b = pipe.decode(testing::read_bytes(tmp / "p.jpg"), "p.jpg", 2);
  CHECK(a.sizes() == torch::IntArrayRef({16, 16, 3}));
  CHECK(torch::equal(a, b));  // eval: no randomness

  // Resize matches cv::resize INTER_LINEAR exactly.
  cv::Mat decoded = cv::imread((tmp / "p.jpg").string(), cv::IMREAD_COLOR);
  cv::Mat expected;
  cv::resize(decoded, expected, cv::Size(16, 16), 0, 0, cv::INTER_LINEAR);
  CHECK(torch::equal(transforms::to_tensor(transforms::Resize(16)(decoded)),
                     transforms::to_tensor(expected)));
}

TEST_CASE("truncated, corrupt, empty and missing files are DataErrors naming the path",
          "[data][image]") {
  TempDir tmp;
  const std::string jpeg = testing::encode(testing::pattern_image(64, 48, 1), ".jpg");
  ImagePipeline pipe(eval_options(16));

  const fs::path truncated = tmp / "truncated.jpg";
  testing::write_text(truncated, jpeg.substr(0, jpeg.size() / 2));
  CHECK_THAT(data_error([&] { pipe.load(truncated.string(), 0); }),
             Contains(truncated.string()) && Contains("truncated"));
  // Zero padding after a truncation does not hide it.
  testing::write_text(truncated, jpeg.substr(0, jpeg.size() - 10) + std::string(64, '\0'));
  CHECK_THAT(data_error([&] { pipe.load(truncated.string(), 0); }), Contains("truncated"));

  // Padding or a trailer after a complete stream is fine.
  CHECK_NOTHROW(pipe.decode(jpeg + std::string(16, '\0') + "\r\n", "padded", 0));
  CHECK_NOTHROW(pipe.decode(jpeg + "TRAILER-DATA", "trailer", 0));
  CHECK_FALSE(transforms::jpeg_is_truncated(jpeg));
  CHECK(transforms::jpeg_is_truncated(jpeg.substr(0, jpeg.size() - 1)));

  const fs::path garbage = tmp / "garbage.jpg";
  testing::write_text(garbage, "this is not an image at all");
  CHECK_THAT(data_error([&] { pipe.load(garbage.string(), 0); }), Contains(garbage.string()));
  const fs::path empty = tmp / "empty.png";
  testing::write_text(empty, "");
  CHECK_THAT(data_error([&] { pipe.load(empty.string(), 0); }), Contains(empty.string()));
  const fs::path missing = tmp / "missing.jpg";
  CHECK_THAT(data_error([&] { pipe.load(missing.string(), 0); }), Contains(missing.string()));
}

TEST_CASE(
    "an image whose header declares too many pixels, or another format, is refused before "
    "decoding",
    "[data][image]") {
  ImagePipeline pipe(eval_options(16));
  // A PNG signature and IHDR chunk claiming 100000 x 100000 (a 30 GB buffer), nothing after.
  std::string png("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR", 16);
  png += std::string("\0\x01\x86\xa0\0\x01\x86\xa0\x08\x02\0\0\0", 13);
  CHECK_THAT(data_error([&] { pipe.decode(png, "huge.png", 0); }),
             Contains("huge.png") && Contains("100000 x 100000") && Contains("limit"));
  // A JPEG frame header of 65535 x 65535.
  const std::string jpeg = testing::encode(testing::pattern_image(8, 8, 1), ".jpg");
  int w = 0;
  int h = 0;
  REQUIRE(transforms::jpeg_size(jpeg, &w, &h));
  std::string big = jpeg;
  const size_t sof = big.find("\xFF\xC0");
  REQUIRE(sof != std::string::npos);
  big[sof + 5] = big[sof + 6] = big[sof + 7] = big[sof + 8] = '\xFF';
  CHECK_THAT(data_error([&] { pipe.decode(big, "big.jpg", 0); }), Contains("65535 x 65535"));
  // GIF and TIFF are not formats the trainer reads (OpenCV would try some of them).
  CHECK_THAT(data_error([&] { pipe.decode("GIF89a\x01\0\x01\0", "a.gif", 0); }),
             Contains("not a JPEG, PNG or BMP"));
  CHECK_THAT(data_error([&] { pipe.decode("II*\0\x08\0\0\0", "a.tif", 0); }),
             Contains("not a JPEG, PNG or BMP"));
  // BMP and PNG files of ordinary sizes still decode.
  CHECK_NOTHROW(
      pipe.decode(testing::encode(testing::pattern_image(20, 10, 2), ".bmp"), "a.bmp", 0));
  CHECK_NOTHROW(
      pipe.decode(testing::encode(testing::pattern_image(20, 10, 2), ".png"), "a.png", 0));
}

TEST_CASE("RandomResizedCrop follows torchvision's algorithm", "[data][image]") {
  const transforms::RandomResizedCrop rrc(32, 0.08);
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int w = 20 + trial % 50;
    const int h = 30 + (trial * 7) % 40;
    const transforms::CropBox box = rrc.params(w, h, rng);
    REQUIRE(box.w >= 1);
    REQUIRE(box.h >= 1);
    REQUIRE(box.x >= 0);
    REQUIRE(box.y >= 0);
    REQUIRE(box.x + box.w <= w);
    REQUIRE(box.y + box.h <= h);
  }
  SECTION("no attempt fits: the central crop clamped to the ratio range") {
    Rng r(1);
    const transforms::CropBox box = rrc.params(100, 10, r);
    CHECK(box.h == 10);
    CHECK(box.w == 13);  // round(10 * 4/3)
    CHECK(box.x == 43);
    CHECK(box.y == 0);
  }
  SECTION("same seed, same crop; output is size x size") {
    const cv::Mat img = testing::pattern_image(80, 60, 2);
    Rng a(99), b(99);
    const cv::Mat ca = rrc(img, a);
    const cv::Mat cb = rrc(img, b);
    CHECK(ca.size() == cv::Size(32, 32));
    CHECK(cv::norm(ca, cb, cv::NORM_INF) == 0.0);
  }
}

TEST_CASE("HorizontalFlip flips with probability p", "[data][image]") {
  const cv::Mat img = testing::pattern_image(5, 3, 4);
  Rng rng(3);
  const cv::Mat flipped = transforms::HorizontalFlip(1.0)(img, rng);
  CHECK(flipped.at<cv::Vec3b>(1, 0) == img.at<cv::Vec3b>(1, 4));
  const cv::Mat same = transforms::HorizontalFlip(0.0)(img, rng);
  CHECK(cv::norm(same, img, cv::NORM_INF) == 0.0);
  int flips = 0;
  for (int i = 0; i < 400; ++i) {
    const cv::Mat out = transforms::HorizontalFlip(0.5)(img, rng);
    flips += out.at<cv::Vec3b>(0, 0) != img.at<cv::Vec3b>(0, 0) ? 1 : 0;
  }
  CHECK(flips > 150);
  CHECK(flips < 250);
}

TEST_CASE("train pipeline: shape, determinism per seed, variety across seeds", "[data][image]") {
  TempDir tmp;
  testing::write_jpeg(tmp / "a.jpg", testing::pattern_image(70, 50, 5));
  PreprocessOptions o = eval_options(24);
  o.train = true;
  o.random_resized_crop = true;
  o.horizontal_flip = true;
  o.crop_scale_min = 0.2;
  const ImagePipeline pipe(o);
  const std::string path = (tmp / "a.jpg").string();
  const torch::Tensor a = pipe.load(path, 42);
  CHECK(a.sizes() == torch::IntArrayRef({24, 24, 3}));
  CHECK(a.is_contiguous());
  CHECK(torch::equal(a, pipe.load(path, 42)));
  int different = 0;
  for (uint64_t seed = 0; seed < 8; ++seed)
    different += torch::equal(a, pipe.load(path, seed)) ? 0 : 1;
  CHECK(different >= 7);

  // Augmentation flags are ignored when train is false.
  o.train = false;
  const ImagePipeline eval(o);
  CHECK(torch::equal(eval.load(path, 1), eval.load(path, 2)));
}
