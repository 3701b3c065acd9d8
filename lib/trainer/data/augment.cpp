#include "trainer/data/augment.h"

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>

#include "trainer/util/error.h"

namespace trainer::data::augment {

namespace {

[[noreturn]] void internal(const std::string& what) { throw Error(ErrorKind::kInternal, what); }

void check_image(const cv::Mat& image, const char* who) {
  if (image.empty() || image.type() != CV_8UC3) {
    internal(std::string(who) + ": expected a non-empty 8-bit 3-channel image");
  }
}

constexpr double kPi = 3.14159265358979323846;
// CPython's math.radians / math.degrees.
double radians(double degrees) { return degrees * (kPi / 180.0); }
double degrees(double radians) { return radians * (180.0 / kPi); }

float f32(double v) { return static_cast<float>(v); }

// (x).clamp(0, 255).to(torch.uint8) of a float32 value: clamp, then truncate.
uint8_t clamp_trunc(float v) {
  if (!(v > 0.0f)) return 0;
  if (v >= 255.0f) return 255;
  return static_cast<uint8_t>(v);
}

// A point op: the same 256-entry table on every channel.
cv::Mat apply_lut(const cv::Mat& image, const std::array<uint8_t, 256>& table) {
  cv::Mat lut(1, 256, CV_8UC1, const_cast<uint8_t*>(table.data()));
  cv::Mat out;
  cv::LUT(image, lut, out);
  return out;
}

// One table per channel (BGR order of the image).
cv::Mat apply_lut3(const cv::Mat& image, const std::array<std::array<uint8_t, 256>, 3>& tables) {
  cv::Mat lut(1, 256, CV_8UC3);
  for (int v = 0; v < 256; ++v) {
    lut.at<cv::Vec3b>(0, v) = cv::Vec3b(tables[0][v], tables[1][v], tables[2][v]);
  }
  cv::Mat out;
  cv::LUT(image, lut, out);
  return out;
}

// rgb_to_grayscale on uint8: (0.2989 r + 0.587 g + 0.114 b) in float32, truncated to uint8.
struct GrayTables {
  std::array<float, 256> r, g, b;
  GrayTables() {
    for (int v = 0; v < 256; ++v) {
      r[v] = 0.2989f * static_cast<float>(v);
      g[v] = 0.587f * static_cast<float>(v);
      b[v] = 0.114f * static_cast<float>(v);
    }
  }
  uint8_t operator()(const uint8_t* bgr) const {
    const float sum = (r[bgr[2]] + g[bgr[1]]) + b[bgr[0]];
    return static_cast<uint8_t>(sum);
  }
};

const GrayTables& gray_tables() {
  static const GrayTables tables;
  return tables;
}

// _blend(img1, img2, ratio) = (ratio * img1 + (1 - ratio) * img2).clamp(0, 255).to(uint8), in
// float32 as torch computes it, as two tables of products.
struct Blend {
  std::array<float, 256> a, b;
  explicit Blend(double ratio) {
    const float rf = f32(ratio);
    const float qf = f32(1.0 - ratio);
    for (int v = 0; v < 256; ++v) {
      a[v] = rf * static_cast<float>(v);
      b[v] = qf * static_cast<float>(v);
    }
  }
  uint8_t operator()(uint8_t v1, uint8_t v2) const { return clamp_trunc(a[v1] + b[v2]); }
};

}  // namespace

// ---- Geometry ----

cv::Mat vflip(const cv::Mat& image) {
  check_image(image, "vflip");
  cv::Mat out;
  cv::flip(image, out, 0);
  return out;
}

cv::Mat rot90(const cv::Mat& image, int k) {
  check_image(image, "rot90");
  k = ((k % 4) + 4) % 4;
  if (k == 0) return image;
  cv::Mat out;
  const int codes[] = {0, cv::ROTATE_90_COUNTERCLOCKWISE, cv::ROTATE_180, cv::ROTATE_90_CLOCKWISE};
  cv::rotate(image, out, codes[k]);
  return out;
}

std::array<double, 6> inverse_affine_matrix(const std::array<double, 2>& center, double angle,
                                            const std::array<double, 2>& translate, double scale,
                                            const std::array<double, 2>& shear) {
  const double rot = radians(angle);
  const double sx = radians(shear[0]);
  const double sy = radians(shear[1]);
  const double cx = center[0], cy = center[1];
  const double tx = translate[0], ty = translate[1];
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  std::array<double, 6> m = {d, -b, 0.0, -c, a, 0.0};
  for (double& x : m) x = x / scale;
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
  return m;
}

// _functional_tensor.affine: an output pixel's centre, relative to the image centre, goes through
// theta (float32), is normalised by (w/2, h/2) and un-normalised by grid_sample
// (align_corners=False) as torch's CPU kernel does, in float32; nearest rounds half to even.
cv::Mat affine(const cv::Mat& image, const std::array<double, 6>& m, Interp interp) {
  check_image(image, "affine");
  const int w = image.cols;
  const int h = image.rows;
  const float half_w = f32(0.5 * w);
  const float half_h = f32(0.5 * h);
  const float ax = f32(m[0]) / half_w, ay = f32(m[1]) / half_w, ac = f32(m[2]) / half_w;
  const float bx = f32(m[3]) / half_h, by = f32(m[4]) / half_h, bc = f32(m[5]) / half_h;
  const float scale_x = static_cast<float>(w) / 2;
  const float scale_y = static_cast<float>(h) / 2;
  cv::Mat out(h, w, CV_8UC3);
  for (int r = 0; r < h; ++r) {
    const float y = f32(r - h * 0.5 + 0.5);
    uint8_t* dst = out.ptr<uint8_t>(r);
    for (int c = 0; c < w; ++c, dst += 3) {
      const float x = f32(c - w * 0.5 + 0.5);
      const float gx = x * ax + y * ay + ac;
      const float gy = x * bx + y * by + bc;
      const float ix = (gx + 1.0f) * scale_x - 0.5f;
      const float iy = (gy + 1.0f) * scale_y - 0.5f;
      if (interp == Interp::kNearest) {
        const float rx = std::nearbyint(ix);
        const float ry = std::nearbyint(iy);
        if (rx >= 0 && rx <= w - 1 && ry >= 0 && ry <= h - 1) {
          const uint8_t* src = image.ptr<uint8_t>(static_cast<int>(ry)) + 3 * static_cast<int>(rx);
          dst[0] = src[0];
          dst[1] = src[1];
          dst[2] = src[2];
        } else {
          dst[0] = dst[1] = dst[2] = 0;
        }
        continue;
      }
      // Bilinear, zeros outside (grid_sample's order of the four corners and weights).
      const float fx = std::floor(ix);
      const float fy = std::floor(iy);
      const float we = ix - fx;  // distance to the west neighbour
      const float ee = 1.0f - we;
      const float wn = iy - fy;
      const float ws = 1.0f - wn;
      const float weights[4] = {ws * ee, ws * we, wn * ee, wn * we};  // nw, ne, sw, se
      const int x0 = static_cast<int>(fx);
      const int y0 = static_cast<int>(fy);
      const int xs[4] = {x0, x0 + 1, x0, x0 + 1};
      const int ys[4] = {y0, y0, y0 + 1, y0 + 1};
      float acc[3] = {0, 0, 0};
      for (int k = 0; k < 4; ++k) {
        if (xs[k] < 0 || xs[k] >= w || ys[k] < 0 || ys[k] >= h) continue;
        const uint8_t* src = image.ptr<uint8_t>(ys[k]) + 3 * xs[k];
        for (int ch = 0; ch < 3; ++ch) acc[ch] = acc[ch] + static_cast<float>(src[ch]) * weights[k];
      }
      for (int ch = 0; ch < 3; ++ch) {
        const float v = std::nearbyint(acc[ch]);
        dst[ch] = v <= 0 ? 0 : (v >= 255 ? 255 : static_cast<uint8_t>(v));
      }
    }
  }
  return out;
}

cv::Mat rotate(const cv::Mat& image, double angle, Interp interp) {
  return affine(image, inverse_affine_matrix({0.0, 0.0}, -angle, {0.0, 0.0}, 1.0, {0.0, 0.0}),
                interp);
}

// ---- Colour ----

cv::Mat adjust_brightness(const cv::Mat& image, double factor) {
  check_image(image, "adjust_brightness");
  if (factor < 0) internal("adjust_brightness: negative factor");
  const Blend blend(factor);
  std::array<uint8_t, 256> table;
  for (int v = 0; v < 256; ++v) table[v] = blend(static_cast<uint8_t>(v), 0);
  return apply_lut(image, table);
}

cv::Mat adjust_contrast(const cv::Mat& image, double factor) {
  check_image(image, "adjust_contrast");
  if (factor < 0) internal("adjust_contrast: negative factor");
  const GrayTables& gray = gray_tables();
  int64_t sum = 0;
  for (int r = 0; r < image.rows; ++r) {
    const uint8_t* p = image.ptr<uint8_t>(r);
    for (int c = 0; c < image.cols; ++c, p += 3) sum += gray(p);
  }
  // torch.mean of the float32 grey image: the sum (exact below 2^24), then divided by the count.
  const float mean = static_cast<float>(sum) / static_cast<float>(image.total());
  const float rf = f32(factor);
  const float other = f32(1.0 - factor) * mean;
  std::array<uint8_t, 256> table;
  for (int v = 0; v < 256; ++v) table[v] = clamp_trunc(rf * static_cast<float>(v) + other);
  return apply_lut(image, table);
}

cv::Mat adjust_saturation(const cv::Mat& image, double factor) {
  check_image(image, "adjust_saturation");
  if (factor < 0) internal("adjust_saturation: negative factor");
  const GrayTables& gray = gray_tables();
  const Blend blend(factor);
  cv::Mat out(image.rows, image.cols, CV_8UC3);
  for (int r = 0; r < image.rows; ++r) {
    const uint8_t* p = image.ptr<uint8_t>(r);
    uint8_t* q = out.ptr<uint8_t>(r);
    for (int c = 0; c < image.cols; ++c, p += 3, q += 3) {
      const uint8_t g = gray(p);
      q[0] = blend(p[0], g);
      q[1] = blend(p[1], g);
      q[2] = blend(p[2], g);
    }
  }
  return out;
}

// adjust_hue: uint8 -> float32 / 255, _rgb2hsv, h = (h + factor) mod 1, _hsv2rgb, * 255,
// truncated; the float32 steps of torch's code, per pixel.
cv::Mat adjust_hue(const cv::Mat& image, double hue_factor) {
  check_image(image, "adjust_hue");
  if (!(hue_factor >= -0.5 && hue_factor <= 0.5)) internal("adjust_hue: factor not in [-0.5, 0.5]");
  const float hf = f32(hue_factor);
  std::array<float, 256> unit;
  for (int v = 0; v < 256; ++v) unit[v] = static_cast<float>(v) / 255.0f;
  cv::Mat out(image.rows, image.cols, CV_8UC3);
  for (int row = 0; row < image.rows; ++row) {
    const uint8_t* p = image.ptr<uint8_t>(row);
    uint8_t* q = out.ptr<uint8_t>(row);
    for (int col = 0; col < image.cols; ++col, p += 3, q += 3) {
      const float r = unit[p[2]], g = unit[p[1]], b = unit[p[0]];
      const float maxc = std::max(r, std::max(g, b));
      const float minc = std::min(r, std::min(g, b));
      const bool eqc = maxc == minc;
      const float cr = maxc - minc;
      const float s = cr / (eqc ? 1.0f : maxc);
      const float crd = eqc ? 1.0f : cr;
      const float rc = (maxc - r) / crd;
      const float gc = (maxc - g) / crd;
      const float bc = (maxc - b) / crd;
      float h;
      if (maxc == r) {
        h = bc - gc;
      } else if (maxc == g) {
        h = 2.0f + rc - bc;
      } else {
        h = 4.0f + gc - rc;
      }
      h = std::fmod(h / 6.0f + 1.0f, 1.0f);
      // (h + factor) % 1.0, Python's sign convention.
      float hh = std::fmod(h + hf, 1.0f);
      if (hh != 0 && hh < 0) hh += 1.0f;
      const float v = maxc;
      const float h6 = hh * 6.0f;
      const float fi = std::floor(h6);
      const float f = h6 - fi;
      const float pp = std::clamp(v * (1.0f - s), 0.0f, 1.0f);
      const float qq = std::clamp(v * (1.0f - s * f), 0.0f, 1.0f);
      const float tt = std::clamp(v * (1.0f - s * (1.0f - f)), 0.0f, 1.0f);
      const int i = ((static_cast<int>(fi) % 6) + 6) % 6;
      float rr, gg, bb;
      switch (i) {
        case 0:
          rr = v, gg = tt, bb = pp;
          break;
        case 1:
          rr = qq, gg = v, bb = pp;
          break;
        case 2:
          rr = pp, gg = v, bb = tt;
          break;
        case 3:
          rr = pp, gg = qq, bb = v;
          break;
        case 4:
          rr = tt, gg = pp, bb = v;
          break;
        default:
          rr = v, gg = pp, bb = qq;
          break;
      }
      q[2] = static_cast<uint8_t>(rr * 255.0f);
      q[1] = static_cast<uint8_t>(gg * 255.0f);
      q[0] = static_cast<uint8_t>(bb * 255.0f);
    }
  }
  return out;
}

// The blurred image (3x3 kernel [1 1 1; 1 5 1; 1 1 1] / 13, rounded; border pixels kept)
// blended with the image. The integer sum / 13 is never within float error of a .5 tie, so
// rounding it exactly gives torch's float32 convolution's result.
cv::Mat adjust_sharpness(const cv::Mat& image, double factor) {
  check_image(image, "adjust_sharpness");
  if (factor < 0) internal("adjust_sharpness: negative factor");
  if (image.cols <= 2 || image.rows <= 2) return image;
  const Blend blend(factor);
  std::array<uint8_t, 13 * 255 + 1> rounded;
  for (int s = 0; s <= 13 * 255; ++s) {
    rounded[s] = static_cast<uint8_t>(std::nearbyint(static_cast<double>(s) / 13.0));
  }
  cv::Mat out(image.rows, image.cols, CV_8UC3);
  const int w = image.cols;
  const int h = image.rows;
  for (int r = 0; r < h; ++r) {
    const uint8_t* p = image.ptr<uint8_t>(r);
    uint8_t* q = out.ptr<uint8_t>(r);
    const bool border_row = r == 0 || r == h - 1;
    const uint8_t* up = border_row ? p : image.ptr<uint8_t>(r - 1);
    const uint8_t* down = border_row ? p : image.ptr<uint8_t>(r + 1);
    for (int c = 0; c < w; ++c) {
      for (int ch = 0; ch < 3; ++ch) {
        const int i = 3 * c + ch;
        int blurred = p[i];
        if (!border_row && c > 0 && c < w - 1) {
          const int s = up[i - 3] + up[i] + up[i + 3] + p[i - 3] + 5 * p[i] + p[i + 3] +
                        down[i - 3] + down[i] + down[i + 3];
          blurred = rounded[s];
        }
        q[i] = blend(p[i], static_cast<uint8_t>(blurred));
      }
    }
  }
  return out;
}

cv::Mat posterize(const cv::Mat& image, int bits) {
  check_image(image, "posterize");
  if (bits < 0 || bits > 8) internal("posterize: bits must be in [0, 8]");
  const int mask = (0xFF << (8 - bits)) & 0xFF;
  std::array<uint8_t, 256> table;
  for (int v = 0; v < 256; ++v) table[v] = static_cast<uint8_t>(v & mask);
  return apply_lut(image, table);
}

cv::Mat solarize(const cv::Mat& image, double threshold) {
  check_image(image, "solarize");
  const float t = f32(threshold);
  std::array<uint8_t, 256> table;
  for (int v = 0; v < 256; ++v) {
    table[v] = static_cast<uint8_t>(static_cast<float>(v) >= t ? 255 - v : v);
  }
  return apply_lut(image, table);
}

cv::Mat autocontrast(const cv::Mat& image) {
  check_image(image, "autocontrast");
  std::array<std::array<uint8_t, 256>, 3> tables;
  for (int ch = 0; ch < 3; ++ch) {
    uint8_t lo = 255, hi = 0;
    for (int r = 0; r < image.rows; ++r) {
      const uint8_t* p = image.ptr<uint8_t>(r) + ch;
      for (int c = 0; c < image.cols; ++c, p += 3) {
        lo = std::min(lo, *p);
        hi = std::max(hi, *p);
      }
    }
    const float minimum = lo;
    const float scale = 255.0f / (static_cast<float>(hi) - minimum);
    for (int v = 0; v < 256; ++v) {
      tables[ch][v] = hi == lo ? static_cast<uint8_t>(v)
                               : clamp_trunc((static_cast<float>(v) - minimum) * scale);
    }
  }
  return apply_lut3(image, tables);
}

cv::Mat equalize(const cv::Mat& image) {
  check_image(image, "equalize");
  std::array<std::array<uint8_t, 256>, 3> tables;
  for (int ch = 0; ch < 3; ++ch) {
    std::array<int64_t, 256> hist{};
    for (int r = 0; r < image.rows; ++r) {
      const uint8_t* p = image.ptr<uint8_t>(r) + ch;
      for (int c = 0; c < image.cols; ++c, p += 3) ++hist[*p];
    }
    int last = 255;
    while (last > 0 && hist[last] == 0) --last;
    const int64_t total = static_cast<int64_t>(image.total());
    const int64_t step = (total - hist[last]) / 255;
    auto& t = tables[ch];
    if (step == 0) {
      for (int v = 0; v < 256; ++v) t[v] = static_cast<uint8_t>(v);
      continue;
    }
    int64_t cum = 0;
    t[0] = 0;
    for (int v = 1; v < 256; ++v) {
      cum += hist[v - 1];
      t[v] = static_cast<uint8_t>(std::min<int64_t>(255, (cum + step / 2) / step));
    }
  }
  return apply_lut3(image, tables);
}

cv::Mat invert(const cv::Mat& image) {
  check_image(image, "invert");
  std::array<uint8_t, 256> table;
  for (int v = 0; v < 256; ++v) table[v] = static_cast<uint8_t>(255 - v);
  return apply_lut(image, table);
}

// ---- Policies ----

namespace {

struct OpInfo {
  Op op;
  const char* name;
};
constexpr OpInfo kOps[] = {
    {Op::kIdentity, "Identity"},
    {Op::kShearX, "ShearX"},
    {Op::kShearY, "ShearY"},
    {Op::kTranslateX, "TranslateX"},
    {Op::kTranslateY, "TranslateY"},
    {Op::kRotate, "Rotate"},
    {Op::kBrightness, "Brightness"},
    {Op::kColor, "Color"},
    {Op::kContrast, "Contrast"},
    {Op::kSharpness, "Sharpness"},
    {Op::kPosterize, "Posterize"},
    {Op::kSolarize, "Solarize"},
    {Op::kAutoContrast, "AutoContrast"},
    {Op::kEqualize, "Equalize"},
    {Op::kInvert, "Invert"},
};

}  // namespace

const char* op_name(Op op) {
  for (const OpInfo& info : kOps) {
    if (info.op == op) return info.name;
  }
  internal("op_name: unknown op");
}

Op op_from_name(const std::string& name) {
  for (const OpInfo& info : kOps) {
    if (name == info.name) return info.op;
  }
  internal("op_from_name: unknown op '" + name + "'");
}

cv::Mat apply_op(const cv::Mat& image, Op op, double magnitude, Interp interp) {
  const double w = image.cols;
  const double h = image.rows;
  switch (op) {
    case Op::kIdentity:
      return image;
    case Op::kShearX:
      return affine(image,
                    inverse_affine_matrix({-w * 0.5, -h * 0.5}, 0.0, {0.0, 0.0}, 1.0,
                                          {degrees(std::atan(magnitude)), 0.0}),
                    interp);
    case Op::kShearY:
      return affine(image,
                    inverse_affine_matrix({-w * 0.5, -h * 0.5}, 0.0, {0.0, 0.0}, 1.0,
                                          {0.0, degrees(std::atan(magnitude))}),
                    interp);
    case Op::kTranslateX:
      return affine(
          image,
          inverse_affine_matrix({0.0, 0.0}, 0.0, {std::trunc(magnitude), 0.0}, 1.0, {0.0, 0.0}),
          interp);
    case Op::kTranslateY:
      return affine(
          image,
          inverse_affine_matrix({0.0, 0.0}, 0.0, {0.0, std::trunc(magnitude)}, 1.0, {0.0, 0.0}),
          interp);
    case Op::kRotate:
      return rotate(image, magnitude, interp);
    case Op::kBrightness:
      return adjust_brightness(image, 1.0 + magnitude);
    case Op::kColor:
      return adjust_saturation(image, 1.0 + magnitude);
    case Op::kContrast:
      return adjust_contrast(image, 1.0 + magnitude);
    case Op::kSharpness:
      return adjust_sharpness(image, 1.0 + magnitude);
    case Op::kPosterize:
      return posterize(image, static_cast<int>(magnitude));
    case Op::kSolarize:
      return solarize(image, magnitude);
    case Op::kAutoContrast:
      return autocontrast(image);
    case Op::kEqualize:
      return equalize(image);
    case Op::kInvert:
      return invert(image);
  }
  internal("apply_op: unknown op");
}

Policy parse_policy(const std::string& name, const std::string& field) {
  if (name == "none") return Policy::kNone;
  if (name == "trivial_augment_wide") return Policy::kTrivialAugmentWide;
  if (name == "rand_augment") return Policy::kRandAugment;
  if (name == "auto_augment") return Policy::kAutoAugment;
  if (name == "augmix") return Policy::kAugMix;
  throw ConfigError(field +
                    ": expected one of none|trivial_augment_wide|rand_augment|auto_augment|augmix, "
                    "got '" +
                    name + "'");
}

namespace {

// torch.linspace(lo, hi, bins) as float32 values (each rounded once from the exact value; torch's
// own float32 steps differ from it by an ulp on a few bins, differently between versions).
std::vector<double> linspace(double lo, double hi, int bins) {
  std::vector<double> out(bins);
  for (int i = 0; i < bins; ++i) {
    out[i] = static_cast<float>(lo + (hi - lo) * i / (bins - 1));
  }
  return out;
}

// base - (arange(bins) / ((bins - 1) / div)).round().int(), in float32, half to even.
std::vector<double> posterize_bins(int base, double div, int bins) {
  std::vector<double> out(bins);
  const float d = f32((bins - 1) / div);
  for (int i = 0; i < bins; ++i) {
    out[i] = base - std::nearbyint(static_cast<float>(i) / d);
  }
  return out;
}

}  // namespace

std::vector<OpSpace> augmentation_space(Policy policy, int h, int w) {
  switch (policy) {
    case Policy::kTrivialAugmentWide: {
      const int n = 31;
      return {{Op::kIdentity, false, {}},
              {Op::kShearX, true, linspace(0.0, 0.99, n)},
              {Op::kShearY, true, linspace(0.0, 0.99, n)},
              {Op::kTranslateX, true, linspace(0.0, 32.0, n)},
              {Op::kTranslateY, true, linspace(0.0, 32.0, n)},
              {Op::kRotate, true, linspace(0.0, 135.0, n)},
              {Op::kBrightness, true, linspace(0.0, 0.99, n)},
              {Op::kColor, true, linspace(0.0, 0.99, n)},
              {Op::kContrast, true, linspace(0.0, 0.99, n)},
              {Op::kSharpness, true, linspace(0.0, 0.99, n)},
              {Op::kPosterize, false, posterize_bins(8, 6.0, n)},
              {Op::kSolarize, false, linspace(255.0, 0.0, n)},
              {Op::kAutoContrast, false, {}},
              {Op::kEqualize, false, {}}};
    }
    case Policy::kRandAugment:
    case Policy::kAutoAugment: {
      const bool rand = policy == Policy::kRandAugment;
      const int n = rand ? 31 : 10;
      std::vector<OpSpace> s;
      if (rand) s.push_back({Op::kIdentity, false, {}});
      const std::vector<OpSpace> rest = {
          {Op::kShearX, true, linspace(0.0, 0.3, n)},
          {Op::kShearY, true, linspace(0.0, 0.3, n)},
          {Op::kTranslateX, true, linspace(0.0, 150.0 / 331.0 * w, n)},
          {Op::kTranslateY, true, linspace(0.0, 150.0 / 331.0 * h, n)},
          {Op::kRotate, true, linspace(0.0, 30.0, n)},
          {Op::kBrightness, true, linspace(0.0, 0.9, n)},
          {Op::kColor, true, linspace(0.0, 0.9, n)},
          {Op::kContrast, true, linspace(0.0, 0.9, n)},
          {Op::kSharpness, true, linspace(0.0, 0.9, n)},
          {Op::kPosterize, false, posterize_bins(8, 4.0, n)},
          {Op::kSolarize, false, linspace(255.0, 0.0, n)},
          {Op::kAutoContrast, false, {}},
          {Op::kEqualize, false, {}}};
      s.insert(s.end(), rest.begin(), rest.end());
      if (!rand) s.push_back({Op::kInvert, false, {}});
      return s;
    }
    case Policy::kAugMix: {
      const int n = 10;
      return {{Op::kShearX, true, linspace(0.0, 0.3, n)},
              {Op::kShearY, true, linspace(0.0, 0.3, n)},
              {Op::kTranslateX, true, linspace(0.0, w / 3.0, n)},
              {Op::kTranslateY, true, linspace(0.0, h / 3.0, n)},
              {Op::kRotate, true, linspace(0.0, 30.0, n)},
              {Op::kPosterize, false, posterize_bins(4, 4.0, n)},
              {Op::kSolarize, false, linspace(255.0, 0.0, n)},
              {Op::kAutoContrast, false, {}},
              {Op::kEqualize, false, {}},
              {Op::kBrightness, true, linspace(0.0, 0.9, n)},
              {Op::kColor, true, linspace(0.0, 0.9, n)},
              {Op::kContrast, true, linspace(0.0, 0.9, n)},
              {Op::kSharpness, true, linspace(0.0, 0.9, n)}};
    }
    case Policy::kNone:
      break;
  }
  return {};
}

namespace {

// `if signed and torch.randint(2, (1,))`: negative when the draw is 1.
double signed_draw(const OpSpace& row, double magnitude, Rng& rng) {
  if (row.signed_magnitude && uniform_int(rng, 0, 2) == 1) return -magnitude;
  return magnitude;
}

}  // namespace

std::vector<OpDraw> draw_trivial_augment(int h, int w, Rng& rng) {
  const std::vector<OpSpace> space = augmentation_space(Policy::kTrivialAugmentWide, h, w);
  const OpSpace& row = space[uniform_int(rng, 0, static_cast<int64_t>(space.size()))];
  double magnitude = 0.0;
  if (!row.magnitudes.empty()) {
    magnitude = row.magnitudes[uniform_int(rng, 0, static_cast<int64_t>(row.magnitudes.size()))];
  }
  return {{row.op, signed_draw(row, magnitude, rng)}};
}

std::vector<OpDraw> draw_rand_augment(int num_ops, int magnitude_bin, int h, int w, Rng& rng) {
  const std::vector<OpSpace> space = augmentation_space(Policy::kRandAugment, h, w);
  std::vector<OpDraw> out;
  for (int i = 0; i < num_ops; ++i) {
    const OpSpace& row = space[uniform_int(rng, 0, static_cast<int64_t>(space.size()))];
    const double magnitude = row.magnitudes.empty() ? 0.0 : row.magnitudes.at(magnitude_bin);
    out.push_back({row.op, signed_draw(row, magnitude, rng)});
  }
  return out;
}

namespace {

struct SubOp {
  Op op;
  double p;
  int bin;  // -1: no magnitude
};
// AutoAugmentPolicy.IMAGENET.
const SubOp kImagenetPolicy[25][2] = {
    {{Op::kPosterize, 0.4, 8}, {Op::kRotate, 0.6, 9}},
    {{Op::kSolarize, 0.6, 5}, {Op::kAutoContrast, 0.6, -1}},
    {{Op::kEqualize, 0.8, -1}, {Op::kEqualize, 0.6, -1}},
    {{Op::kPosterize, 0.6, 7}, {Op::kPosterize, 0.6, 6}},
    {{Op::kEqualize, 0.4, -1}, {Op::kSolarize, 0.2, 4}},
    {{Op::kEqualize, 0.4, -1}, {Op::kRotate, 0.8, 8}},
    {{Op::kSolarize, 0.6, 3}, {Op::kEqualize, 0.6, -1}},
    {{Op::kPosterize, 0.8, 5}, {Op::kEqualize, 1.0, -1}},
    {{Op::kRotate, 0.2, 3}, {Op::kSolarize, 0.6, 8}},
    {{Op::kEqualize, 0.6, -1}, {Op::kPosterize, 0.4, 6}},
    {{Op::kRotate, 0.8, 8}, {Op::kColor, 0.4, 0}},
    {{Op::kRotate, 0.4, 9}, {Op::kEqualize, 0.6, -1}},
    {{Op::kEqualize, 0.0, -1}, {Op::kEqualize, 0.8, -1}},
    {{Op::kInvert, 0.6, -1}, {Op::kEqualize, 1.0, -1}},
    {{Op::kColor, 0.6, 4}, {Op::kContrast, 1.0, 8}},
    {{Op::kRotate, 0.8, 8}, {Op::kColor, 1.0, 2}},
    {{Op::kColor, 0.8, 8}, {Op::kSolarize, 0.8, 7}},
    {{Op::kSharpness, 0.4, 7}, {Op::kInvert, 0.6, -1}},
    {{Op::kShearX, 0.6, 5}, {Op::kEqualize, 1.0, -1}},
    {{Op::kColor, 0.4, 0}, {Op::kEqualize, 0.6, -1}},
    {{Op::kEqualize, 0.4, -1}, {Op::kSolarize, 0.2, 4}},
    {{Op::kSolarize, 0.6, 5}, {Op::kAutoContrast, 0.6, -1}},
    {{Op::kInvert, 0.6, -1}, {Op::kEqualize, 1.0, -1}},
    {{Op::kColor, 0.6, 4}, {Op::kContrast, 1.0, 8}},
    {{Op::kEqualize, 0.8, -1}, {Op::kEqualize, 0.6, -1}},
};

}  // namespace

std::vector<OpDraw> draw_auto_augment(int h, int w, Rng& rng) {
  const std::vector<OpSpace> space = augmentation_space(Policy::kAutoAugment, h, w);
  const auto id = uniform_int(rng, 0, 25);
  double probs[2];
  int64_t signs[2];
  probs[0] = uniform01(rng);
  probs[1] = uniform01(rng);
  signs[0] = uniform_int(rng, 0, 2);
  signs[1] = uniform_int(rng, 0, 2);
  std::vector<OpDraw> out;
  for (int i = 0; i < 2; ++i) {
    const SubOp& sub = kImagenetPolicy[id][i];
    if (!(probs[i] <= sub.p)) continue;
    const auto row =
        std::find_if(space.begin(), space.end(), [&](const OpSpace& r) { return r.op == sub.op; });
    double magnitude = sub.bin >= 0 ? row->magnitudes.at(sub.bin) : 0.0;
    if (row->signed_magnitude && signs[i] == 0) magnitude = -magnitude;
    out.push_back({sub.op, magnitude});
  }
  return out;
}

std::vector<double> dirichlet(Rng& rng, const std::vector<double>& alpha) {
  std::vector<double> out(alpha.size());
  double sum = 0;
  for (size_t i = 0; i < alpha.size(); ++i) {
    out[i] = gamma_sample(rng, alpha[i]);
    sum += out[i];
  }
  for (double& x : out) x = sum > 0 ? x / sum : 1.0 / static_cast<double>(alpha.size());
  return out;
}

AugMixDraw draw_augmix(int severity, int h, int w, Rng& rng) {
  constexpr int kWidth = 3;
  const std::vector<OpSpace> space = augmentation_space(Policy::kAugMix, h, w);
  AugMixDraw d;
  const std::vector<double> m = dirichlet(rng, {1.0, 1.0});
  const std::vector<double> mix = dirichlet(rng, std::vector<double>(kWidth, 1.0));
  d.original = f32(m[0]);
  const float m1 = f32(m[1]);
  for (int i = 0; i < kWidth; ++i) d.weights.push_back(f32(mix[i]) * m1);
  for (int i = 0; i < kWidth; ++i) {
    const int depth = static_cast<int>(uniform_int(rng, 1, 4));
    std::vector<OpDraw> chain;
    for (int k = 0; k < depth; ++k) {
      const OpSpace& row = space[uniform_int(rng, 0, static_cast<int64_t>(space.size()))];
      double magnitude = 0.0;
      if (!row.magnitudes.empty()) magnitude = row.magnitudes.at(uniform_int(rng, 0, severity));
      chain.push_back({row.op, signed_draw(row, magnitude, rng)});
    }
    d.chains.push_back(std::move(chain));
  }
  return d;
}

cv::Mat apply_augmix(const cv::Mat& image, const AugMixDraw& d) {
  check_image(image, "apply_augmix");
  const int n = static_cast<int>(image.total()) * 3;
  std::vector<float> mix(n);
  const uint8_t* src = image.isContinuous() ? image.ptr<uint8_t>() : nullptr;
  cv::Mat continuous = src ? image : image.clone();
  src = continuous.ptr<uint8_t>();
  for (int i = 0; i < n; ++i) mix[i] = d.original * static_cast<float>(src[i]);
  for (size_t c = 0; c < d.chains.size(); ++c) {
    cv::Mat aug = continuous;
    for (const OpDraw& op : d.chains[c])
      aug = apply_op(aug, op.op, op.magnitude, Interp::kBilinear);
    if (!aug.isContinuous()) aug = aug.clone();
    const uint8_t* a = aug.ptr<uint8_t>();
    const float wgt = d.weights[c];
    for (int i = 0; i < n; ++i) mix[i] = mix[i] + wgt * static_cast<float>(a[i]);
  }
  cv::Mat out(image.rows, image.cols, CV_8UC3);
  uint8_t* dst = out.ptr<uint8_t>();
  for (int i = 0; i < n; ++i) {
    const float v = mix[i];
    dst[i] = v <= 0 ? 0 : (v >= 255 ? 255 : static_cast<uint8_t>(v));
  }
  return out;
}

ColorJitterDraw draw_color_jitter(const ColorJitterOptions& o, Rng& rng) {
  ColorJitterDraw d;
  std::vector<int> order = {0, 1, 2, 3};
  shuffle_in_place(order, rng);
  std::copy(order.begin(), order.end(), d.order.begin());
  if (o.brightness > 0)
    d.brightness = uniform(rng, std::max(0.0, 1.0 - o.brightness), 1.0 + o.brightness);
  if (o.contrast > 0) d.contrast = uniform(rng, std::max(0.0, 1.0 - o.contrast), 1.0 + o.contrast);
  if (o.saturation > 0) {
    d.saturation = uniform(rng, std::max(0.0, 1.0 - o.saturation), 1.0 + o.saturation);
  }
  if (o.hue > 0) d.hue = uniform(rng, -o.hue, o.hue);
  return d;
}

cv::Mat apply_color_jitter(const cv::Mat& image, const ColorJitterDraw& d) {
  cv::Mat out = image;
  for (const int fn : d.order) {
    if (fn == 0 && d.brightness >= 0) out = adjust_brightness(out, d.brightness);
    if (fn == 1 && d.contrast >= 0) out = adjust_contrast(out, d.contrast);
    if (fn == 2 && d.saturation >= 0) out = adjust_saturation(out, d.saturation);
    if (fn == 3 && d.hue >= -1) out = adjust_hue(out, d.hue);
  }
  return out;
}

EraseBox draw_erasing(double p, int w, int h, Rng& rng) {
  if (!(uniform01(rng) < p)) return {};
  const double area = static_cast<double>(h) * static_cast<double>(w);
  const double log_lo = std::log(0.3);
  const double log_hi = std::log(3.3);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * uniform(rng, 0.02, 0.33);
    const double aspect = std::exp(uniform(rng, log_lo, log_hi));
    // Python's round(): half to even.
    const auto eh = static_cast<int64_t>(std::nearbyint(std::sqrt(erase_area * aspect)));
    const auto ew = static_cast<int64_t>(std::nearbyint(std::sqrt(erase_area / aspect)));
    if (!(eh < h && ew < w)) continue;
    EraseBox box;
    box.h = static_cast<int>(eh);
    box.w = static_cast<int>(ew);
    box.y = static_cast<int>(uniform_int(rng, 0, h - eh + 1));
    box.x = static_cast<int>(uniform_int(rng, 0, w - ew + 1));
    return box;
  }
  return {};
}

