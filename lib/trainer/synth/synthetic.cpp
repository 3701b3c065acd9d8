#include "trainer/synth/synthetic.h"

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "trainer/data/random.h"
#include "trainer/data/tf_example.h"
#include "trainer/data/tfrecord.h"
#include "trainer/data/transforms.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/rng.h"

namespace trainer::synth {

using data::Compression;
using data::make_image_example;
using data::RecordWriter;
using data::Rng;
using data::shuffle_in_place;
using data::uniform;
using data::uniform01;
using data::uniform_int;
namespace transforms = data::transforms;

namespace {

namespace fs = std::filesystem;

constexpr double kPi = 3.14159265358979323846;
constexpr int kJpegQuality = 90;

// The look of a class: leaf colour and the lesion pattern drawn on it.
enum class Pattern { kVeins, kSpots, kStreaks, kSpeckles, kMosaic };

struct ClassStyle {
  cv::Scalar leaf;    // base leaf colour (BGR)
  cv::Scalar lesion;  // spot / streak / speckle / mosaic colour (BGR)
  cv::Scalar second;  // a second lesion colour (halo, streak core)
  Pattern pattern;
};

cv::Scalar hsv_to_bgr(double h, double s, double v) {
  cv::Mat3b px(1, 1,
               cv::Vec3b(static_cast<uchar>(h), static_cast<uchar>(s), static_cast<uchar>(v)));
  cv::cvtColor(px, px, cv::COLOR_HSV2BGR);
  const cv::Vec3b c = px(0, 0);
  return cv::Scalar(c[0], c[1], c[2]);
}

ClassStyle class_style(int k) {
  switch (k) {
    case 0:  // cbb, bacterial blight: green with brown angular spots (yellow halo)
      return {cv::Scalar(45, 120, 50), cv::Scalar(25, 50, 95), cv::Scalar(60, 150, 170),
              Pattern::kSpots};
    case 1:  // cbsd, brown streak: yellow-green with yellow/brown streaks along the veins
      return {cv::Scalar(45, 165, 140), cv::Scalar(30, 75, 130), cv::Scalar(70, 215, 230),
              Pattern::kStreaks};
    case 2:  // cgm, green mite: pale green with many small white-yellow speckles
      return {cv::Scalar(130, 200, 160), cv::Scalar(215, 245, 245), cv::Scalar(180, 230, 220),
              Pattern::kSpeckles};
    case 3:  // cmd, mosaic: mottled yellow / green patches
      return {cv::Scalar(40, 125, 45), cv::Scalar(45, 215, 215), cv::Scalar(70, 180, 150),
              Pattern::kMosaic};
    case 4:  // healthy: uniform mid/dark green with lighter veins
      return {cv::Scalar(35, 105, 30), cv::Scalar(80, 165, 85), cv::Scalar(80, 165, 85),
              Pattern::kVeins};
    default: {  // class5...: a distinct hue and one of the patterns
      const double hue = std::fmod(20.0 + 53.0 * (k - 5), 180.0);
      const Pattern patterns[] = {Pattern::kSpots, Pattern::kStreaks, Pattern::kSpeckles,
                                  Pattern::kMosaic};
      return {hsv_to_bgr(hue, 150, 160), hsv_to_bgr(std::fmod(hue + 90.0, 180.0), 200, 220),
              hsv_to_bgr(std::fmod(hue + 45.0, 180.0), 120, 90), patterns[(k - 5) % 4]};
    }
  }
}

cv::Scalar jitter(const cv::Scalar& c, Rng& rng, double amount) {
  cv::Scalar out;
  const double shift = uniform(rng, -amount, amount);  // shared: keeps the hue
  for (int i = 0; i < 3; ++i) {
    out[i] = std::clamp(c[i] + shift + uniform(rng, -amount / 2, amount / 2), 0.0, 255.0);
  }
  return out;
}

cv::Point2f polar(cv::Point2f c, double angle, double r) {
  return {static_cast<float>(c.x + r * std::cos(angle)),
          static_cast<float>(c.y + r * std::sin(angle))};
}

cv::Point to_px(cv::Point2f p) { return {cvRound(p.x), cvRound(p.y)}; }

// A smooth random field in [0, 1] (a coarse grid upsampled bicubically).
cv::Mat smooth_field(int size, int cells, Rng& rng) {
  cv::Mat grid(cells, cells, CV_32F);
  for (int y = 0; y < cells; ++y) {
    for (int x = 0; x < cells; ++x) grid.at<float>(y, x) = static_cast<float>(uniform01(rng));
  }
  cv::Mat field;
  cv::resize(grid, field, cv::Size(size, size), 0, 0, cv::INTER_CUBIC);
  return field;
}

// One palmate (cassava-like) leaf: lobes radiating from a centre, a petiole, midribs.
struct Leaf {
  cv::Point2f centre;
  double orientation = 0;  // direction of the central lobe
  std::vector<double> lobe_angles;
  std::vector<double> lobe_lengths;
  std::vector<double> lobe_widths;
};

Leaf random_leaf(int size, Rng& rng, double scale) {
  Leaf leaf;
  const double s = size;
  // Every draw is its own statement: the order in which a call's arguments are evaluated is
  // unspecified (gcc goes right to left, clang left to right), and the images must not depend on
  // the compiler. The order kept here is the one gcc builds always had (y before x, ...).
  const double cy = uniform(rng, 0.38, 0.62);
  const double cx = uniform(rng, 0.38, 0.62);
  leaf.centre = cv::Point2f(static_cast<float>(s * cx), static_cast<float>(s * cy));
  leaf.orientation = uniform(rng, 0.0, 2.0 * kPi);
  const int lobes = static_cast<int>(uniform_int(rng, 5, 8));
  const double spread = uniform(rng, 0.95, 1.3) * kPi;  // fan of the lobes
  const double length = s * scale * uniform(rng, 0.85, 1.1);
  const double width_ratio = uniform(rng, 0.26, 0.34);
  for (int i = 0; i < lobes; ++i) {
    const double t = lobes == 1 ? 0.0 : (static_cast<double>(i) / (lobes - 1) - 0.5);
    leaf.lobe_angles.push_back(leaf.orientation + t * spread + uniform(rng, -0.08, 0.08));
    const double l = length * (1.0 - 0.55 * t * t * 4.0 / 2.0) * uniform(rng, 0.9, 1.05);
    leaf.lobe_lengths.push_back(l);
    leaf.lobe_widths.push_back(l * width_ratio * uniform(rng, 0.9, 1.1));
  }
  return leaf;
}

void draw_leaf_mask(const Leaf& leaf, cv::Mat& mask) {
  for (size_t i = 0; i < leaf.lobe_angles.size(); ++i) {
    const double a = leaf.lobe_angles[i];
    const double l = leaf.lobe_lengths[i];
    const cv::Point2f mid = polar(leaf.centre, a, l * 0.5);
    cv::ellipse(mask,
                cv::RotatedRect(
                    mid, cv::Size2f(static_cast<float>(l), static_cast<float>(leaf.lobe_widths[i])),
                    static_cast<float>(a * 180.0 / kPi)),
                cv::Scalar(255), cv::FILLED, cv::LINE_AA);
  }
  cv::circle(mask, to_px(leaf.centre),
             std::max(1, cvRound(leaf.lobe_widths[leaf.lobe_widths.size() / 2] * 0.45)),
             cv::Scalar(255), cv::FILLED, cv::LINE_AA);
}

// Midribs plus a few side veins, drawn as lines of `thickness` in `colour`.
void draw_veins(const Leaf& leaf, cv::Mat& image, const cv::Scalar& colour, int thickness,
                bool side_veins) {
  for (size_t i = 0; i < leaf.lobe_angles.size(); ++i) {
    const double a = leaf.lobe_angles[i];
    const double l = leaf.lobe_lengths[i];
    cv::line(image, to_px(leaf.centre), to_px(polar(leaf.centre, a, l * 0.93)), colour, thickness,
             cv::LINE_AA);
    if (!side_veins) continue;
    for (double t : {0.3, 0.5, 0.7}) {
      const cv::Point2f p = polar(leaf.centre, a, l * t);
      const double w = leaf.lobe_widths[i] * 0.42;
      for (double side : {-1.0, 1.0}) {
        cv::line(image, to_px(p), to_px(polar(p, a + side * 0.75, w)), colour,
                 std::max(1, thickness / 2), cv::LINE_AA);
      }
    }
  }
}

// A random point where mask is set (falls back to the leaf centre).
cv::Point2f point_on(const cv::Mat& mask, const Leaf& leaf, Rng& rng) {
  for (int attempt = 0; attempt < 30; ++attempt) {
    const int x = static_cast<int>(uniform_int(rng, 0, mask.cols));
    const int y = static_cast<int>(uniform_int(rng, 0, mask.rows));
    if (mask.at<uchar>(y, x) > 128)
      return cv::Point2f(static_cast<float>(x), static_cast<float>(y));
  }
  return leaf.centre;
}

// Paints the class's lesions onto the leaf texture `tex` (CV_8UC3, the whole canvas).
void paint_pattern(const ClassStyle& style, const Leaf& leaf, const cv::Mat& mask, cv::Mat& tex,
                   Rng& rng) {
  const int size = tex.cols;
  const double s = size;
  const int thin = std::max(1, cvRound(s / 110.0));
  switch (style.pattern) {
    case Pattern::kVeins:
      draw_veins(leaf, tex, jitter(style.lesion, rng, 10), thin, true);
      break;
    case Pattern::kSpots: {
      draw_veins(leaf, tex, jitter(style.leaf, rng, 8) + cv::Scalar(25, 35, 25), thin, false);
      const int spots = static_cast<int>(uniform_int(rng, 4, 9));
      for (int i = 0; i < spots; ++i) {
        const cv::Point2f c = point_on(mask, leaf, rng);
        const double r = s * uniform(rng, 0.04, 0.085);
        const int vertices = static_cast<int>(uniform_int(rng, 5, 8));
        std::vector<cv::Point> poly, halo;
        const double turn = uniform(rng, 0.0, 2.0 * kPi);
        for (int v = 0; v < vertices; ++v) {
          const double a = turn + 2.0 * kPi * v / vertices + uniform(rng, -0.3, 0.3);
          const double rr = r * uniform(rng, 0.6, 1.15);
          poly.push_back(to_px(polar(c, a, rr)));
          halo.push_back(to_px(polar(c, a, rr * 1.35 + 1.0)));
        }
        cv::fillConvexPoly(tex, halo, jitter(style.second, rng, 12), cv::LINE_AA);
        cv::fillPoly(tex, std::vector<std::vector<cv::Point>>{poly}, jitter(style.lesion, rng, 12),
                     cv::LINE_AA);
      }
      break;
    }
    case Pattern::kStreaks: {
      const int thick = std::max(2, cvRound(s * uniform(rng, 0.03, 0.045)));
      draw_veins(leaf, tex, jitter(style.second, rng, 12), thick, true);
      // brown necrotic segments along some midribs
      for (size_t i = 0; i < leaf.lobe_angles.size(); ++i) {
        if (uniform01(rng) < 0.35) continue;
        const double a = leaf.lobe_angles[i];
        const double l = leaf.lobe_lengths[i];
        const double t0 = uniform(rng, 0.1, 0.5);
        const double t1 = std::min(0.9, t0 + uniform(rng, 0.2, 0.45));
        cv::line(tex, to_px(polar(leaf.centre, a, l * t0)), to_px(polar(leaf.centre, a, l * t1)),
                 jitter(style.lesion, rng, 12), std::max(1, thick * 2 / 3), cv::LINE_AA);
      }
      break;
    }
    case Pattern::kSpeckles: {
      draw_veins(leaf, tex, jitter(style.second, rng, 8), thin, false);
      const int dots = static_cast<int>(s * s * uniform(rng, 0.05, 0.08));
      const double radius = std::max(0.6, s / 130.0);
      for (int i = 0; i < dots; ++i) {
        const auto cy = static_cast<int>(uniform_int(rng, 0, size));  // y first (random_leaf)
        const auto cx = static_cast<int>(uniform_int(rng, 0, size));
        const cv::Point c(cx, cy);
        const int r = std::max(1, cvRound(radius * uniform(rng, 0.7, 1.5)));
        cv::circle(tex, c, r - 1 > 0 ? r - 1 : 0, jitter(style.lesion, rng, 15), cv::FILLED,
                   cv::LINE_AA);
        if (r == 1)
          tex.at<cv::Vec3b>(c) =
              cv::Vec3b(static_cast<uchar>(style.lesion[0]), static_cast<uchar>(style.lesion[1]),
                        static_cast<uchar>(style.lesion[2]));
      }
      break;
    }
    case Pattern::kMosaic: {
      const int cells = static_cast<int>(uniform_int(rng, 5, 9));
      const cv::Mat field = smooth_field(size, cells, rng);
      const cv::Scalar yellow = jitter(style.lesion, rng, 12);
      const double threshold = uniform(rng, 0.42, 0.55);
      for (int y = 0; y < size; ++y) {
        cv::Vec3b* row = tex.ptr<cv::Vec3b>(y);
        const float* f = field.ptr<float>(y);
        for (int x = 0; x < size; ++x) {
          const double t = std::clamp((f[x] - threshold) * 8.0 + 0.5, 0.0, 1.0);  // soft edge
          for (int c = 0; c < 3; ++c) {
            row[x][c] = cv::saturate_cast<uchar>(row[x][c] * (1.0 - t) + yellow[c] * t);
          }
        }
      }
      draw_veins(leaf, tex, jitter(style.second, rng, 8), thin, false);
      break;
    }
  }
}

// Renders one image (BGR, 8-bit) of class k.
cv::Mat render_image(int k, int size, Rng& rng) {
  const ClassStyle style = class_style(k);
  const double s = size;
  cv::RNG noise(rng());

  // Soil: brown/grey base, coarse variation, pebbles and dry grass.
  const double soil_red = uniform(rng, 90, 150);
  const double soil_green = soil_red * uniform(rng, 0.72, 0.88);  // draws in gcc's order
  const double soil_blue = soil_red * uniform(rng, 0.45, 0.65);
  const cv::Scalar soil(soil_blue, soil_green, soil_red);
  cv::Mat image(size, size, CV_32FC3, soil);
  {
    const cv::Mat field = smooth_field(size, 4, rng);
    std::vector<cv::Mat> planes(3, (field - 0.5f) * 50.0f);
    cv::Mat var;
    cv::merge(planes, var);
    image += var;
    cv::Mat grain(size, size, CV_32FC3);
    noise.fill(grain, cv::RNG::NORMAL, cv::Scalar::all(0), cv::Scalar::all(12));
    image += grain;
    const int pebbles = static_cast<int>(uniform_int(rng, 3, 10));
    for (int i = 0; i < pebbles; ++i) {
      const double shade = uniform(rng, -35, 35);
      const auto angle = static_cast<float>(uniform(rng, 0, 180));  // draws in gcc's order
      const auto height = static_cast<float>(s * uniform(rng, 0.015, 0.04));
      const auto width = static_cast<float>(s * uniform(rng, 0.02, 0.06));
      const auto y = static_cast<float>(uniform(rng, 0, s));
      const auto x = static_cast<float>(uniform(rng, 0, s));
      cv::ellipse(image, cv::RotatedRect(cv::Point2f(x, y), cv::Size2f(width, height), angle),
                  soil + cv::Scalar::all(shade), cv::FILLED, cv::LINE_AA);
    }
    const int blades = static_cast<int>(uniform_int(rng, 0, 5));
    for (int i = 0; i < blades; ++i) {
      const auto ay = static_cast<float>(uniform(rng, 0, s));  // draws in gcc's order
      const auto ax = static_cast<float>(uniform(rng, 0, s));
      const cv::Point2f a(ax, ay);
      const double red = uniform(rng, 150, 180);
      const double green = uniform(rng, 130, 160);
      const double blue = uniform(rng, 70, 100);
      const double length = s * uniform(rng, 0.1, 0.25);
      const double direction = uniform(rng, 0, 2 * kPi);
      cv::line(image, to_px(a), to_px(polar(a, direction, length)), cv::Scalar(blue, green, red),
               std::max(1, cvRound(s / 120.0)), cv::LINE_AA);
    }
  }

  // Leaf texture for the whole canvas: base colour, a little mottling, then the class pattern.
  const cv::Scalar leaf_colour = jitter(style.leaf, rng, 14);
  cv::Mat tex(size, size, CV_8UC3, leaf_colour);
  {
    cv::Mat grain(size, size, CV_16SC3);
    noise.fill(grain, cv::RNG::NORMAL, cv::Scalar::all(0), cv::Scalar::all(5));
    cv::Mat tex16;
    tex.convertTo(tex16, CV_16SC3);
    tex16 += grain;
    tex16.convertTo(tex, CV_8UC3);
  }

  // A second leaf behind the main one (darker), then the main leaf.
  const Leaf back = random_leaf(size, rng, 0.42);
  const Leaf leaf = random_leaf(size, rng, 0.5);
  cv::Mat back_mask = cv::Mat::zeros(size, size, CV_8U);
  draw_leaf_mask(back, back_mask);
  cv::Mat main_mask = cv::Mat::zeros(size, size, CV_8U);
  draw_leaf_mask(leaf, main_mask);

  cv::Mat back_tex = tex.clone();
  paint_pattern(style, back, back_mask, back_tex, rng);
  paint_pattern(style, leaf, main_mask, tex, rng);

  // Petiole (cassava's are reddish) of the main leaf.
  const cv::Point2f petiole_end =
      polar(leaf.centre, leaf.orientation + kPi, s * uniform(rng, 0.3, 0.5));
  const double petiole_red = uniform(rng, 120, 170);  // draws in gcc's order
  const double petiole_green = uniform(rng, 50, 90);
  const double petiole_blue = uniform(rng, 40, 70);
  cv::line(image, to_px(leaf.centre), to_px(petiole_end),
           cv::Scalar(petiole_blue, petiole_green, petiole_red), std::max(1, cvRound(s / 55.0)),
           cv::LINE_AA);

  // Composite with a lighting gradient across the leaf.
  const double light_angle = uniform(rng, 0, 2 * kPi);
  const double light_gain = uniform(rng, 0.1, 0.25);
  const double light_x = std::cos(light_angle) / s;
  const double light_y = std::sin(light_angle) / s;
  auto composite = [&](const cv::Mat& leaf_tex, const cv::Mat& mask, double gain) {
    for (int y = 0; y < size; ++y) {
      cv::Vec3f* out = image.ptr<cv::Vec3f>(y);
      const cv::Vec3b* in = leaf_tex.ptr<cv::Vec3b>(y);
      const uchar* m = mask.ptr<uchar>(y);
      for (int x = 0; x < size; ++x) {
        if (m[x] == 0) continue;
        const double a = m[x] / 255.0;
        const double u = (x - s / 2) * light_x + (y - s / 2) * light_y;
        const double g = gain * (1.0 + light_gain * u * 2.0);
        for (int c = 0; c < 3; ++c) {
          out[x][c] = static_cast<float>(out[x][c] * (1.0 - a) + in[x][c] * g * a);
        }
      }
    }
  };
  composite(back_tex, back_mask, uniform(rng, 0.7, 0.85));
  composite(tex, main_mask, 1.0);

  // Per-image photometric jitter: contrast, brightness, noise, sometimes a slight blur.
  const double contrast = uniform(rng, 0.85, 1.15);
  const double brightness = uniform(rng, -18, 18);
  image.convertTo(image, CV_32FC3, contrast, brightness + 128.0 * (1.0 - contrast));
  cv::Mat grain(size, size, CV_32FC3);
  noise.fill(grain, cv::RNG::NORMAL, cv::Scalar::all(0), cv::Scalar::all(uniform(rng, 3, 8)));
  image += grain;
  if (uniform01(rng) < 0.3) cv::GaussianBlur(image, image, cv::Size(3, 3), 0);
  cv::Mat out;
  image.convertTo(out, CV_8UC3);
  return out;
}

void write_bytes(const fs::path& path, const std::vector<uchar>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (f)
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (f) f.close();
  if (!f) throw DataError("make-dataset: cannot write '" + path.string() + "'");
}

// Removes files named <class>_<digits>.jpg numbered `keep` and above (left by an earlier,
// larger run), and the directory when nothing else is left in it.
void remove_stale(const fs::path& dir, const std::string& class_name, int64_t keep) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  const std::string prefix = class_name + "_";
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() + 4 || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - 4, 4, ".jpg") != 0) {
      continue;
    }
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 4);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        digits.size() > 9) {
      continue;
    }
    if (std::stoll(digits) >= keep) stale.push_back(entry.path());
  }
  for (const auto& p : stale) fs::remove(p, ec);
  if (keep == 0 && fs::is_empty(dir, ec)) fs::remove(dir, ec);
}

