#include "trainer/data/image.h"

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>
#include <utility>
#include <vector>

#include "trainer/data/augment.h"
#include "trainer/data/random.h"
#include "trainer/data/transforms.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"

namespace trainer::data {

ImagePipeline::ImagePipeline(PreprocessOptions options) : options_(std::move(options)) {
  if (options_.image_size < 1) {
    throw ConfigError("data.image_size: expected >= 1, got " + std::to_string(options_.image_size));
  }
  if (!(options_.crop_scale_min > 0.0 && options_.crop_scale_min <= 1.0)) {
    throw ConfigError("data.augment.crop_scale_min: expected a value in (0, 1], got " +
                      std::to_string(options_.crop_scale_min));
  }
  transforms::parse_interpolation(options_.interpolation);
  if (options_.eval_resize != "square" && options_.eval_resize != "shorter_side") {
    throw ConfigError("data.eval_resize: expected one of square|shorter_side, got '" +
                      options_.eval_resize + "'");
  }
  if (options_.eval_crop_size < 0 || options_.eval_resize_size < 0) {
    throw ConfigError("data.eval_crop_size, data.eval_resize_size: expected >= 0 (0 = auto)");
  }
  augmenter_ = std::make_shared<const augment::Augmenter>(options_);
  transforms::init_opencv_threads();
}

int PreprocessOptions::eval_resize_side() const {
  if (eval_resize_size > 0) return eval_resize_size;
  return static_cast<int>(std::lround(eval_crop() / 0.875));
}

torch::Tensor ImagePipeline::load(const std::string& path, uint64_t seed) const {
  return decode(util::read_file(path), path, seed);
}

namespace {

// Decodes at the reduction the pipeline allows when the next step is a plain resize to `size`.
cv::Mat decode_for_resize(const std::string& bytes, const std::string& origin, int size,
                          bool reduced) {
  const int reduction = reduced ? transforms::jpeg_reduction_for(bytes, size) : 1;
  return transforms::decode_bgr(bytes, origin, reduction);
}

// shorter_side with reduced_decode: the reduced image's shorter side must be at least this many
// times the resize (the antialiased filter then does most of the smoothing; see
// eval_preset_parity_test.cpp for the measured difference from torchvision's full decode).
constexpr int kReducedCover = 2;

// The evaluation preprocessing (options.train false), output_size() square, BGR: square = the
// whole image resized (no antialiasing, the tutorial's tf.image.resize); shorter_side =
// torchvision's Resize(eval_resize_side()) on a PIL image, then CenterCrop(eval_crop()).
// The reduced decode applies where the reduced image still covers the resize on both sides.
cv::Mat eval_image(const PreprocessOptions& o, const std::string& bytes,
                   const std::string& origin) {
  const int crop = o.eval_crop();
  const transforms::Interpolation interpolation = transforms::parse_interpolation(o.interpolation);
  if (o.eval_resize == "shorter_side") {
    const transforms::ResizeShorterSide resize(o.eval_resize_side(), interpolation);
    const transforms::CenterCrop center(crop);
    const int reduction =
        o.reduced_decode ? transforms::jpeg_reduction_for(bytes, kReducedCover * resize.size) : 1;
    const cv::Mat image = transforms::decode_bgr(bytes, origin, reduction);
    int width = 0;
    int height = 0;
    if (reduction > 1 && transforms::jpeg_size(bytes, &width, &height) &&
        image.cols == (width + reduction - 1) / reduction &&
        image.rows == (height + reduction - 1) / reduction) {
      return center(resize(image, width, height, reduction));
    }
    return center(resize(image));
  }
  return transforms::Resize(
      crop, interpolation)(decode_for_resize(bytes, origin, crop, o.reduced_decode));
}

// RandomResizedCrop, resized with data.interpolation's filter (bilinear: cv::INTER_LINEAR, as
// transforms::RandomResizedCrop; bicubic: cv::INTER_CUBIC).
cv::Mat random_resized_crop(const PreprocessOptions& o, const cv::Mat& image, Rng& rng,
                            nlohmann::json* drawn) {
  const transforms::CropBox box = transforms::RandomResizedCrop(o.image_size, o.crop_scale_min)
                                      .params(image.cols, image.rows, rng);
  if (drawn) (*drawn)["crop"] = {box.x, box.y, box.w, box.h};
  cv::Mat out;
  cv::resize(image(cv::Rect(box.x, box.y, box.w, box.h)), out, cv::Size(o.image_size, o.image_size),
             0, 0, o.interpolation == "bicubic" ? cv::INTER_CUBIC : cv::INTER_LINEAR);
  return out;
}

// The training chain after the crop (or resize): the horizontal flip (one draw, as
// transforms::HorizontalFlip), augment.h's chain, to_tensor. `image` may view a cached tensor:
// nothing here writes into it.
torch::Tensor train_tail(const PreprocessOptions& o, const augment::Augmenter& augmenter,
                         cv::Mat image, Rng& rng, nlohmann::json* drawn) {
  if (o.horizontal_flip) {
    const bool flip = uniform01(rng) < 0.5;
    if (flip) {
      cv::Mat flipped;
      cv::flip(image, flipped, 1);
      image = flipped;
    }
    if (drawn) (*drawn)["hflip"] = flip;
  }
  return transforms::to_tensor(augmenter(image, rng, drawn));
}

}  // namespace

torch::Tensor ImagePipeline::decode(const std::string& bytes, const std::string& origin,
                                    uint64_t seed, nlohmann::json* drawn) const {
  if (drawn) *drawn = nlohmann::json::object();
  if (!options_.train) return transforms::to_tensor(eval_image(options_, bytes, origin));
  const int size = options_.image_size;
  const bool crop = options_.random_resized_crop;
  cv::Mat image = crop ? transforms::decode_bgr(bytes, origin)
                       : decode_for_resize(bytes, origin, size, options_.reduced_decode);
  Rng rng(seed);
  if (crop) {
    image = random_resized_crop(options_, image, rng, drawn);
  } else {
    image =
        transforms::Resize(size, transforms::parse_interpolation(options_.interpolation))(image);
  }
  return train_tail(options_, *augmenter_, image, rng, drawn);
}

torch::Tensor ImagePipeline::decode_resized(const std::string& bytes,
                                            const std::string& origin) const {
  const int size = options_.output_size();
  const cv::Mat image =
      options_.train
          ? transforms::Resize(size, transforms::parse_interpolation(options_.interpolation))(
                decode_for_resize(bytes, origin, size, options_.reduced_decode))
          : eval_image(options_, bytes, origin);
  torch::Tensor out = torch::empty({size, size, 3}, torch::kUInt8);
  cv::Mat view(size, size, CV_8UC3, out.data_ptr<uint8_t>());
  image.copyTo(view);
  return out;
}

torch::Tensor ImagePipeline::augment(const torch::Tensor& resized, uint64_t seed,
                                     nlohmann::json* drawn) const {
  if (drawn) *drawn = nlohmann::json::object();
  const int size = options_.output_size();
  if (resized.dim() != 3 || resized.size(0) != size || resized.size(1) != size ||
      resized.size(2) != 3 || resized.scalar_type() != torch::kUInt8 || !resized.is_contiguous()) {
    throw Error(ErrorKind::kInternal,
                "ImagePipeline::augment: expected a contiguous [S, S, 3] "
                "uint8 image from decode_resized");
  }
  cv::Mat image(size, size, CV_8UC3, const_cast<uint8_t*>(resized.data_ptr<uint8_t>()));
  if (!options_.train) return transforms::to_tensor(image);
  Rng rng(seed);
  if (options_.random_resized_crop) image = random_resized_crop(options_, image, rng, drawn);
  return train_tail(options_, *augmenter_, image, rng, drawn);
}

Normalize parse_normalize(const std::string& mode, const std::string& field) {
  if (mode == "unit") return Normalize::kUnit;
  if (mode == "imagenet") return Normalize::kImagenet;
  throw ConfigError(field + ": expected one of unit|imagenet, got '" + mode + "'");
}

NormConstants norm_constants(Normalize mode, const torch::Device& device) {
  NormConstants c;
  if (mode != Normalize::kImagenet) return c;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  c.mean = torch::tensor({0.485f, 0.456f, 0.406f}, opts).view({1, 3, 1, 1});
  c.std = torch::tensor({0.229f, 0.224f, 0.225f}, opts).view({1, 3, 1, 1});
  return c;
}

torch::Tensor normalize_images(const torch::Tensor& images, Normalize mode, bool channels_last,
                               const NormConstants& constants) {
  if (images.dim() != 4 || images.size(3) != 3 || images.scalar_type() != torch::kUInt8) {
    std::ostringstream got;
    got << images.sizes() << " " << images.scalar_type();
    throw Error(ErrorKind::kInternal,
                "normalize_images: expected a [B, S, S, 3] uint8 batch, got " + got.str());
  }
  const torch::Tensor nchw = images.permute({0, 3, 1, 2});
  torch::Tensor x =
      torch::empty(nchw.sizes(), nchw.options().dtype(torch::kFloat32),
                   channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
  x.copy_(nchw);
  x.div_(255.0);
  if (mode == Normalize::kImagenet) {
    const bool given = constants.mean.defined() && constants.mean.device() == x.device();
    const NormConstants c = given ? constants : norm_constants(mode, x.device());
    x.sub_(c.mean);
    x.div_(c.std);
  }
  return x;
}

std::string encode_png(const torch::Tensor& image) {
  if (image.dim() != 3 || image.size(2) != 3 || image.scalar_type() != torch::kUInt8) {
    std::ostringstream got;
    got << image.sizes() << " " << image.scalar_type();
    throw Error(ErrorKind::kInternal,
                "encode_png: expected an [H, W, 3] uint8 image, got " + got.str());
  }
  const torch::Tensor rgb = image.to(torch::kCPU).contiguous();
  const cv::Mat view(static_cast<int>(rgb.size(0)), static_cast<int>(rgb.size(1)), CV_8UC3,
                     rgb.data_ptr<uint8_t>());
  cv::Mat bgr;
  cv::cvtColor(view, bgr, cv::COLOR_RGB2BGR);
  std::vector<uint8_t> png;
  if (!cv::imencode(".png", bgr, png)) {
    throw Error(ErrorKind::kInternal, "encode_png: OpenCV could not encode the image");
  }
  return std::string(png.begin(), png.end());
}

}  // namespace trainer::data