void erase(cv::Mat& image, const EraseBox& box, const cv::Vec3b& bgr) {
  check_image(image, "erase");
  if (box.w <= 0 || box.h <= 0) return;
  if (box.x < 0 || box.y < 0 || box.x + box.w > image.cols || box.y + box.h > image.rows) {
    internal("erase: the box is outside the image");
  }
  image(cv::Rect(box.x, box.y, box.w, box.h)).setTo(cv::Scalar(bgr[0], bgr[1], bgr[2]));
}

// ---- The chain ----

namespace {

void require(bool ok, const std::string& field, const std::string& expected, double got) {
  if (!ok) {
    std::ostringstream s;
    s << field << ": expected " << expected << ", got " << got;
    throw ConfigError(s.str());
  }
}

nlohmann::json ops_json(const std::vector<OpDraw>& ops) {
  nlohmann::json out = nlohmann::json::array();
  for (const OpDraw& op : ops) out.push_back({{"op", op_name(op.op)}, {"magnitude", op.magnitude}});
  return out;
}

}  // namespace

Augmenter::Augmenter(const PreprocessOptions& options) : options_(options) {
  const PreprocessOptions& o = options_;
  policy_ = parse_policy(o.policy);
  require(std::isfinite(o.rotate_degrees) && o.rotate_degrees >= 0 && o.rotate_degrees <= 360,
          "data.augment.rotate_degrees", "a value in [0, 360] (0 = off)", o.rotate_degrees);
  const ColorJitterOptions& j = o.color_jitter;
  require(std::isfinite(j.brightness) && j.brightness >= 0, "data.augment.color_jitter.brightness",
          ">= 0", j.brightness);
  require(std::isfinite(j.contrast) && j.contrast >= 0, "data.augment.color_jitter.contrast",
          ">= 0", j.contrast);
  require(std::isfinite(j.saturation) && j.saturation >= 0, "data.augment.color_jitter.saturation",
          ">= 0", j.saturation);
  require(j.hue >= 0 && j.hue <= 0.5, "data.augment.color_jitter.hue", "a value in [0, 0.5]",
          j.hue);
  require(o.random_erasing >= 0 && o.random_erasing <= 1, "data.augment.random_erasing",
          "a probability in [0, 1]", o.random_erasing);
  require(o.num_ops >= 0 && o.num_ops <= 16, "data.augment.num_ops", "0..16 (0 = 2)", o.num_ops);
  if (policy_ == Policy::kRandAugment) {
    require(o.magnitude >= 0 && o.magnitude <= 30, "data.augment.magnitude",
            "0..30 for rand_augment (0 = 9)", o.magnitude);
    magnitude_ = o.magnitude == 0 ? 9 : o.magnitude;
  } else if (policy_ == Policy::kAugMix) {
    require(o.magnitude >= 0 && o.magnitude <= 10, "data.augment.magnitude",
            "0..10 for augmix (the severity; 0 = 3)", o.magnitude);
    magnitude_ = o.magnitude == 0 ? 3 : o.magnitude;
  } else {
    require(o.magnitude >= 0, "data.augment.magnitude", ">= 0", o.magnitude);
  }
  num_ops_ = o.num_ops == 0 ? 2 : o.num_ops;
  if (o.normalize == "imagenet") {
    erase_fill_ = cv::Vec3b(104, 116, 124);  // round(255 * (0.406, 0.456, 0.485)), BGR
  } else if (o.normalize == "unit") {
    erase_fill_ = cv::Vec3b(0, 0, 0);
  } else {
    throw ConfigError("data.normalize: expected one of unit|imagenet, got '" + o.normalize + "'");
  }
  jitter_ = j.brightness > 0 || j.contrast > 0 || j.saturation > 0 || j.hue > 0;
  active_ = o.train && (o.vertical_flip || o.rotate90 || o.rotate_degrees > 0 || jitter_ ||
                        policy_ != Policy::kNone || o.random_erasing > 0);
}