std::string file_name(const std::string& class_name, int64_t index) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%04lld", static_cast<long long>(index));
  return class_name + "_" + digits + ".jpg";
}

void validate(const SyntheticOptions& o) {
  if (o.out_dir.empty()) throw UsageError("make-dataset: the output directory is empty");
  if (o.classes < 2) {
    throw UsageError("make-dataset: --classes must be >= 2, got " + std::to_string(o.classes));
  }
  if (o.per_class < 1) {
    throw UsageError("make-dataset: --per-class must be >= 1, got " + std::to_string(o.per_class));
  }
  if (o.image_size < 16) {
    throw UsageError("make-dataset: --image-size must be >= 16, got " +
                     std::to_string(o.image_size));
  }
  if (o.image_height != 0 && o.image_height < 16) {
    throw UsageError("make-dataset: --image-height must be >= 16 (or 0: square), got " +
                     std::to_string(o.image_height));
  }
  if (o.format != "jpeg" && o.format != "tfrecord") {
    throw UsageError("make-dataset: --format: expected jpeg or tfrecord, got '" + o.format + "'");
  }
  if (o.format != "tfrecord" && (o.tfds || o.compression != "none")) {
    throw UsageError("make-dataset: --tfds and --compression need --format tfrecord");
  }
  if (o.shards < 1) {
    throw UsageError("make-dataset: --shards must be >= 1, got " + std::to_string(o.shards));
  }
  if (o.compression != "none" && o.compression != "gzip") {
    throw UsageError("make-dataset: --compression: expected none or gzip, got '" + o.compression +
                     "'");
  }
  if (o.image_key.empty() || o.label_key.empty() || o.image_key == o.label_key) {
    throw UsageError("make-dataset: --image-key and --label-key must be two different names");
  }
  if (o.splits.empty()) throw UsageError("make-dataset: no splits given");
  std::set<std::string> seen;
  for (const std::string& split : o.splits) {
    if (split.empty()) throw UsageError("make-dataset: empty split name");
    if (split == "." || split == ".." || split.find('/') != std::string::npos) {
      throw UsageError("make-dataset: split name '" + split + "' must be a plain directory name");
    }
    if (!seen.insert(split).second) {
      throw UsageError("make-dataset: split '" + split + "' is given twice");
    }
  }
}

