// Training-time augmentation after the crop and the horizontal flip (internal to data/: include
// only from image.cpp, augment.cpp and tests, never from a public header): vertical flip,
// rotations by 90 degrees, RandomRotation, ColorJitter, the policies (TrivialAugmentWide,
// RandAugment, AutoAugment ImageNet, AugMix) and RandomErasing, in torchvision's order.
// Each op is a deterministic function of 8-bit 3-channel BGR images that gives what
// torchvision.transforms.functional gives on the same uint8 [3, H, W] RGB tensor (its
// _functional_tensor code, float32 arithmetic replayed where it is a point op; geometric ops use
// torch's grid_sample index arithmetic). Parameters are drawn apart from applying them (draw_*),
// from the Rng only, in a fixed order. Point ops are LUTs; nothing here calls LibTorch.
// Stateless apart from the engine passed in; thread-safe.
#pragma once

#include <opencv2/core.hpp>

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <string>
#include <vector>

#include "trainer/data/image.h"
#include "trainer/data/random.h"

namespace trainer::data::augment {

// grid_sample's modes. RandomRotation uses nearest (its default); the policies bilinear, as
// torchvision's classification reference passes its --interpolation (bilinear) to them; AugMix
// bilinear. Outside the image is 0 (torchvision's fill=None / fill=0).
enum class Interp { kNearest, kBilinear };

// ---- Functional ops (F.* on a uint8 tensor) ----
cv::Mat vflip(const cv::Mat& image);         // F.vflip
cv::Mat rot90(const cv::Mat& image, int k);  // torch.rot90(img, k, dims=(-2, -1)): CCW
// torchvision's _get_inverse_affine_matrix (center relative to the image centre, as the tensor
// path passes it; angle and shear in degrees).
std::array<double, 6> inverse_affine_matrix(const std::array<double, 2>& center, double angle,
                                            const std::array<double, 2>& translate, double scale,
                                            const std::array<double, 2>& shear);
// _functional_tensor.affine with that inverse matrix (same size out, outside = 0).
cv::Mat affine(const cv::Mat& image, const std::array<double, 6>& inverse_matrix, Interp interp);
cv::Mat rotate(const cv::Mat& image, double degrees, Interp interp);  // F.rotate, CCW, centre
cv::Mat adjust_brightness(const cv::Mat& image, double factor);
cv::Mat adjust_contrast(const cv::Mat& image, double factor);
cv::Mat adjust_saturation(const cv::Mat& image, double factor);
cv::Mat adjust_hue(const cv::Mat& image, double hue_factor);  // in [-0.5, 0.5]
cv::Mat adjust_sharpness(const cv::Mat& image, double factor);
cv::Mat posterize(const cv::Mat& image, int bits);
cv::Mat solarize(const cv::Mat& image, double threshold);
cv::Mat autocontrast(const cv::Mat& image);
cv::Mat equalize(const cv::Mat& image);
cv::Mat invert(const cv::Mat& image);

// ---- The policies' ops (autoaugment.py's _apply_op) ----
enum class Op {
  kIdentity,
  kShearX,
  kShearY,
  kTranslateX,
  kTranslateY,
  kRotate,
  kBrightness,
  kColor,
  kContrast,
  kSharpness,
  kPosterize,
  kSolarize,
  kAutoContrast,
  kEqualize,
  kInvert,
};
const char* op_name(Op op);
Op op_from_name(const std::string& name);  // Error(kInternal) for an unknown name
cv::Mat apply_op(const cv::Mat& image, Op op, double magnitude, Interp interp);

enum class Policy { kNone, kTrivialAugmentWide, kRandAugment, kAutoAugment, kAugMix };
// none|trivial_augment_wide|rand_augment|auto_augment|augmix; else ConfigError naming `field`.
Policy parse_policy(const std::string& name, const std::string& field = "data.augment.policy");

// One row of a policy's augmentation space: the op, whether its magnitude gets a random sign,
// and its magnitudes (torch.linspace(lo, hi, bins) values, each rounded to float32 as torch holds
// them; Posterize's integer bins; empty for ops without a magnitude).
struct OpSpace {
  Op op;
  bool signed_magnitude;
  std::vector<double> magnitudes;
};
// autoaugment.py's _augmentation_space, in its dict order: TrivialAugmentWide (bins 31),
// RandAugment (bins 31), AutoAugment (bins 10, Invert included) and AugMix (bins 10, all_ops)
// for an image of height h and width w.
std::vector<OpSpace> augmentation_space(Policy policy, int h, int w);

struct OpDraw {
  Op op = Op::kIdentity;
  double magnitude = 0;  // signed, as _apply_op receives it
};

std::vector<OpDraw> draw_trivial_augment(int h, int w, Rng& rng);
std::vector<OpDraw> draw_rand_augment(int num_ops, int magnitude, int h, int w, Rng& rng);
// AutoAugment(IMAGENET): the ops of the drawn sub-policy whose probability passed.
std::vector<OpDraw> draw_auto_augment(int h, int w, Rng& rng);

// AugMix(severity, mixture_width=3, chain_depth=-1, alpha=1, all_ops=True).
struct AugMixDraw {
  float original = 0;          // m[0], the original image's weight
  std::vector<float> weights;  // Dirichlet(1,1,1) * m[1], one per chain
  std::vector<std::vector<OpDraw>> chains;
};
AugMixDraw draw_augmix(int severity, int h, int w, Rng& rng);
cv::Mat apply_augmix(const cv::Mat& image, const AugMixDraw& draw);  // bilinear, float32 mix

// Dirichlet(alpha) from normalised Gamma draws (random.h's gamma_sample: Marsaglia-Tsang over a
// Box-Muller normal, no std:: distributions).
std::vector<double> dirichlet(Rng& rng, const std::vector<double>& alpha);

// ColorJitter: torchvision's get_params (randperm(4), then a factor for each part that is on,
// in the order brightness, contrast, saturation, hue); -1 = that part off.
struct ColorJitterDraw {
  std::array<int, 4> order{0, 1, 2, 3};  // 0 brightness, 1 contrast, 2 saturation, 3 hue
  double brightness = -1, contrast = -1, saturation = -1;
  double hue = -2;  // off below -1
};
ColorJitterDraw draw_color_jitter(const ColorJitterOptions& options, Rng& rng);
cv::Mat apply_color_jitter(const cv::Mat& image, const ColorJitterDraw& draw);

// RandomErasing(p, scale (0.02, 0.33), ratio (0.3, 3.3)): one draw for p, then get_params' ten
// attempts. x/y = left column/top row; w = 0 when nothing is erased.
struct EraseBox {
  int x = 0, y = 0, w = 0, h = 0;
};
EraseBox draw_erasing(double p, int w, int h, Rng& rng);
void erase(cv::Mat& image, const EraseBox& box, const cv::Vec3b& bgr);

// The training chain after RandomResizedCrop and the horizontal flip, as PreprocessOptions sets
// it: vertical flip -> rotate90 -> RandomRotation -> ColorJitter -> policy -> RandomErasing (on
// the uint8 image, filled with the pixel that normalises to 0). The constructor validates the
// options (ConfigError naming the field). With every option off it draws nothing.
class Augmenter {
 public:
  explicit Augmenter(const PreprocessOptions& options);
  bool active() const { return active_; }
  // `drawn` (may be null) receives one key per operation that is on.
  cv::Mat operator()(cv::Mat image, Rng& rng, nlohmann::json* drawn) const;
  cv::Vec3b erase_fill() const { return erase_fill_; }

 private:
  PreprocessOptions options_;
  Policy policy_ = Policy::kNone;
  int magnitude_ = 0;  // rand_augment's magnitude, augmix's severity (resolved)
  int num_ops_ = 0;
  bool jitter_ = false;
  bool active_ = false;
  cv::Vec3b erase_fill_{0, 0, 0};  // BGR
};

}  // namespace trainer::data::augment
