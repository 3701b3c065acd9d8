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

#include "trainer/data/image.h"
#include "trainer/loop/runtime.h"
#include "trainer/model/net.h"

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
  int64_t batch_size = 32;  // per-replica training batch (predict's default batch)
  // The evaluation preprocessing validation used (data.interpolation, data.eval_*), which
  // evaluate, predict and the ONNX export reuse. A model.json without them (written before they
  // existed): square, bilinear, the crop = image_size.
  std::string interpolation = "bilinear";  // bilinear | bicubic
  std::string eval_resize = "square";      // square | shorter_side
  int eval_resize_size = 0;                // shorter_side's shorter side; 0 = auto (crop / 0.875)
  int eval_crop_size = 0;                  // 0 = image_size

  // The model's input side at inference (the eval crop): what predict, evaluate and the ONNX
  // export feed it.
  int input_size() const;
  // model.json, with the eval sizes resolved (no 0 = auto).
  nlohmann::json to_json() const;
};

// What a serving stack must do to an image before the model sees it (model.json's
// `preprocessing`, and the ONNX metadata): decode; eval_resize square: resize the whole image to
// input_size() square (bilinear or bicubic, aspect ratio not kept, no crop; a JPEG at least
// twice that size first decoded at 1/2, 1/4 or 1/8 scale when reduced_decode); shorter_side:
// torchvision's Resize(eval_resize_size) (PIL's antialiased filters) + CenterCrop(input_size());
// RGB, x / 255, then (x - mean) / std per channel for "imagenet"; NCHW float32. Its
// `image_size` is the input side.
nlohmann::json preprocessing_contract(const ModelInfo& info);

// The image preprocessing the model of `info` was validated with (its eval resize, crop,
// interpolation and JPEG decode, no augmentation): what `trainer evaluate` and `trainer
// predict` feed it.
data::PreprocessOptions inference_preprocess(const ModelInfo& info);

// How the model of `info` runs inference on `device`: the precision it was trained in where the
// device has it (inference_precision), its memory format and its input normalization. The one
// reading of model.json's inference settings.
ModelSettings inference_settings(const ModelInfo& info, const torch::Device& device);

struct OnnxOptions {
  bool include_preprocessing = false;  // input uint8 NHWC RGB, normalised in the graph
  int opset = 13;
};
// The model as an ONNX file's bytes (model::export_onnx), with the contract, the class names
// and model.json in its metadata_props.
std::string onnx_model(model::Net net, const ModelInfo& info, const OnnxOptions& options);

// Writes the model directory `dir`: model.safetensors, model.json and, with `onnx`, model.onnx,
// built under a hidden name beside it (.<name>.building-<pid>) and renamed into place when every
// file is written (util::replace_dir), so `dir` is complete or absent. A failed ONNX export
// throws naming it, and leaves the weights in <dir>.without-onnx for predict and evaluate.
void export_model(const std::filesystem::path& dir, const model::Net& net, const ModelInfo& info,
                  const OnnxOptions* onnx = nullptr);

struct LoadedModel {
  model::Net net{nullptr};
  ModelInfo info;
};

// Reads and checks model.json (the first step of load_model_dir; no network is built). Throws
// DataError naming the file and the field that is missing, of the wrong type or out of range.
ModelInfo read_model_info(const std::filesystem::path& json_path);

// Reads a model directory. Throws UsageError when `dir` is not a model directory, DataError
// when its files are damaged or disagree.
LoadedModel load_model_dir(const std::filesystem::path& dir);

}  // namespace trainer::train
