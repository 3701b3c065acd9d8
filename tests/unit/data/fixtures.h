// Test fixtures for the data module: a unique temp directory removed at scope exit, and small
// image files written with OpenCV at test time (no checked-in data).
#pragma once

#include "common/temp_dir.h"

#include <unistd.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::data::testing {

namespace fs = std::filesystem;

using trainer::test_support::TempDir;  // tests/common/temp_dir.h

// An integer from the environment (benchmark sizes), or `fallback` when unset or empty.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

inline void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

inline std::string read_bytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline std::string encode(const cv::Mat& image, const std::string& ext = ".jpg") {
  std::vector<uchar> buf;
  if (!cv::imencode(ext, image, buf)) throw std::runtime_error("imencode failed");
  return std::string(buf.begin(), buf.end());
}

// A w x h BGR image with a deterministic gradient pattern (value depends on `tag`).
inline cv::Mat pattern_image(int w, int h, int tag) {
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      m.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uchar>((x * 7 + tag * 31) % 256),
                                        static_cast<uchar>((y * 5 + tag * 17) % 256),
                                        static_cast<uchar>((x + y + tag * 53) % 256));
    }
  }
  return m;
}

inline void write_jpeg(const fs::path& path, const cv::Mat& image) {
  write_text(path, encode(image, ".jpg"));
}

}  // namespace trainer::data::testing
