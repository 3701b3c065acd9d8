// Decoding and preprocessing of one image, behind an interface with no OpenCV types (OpenCV is
// included only by image.cpp, transforms.h/.cpp and synthetic.cpp). The pipeline is:
// decode (OpenCV) -> [train: RandomResizedCrop | eval: Resize] -> [HorizontalFlip] ->
// to_tensor (BGR->RGB, HWC->CHW, float, the one conversion function) -> normalize.
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
  std::string normalize = "imagenet";  // unit | imagenet
  bool train = false;                  // apply the augmentations below
  bool horizontal_flip = false;
  bool random_resized_crop = false;
  double crop_scale_min = 0.08;
  bool reduced_decode = true;  // JPEG DCT-scaled decode on the resize path
};

class ImagePipeline {
 public:
  explicit ImagePipeline(PreprocessOptions options);
  // Decodes the file and returns a [3, S, S] float tensor. Throws DataError naming the path when
  // the file is missing, unreadable or not a decodable image (a truncated JPEG included).
  torch::Tensor load(const std::string& path, uint64_t seed) const;
  // Same from encoded bytes already in memory (origin names them in errors).
  torch::Tensor decode(const std::string& bytes, const std::string& origin, uint64_t seed) const;
  // The cacheable first stage: decode (reduced when allowed) and resize to image_size square,
  // as a [S, S, 3] uint8 BGR tensor. Throws DataError naming `origin`.
  torch::Tensor decode_resized(const std::string& bytes, const std::string& origin) const;
  // The rest for a decode_resized() result: [train: RandomResizedCrop of it, resized back] ->
  // [HorizontalFlip] -> to_tensor -> normalize. Without RandomResizedCrop the result equals
  // decode(bytes, origin, seed).
  torch::Tensor augment(const torch::Tensor& resized, uint64_t seed) const;
  const PreprocessOptions& options() const { return options_; }

 private:
  PreprocessOptions options_;
};

}  // namespace trainer::data
