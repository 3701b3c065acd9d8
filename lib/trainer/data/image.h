// Decoding and preprocessing of one image, behind an interface with no OpenCV types (OpenCV is
// included only by image.cpp, transforms.h/.cpp and synthetic.cpp). The pipeline is:
// decode (OpenCV) -> [train: RandomResizedCrop | eval: Resize] -> [HorizontalFlip] ->
// to_tensor (BGR->RGB, the one conversion function) -> [S, S, 3] uint8. Batches travel as uint8
// (a quarter of the bytes of float32, no per-pixel float work on the decode threads) and are
// normalised in the graph by normalize_images(), on the model's device.
// Where the image is only resized (no RandomResizedCrop) and reduced_decode is on, a JPEG much
// larger than image_size is decoded at 1/2, 1/4 or 1/8 scale first (libjpeg DCT scaling).
// The cache (data.cache: memory) splits the pipeline in two: decode_resized() -> uint8 image
// (the cached value) -> augment(); RandomResizedCrop then crops the resized image.
// All randomness comes from the `seed` argument. const methods are thread-safe.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace trainer::data {

struct PreprocessOptions {
  int image_size = 224;
  bool train = false;  // apply the augmentations below
  bool horizontal_flip = false;
  bool random_resized_crop = false;
  double crop_scale_min = 0.08;
  bool reduced_decode = true;  // JPEG DCT-scaled decode on the resize path
};

class ImagePipeline {
 public:
  explicit ImagePipeline(PreprocessOptions options);
  // Decodes the file and returns a [S, S, 3] uint8 RGB tensor. Throws DataError naming the path
  // when the file is missing, unreadable or not a decodable image (a truncated JPEG included).
  torch::Tensor load(const std::string& path, uint64_t seed) const;
  // Same from encoded bytes already in memory (origin names them in errors).
  torch::Tensor decode(const std::string& bytes, const std::string& origin, uint64_t seed) const;
  // The cacheable first stage: decode (reduced when allowed) and resize to image_size square,
  // as a [S, S, 3] uint8 BGR tensor. Throws DataError naming `origin`.
  torch::Tensor decode_resized(const std::string& bytes, const std::string& origin) const;
  // The rest for a decode_resized() result: [train: RandomResizedCrop of it, resized back] ->
  // [HorizontalFlip] -> to_tensor. Without RandomResizedCrop the result equals
  // decode(bytes, origin, seed).
  torch::Tensor augment(const torch::Tensor& resized, uint64_t seed) const;
  const PreprocessOptions& options() const { return options_; }

 private:
  PreprocessOptions options_;
};

// The normalisations data.normalize names.
enum class Normalize { kUnit, kImagenet };
// "unit" | "imagenet"; anything else is a ConfigError naming `field`.
Normalize parse_normalize(const std::string& mode, const std::string& field = "data.normalize");

// The model's input from a batch of pipeline images: [B, S, S, 3] uint8 RGB on any device ->
// [B, 3, S, S] float32 on the same device, "unit" = x / 255, "imagenet" = (x / 255 - mean) / std
// with torchvision's mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225), computed in
// float32 in that order (the same values the per-pixel loop gave). channels_last: the result
// is in ChannelsLast memory format (no transpose at all: the uint8 batch is already NHWC),
// else contiguous NCHW.
// `constants` (norm_constants for the images' device) avoids making the mean and std tensors
// on every call; undefined ones are made here.
struct NormConstants {
  torch::Tensor mean, std;  // [1, 3, 1, 1] float32 (imagenet); undefined for unit
};
NormConstants norm_constants(Normalize mode, const torch::Device& device);
torch::Tensor normalize_images(const torch::Tensor& images, Normalize mode, bool channels_last,
                               const NormConstants& constants = {});

// A pipeline image as PNG bytes (for summaries): [H, W, 3] uint8 RGB, any device and strides.
// Anything else is Error(kInternal).
std::string encode_png(const torch::Tensor& image);

}  // namespace trainer::data
