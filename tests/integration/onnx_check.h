// An independent runtime for the trainer's ONNX files: OpenCV's DNN module (its own ONNX
// importer and kernels, nothing shared with LibTorch) runs model.onnx on images preprocessed
// as the model's contract says, for comparison with `trainer predict`.
#pragma once

#include <opencv2/dnn.hpp>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "harness.h"
#include "trainer/data/image.h"

namespace trainer::testing {

// Images as the model gets them: [N, S, S, 3] uint8 RGB (the trainer's own decode and resize).
inline torch::Tensor decoded_images(const std::vector<std::string>& paths, int size,
                                    bool reduced_decode = true) {
  data::PreprocessOptions pre;
  pre.image_size = size;
  pre.reduced_decode = reduced_decode;
  const data::ImagePipeline pipeline(pre);
  std::vector<torch::Tensor> images;
  for (const auto& p : paths) images.push_back(pipeline.load(p, 0));
  return torch::stack(images);
}

inline cv::Mat to_blob(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  std::vector<int> dims(c.sizes().begin(), c.sizes().end());
  const int type = c.scalar_type() == torch::kByte ? CV_8U : CV_32F;
  return cv::Mat(static_cast<int>(dims.size()), dims.data(), type, c.data_ptr()).clone();
}

// Runs `onnx_file` with OpenCV on the images, `batch` at a time; returns the probabilities
// ([N, classes]) and fills *logits. uint8_input: the file takes the uint8 NHWC images itself
// (--include-preprocessing); otherwise they are normalised here, as `normalize` says.
inline torch::Tensor opencv_probabilities(const std::string& onnx_file, const torch::Tensor& images,
                                          int64_t batch, const std::string& normalize,
                                          bool uint8_input, torch::Tensor* logits = nullptr) {
  cv::dnn::Net net = cv::dnn::readNetFromONNX(onnx_file);
  net.setPreferableBackend(cv::dnn::DNN_BACKEND_OPENCV);
  net.setPreferableTarget(cv::dnn::DNN_TARGET_CPU);
  std::vector<torch::Tensor> probs, scores;
  for (int64_t start = 0; start < images.size(0); start += batch) {
    const torch::Tensor part = images.slice(0, start, std::min(start + batch, images.size(0)));
    const torch::Tensor input =
        uint8_input ? part : data::normalize_images(part, data::parse_normalize(normalize), false);
    net.setInput(to_blob(input), uint8_input ? "image" : "input");
    std::vector<cv::Mat> outs;
    net.forward(outs, std::vector<cv::String>{"logits", "probabilities"});
    for (size_t k = 0; k < outs.size(); ++k) {
      const cv::Mat m = outs[k].reshape(1, static_cast<int>(part.size(0)));
      torch::Tensor t =
          torch::from_blob(const_cast<float*>(m.ptr<float>()), {m.rows, m.cols}, torch::kFloat)
              .clone();
      (k == 0 ? scores : probs).push_back(t);
    }
  }
  if (logits) *logits = torch::cat(scores);
  return torch::cat(probs);
}

// `trainer predict` JSON lines -> path: probabilities.
inline std::map<std::string, std::vector<float>> predicted(const std::string& jsonl) {
  std::map<std::string, std::vector<float>> out;
  std::istringstream lines(jsonl);
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    out[j["path"].get<std::string>()] = j["probabilities"].get<std::vector<float>>();
  }
  return out;
}

// Largest |a - b| over the images, a from OpenCV (rows in `paths` order), b from predict.
inline double max_difference(const torch::Tensor& a, const std::vector<std::string>& paths,
                             const std::map<std::string, std::vector<float>>& b) {
  double worst = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto it = b.find(paths[i]);
    if (it == b.end()) return 1e9;  // predict left an image out
    const torch::Tensor row = a[static_cast<int64_t>(i)];
    if (static_cast<int64_t>(it->second.size()) != row.numel()) return 1e9;
    for (int64_t c = 0; c < row.numel(); ++c) {
      worst = std::max(worst, std::abs(static_cast<double>(row[c].item<float>()) - it->second[c]));
    }
  }
  return worst;
}

}  // namespace trainer::testing
