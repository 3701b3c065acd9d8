// Parity of the training augmentation (lib/trainer/data/augment.h) with torchvision's functional
// ops on uint8 tensors, and of the policies' tables and draw distributions with torchvision's
// autoaugment.py: this side writes a textured image, our outputs for a list of ops with fixed
// parameters, our augmentation spaces and 20000 TrivialAugmentWide / RandAugment draws into a temp
// dir; tests/parity/augment_parity.py applies torchvision to the same image and parameters and
// compares (tolerances there). Runs with TRAINER_PYTHON (Debian's torch 1.13 / torchvision 0.14)
// and, where it exists, /opt/trainer/venv-torch-2.11.0/bin/python (torchvision 0.26).
#include "common/catch.h"

#include "common/run_command.h"

#include <sys/wait.h>

#include <opencv2/imgproc.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "fixtures.h"
#include "trainer/data/augment.h"
#include "trainer/data/random.h"

using namespace trainer::data;
using namespace trainer::data::augment;
using testing::TempDir;

namespace {

constexpr int kH = 80;
constexpr int kW = 96;
constexpr int kDraws = 20000;
const char* const kVenvPython = "/opt/trainer/venv-torch-2.11.0/bin/python";

// A textured BGR image: sinusoids per channel, noise, saturated corners and a flat grey patch.
cv::Mat textured_image() {
  Rng rng(12345);
  cv::Mat m(kH, kW, CV_8UC3);
  for (int y = 0; y < kH; ++y) {
    for (int x = 0; x < kW; ++x) {
      cv::Vec3b& p = m.at<cv::Vec3b>(y, x);
      for (int c = 0; c < 3; ++c) {
        // 128 +- 95 at most: no channel spans 0..255 but for the corner (AutoContrast changes it).
        double v = 128 + 50 * std::sin(x * (0.21 + 0.07 * c) + c) +
                   30 * std::cos(y * (0.17 + 0.05 * c) - 0.5 * c) + uniform(rng, -15, 15);
        if (x < 8 && y < 8) v = c == 0 ? 255 : 0;  // saturated corner
        if (x >= kW - 10 && y >= kH - 10) v = 97;  // flat grey patch
        p[c] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return m;
}

void write_rgb(const std::string& path, const cv::Mat& bgr) {
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  if (!rgb.isContinuous()) rgb = rgb.clone();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(rgb.data), static_cast<std::streamsize>(rgb.total() * 3));
  REQUIRE(f.good());
}

using trainer::test_support::Run;
using trainer::test_support::run_command;

// Writes the input, our outputs and draws; returns the manifest's path.
std::string write_cases(const TempDir& dir) {
  const cv::Mat image = textured_image();
  write_rgb(dir.file("input.rgb"), image);
  nlohmann::json cases = nlohmann::json::array();
  int n = 0;
  auto add = [&](const std::string& kind, const nlohmann::json& args, const cv::Mat& ours) {
    const std::string file = "out_" + std::to_string(n++) + ".rgb";
    write_rgb(dir.file(file), ours);
    cases.push_back(
        {{"kind", kind}, {"args", args}, {"file", file}, {"h", ours.rows}, {"w", ours.cols}});
  };
  add("vflip", nlohmann::json::object(), vflip(image));
  for (int k = 1; k < 4; ++k) add("rot90", {{"k", k}}, rot90(image, k));
  // RandomRotation's call: F.rotate(nearest, fill=[0, 0, 0]).
  for (const double a : {17.3, -33.71, 90.0, 4.0}) {
    add("rotate_fill0", {{"angle", a}}, rotate(image, a, Interp::kNearest));
  }
  add("brightness", {{"factor", 0.37}}, adjust_brightness(image, 0.37));
  add("brightness", {{"factor", 1.61}}, adjust_brightness(image, 1.61));
  add("contrast", {{"factor", 0.55}}, adjust_contrast(image, 0.55));
  add("contrast", {{"factor", 1.8}}, adjust_contrast(image, 1.8));
  add("saturation", {{"factor", 0.2}}, adjust_saturation(image, 0.2));
  add("saturation", {{"factor", 1.9}}, adjust_saturation(image, 1.9));
  for (const double h : {-0.43, -0.1, 0.07, 0.31, 0.5})
    add("hue", {{"factor", h}}, adjust_hue(image, h));
  // The policies' ops through _apply_op, nearest (TrivialAugmentWide, RandAugment, AutoAugment)
  // and bilinear (AugMix), magnitudes from the tables and in between.
  const std::vector<std::pair<Op, double>> ops = {
      {Op::kIdentity, 0},      {Op::kShearX, 0.3},       {Op::kShearX, -0.99},
      {Op::kShearY, 0.165},    {Op::kShearY, -0.627},    {Op::kTranslateX, 13.7},
      {Op::kTranslateX, -32},  {Op::kTranslateY, 21.33}, {Op::kTranslateY, -5},
      {Op::kRotate, 30},       {Op::kRotate, -135},      {Op::kRotate, 58.5},
      {Op::kBrightness, 0.99}, {Op::kBrightness, -0.66}, {Op::kColor, 0.9},
      {Op::kColor, -0.3},      {Op::kContrast, 0.462},   {Op::kContrast, -0.99},
      {Op::kSharpness, 0.99},  {Op::kSharpness, -0.7},   {Op::kPosterize, 2},
      {Op::kPosterize, 5},     {Op::kPosterize, 0},      {Op::kSolarize, 127.5},
      {Op::kSolarize, 246.5},  {Op::kSolarize, 0},       {Op::kAutoContrast, 0},
      {Op::kEqualize, 0},      {Op::kInvert, 0}};
  for (const auto& [op, magnitude] : ops) {
    add("op", {{"op", op_name(op)}, {"magnitude", magnitude}, {"interpolation", "nearest"}},
        apply_op(image, op, magnitude, Interp::kNearest));
  }
  for (const auto& [op, magnitude] : ops) {
    if (op != Op::kShearX && op != Op::kShearY && op != Op::kTranslateX && op != Op::kTranslateY &&
        op != Op::kRotate) {
      continue;
    }
    add("op", {{"op", op_name(op)}, {"magnitude", magnitude}, {"interpolation", "bilinear"}},
        apply_op(image, op, magnitude, Interp::kBilinear));
  }
  // ColorJitter in a drawn order, AugMix's mixing with drawn weights and chains, RandomErasing.
  for (const uint64_t seed : {1u, 2u, 3u}) {
    Rng rng(seed);
    const ColorJitterDraw d = draw_color_jitter({0.4, 0.4, 0.4, 0.2}, rng);
    add("color_jitter",
        {{"order", d.order},
         {"brightness", d.brightness},
         {"contrast", d.contrast},
         {"saturation", d.saturation},
         {"hue", d.hue}},
        apply_color_jitter(image, d));
  }
  for (const uint64_t seed : {5u, 6u}) {
    Rng rng(seed);
    const AugMixDraw d = draw_augmix(3, kH, kW, rng);
    nlohmann::json chains = nlohmann::json::array();
    for (const auto& chain : d.chains) {
      nlohmann::json c = nlohmann::json::array();
      for (const OpDraw& op : chain) c.push_back({op_name(op.op), op.magnitude});
      chains.push_back(c);
    }
    add("augmix", {{"original", d.original}, {"weights", d.weights}, {"chains", chains}},
        apply_augmix(image, d));
  }
  {
    Rng rng(9);
    EraseBox box;
    while (box.w == 0) box = draw_erasing(1.0, kW, kH, rng);
    cv::Mat erased = image.clone();
    erase(erased, box, cv::Vec3b(104, 116, 124));
    add("erase", {{"x", box.x}, {"y", box.y}, {"w", box.w}, {"h", box.h}, {"rgb", {124, 116, 104}}},
        erased);
  }

  // The augmentation spaces, and draws of the policies for the distribution test.
  nlohmann::json spaces;
  const std::vector<std::pair<std::string, Policy>> policies = {
      {"trivial_augment_wide", Policy::kTrivialAugmentWide},
      {"rand_augment", Policy::kRandAugment},
      {"auto_augment", Policy::kAutoAugment},
      {"augmix", Policy::kAugMix}};
  for (const auto& [name, policy] : policies) {
    nlohmann::json rows = nlohmann::json::array();
    for (const OpSpace& row : augmentation_space(policy, kH, kW)) {
      rows.push_back({op_name(row.op), row.signed_magnitude, row.magnitudes});
    }
    spaces[name] = rows;
  }
  {
    Rng rng(2024);
    std::ofstream ta(dir.file("draws_trivial_augment_wide.txt"));
    for (int i = 0; i < kDraws; ++i) {
      for (const OpDraw& d : draw_trivial_augment(kH, kW, rng)) {
        ta << op_name(d.op) << ' ' << nlohmann::json(d.magnitude).dump() << '\n';
      }
    }
    std::ofstream ra(dir.file("draws_rand_augment.txt"));
    for (int i = 0; i < kDraws / 2; ++i) {
      for (const OpDraw& d : draw_rand_augment(2, 9, kH, kW, rng)) {
        ra << op_name(d.op) << ' ' << nlohmann::json(d.magnitude).dump() << '\n';
      }
    }
  }
  const nlohmann::json manifest = {{"h", kH},
                                   {"w", kW},
                                   {"input", "input.rgb"},
                                   {"cases", cases},
                                   {"spaces", spaces},
                                   {"rand_augment_magnitude", 9},
                                   {"draws",
                                    {{"trivial_augment_wide", "draws_trivial_augment_wide.txt"},
                                     {"rand_augment", "draws_rand_augment.txt"}}}};
  std::ofstream(dir.file("manifest.json")) << manifest.dump(1);
  return dir.file("manifest.json");
}

void run_parity(const std::string& python, const std::string& manifest) {
  const std::string script = std::string(TRAINER_SOURCE_DIR) + "/tests/parity/augment_parity.py";
  const std::string command = python + " '" + script + "' --manifest '" + manifest + "'";
  const Run run = run_command(command);
  INFO("command: " << command << "\noutput:\n" << run.output);
  if (run.rc == 2) {
    FAIL(python << " lacks torch, torchvision or numpy (Debian: python3-torch python3-torchvision "
                   "python3-numpy; scripts/install-deps.sh)");
  }
  std::cout << "[parity] augment, " << python << ":\n" << run.output;
  REQUIRE(run.rc == 0);
}

}  // namespace

TEST_CASE("augmentation ops, tables and policy draws match torchvision", "[parity][augment]") {
  TempDir dir("augment_parity");
  const std::string manifest = write_cases(dir);
  SECTION("Debian's torchvision (TRAINER_PYTHON)") { run_parity(TRAINER_PYTHON, manifest); }
  SECTION("torchvision 0.26 (the PyTorch 2.11 venv)") {
    if (!std::filesystem::exists(kVenvPython)) {
      WARN("skipped: " << kVenvPython << " is absent (the PyTorch 2.11 venv is optional)");
      return;
    }
    run_parity(kVenvPython, manifest);
  }
}