cv::Mat Augmenter::operator()(cv::Mat image, Rng& rng, nlohmann::json* drawn) const {
  if (!active_) return image;
  const PreprocessOptions& o = options_;
  if (o.vertical_flip) {
    const bool flip = uniform01(rng) < 0.5;
    if (flip) image = vflip(image);
    if (drawn) (*drawn)["vflip"] = flip;
  }
  if (o.rotate90) {
    const int k = static_cast<int>(uniform_int(rng, 0, 4));
    image = rot90(image, k);
    if (drawn) (*drawn)["rotate90"] = k;
  }
  if (o.rotate_degrees > 0) {
    const double angle = uniform(rng, -o.rotate_degrees, o.rotate_degrees);
    image = rotate(image, angle, Interp::kNearest);
    if (drawn) (*drawn)["rotate"] = angle;
  }
  if (jitter_) {
    const ColorJitterDraw d = draw_color_jitter(o.color_jitter, rng);
    image = apply_color_jitter(image, d);
    if (drawn) {
      static const char* const kNames[] = {"brightness", "contrast", "saturation", "hue"};
      nlohmann::json j = {{"order", nlohmann::json::array()}};
      for (const int fn : d.order) j["order"].push_back(kNames[fn]);
      if (d.brightness >= 0) j["brightness"] = d.brightness;
      if (d.contrast >= 0) j["contrast"] = d.contrast;
      if (d.saturation >= 0) j["saturation"] = d.saturation;
      if (d.hue >= -1) j["hue"] = d.hue;
      (*drawn)["color_jitter"] = std::move(j);
    }
  }
  const int h = image.rows;
  const int w = image.cols;
  switch (policy_) {
    case Policy::kNone:
      break;
    case Policy::kTrivialAugmentWide:
    case Policy::kRandAugment:
    case Policy::kAutoAugment: {
      const std::vector<OpDraw> ops =
          policy_ == Policy::kTrivialAugmentWide ? draw_trivial_augment(h, w, rng)
          : policy_ == Policy::kRandAugment ? draw_rand_augment(num_ops_, magnitude_, h, w, rng)
                                            : draw_auto_augment(h, w, rng);
      // torchvision's reference passes its --interpolation (bilinear by default) to the policy;
      // the tensor ops have no bicubic, so bicubic resamples the policy's geometry bilinearly.
      for (const OpDraw& op : ops) image = apply_op(image, op.op, op.magnitude, Interp::kBilinear);
      if (drawn) (*drawn)["policy"] = ops_json(ops);
      break;
    }
    case Policy::kAugMix: {
      const AugMixDraw d = draw_augmix(magnitude_, h, w, rng);
      image = apply_augmix(image, d);
      if (drawn) {
        nlohmann::json chains = nlohmann::json::array();
        for (const auto& chain : d.chains) chains.push_back(ops_json(chain));
        (*drawn)["policy"] = {{"original", d.original}, {"weights", d.weights}, {"chains", chains}};
      }
      break;
    }
  }
  if (o.random_erasing > 0) {
    const EraseBox box = draw_erasing(o.random_erasing, w, h, rng);
    if (box.w > 0) {
      image = image.clone();  // never write into a cached image
      erase(image, box, erase_fill_);
    }
    if (drawn) {
      (*drawn)["erase"] =
          box.w > 0 ? nlohmann::json::array({box.x, box.y, box.w, box.h}) : nlohmann::json(nullptr);
    }
  }
  return image;
}

}  // namespace trainer::data::augment
