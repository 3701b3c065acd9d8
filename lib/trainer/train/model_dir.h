// The exported model, the counterpart of the tutorial's SavedModel: MODEL_DIR/model.safetensors
// (torchvision state-dict keys) and MODEL_DIR/model.json (arch, classes and their names, image
// size, normalisation, head, precision). `predict` and `evaluate` read exactly this directory.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/model/resnet.h"

namespace trainer::train {

inline constexpr int kModelFormatVersion = 1;

struct ModelInfo {
  std::string arch;
  int64_t num_classes = 0;
  int64_t head_hidden = 0;
  std::vector<std::string> class_names;
  int image_size = 224;
  std::string normalize = "imagenet";
  bool reduced_decode = true;      // JPEG DCT-scaled decode (data.reduced_decode)
  std::string precision = "fp32";  // what it was trained with (evaluate/predict reuse it)
  bool channels_last = false;
  int64_t global_step = 0;
  int64_t epochs = 0;

  nlohmann::json to_json() const;
};

// Writes model.safetensors then model.json (each atomically) into `dir`.
void export_model(const std::filesystem::path& dir, const model::ResNet& net,
                  const ModelInfo& info);

struct LoadedModel {
  model::ResNet net{nullptr};
  ModelInfo info;
};

// Reads and checks model.json (the first step of load_model_dir; no network is built). Throws
// DataError naming the file and the field that is missing, of the wrong type or out of range.
ModelInfo read_model_info(const std::filesystem::path& json_path);

// Reads a model directory. Throws UsageError when `dir` is not a model directory, DataError
// when its files are damaged or disagree.
LoadedModel load_model_dir(const std::filesystem::path& dir);

}  // namespace trainer::train
