#include "trainer/data/image.h"

#include <opencv2/core.hpp>

#include <utility>

#include "trainer/data/random.h"
#include "trainer/data/transforms.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"

namespace trainer::data {

ImagePipeline::ImagePipeline(PreprocessOptions options) : options_(std::move(options)) {
  if (options_.image_size < 1) {
    throw ConfigError("data.image_size: expected >= 1, got " + std::to_string(options_.image_size));
  }
  if (options_.normalize != "unit" && options_.normalize != "imagenet") {
    throw ConfigError("data.normalize: expected one of unit|imagenet, got '" + options_.normalize +
                      "'");
  }
  if (!(options_.crop_scale_min > 0.0 && options_.crop_scale_min <= 1.0)) {
    throw ConfigError("data.augment.crop_scale_min: expected a value in (0, 1], got " +
                      std::to_string(options_.crop_scale_min));
  }
  transforms::init_opencv_threads();
}

torch::Tensor ImagePipeline::load(const std::string& path, uint64_t seed) const {
  return decode(util::read_file(path), path, seed);
}

torch::Tensor ImagePipeline::decode(const std::string& bytes, const std::string& origin,
                                    uint64_t seed) const {
  cv::Mat image = transforms::decode_bgr(bytes, origin);
  Rng rng(seed);
  const int size = options_.image_size;
  if (options_.train && options_.random_resized_crop) {
    image = transforms::RandomResizedCrop(size, options_.crop_scale_min)(image, rng);
  } else {
    image = transforms::Resize(size)(image);
  }
  if (options_.train && options_.horizontal_flip)
    image = transforms::HorizontalFlip(0.5)(image, rng);
  torch::Tensor out = transforms::to_tensor(image);
  transforms::normalize_(out, options_.normalize);
  return out;
}

}  // namespace trainer::data
