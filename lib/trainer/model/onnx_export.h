// A trained classifier (model/net.h) as an ONNX model (what a serving stack reads: ONNX Runtime,
// OpenCV's DNN, TensorRT, OpenVINO, Triton), written with the ONNX project's protobuf types through
// model/onnx/graph.h and checked with its checker before it is returned.
// The graph is the module's eval-mode forward: every BatchNorm is folded into the convolution
// before it (weights and a bias, computed in double, stored in fp32), as torch.onnx.export does
// in eval mode; fp32 weights whatever the training precision; the batch dimension is dynamic.
// Input "input": [batch, 3, S, S] float32, RGB, normalised; or, with include_preprocessing,
// "image": [batch, S, S, 3] uint8 RGB, cast, transposed and normalised inside the graph with
// the same float32 operations, in the same order, as the trainer (data::normalize_images).
// Outputs "logits" and "probabilities" (softmax over the classes), both [batch, classes].
// Stateless; thread-safe for different modules.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trainer/model/net.h"

namespace trainer::model {

struct OnnxExportOptions {
  int opset = 13;
  int image_size = 224;
  bool include_preprocessing = false;
  // The normalisation after x / 255: empty for none ("unit"), else one value per channel.
  std::vector<float> mean, std;
  std::string graph_name = "resnet";
  std::string doc;            // the graph's doc_string
  int64_t model_version = 0;  // ModelProto.model_version (the trainer: the global step)
  std::vector<std::pair<std::string, std::string>> properties;  // metadata_props
};

// Input and output names.
inline constexpr const char* kOnnxInput = "input";
inline constexpr const char* kOnnxImageInput = "image";
inline constexpr const char* kOnnxLogits = "logits";
inline constexpr const char* kOnnxProbabilities = "probabilities";

// The serialised model. Throws ConfigError for an opset outside 13..17, Error(kInternal) when
// the module is not the torchvision layout or the checker refuses the result.
std::string export_onnx(NetImpl& net, const OnnxExportOptions& options);

}  // namespace trainer::model
