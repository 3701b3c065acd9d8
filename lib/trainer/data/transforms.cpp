#include "trainer/data/transforms.h"

#include <opencv2/core/utility.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "trainer/util/error.h"

namespace trainer::data::transforms {

namespace {

[[noreturn]] void internal(const std::string& what) { throw Error(ErrorKind::kInternal, what); }

bool is_padding(unsigned char c) {
  return c == 0x00 || c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

// Position of the last `FF <marker>` pair in bytes, or npos.
size_t find_last_marker(const std::string& bytes, unsigned char marker) {
  for (size_t i = bytes.size(); i >= 2; --i) {
    if (static_cast<unsigned char>(bytes[i - 2]) == 0xFF &&
        static_cast<unsigned char>(bytes[i - 1]) == marker) {
      return i - 2;
    }
  }
  return std::string::npos;
}

}  // namespace

void init_opencv_threads() {
  static std::once_flag once;
  std::call_once(once, [] {
    cv::setNumThreads(0);
    // OpenCV's own bound on a decoded image (read once, at the first decode; 2^30 pixels by
    // default, a 3 GiB buffer) made ours, for formats whose header decode_bgr cannot read.
    ::setenv("OPENCV_IO_MAX_IMAGE_PIXELS", std::to_string(kMaxImagePixels).c_str(), 0);
  });
}

bool looks_like_jpeg(const std::string& bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0xFF &&
         static_cast<unsigned char>(bytes[1]) == 0xD8;
}

bool jpeg_is_truncated(const std::string& bytes) {
  size_t end = bytes.size();
  while (end > 0 && is_padding(static_cast<unsigned char>(bytes[end - 1]))) --end;
  if (end >= 4 && static_cast<unsigned char>(bytes[end - 2]) == 0xFF &&
      static_cast<unsigned char>(bytes[end - 1]) == 0xD9) {
    return false;  // the common case: the stream ends with EOI
  }
  // Some writers append trailers after EOI. Inside entropy-coded data a 0xFF byte is always
  // followed by 0x00 or a restart marker, so an EOI (FF D9) after the last start-of-scan
  // (FF DA) can only be the real end of the image.
  const size_t sos = find_last_marker(bytes, 0xDA);
  if (sos == std::string::npos) return true;
  const size_t eoi = find_last_marker(bytes, 0xD9);
  return eoi == std::string::npos || eoi < sos;
}

bool jpeg_size(const std::string& bytes, int* width, int* height) {
  if (!looks_like_jpeg(bytes)) return false;
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 2;
  while (i + 4 <= n) {
    if (b[i] != 0xFF) return false;
    const unsigned char marker = b[i + 1];
    if (marker == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) {
      i += 2;  // markers without a length
      continue;
    }
    const size_t len = (static_cast<size_t>(b[i + 2]) << 8) | b[i + 3];
    if (len < 2) return false;
    const bool sof =
        marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (sof) {
      if (i + 9 > n) return false;
      *height = (b[i + 5] << 8) | b[i + 6];
      *width = (b[i + 7] << 8) | b[i + 8];
      return *width > 0 && *height > 0;
    }
    if (marker == 0xDA || marker == 0xD9) return false;  // scan data before any frame header
    i += 2 + len;
  }
  return false;
}

namespace {

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
int32_t le32(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) |
                              (uint32_t{p[3]} << 24));
}

}  // namespace

bool image_header_size(const std::string& bytes, int* width, int* height) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  if (looks_like_jpeg(bytes)) return jpeg_size(bytes, width, height);
  if (n >= 24 && std::memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0 &&
      std::memcmp(b + 12, "IHDR", 4) == 0) {
    const uint32_t w = be32(b + 16);
    const uint32_t h = be32(b + 20);
    if (w == 0 || h == 0 || w > 0x7fffffffu || h > 0x7fffffffu) return false;
    *width = static_cast<int>(w);
    *height = static_cast<int>(h);
    return true;
  }
  if (n >= 26 && b[0] == 'B' && b[1] == 'M') {
    const uint32_t info_size = static_cast<uint32_t>(le32(b + 14));
    int64_t w = 0;
    int64_t h = 0;
    if (info_size == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit sizes
      w = b[18] | (b[19] << 8);
      h = b[20] | (b[21] << 8);
    } else {
      w = le32(b + 18);
      h = le32(b + 22);
      if (h < 0) h = -h;  // top-down rows
    }
    if (w <= 0 || h <= 0 || w > 0x7fffffff || h > 0x7fffffff) return false;
    *width = static_cast<int>(w);
    *height = static_cast<int>(h);
    return true;
  }
  return false;
}

int jpeg_reduction_for(const std::string& bytes, int min_side) {
  int w = 0;
  int h = 0;
  if (min_side < 1 || !jpeg_size(bytes, &w, &h)) return 1;
  for (const int r : {8, 4, 2}) {
    if ((w + r - 1) / r >= min_side && (h + r - 1) / r >= min_side) return r;
  }
  return 1;
}

