// The subcommands as functions: each has its own options struct and run_x(const Options&), so
// tests call them without argv (CLI11's subcom_in_files pattern). app/trainer/main.cpp only
// fills the structs. Every run_x returns 0 or throws an Error whose kind main maps to the exit
// code. Not thread-safe (they configure process-wide LibTorch state).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "trainer/synth/synthetic.h"

namespace trainer::train {

struct TrainOptions {
  std::string config;                  // YAML job spec ("" = defaults + overrides)
  std::string job_dir;                 // required
  int epochs = 0;                      // > 0 overrides train.epochs
  std::vector<std::string> overrides;  // "key.path=value"
  bool overwrite = false;              // start afresh in a job dir that holds another job
};
int run_train(const TrainOptions& options);

struct InspectOptions {
  std::string config;
  std::string job_dir;  // optional: reported, and the planned write dir
  int epochs = 0;
  std::vector<std::string> overrides;
};
int run_inspect(const InspectOptions& options, std::ostream& out);

// trainer preview: the first `count` examples of `split` in epoch `epoch` as the model receives
// them, from the real loader and the real batch mixing: DIR/preview.png (a captioned contact
// sheet), DIR/inputs.npy (float32 [N, 3, H, W], the model's input), DIR/targets.npy (float32
// [N, classes], mixup/CutMix and label smoothing included), DIR/examples.jsonl (per example:
// source, label, the augmentation drawn, the mixing).
struct PreviewOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string split = "train";  // train | validation
  int count = 16;
  int64_t epoch = 0;
  std::string out;
};
int run_preview(const PreviewOptions& options, std::ostream& out);

struct EvaluateOptions {
  std::string model_dir;
  std::string config;
  std::string split = "validation";  // validation | train
  std::vector<std::string> overrides;
  std::string tta = "none";  // test-time augmentation: none | flip | dihedral (loop/evaluate.h)
};
int run_evaluate(const EvaluateOptions& options, std::ostream& out);

// Classifies images: files, directories (their images, recursively, as an imagefolder class
// folder is listed), globs, and CSV manifests (.csv: the image column's paths); in batches of
// batch_size (0 = the model's training batch), decoded on the thread budget while the model
// runs. Writes JSON lines (path, label, index, probabilities) or, with format csv, Kaggle's
// `image_id,label` (file name, class index), to `out` (atomically, at the end) or else to the
// stream as it goes. A progress line on a terminal, a summary with images/s in the log.
// With tta, the probabilities (and so the label) are the softmax averaged over the views.
struct PredictOptions {
  std::string model_dir;
  std::vector<std::string> images;
  int threads = 0;
  int64_t batch_size = 0;
  std::string format;        // jsonl | csv; "" = csv when `out` ends in .csv, else jsonl
  std::string out;           // "" = the stream
  bool overwrite = false;    // replace an existing `out`
  std::string image_column;  // manifests: the column of image paths ("" = guess)
  std::string image_root;    // manifests: what paths are relative to ("" = the manifest's dir)
  std::string tta = "none";  // test-time augmentation: none | flip | dihedral (loop/evaluate.h)
};
int run_predict(const PredictOptions& options, std::ostream& out);

// Writes an exported model directory (MODEL_DIR/model.json + model.safetensors) as an ONNX file
// (model_dir.h's onnx_model); refuses an existing `out` unless overwrite. Prints a JSON summary
// (inputs, outputs, opset, bytes, nodes, parameters).
struct ExportOptions {
  std::string model_dir;
  std::string format = "onnx";
  std::string out;
  bool overwrite = false;
  bool include_preprocessing = false;
  int opset = 13;
};
int run_export(const ExportOptions& options, std::ostream& out);

// Reads a weights file (torch.save .pth or safetensors, told apart by content) and writes its
// state dict as safetensors, atomically; refuses an existing output unless overwrite. Prints a
// JSON summary (tensors, elements, bytes).
struct ConvertOptions {
  std::string input;
  std::string output;
  bool overwrite = false;
};
int run_convert(const ConvertOptions& options, std::ostream& out);

using MakeDatasetOptions = synth::SyntheticOptions;
int run_make_dataset(const MakeDatasetOptions& options, std::ostream& out);

}  // namespace trainer::train
