#include "trainer/data/contact_sheet.h"

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>

#include "trainer/util/error.h"

namespace trainer::data {

std::string encode_contact_sheet(const std::vector<torch::Tensor>& images,
                                 const std::vector<std::vector<std::string>>& captions,
                                 int columns) {
  if (images.size() != captions.size() || images.empty() || columns < 1) {
    throw Error(ErrorKind::kInternal, "encode_contact_sheet: bad arguments");
  }
  constexpr int kMinSide = 160;
  constexpr int kPad = 6;
  constexpr int kLine = 14;
  constexpr double kFont = 0.38;
  int cell_w = 0;
  int cell_h = 0;
  size_t lines = 0;
  std::vector<cv::Mat> tiles;
  for (size_t i = 0; i < images.size(); ++i) {
    const torch::Tensor& t = images[i];
    if (t.dim() != 3 || t.size(2) != 3 || t.scalar_type() != torch::kUInt8) {
      throw Error(ErrorKind::kInternal, "encode_contact_sheet: expected [H, W, 3] uint8 images");
    }
    const torch::Tensor rgb = t.to(torch::kCPU).contiguous();
    const cv::Mat view(static_cast<int>(rgb.size(0)), static_cast<int>(rgb.size(1)), CV_8UC3,
                       const_cast<uint8_t*>(rgb.data_ptr<uint8_t>()));
    cv::Mat bgr;
    cv::cvtColor(view, bgr, cv::COLOR_RGB2BGR);
    const int scale =
        std::max(1, (kMinSide + std::max(bgr.cols, bgr.rows) - 1) / std::max(bgr.cols, bgr.rows));
    if (scale > 1) {
      cv::resize(bgr, bgr, cv::Size(bgr.cols * scale, bgr.rows * scale), 0, 0, cv::INTER_NEAREST);
    }
    cell_w = std::max(cell_w, bgr.cols);
    cell_h = std::max(cell_h, bgr.rows);
    lines = std::max(lines, captions[i].size());
    tiles.push_back(bgr);
  }
  const int cols = std::min<int>(columns, static_cast<int>(tiles.size()));
  const int rows = (static_cast<int>(tiles.size()) + cols - 1) / cols;
  const int tile_w = cell_w + 2 * kPad;
  const int tile_h = cell_h + 2 * kPad + static_cast<int>(lines) * kLine;
  cv::Mat sheet(rows * tile_h, cols * tile_w, CV_8UC3, cv::Scalar(255, 255, 255));
  for (size_t i = 0; i < tiles.size(); ++i) {
    const int x = static_cast<int>(i) % cols * tile_w + kPad;
    const int y = static_cast<int>(i) / cols * tile_h + kPad;
    tiles[i].copyTo(sheet(cv::Rect(x, y, tiles[i].cols, tiles[i].rows)));
    for (size_t l = 0; l < captions[i].size(); ++l) {
      std::string text = captions[i][l];
      int baseline = 0;
      while (text.size() > 4 &&
             cv::getTextSize(text, cv::FONT_HERSHEY_SIMPLEX, kFont, 1, &baseline).width > cell_w) {
        text = text.substr(0, text.size() - 4) + "...";
      }
      cv::putText(sheet, text, cv::Point(x, y + cell_h + kLine * static_cast<int>(l + 1) - 2),
                  cv::FONT_HERSHEY_SIMPLEX, kFont, cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
    }
  }
  std::vector<uint8_t> png;
  if (!cv::imencode(".png", sheet, png)) {
    throw Error(ErrorKind::kInternal, "encode_contact_sheet: OpenCV could not encode the sheet");
  }
  return std::string(png.begin(), png.end());
}

}  // namespace trainer::data