cv::Mat decode_bgr(const std::string& bytes, const std::string& origin, int reduction) {
  const std::string where = "cannot decode image '" + origin + "': ";
  if (bytes.empty()) throw DataError(where + "the file is empty");
  if (bytes.size() > static_cast<size_t>(INT_MAX)) throw DataError(where + "the file is too large");
  if (looks_like_jpeg(bytes) && jpeg_is_truncated(bytes)) {
    throw DataError(where +
                    "truncated JPEG (no end-of-image marker FF D9); hint: re-download or "
                    "re-encode the file");
  }
  int width = 0;
  int height = 0;
  if (!image_header_size(bytes, &width, &height)) {
    throw DataError(where + "not a JPEG, PNG or BMP image (or its header is damaged)");
  }
  if (static_cast<int64_t>(width) * height > kMaxImagePixels) {
    throw DataError(where + "the image is " + std::to_string(width) + " x " +
                    std::to_string(height) + " pixels, more than the limit of " +
                    std::to_string(kMaxImagePixels) + " pixels");
  }
  const cv::Mat buffer(1, static_cast<int>(bytes.size()), CV_8UC1, const_cast<char*>(bytes.data()));
  cv::Mat image;
  try {
    int flags = cv::IMREAD_COLOR;
    if (reduction == 2) flags = cv::IMREAD_REDUCED_COLOR_2;
    if (reduction == 4) flags = cv::IMREAD_REDUCED_COLOR_4;
    if (reduction == 8) flags = cv::IMREAD_REDUCED_COLOR_8;
    image = cv::imdecode(buffer, flags | cv::IMREAD_IGNORE_ORIENTATION);
  } catch (const cv::Exception& e) {
    throw DataError(where + "OpenCV: " + e.what());
  }
  if (image.empty()) {
    throw DataError(where + "not a decodable image (corrupt, truncated or an unsupported format)");
  }
  if (image.type() != CV_8UC3) internal(where + "OpenCV returned an image that is not 8-bit BGR");
  return image;
}

Resize::Resize(int size_) : size(size_) {
  if (size <= 0) internal("Resize: size must be >= 1, got " + std::to_string(size));
}

cv::Mat Resize::operator()(const cv::Mat& image) const {
  if (image.empty()) internal("Resize: empty image");
  cv::Mat out;
  cv::resize(image, out, cv::Size(size, size), 0, 0, cv::INTER_LINEAR);
  return out;
}

RandomResizedCrop::RandomResizedCrop(int size_, double scale_min_, double scale_max_,
                                     double ratio_min_, double ratio_max_)
    : size(size_),
      scale_min(scale_min_),
      scale_max(scale_max_),
      ratio_min(ratio_min_),
      ratio_max(ratio_max_) {
  if (size <= 0) internal("RandomResizedCrop: size must be >= 1, got " + std::to_string(size));
  if (!(scale_min > 0.0 && scale_min <= scale_max && scale_max <= 1.0)) {
    internal("RandomResizedCrop: expected 0 < scale_min <= scale_max <= 1, got (" +
             std::to_string(scale_min) + ", " + std::to_string(scale_max) + ")");
  }
  if (!(ratio_min > 0.0 && ratio_min <= ratio_max)) {
    internal("RandomResizedCrop: expected 0 < ratio_min <= ratio_max");
  }
}

CropBox RandomResizedCrop::params(int width, int height, Rng& rng) const {
  const double area = static_cast<double>(width) * static_cast<double>(height);
  const double log_ratio_min = std::log(ratio_min);
  const double log_ratio_max = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * uniform(rng, scale_min, scale_max);
    const double aspect = std::exp(uniform(rng, log_ratio_min, log_ratio_max));
    // Python's round(): half to even, as std::nearbyint in the default rounding mode.
    const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(target_area * aspect)));
    const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(target_area / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      CropBox box;
      box.w = static_cast<int>(w);
      box.h = static_cast<int>(h);
      box.y = static_cast<int>(uniform_int(rng, 0, height - h + 1));
      box.x = static_cast<int>(uniform_int(rng, 0, width - w + 1));
      return box;
    }
  }
  // Fallback: the central crop, clamped to the ratio range.
  CropBox box;
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  if (in_ratio < ratio_min) {
    box.w = width;
    box.h = static_cast<int>(std::nearbyint(width / ratio_min));
  } else if (in_ratio > ratio_max) {
    box.h = height;
    box.w = static_cast<int>(std::nearbyint(height * ratio_max));
  } else {
    box.w = width;
    box.h = height;
  }
  box.w = std::clamp(box.w, 1, width);
  box.h = std::clamp(box.h, 1, height);
  box.y = (height - box.h) / 2;
  box.x = (width - box.w) / 2;
  return box;
}

cv::Mat RandomResizedCrop::operator()(const cv::Mat& image, Rng& rng) const {
  if (image.empty()) internal("RandomResizedCrop: empty image");
  const CropBox box = params(image.cols, image.rows, rng);
  cv::Mat out;
  cv::resize(image(cv::Rect(box.x, box.y, box.w, box.h)), out, cv::Size(size, size), 0, 0,
             cv::INTER_LINEAR);
  return out;
}

HorizontalFlip::HorizontalFlip(double p_) : p(p_) {
  if (!(p >= 0.0 && p <= 1.0)) internal("HorizontalFlip: p must be in [0, 1]");
}

cv::Mat HorizontalFlip::operator()(const cv::Mat& image, Rng& rng) const {
  if (image.empty()) internal("HorizontalFlip: empty image");
  if (uniform01(rng) < p) {
    cv::Mat out;
    cv::flip(image, out, 1);
    return out;
  }
  return image;
}

torch::Tensor to_tensor(const cv::Mat& bgr) {
  if (bgr.empty() || bgr.type() != CV_8UC3) {
    internal("to_tensor: expected a non-empty 8-bit 3-channel BGR image");
  }
  torch::Tensor out = torch::empty({bgr.rows, bgr.cols, 3}, torch::kUInt8);
  cv::Mat rgb(bgr.rows, bgr.cols, CV_8UC3, out.data_ptr<uint8_t>());
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  if (rgb.data != out.data_ptr<uint8_t>()) internal("to_tensor: OpenCV reallocated the output");
  return out;
}

}  // namespace trainer::data::transforms
