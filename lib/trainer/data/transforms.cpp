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
#include <vector>

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

Interpolation parse_interpolation(const std::string& name, const std::string& field) {
  if (name == "bilinear") return Interpolation::kBilinear;
  if (name == "bicubic") return Interpolation::kBicubic;
  throw ConfigError(field + ": expected one of bilinear|bicubic, got '" + name + "'");
}

Resize::Resize(int size_, Interpolation interpolation_)
    : size(size_), interpolation(interpolation_) {
  if (size <= 0) internal("Resize: size must be >= 1, got " + std::to_string(size));
}

cv::Mat Resize::operator()(const cv::Mat& image) const {
  if (image.empty()) internal("Resize: empty image");
  cv::Mat out;
  cv::resize(image, out, cv::Size(size, size), 0, 0,
             interpolation == Interpolation::kBicubic ? cv::INTER_CUBIC : cv::INTER_LINEAR);
  return out;
}

namespace {

// Pillow's Resample.c, 8 bits per channel: coefficients in fixed point with this many
// fractional bits, sums started at one half, results shifted back and clamped.
constexpr int kPrecisionBits = 32 - 8 - 2;

double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// One axis's taps: output pixel i reads `count[i]` inputs from `first[i]` with weights
// k[i * ksize ...] (Pillow's precompute_coeffs and normalize_coeffs_8bpc).
struct AxisCoeffs {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> k;
};

AxisCoeffs axis_coeffs(int in_size, double in0, double in1, int out_size,
                       Interpolation interpolation) {
  const bool cubic = interpolation == Interpolation::kBicubic;
  const double filter_support = cubic ? 2.0 : 1.0;
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filter_support * filterscale;
  AxisCoeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.k.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> w(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = cubic ? bicubic_filter((x + xmin - center + 0.5) * ss)
                   : bilinear_filter((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[x] / ww : w[x];
      c.k[static_cast<size_t>(xx) * c.ksize + x] = static_cast<int32_t>(
          v < 0 ? -0.5 + v * (1 << kPrecisionBits) : 0.5 + v * (1 << kPrecisionBits));
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

inline uint8_t clip8(int32_t v) {
  v >>= kPrecisionBits;  // arithmetic shift, as Pillow's lookup table index
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

}  // namespace

cv::Mat resize_antialiased(const cv::Mat& image, cv::Size size, Interpolation interpolation,
                           cv::Rect2d box) {
  if (image.empty() || image.type() != CV_8UC3) {
    internal("resize_antialiased: expected a non-empty 8-bit 3-channel image");
  }
  if (size.width <= 0 || size.height <= 0) internal("resize_antialiased: empty output size");
  if (box.width <= 0 || box.height <= 0) box = cv::Rect2d(0, 0, image.cols, image.rows);
  if (box.x < 0 || box.y < 0 || box.x + box.width > image.cols || box.y + box.height > image.rows) {
    internal("resize_antialiased: the box is not inside the image");
  }
  constexpr int kCh = 3;
  const bool horizontal = size.width != image.cols || box.x != 0 || box.width != size.width;
  const bool vertical = size.height != image.rows || box.y != 0 || box.height != size.height;
  if (!horizontal && !vertical) return image.clone();
  const AxisCoeffs ch =
      axis_coeffs(image.cols, box.x, box.x + box.width, size.width, interpolation);
  const AxisCoeffs cv_ =
      axis_coeffs(image.rows, box.y, box.y + box.height, size.height, interpolation);
  constexpr int32_t kHalf = int32_t{1} << (kPrecisionBits - 1);

  // Horizontal pass over the rows the vertical pass reads (Pillow's ybox_first..ybox_last).
  cv::Mat rows = image;
  int row0 = 0;
  if (horizontal) {
    row0 = cv_.first.front();
    const int row_end = cv_.first.back() + cv_.count.back();
    cv::Mat tmp(row_end - row0, size.width, CV_8UC3);
    for (int y = 0; y < tmp.rows; ++y) {
      const uint8_t* in = image.ptr<uint8_t>(y + row0);
      uint8_t* out = tmp.ptr<uint8_t>(y);
      for (int xx = 0; xx < size.width; ++xx) {
        const int32_t* k = &ch.k[static_cast<size_t>(xx) * ch.ksize];
        const uint8_t* p = in + static_cast<ptrdiff_t>(ch.first[xx]) * kCh;
        int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
        for (int x = 0; x < ch.count[xx]; ++x, p += kCh) {
          s0 += p[0] * k[x];
          s1 += p[1] * k[x];
          s2 += p[2] * k[x];
        }
        out[xx * kCh + 0] = clip8(s0);
        out[xx * kCh + 1] = clip8(s1);
        out[xx * kCh + 2] = clip8(s2);
      }
    }
    rows = tmp;
  }
  if (!vertical) return rows;

  // Vertical pass, a row of sums at a time (integer sums: the order does not matter).
  cv::Mat out(size.height, rows.cols, CV_8UC3);
  const int n = rows.cols * kCh;
  std::vector<int32_t> sum(static_cast<size_t>(n));
  for (int yy = 0; yy < size.height; ++yy) {
    const int32_t* k = &cv_.k[static_cast<size_t>(yy) * cv_.ksize];
    std::fill(sum.begin(), sum.end(), kHalf);
    for (int y = 0; y < cv_.count[yy]; ++y) {
      const uint8_t* in = rows.ptr<uint8_t>(cv_.first[yy] - row0 + y);
      const int32_t w = k[y];
      for (int i = 0; i < n; ++i) sum[i] += in[i] * w;
    }
    uint8_t* o = out.ptr<uint8_t>(yy);
    for (int i = 0; i < n; ++i) o[i] = clip8(sum[i]);
  }
  return out;
}

ResizeShorterSide::ResizeShorterSide(int size_, Interpolation interpolation_)
    : size(size_), interpolation(interpolation_) {
  if (size <= 0) internal("ResizeShorterSide: size must be >= 1, got " + std::to_string(size));
}

cv::Size ResizeShorterSide::output_size(int width, int height) const {
  const int shorter = std::min(width, height);
  const int longer = std::max(width, height);
  // Python's int(size * long / short): the quotient as a double, truncated.
  const int new_long = static_cast<int>(static_cast<double>(int64_t{size} * longer) / shorter);
  return width <= height ? cv::Size(size, new_long) : cv::Size(new_long, size);
}

cv::Mat ResizeShorterSide::operator()(const cv::Mat& image) const {
  if (image.empty()) internal("ResizeShorterSide: empty image");
  const cv::Size out = output_size(image.cols, image.rows);
  if (out.width == image.cols && out.height == image.rows) return image;  // as torchvision
  return resize_antialiased(image, out, interpolation);
}

cv::Mat ResizeShorterSide::operator()(const cv::Mat& reduced, int width, int height,
                                      int reduction) const {
  if (reduction == 1) return (*this)(reduced);
  if (reduced.empty() || reduction < 1 || (width + reduction - 1) / reduction != reduced.cols ||
      (height + reduction - 1) / reduction != reduced.rows) {
    internal("ResizeShorterSide: the reduced image is not width x height / reduction");
  }
  // Reduced pixel i covers original pixels [i r, (i + 1) r): the original's extent is
  // [0, width / r) there (the last reduced column may cover a partial block).
  return resize_antialiased(reduced, output_size(width, height), interpolation,
                            cv::Rect2d(0, 0, static_cast<double>(width) / reduction,
                                       static_cast<double>(height) / reduction));
}

CenterCrop::CenterCrop(int size_) : size(size_) {
  if (size <= 0) internal("CenterCrop: size must be >= 1, got " + std::to_string(size));
}

cv::Rect CenterCrop::window(int width, int height) const {
  if (width < size || height < size) internal("CenterCrop::window: the image is smaller");
  // int(round((side - size) / 2.0)): half to even, as std::nearbyint by default.
  const int left = static_cast<int>(std::nearbyint((width - size) / 2.0));
  const int top = static_cast<int>(std::nearbyint((height - size) / 2.0));
  return cv::Rect(left, top, size, size);
}

cv::Mat CenterCrop::operator()(const cv::Mat& image) const {
  if (image.empty()) internal("CenterCrop: empty image");
  cv::Mat padded = image;
  if (image.cols < size || image.rows < size) {
    const int dw = std::max(size - image.cols, 0);
    const int dh = std::max(size - image.rows, 0);
    cv::copyMakeBorder(image, padded, dh / 2, (dh + 1) / 2, dw / 2, (dw + 1) / 2,
                       cv::BORDER_CONSTANT, cv::Scalar::all(0));
  }
  return padded(window(padded.cols, padded.rows));
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
