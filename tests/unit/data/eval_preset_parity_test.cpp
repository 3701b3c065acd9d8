// data.eval_resize: shorter_side against torchvision's evaluation preset on real photos
// (../shared/realdata's hymenoptera JPEGs; skipped with a message where it does not exist):
// tests/parity/eval_preset_parity.py runs Compose([Resize(R, interpolation, antialias=True),
// CenterCrop(C), PILToTensor()]) on PIL images with TRAINER_PYTHON; our ImagePipeline must give
// the same pixels up to the bounds below. Alternatives (OpenCV's INTER_LINEAR and INTER_AREA in
// place of the PIL-style resampler) are measured and printed, not checked, to show the choice.
#include "common/catch.h"

#include "common/run_command.h"

#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "fixtures.h"
#include "trainer/data/image.h"
#include "trainer/data/transforms.h"

using namespace trainer::data;
namespace fs = std::filesystem;
using testing::TempDir;

namespace {

const fs::path kPhotos = fs::path(TRAINER_SOURCE_DIR) / ".." / "shared" / "realdata" /
                         "zhangtao7750-syn" / "hymenoptera_data";

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

using trainer::test_support::Run;
using trainer::test_support::run_command;

std::vector<std::string> photos() {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(kPhotos)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg")) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// torchvision's results for `images`, [crop, crop, 3] uint8 RGB each.
std::vector<torch::Tensor> torchvision_results(const std::vector<std::string>& images, int resize,
                                               int crop, const std::string& interpolation) {
  TempDir dir;
  std::string command =
      std::string(TRAINER_PYTHON) + " " +
      quoted(std::string(TRAINER_SOURCE_DIR) + "/tests/parity/eval_preset_parity.py") +
      " --resize " + std::to_string(resize) + " --crop " + std::to_string(crop) +
      " --interpolation " + interpolation + " --out " + quoted(dir.path().string());
  for (const std::string& p : images) command += " " + quoted(p);
  const Run run = run_command(command);
  INFO("command: " << command << "\noutput:\n" << run.output);
  if (run.rc == 2) {
    FAIL("this test needs torch, torchvision and PIL for " TRAINER_PYTHON
         " (Debian: python3-torch python3-torchvision python3-pil)");
  }
  REQUIRE(run.rc == 0);
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string bytes = testing::read_bytes(dir / (std::to_string(i) + ".rgb"));
    REQUIRE(bytes.size() == static_cast<size_t>(crop) * crop * 3);
    out.push_back(
        torch::from_blob(const_cast<char*>(bytes.data()), {crop, crop, 3}, torch::kUInt8).clone());
  }
  return out;
}

struct Diff {
  double worst_mean = 0;   // the largest per-image mean |difference|
  double mean = 0;         // over all pixels of all images
  int max = 0;             // the largest |difference| of any pixel
  double frac_over_2 = 0;  // fraction of values differing by more than 2
};

Diff compare(const std::vector<torch::Tensor>& ours, const std::vector<torch::Tensor>& theirs) {
  Diff d;
  double sum = 0;
  double over = 0;
  double count = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const torch::Tensor diff = (ours[i].to(torch::kInt) - theirs[i].to(torch::kInt)).abs();
    const double m = diff.to(torch::kDouble).mean().item<double>();
    d.worst_mean = std::max(d.worst_mean, m);
    d.max = std::max(d.max, diff.max().item<int>());
    sum += diff.to(torch::kDouble).sum().item<double>();
    over += diff.gt(2).sum().item<double>();
    count += static_cast<double>(diff.numel());
  }
  d.mean = sum / count;
  d.frac_over_2 = over / count;
  return d;
}

std::string describe(const Diff& d) {
  std::ostringstream s;
  s << "mean |diff| " << d.mean << ", worst image's mean " << d.worst_mean << ", max " << d.max
    << ", values off by > 2: " << d.frac_over_2 * 100 << "%";
  return s.str();
}

// An OpenCV resampler in place of ours (for the printed comparison only).
std::vector<torch::Tensor> opencv_results(const std::vector<std::string>& images, int resize,
                                          int crop, int flag) {
  std::vector<torch::Tensor> out;
  for (const std::string& p : images) {
    const cv::Mat image = transforms::decode_bgr(testing::read_bytes(p), p);
    const cv::Size size = transforms::ResizeShorterSide(resize).output_size(image.cols, image.rows);
    cv::Mat resized;
    cv::resize(image, resized, size, 0, 0, flag);
    out.push_back(transforms::to_tensor(transforms::CenterCrop(crop)(resized)));
  }
  return out;
}

