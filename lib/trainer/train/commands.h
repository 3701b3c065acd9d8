// The subcommands as functions: each has its own options struct and run_x(const Options&), so
// tests call them without argv (CLI11's subcom_in_files pattern). app/trainer/main.cpp only
// fills the structs. Every run_x returns 0 or throws an Error whose kind main maps to the exit
// code. Not thread-safe (they configure process-wide LibTorch state).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "trainer/data/synthetic.h"

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

struct EvaluateOptions {
  std::string model_dir;
  std::string config;
  std::string split = "validation";  // validation | train
  std::vector<std::string> overrides;
};
int run_evaluate(const EvaluateOptions& options, std::ostream& out);

struct PredictOptions {
  std::string model_dir;
  std::vector<std::string> images;
  int threads = 0;
};
int run_predict(const PredictOptions& options, std::ostream& out);

// Reads a weights file (torch.save .pth or safetensors, told apart by content) and writes its
// state dict as safetensors, atomically; refuses an existing output unless overwrite. Prints a
// JSON summary (tensors, elements, bytes).
struct ConvertOptions {
  std::string input;
  std::string output;
  bool overwrite = false;
};
int run_convert(const ConvertOptions& options, std::ostream& out);

using MakeDatasetOptions = data::SyntheticOptions;
int run_make_dataset(const MakeDatasetOptions& options, std::ostream& out);

}  // namespace trainer::train
