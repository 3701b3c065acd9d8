// OpenCV-side image transforms (internal to data/: include only from image.cpp, synthetic.cpp
// and tests, never from a public header). Small functors in torchvision's style: each validates
// its input and takes its randomness from an explicit engine. to_tensor() is the one function
// that turns a cv::Mat into a tensor (BGR->RGB, still HWC uint8: normalisation happens on the
// batch, in the graph; see data::normalize_images).
// Stateless apart from the engine passed in; thread-safe.
#pragma once

#include <torch/torch.h>

#include <opencv2/core.hpp>

#include <string>

#include "trainer/data/random.h"

namespace trainer::data::transforms {

// Disables OpenCV's own thread pool (once per process), so decode threads do not each spawn one.
void init_opencv_threads();

// True when `bytes` start with a JPEG SOI marker (FF D8).
bool looks_like_jpeg(const std::string& bytes);
// True when a JPEG stream does not end with the EOI marker (FF D9) once trailing zero/whitespace
// padding is trimmed: libjpeg decodes such a truncated file partially without failing.
bool jpeg_is_truncated(const std::string& bytes);

// Decodes encoded bytes to an 8-bit BGR image (cv::IMREAD_COLOR, EXIF orientation ignored as
// tf.image.decode_jpeg and PIL do). reduction 2, 4 or 8 decodes a JPEG at that fraction of its
// size through libjpeg's DCT scaling (cv::IMREAD_REDUCED_COLOR_*), far cheaper than a full
// decode. Throws DataError naming `origin` for empty, truncated or undecodable data.
cv::Mat decode_bgr(const std::string& bytes, const std::string& origin, int reduction = 1);

// The most pixels an image may have (8192 x 8192: a 192 MiB BGR buffer); a bigger one is a
// DataError before anything is allocated for it.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;

// Width and height from the header of a JPEG (frame header), PNG (IHDR) or BMP, the formats
// decode_bgr accepts; false for anything else or a header it cannot read.
bool image_header_size(const std::string& bytes, int* width, int* height);

// Width and height from a JPEG's frame header (SOFn), without decoding; false when `bytes` is
// not a JPEG or has no readable frame header.
bool jpeg_size(const std::string& bytes, int* width, int* height);

// The largest reduction in {8, 4, 2} whose decoded image (ceil(side / r), as libjpeg scales)
// still has both sides >= min_side, else 1. Non-JPEG data: 1.
int jpeg_reduction_for(const std::string& bytes, int min_side);

// The resampling filters data.interpolation names.
enum class Interpolation { kBilinear, kBicubic };
// "bilinear" | "bicubic"; anything else is a ConfigError naming `field`.
Interpolation parse_interpolation(const std::string& name,
                                  const std::string& field = "data.interpolation");

// Resize to size x size (the whole image, aspect ratio not kept), half-pixel centres as
// tf.image.resize and no antialiasing (tf.image.resize's default): bilinear = cv::INTER_LINEAR,
// bicubic = cv::INTER_CUBIC.
struct Resize {
  explicit Resize(int size, Interpolation interpolation = Interpolation::kBilinear);
  cv::Mat operator()(const cv::Mat& image) const;
  int size;
  Interpolation interpolation;
};

// PIL's Image.resize (Pillow's Resample.c, as torchvision's Resize runs on PIL images): a
// separable convolution, horizontal pass then vertical, whose filter (PIL's BILINEAR triangle or
// BICUBIC a = -0.5) is widened by the scale factor when reducing, so a downscale is antialiased;
// 8-bit fixed-point coefficients (22 fractional bits) and rounding as Pillow's, so the same
// input pixels give Pillow's output pixels. Any 8-bit 3-channel image; channel order is kept.
// `box` is the part of `image` resampled (Pillow's box argument, fractional pixel coordinates);
// empty = the whole image.
cv::Mat resize_antialiased(const cv::Mat& image, cv::Size size, Interpolation interpolation,
                           cv::Rect2d box = {});

// torchvision's Resize(size) with an int size: the shorter side to `size`, the longer to
// int(size * long / short) (torchvision's truncation), resampled by resize_antialiased.
struct ResizeShorterSide {
  ResizeShorterSide(int size, Interpolation interpolation = Interpolation::kBilinear);
  cv::Size output_size(int width, int height) const;
  cv::Mat operator()(const cv::Mat& image) const;
  // The same for an image of width x height decoded at 1/reduction scale (decode_bgr's
  // reduction; its sides ceil(side / reduction)): the output size of the original, resampled from
  // the reduced image's part that the original covers, so only the pixel values change.
  cv::Mat operator()(const cv::Mat& reduced, int width, int height, int reduction) const;
  int size;
  Interpolation interpolation;
};

// torchvision's CenterCrop(size): the size x size window at left = round((width - size) / 2),
// top = round((height - size) / 2), Python's round (half to even). A side smaller than `size` is
// first padded with zeros as torchvision pads (the extra pixel, if odd, on the right/bottom).
// The result may be a view into `image` (no copy).
struct CenterCrop {
  explicit CenterCrop(int size);
  cv::Rect window(int width, int height) const;  // only for width, height >= size
  cv::Mat operator()(const cv::Mat& image) const;
  int size;
};

// The crop window RandomResizedCrop picks: x/y = left/top column/row, w x h pixels.
struct CropBox {
  int x = 0;
  int y = 0;
  int w = 0;
  int h = 0;
};

// torchvision's RandomResizedCrop: 10 attempts at a crop of area fraction in `scale` and aspect
// ratio (log-uniform) in `ratio` that fits, else the central crop clamped to `ratio`; the crop
// is then resized to size x size (bilinear).
struct RandomResizedCrop {
  RandomResizedCrop(int size, double scale_min = 0.08, double scale_max = 1.0,
                    double ratio_min = 3.0 / 4.0, double ratio_max = 4.0 / 3.0);
  CropBox params(int width, int height, Rng& rng) const;
  cv::Mat operator()(const cv::Mat& image, Rng& rng) const;
  int size;
  double scale_min, scale_max, ratio_min, ratio_max;
};

// Flips left-right with probability p (one draw from the engine whatever p is).
struct HorizontalFlip {
  explicit HorizontalFlip(double p = 0.5);
  cv::Mat operator()(const cv::Mat& image, Rng& rng) const;
  double p;
};

// The one cv::Mat -> tensor conversion: 8-bit 3-channel BGR HxW -> [H, W, 3] uint8 RGB,
// contiguous. Runs on the calling thread (no intra-op pool).
torch::Tensor to_tensor(const cv::Mat& bgr);

}  // namespace trainer::data::transforms