std::vector<torch::Tensor> our_results(const std::vector<std::string>& images, int resize, int crop,
                                       const std::string& interpolation, bool reduced) {
  PreprocessOptions o;
  o.image_size = 32;  // the training crop: unused on the eval path
  o.eval_resize = "shorter_side";
  o.eval_resize_size = resize;
  o.eval_crop_size = crop;
  o.interpolation = interpolation;
  o.reduced_decode = reduced;
  const ImagePipeline pipe(o);
  std::vector<torch::Tensor> out;
  for (const std::string& p : images) out.push_back(pipe.load(p, 0));
  return out;
}

}  // namespace

TEST_CASE("shorter_side eval preprocessing matches torchvision's eval preset on real photos",
          "[parity][data][image][realdata]") {
  if (!fs::is_directory(kPhotos)) {
    WARN("skipped: ../shared/realdata not found (" << kPhotos.string() << ")");
    return;
  }
  const std::vector<std::string> images = photos();
  REQUIRE(images.size() >= 30);

  struct Case {
    int resize, crop;
    std::string interpolation;
  };
  // torchvision's 256/224; odd sizes; bicubic. Every hymenoptera photo is larger than 256 on
  // both sides, so every image is downscaled (the antialiased case).
  for (const Case& c :
       {Case{256, 224, "bilinear"}, Case{147, 129, "bilinear"}, Case{256, 224, "bicubic"},
        Case{75, 64, "bicubic"}, Case{64, 57, "bilinear"}}) {
    INFO("Resize(" << c.resize << ", " << c.interpolation << ") + CenterCrop(" << c.crop << ")");
    const std::vector<torch::Tensor> theirs =
        torchvision_results(images, c.resize, c.crop, c.interpolation);

    // The full decode. Measured (Debian 12: OpenCV and Pillow both on libjpeg62-turbo 2.1.5):
    // 0 and 0, every pixel equal, since resize_antialiased is Pillow's fixed-point arithmetic.
    // The bounds allow another libjpeg-turbo build (a Pillow wheel bundles its own), whose IDCT
    // may round a few values differently by 1, which the resampling can carry to 2.
    const Diff exact =
        compare(our_results(images, c.resize, c.crop, c.interpolation, false), theirs);
    std::cout << "[parity] eval preset " << c.resize << "/" << c.crop << " " << c.interpolation
              << ", full decode: " << describe(exact) << "\n";
    CHECK(exact.mean <= 0.02);
    CHECK(exact.max <= 2);

    // data.reduced_decode (the default): a JPEG whose shorter side is at least twice the resize
    // at 1/2, 1/4 or 1/8 scale is decoded there (libjpeg's DCT scaling), then resampled with the
    // original's geometry. Measured: 0 where no photo is that large (256, 147), else (75/64 and
    // 64/57, 1/2 and 1/4 decodes) mean 0.36-0.38, worst image's mean 0.73, max 10 (a few
    // pixels on sharp edges; over 2 for under 1% of the values). Bounds: about twice those.
    const Diff reduced =
        compare(our_results(images, c.resize, c.crop, c.interpolation, true), theirs);
    std::cout << "[parity] eval preset " << c.resize << "/" << c.crop << " " << c.interpolation
              << ", reduced decode: " << describe(reduced) << "\n";
    CHECK(reduced.mean <= 0.75);
    CHECK(reduced.worst_mean <= 1.5);
    CHECK(reduced.max <= 20);
    CHECK(reduced.frac_over_2 <= 0.02);

    if (c.interpolation == "bilinear") {
      std::cout
          << "[parity]   instead OpenCV INTER_LINEAR (no antialiasing): "
          << describe(compare(opencv_results(images, c.resize, c.crop, cv::INTER_LINEAR), theirs))
          << "\n[parity]   instead OpenCV INTER_AREA: "
          << describe(compare(opencv_results(images, c.resize, c.crop, cv::INTER_AREA), theirs))
          << "\n";
    }
  }
}