constexpr uint64_t kShardShuffleStream = 0x7368617264ULL;  // "shard"

std::string shard_name(const SyntheticOptions& o, const std::string& split, int s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%05d-of-%05d", s, o.shards);
  return o.tfds ? o.name + "-" + split + ".tfrecord-" + buf : split + "-" + buf + ".tfrecord";
}

// Removes the shards of `split` an earlier run wrote (with any shard count): exactly the names
// shard_name() gives, nothing else.
void remove_stale_shards(const SyntheticOptions& o, const std::string& split) {
  const auto quote = [](const std::string& text) {
    return std::regex_replace(text, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
  };
  const std::regex ours(o.tfds ? quote(o.name + "-" + split) + R"(\.tfrecord-\d{5}-of-\d{5})"
                               : quote(split) + R"(-\d{5}-of-\d{5}\.tfrecord)");
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(o.out_dir, ec)) {
    if (std::regex_match(entry.path().filename().string(), ours)) stale.push_back(entry.path());
  }
  for (const auto& p : stale) fs::remove(p, ec);
}

// Writes each split's encoded images as `shards` record files, example j of a split to shard
// j mod shards, and (tfds) the TFDS metadata. Returns the files written.
std::vector<std::string> write_record_shards(const SyntheticOptions& o,
                                             const SyntheticSummary& summary,
                                             const std::vector<int64_t>& split_of,
                                             const std::vector<int64_t>& label_of,
                                             const std::vector<std::string>& name_of,
                                             const std::vector<std::string>& encoded) {
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) throw DataError("make-dataset: cannot create '" + o.out_dir + "': " + ec.message());
  const Compression compression = o.compression == "gzip" ? Compression::kGzip : Compression::kNone;
  std::vector<std::string> written;
  nlohmann::json splits = nlohmann::json::array();
  for (size_t sp = 0; sp < o.splits.size(); ++sp) {
    remove_stale_shards(o, o.splits[sp]);
    std::vector<size_t> members;
    for (size_t j = 0; j < encoded.size(); ++j)
      if (split_of[j] == static_cast<int64_t>(sp)) members.push_back(j);
    // Shuffle before dealing to shards, so that every shard holds a mix of the classes in mixed
    // order, as a shuffled TFDS build does.
    std::vector<size_t> mixed = members;
    Rng rng(util::mix_seed(o.seed, {static_cast<uint64_t>(sp), kShardShuffleStream}));
    shuffle_in_place(mixed, rng);
    std::vector<std::string> lengths;
    int64_t bytes_total = 0;
    for (int s = 0; s < o.shards; ++s) {
      const std::string path = (fs::path(o.out_dir) / shard_name(o, o.splits[sp], s)).string();
      RecordWriter writer(path, compression);
      int64_t n = 0;
      for (size_t m = static_cast<size_t>(s); m < mixed.size();
           m += static_cast<size_t>(o.shards)) {
        const size_t j = mixed[m];
        const std::string record = make_image_example(
            encoded[j], label_of[j], o.image_key, o.label_key, {{"image/filename", name_of[j]}});
        bytes_total += static_cast<int64_t>(record.size());
        writer.write(record);
        ++n;
      }
      writer.close();
      lengths.push_back(std::to_string(n));
      written.push_back(path);
    }
    splits.push_back({{"name", o.splits[sp]},
                      {"numBytes", std::to_string(bytes_total)},
                      {"shardLengths", lengths}});
  }
  const fs::path stale_info = fs::path(o.out_dir) / "dataset_info.json";
  if (!o.tfds && fs::exists(stale_info, ec)) {
    // Left by an earlier --tfds run: the trainer would read the directory as TFDS.
    fs::remove(stale_info, ec);
    fs::remove(fs::path(o.out_dir) / "label.labels.txt", ec);
  }
  if (o.tfds) {
    const nlohmann::json info = {
        {"name", o.name},
        {"version", "0.1.0"},
        {"description", "Synthetic Cassava-like leaf images written by `trainer make-dataset`."},
        {"fileFormat", "tfrecord"},
        {"splits", splits},
        {"supervisedKeys", {{"input", o.image_key}, {"output", o.label_key}}}};
    util::write_file_atomic(fs::path(o.out_dir) / "dataset_info.json", info.dump(2) + "\n");
    std::string labels;
    for (const auto& name : summary.class_names) labels += name + "\n";
    util::write_file_atomic(fs::path(o.out_dir) / "label.labels.txt", labels);
  }
  return written;
}

}  // namespace

