// Decoding and preprocessing of one image, behind an interface with no OpenCV types (OpenCV is
// included only by image.cpp, transforms.h/.cpp and synthetic.cpp). The pipeline is:
// decode (OpenCV) -> [train: RandomResizedCrop | eval: Resize] -> [HorizontalFlip] ->
// to_tensor (BGR->RGB, the one conversion function) -> [S, S, 3] uint8. Batches travel as uint8
// (a quarter of the bytes of float32, no per-pixel float work on the decode threads) and are
// normalised in the graph by normalize_images(), on the model's device.
// Where the image is only resized (no RandomResizedCrop) and reduced_decode is on, a JPEG much
// larger than image_size is decoded at 1/2, 1/4 or 1/8 scale first (libjpeg DCT scaling).
// Evaluation (train false) gives output_size() squares: eval_resize square resizes the whole
// image (OpenCV, as the TensorFlow tutorial); shorter_side is torchvision's eval preset,
// Resize(eval_resize_side()) with PIL's antialiased filters then CenterCrop(eval_crop()), where
// the reduced decode applies only while both sides still cover the resize.
// The cache (data.cache: memory) splits the pipeline in two: decode_resized() -> uint8 image
// (the cached value) -> augment(); RandomResizedCrop then crops the resized image.
// All randomness comes from the `seed` argument. const methods are thread-safe.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace trainer::data {

// data.augment.color_jitter: torchvision's ColorJitter factors (0 = that part off).
struct ColorJitterOptions {
  double brightness = 0, contrast = 0, saturation = 0, hue = 0;
};

struct PreprocessOptions {
  int image_size = 224;  // the training crop (data.image_size)
  bool train = false;    // apply the augmentations below
  bool horizontal_flip = false;
  bool random_resized_crop = false;
  double crop_scale_min = 0.08;
  bool reduced_decode = true;  // JPEG DCT-scaled decode on the resize path
  // Training augmentation (data.augment.*), in torchvision's reference order after the crop and
  // flips: rotations, colour jitter, the policy, random erasing.
  bool vertical_flip = false;
  bool rotate90 = false;      // a random multiple of 90 degrees
  double rotate_degrees = 0;  // RandomRotation(-d, d); 0 = off
  ColorJitterOptions color_jitter;
  std::string policy = "none";  // none|trivial_augment_wide|rand_augment|auto_augment|augmix
  int magnitude = 0;          // rand_augment magnitude / augmix severity; 0 = the policy's default
  int num_ops = 0;            // rand_augment; 0 = the policy's default (2)
  double random_erasing = 0;  // probability; 0 = off
  std::string normalize = "imagenet";  // what random erasing fills with (the mean's pixel)
  // Resampling and evaluation (data.interpolation, data.eval_*): square = the whole image to
  // image_size x image_size (the TensorFlow tutorial); shorter_side = torchvision's
  // Resize(eval_resize_size) + CenterCrop(eval_crop_size).
  std::string interpolation = "bilinear";  // bilinear | bicubic
  std::string eval_resize = "square";      // square | shorter_side
  int eval_resize_size = 0;                // 0 = auto (see config: data.eval_resize_size)
  int eval_crop_size = 0;                  // 0 = image_size

  // The side of the square images the pipeline returns (and of the loader's batches):
  // image_size when training, else eval_crop().
  int output_size() const { return train ? image_size : eval_crop(); }
  // The evaluation input side: eval_crop_size, or image_size when 0 (auto).
  int eval_crop() const { return eval_crop_size > 0 ? eval_crop_size : image_size; }
  // shorter_side: the shorter side before the crop: eval_resize_size, or when 0 (auto)
  // round(eval_crop() / 0.875) (256 for 224, torchvision's ratio).
  int eval_resize_side() const;
};

namespace augment {
class Augmenter;  // augment.h: the training chain after the crop and flip
}

class ImagePipeline {
 public:
  explicit ImagePipeline(PreprocessOptions options);
  // Decodes the file and returns a [S, S, 3] uint8 RGB tensor. Throws DataError naming the path
  // when the file is missing, unreadable or not a decodable image (a truncated JPEG included).
  torch::Tensor load(const std::string& path, uint64_t seed) const;
  // Same from encoded bytes already in memory (origin names them in errors).
  // Training applies, in torchvision's order: RandomResizedCrop (data.interpolation) ->
  // horizontal flip -> vertical flip -> rotate90 -> RandomRotation -> ColorJitter -> policy ->
  // RandomErasing (augment.h). `drawn`, when given, receives what was drawn, one key per
  // operation that is on: {"crop": [x, y, w, h], "hflip": bool, "vflip": bool, "rotate90": k,
  // "rotate": degrees, "color_jitter": {"order": [...], "brightness": f, ...},
  // "policy": [{"op": name, "magnitude": m}, ...] (augmix: {"original", "weights", "chains"}),
  // "erase": [x, y, w, h] or null} (for `trainer preview`).
  torch::Tensor decode(const std::string& bytes, const std::string& origin, uint64_t seed,
                       nlohmann::json* drawn = nullptr) const;
  // The cacheable first stage: decode (reduced when allowed) and resize to image_size square
  // (eval: the whole evaluation preprocessing), as a [S, S, 3] uint8 BGR tensor,
  // S = output_size(). Throws DataError naming `origin`.
  torch::Tensor decode_resized(const std::string& bytes, const std::string& origin) const;
  // The rest for a decode_resized() result: [train: RandomResizedCrop of it, resized back] ->
  // [HorizontalFlip] -> to_tensor. Without RandomResizedCrop the result equals
  // decode(bytes, origin, seed).
  // `drawn` as for decode().
  torch::Tensor augment(const torch::Tensor& resized, uint64_t seed,
                        nlohmann::json* drawn = nullptr) const;
  const PreprocessOptions& options() const { return options_; }

 private:
  PreprocessOptions options_;
  std::shared_ptr<const augment::Augmenter> augmenter_;  // immutable, shared by copies
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
