// Decoding and preprocessing of one image, behind an interface with no OpenCV types (OpenCV is
// included only by image.cpp, transforms.h/.cpp and synthetic.cpp). The pipeline is:
// decode (OpenCV) -> [train: RandomResizedCrop | eval: Resize] -> [HorizontalFlip] ->
// to_tensor (BGR->RGB, HWC->CHW, float, the one conversion function) -> normalize.
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
};

class ImagePipeline {
 public:
  explicit ImagePipeline(PreprocessOptions options);
  // Decodes the file and returns a [3, S, S] float tensor. Throws DataError naming the path when
  // the file is missing, unreadable or not a decodable image (a truncated JPEG included).
  torch::Tensor load(const std::string& path, uint64_t seed) const;
  // Same from encoded bytes already in memory (origin names them in errors).
  torch::Tensor decode(const std::string& bytes, const std::string& origin, uint64_t seed) const;
  const PreprocessOptions& options() const { return options_; }

 private:
  PreprocessOptions options_;
};

}  // namespace trainer::data