std::vector<std::string> synthetic_class_names(int classes) {
  static const char* const kNames[] = {"cbb", "cbsd", "cgm", "cmd", "healthy"};
  std::vector<std::string> names;
  for (int k = 0; k < classes; ++k) {
    names.push_back(k < 5 ? kNames[k] : "class" + std::to_string(k));
  }
  return names;
}

SyntheticSummary make_synthetic_dataset(const SyntheticOptions& options) {
  validate(options);
  transforms::init_opencv_threads();
  SyntheticSummary summary;
  summary.class_names = synthetic_class_names(options.classes);

  struct Job {
    size_t split;
    int k;
    int64_t index;
    fs::path path;  // jpeg: where the image goes; tfrecord: its name in image/filename
  };
  std::vector<Job> jobs;
  const fs::path root(options.out_dir);
  const bool records = options.format == "tfrecord";
  for (size_t sp = 0; sp < options.splits.size(); ++sp) {
    const int64_t count = sp == 0 ? options.per_class : std::max(4, options.per_class / 4);
    summary.images_per_split.emplace_back(options.splits[sp], count * options.classes);
    if (records) {
      for (int k = 0; k < options.classes; ++k)
        for (int64_t i = 0; i < count; ++i)
          jobs.push_back(Job{sp, k, i, file_name(summary.class_names[k], i)});
      continue;
    }
    for (int k = 0; k < options.classes; ++k) {
      const fs::path dir = root / options.splits[sp] / summary.class_names[k];
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec)
        throw DataError("make-dataset: cannot create '" + dir.string() + "': " + ec.message());
      remove_stale(dir, summary.class_names[k], count);
      for (int64_t i = 0; i < count; ++i) {
        jobs.push_back(Job{sp, k, i, dir / file_name(summary.class_names[k], i)});
      }
    }
    // Class folders of an earlier run with more classes.
    for (int k = options.classes; k < options.classes + 64; ++k) {
      const std::string name = synthetic_class_names(k + 1).back();
      remove_stale(root / options.splits[sp] / name, name, 0);
    }
  }

  std::vector<std::string> encoded(records ? jobs.size() : 0);
  std::atomic<size_t> next{0};
  std::mutex error_mu;
  std::exception_ptr error;
  auto work = [&] {
    for (;;) {
      const size_t j = next.fetch_add(1);
      if (j >= jobs.size()) return;
      try {
        const Job& job = jobs[j];
        Rng rng(util::mix_seed(options.seed,
                               {static_cast<uint64_t>(job.split), static_cast<uint64_t>(job.k),
                                static_cast<uint64_t>(job.index)}));
        cv::Mat image = render_image(job.k, options.image_size, rng);
        if (options.image_height != 0 && options.image_height != options.image_size) {
          cv::Mat tall;
          cv::resize(image, tall, cv::Size(options.image_size, options.image_height), 0, 0,
                     cv::INTER_LINEAR);
          image = tall;
        }
        std::vector<uchar> bytes;
        if (!cv::imencode(".jpg", image, bytes, {cv::IMWRITE_JPEG_QUALITY, kJpegQuality})) {
          throw DataError("make-dataset: cannot encode '" + job.path.string() + "'");
        }
        if (records) {
          encoded[j].assign(bytes.begin(), bytes.end());
        } else {
          write_bytes(job.path, bytes);
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next.store(jobs.size());
        return;
      }
    }
  };
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t n_threads = std::min<size_t>({hw, 8, std::max<size_t>(1, jobs.size() / 16)});
  // OpenCV creates its matrix-expression singleton on first use with unsynchronised
  // double-checked locking; create it here, before the threads, so they only read it
  // (ThreadSanitizer reported the threads' first cv::Mat::zeros racing with its creation).
  (void)cv::Mat(cv::Mat::zeros(1, 1, CV_8U));
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  if (records) {
    std::vector<int64_t> split_of(jobs.size());
    std::vector<int64_t> label_of(jobs.size());
    std::vector<std::string> name_of(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) {
      split_of[j] = static_cast<int64_t>(jobs[j].split);
      label_of[j] = jobs[j].k;
      name_of[j] = jobs[j].path.string();
    }
    summary.files = write_record_shards(options, summary, split_of, label_of, name_of, encoded);
  }
  return summary;
}

}  // namespace trainer::synth
