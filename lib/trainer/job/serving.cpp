// `trainer predict` and `trainer export`: the commands that hand a trained model on.
#include <glob.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainer/data/loader.h"
#include "trainer/data/source.h"
#include "trainer/job/commands.h"
#include "trainer/loop/evaluate.h"
#include "trainer/loop/model_dir.h"
#include "trainer/loop/runtime.h"
#include "trainer/model/onnx/graph.h"
#include "trainer/util/cpu.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/log.h"
#include "trainer/util/storage.h"

namespace trainer::train {

namespace fs = std::filesystem;

namespace {

// An output file that must not exist unless --overwrite (nothing is written before the check).
void check_output(const std::string& path, bool overwrite, const std::string& command) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw UsageError(command + ": --out '" + path + "' is a directory, expected a file name");
  }
  util::refuse_existing_output(path, overwrite, command, "--out");
}

// Every image the inputs name, in the order given (a directory's and a glob's sorted).
std::vector<std::string> list_inputs(const PredictOptions& o) {
  std::vector<std::string> images;
  std::vector<std::string> gifs;  // found in directories and globs: left out, one warning
  const auto add_dir = [&](const std::string& dir) {
    std::vector<std::string> found = data::list_image_files(dir, "predict", &gifs);
    if (found.empty()) {
      throw DataError("predict: no images (.jpg .jpeg .png .bmp) under '" + dir + "'");
    }
    images.insert(images.end(), found.begin(), found.end());
  };
  for (const std::string& given : o.images) {
    const std::string p = util::local_path(given, "predict IMAGE");
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      add_dir(p);
    } else if (fs::is_regular_file(p, ec)) {
      if (fs::path(p).extension() == ".csv" || fs::path(p).extension() == ".CSV") {
        const auto rows =
            data::list_manifest_images(p, o.image_column, o.image_root, "predict '" + given + "'");
        images.insert(images.end(), rows.begin(), rows.end());
      } else if (data::is_gif_file(p)) {
        throw DataError("predict: '" + given + "': " + data::kGifNote);
      } else {
        images.push_back(p);
      }
    } else if (util::has_glob_chars(p)) {
      glob_t g{};
      const int rc = ::glob(p.c_str(), 0, nullptr, &g);
      std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
      globfree(&g);
      if (matches.empty()) throw DataError("predict: no files match '" + given + "'");
      for (const std::string& m : matches) {
        if (fs::is_directory(m, ec)) {
          add_dir(m);
        } else if (data::is_gif_file(m)) {
          gifs.push_back(m);
        } else {
          images.push_back(m);
        }
      }
    } else {
      throw DataError("predict: '" + given +
                      "' does not exist (expected an image, a directory, "
                      "a glob or a .csv manifest)");
    }
  }
  data::warn_unlisted_gifs("predict", gifs);
  if (images.empty()) throw DataError("predict: no images to classify");
  return images;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (const char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

int run_predict(const PredictOptions& options, std::ostream& stream) {
  if (options.images.empty()) throw UsageError("predict: give at least one IMAGE");
  if (options.batch_size < 0) {
    throw UsageError("predict: --batch-size: expected 1 or more (0 = the model's training batch)");
  }
  const Tta tta = parse_tta(options.tta, "predict: --tta");
  std::string format = options.format;
  if (format.empty()) format = fs::path(options.out).extension() == ".csv" ? "csv" : "jsonl";
  if (format != "jsonl" && format != "csv") {
    throw UsageError("predict: --format: expected jsonl or csv, got '" + format + "'");
  }
  const std::string out_path =
      options.out.empty() ? "" : util::local_path(options.out, "predict --out");
  if (!out_path.empty()) check_output(out_path, options.overwrite, "predict");
  const LoadedModel loaded = load_model_dir(options.model_dir);
  const std::vector<std::string> images = list_inputs(options);

  const ThreadBudget budget = plan_threads(options.threads, 0, util::usable_cores(), false, false);
  apply_threads(budget);
  data::LoaderOptions lo;
  lo.preprocess = inference_preprocess(loaded.info);
  lo.batch_size = options.batch_size > 0 ? options.batch_size : loaded.info.batch_size;
  lo.num_workers = budget.decode;
  std::vector<data::Example> examples;
  examples.reserve(images.size());
  for (const std::string& path : images) examples.push_back(data::Example{path, 0});
  data::Loader loader(std::move(examples), lo);

  ModelSettings settings = inference_settings(loaded.info, torch::kCPU);
  model::Net net = loaded.net;
  place_model(net, settings);
  net->eval();
  torch::NoGradGuard no_grad;

  std::ostringstream buffer;  // with --out: written whole, atomically, at the end
  std::ostream& out = out_path.empty() ? stream : buffer;
  if (format == "csv") out << "image_id,label\n";
  const bool tty = util::stderr_is_tty();
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const int64_t total = static_cast<int64_t>(images.size());
  int64_t done = 0;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    const torch::Tensor input = prepare_input(batch->images, settings);
    const torch::Tensor probs =
        (tta == Tta::kNone ? torch::softmax(forward_logits(net, input, settings), 1)
                           : tta_log_probabilities(net, input, settings, tta).exp())
            .to(torch::kCPU, torch::kFloat)
            .contiguous();
    const torch::Tensor best = probs.argmax(1);
    for (size_t row = 0; row < batch->indices.size(); ++row) {
      const std::string& path = images[static_cast<size_t>(batch->indices[row])];
      const int64_t index = best[static_cast<int64_t>(row)].item<int64_t>();
      if (format == "csv") {
        out << csv_field(fs::path(path).filename().string()) << "," << index << "\n";
      } else {
        const float* p = probs[static_cast<int64_t>(row)].data_ptr<float>();
        out << nlohmann::json{{"path", path},
                              {"label", loaded.info.class_names.at(static_cast<size_t>(index))},
                              {"index", index},
                              {"probabilities", std::vector<float>(p, p + probs.size(1))}}
                   .dump()
            << "\n";
      }
    }
    out.flush();
    done += static_cast<int64_t>(batch->indices.size());
    if (tty) {
      std::fprintf(stderr, "\rpredict: %lld/%lld images, %.1f images/s",
                   static_cast<long long>(done), static_cast<long long>(total),
                   done / std::max(seconds(), 1e-9));
      std::fflush(stderr);
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  const double elapsed = seconds();
  if (!out_path.empty()) util::write_file_atomic(out_path, buffer.str());
  spdlog::info(
      "predicted {} images in {:.2f} s: {:.1f} images/s (batch {}, {} decode thread{}, "
      "{} intra-op{}){}",
      done, elapsed, done / std::max(elapsed, 1e-9), lo.batch_size, budget.decode,
      budget.decode == 1 ? "" : "s", budget.intra_op,
      tta == Tta::kNone ? "" : ", tta " + options.tta,
      out_path.empty() ? "" : "; written to " + options.out);
  return 0;
}

int run_export(const ExportOptions& options, std::ostream& out) {
  if (options.format != "onnx") {
    throw UsageError("export: --format: expected onnx, got '" + options.format + "'");
  }
  if (options.out.empty()) throw UsageError("export: --out is required");
  const std::string out_path = util::local_path(options.out, "export --out");
  check_output(out_path, options.overwrite, "export");
  const LoadedModel loaded = load_model_dir(options.model_dir);
  OnnxOptions onnx;
  onnx.include_preprocessing = options.include_preprocessing;
  onnx.opset = options.opset;
  const std::string bytes = onnx_model(loaded.net, loaded.info, onnx);
  util::write_file_atomic(out_path, bytes);

  const model::onnx::ModelSummary s = model::onnx::summarize(bytes);
  const auto values = [](const std::vector<model::onnx::ValueInfo>& vs) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& v : vs) {
      nlohmann::json shape = nlohmann::json::array();
      for (const int64_t d : v.dims)
        shape.push_back(d < 0 ? nlohmann::json("batch") : nlohmann::json(d));
      list.push_back({{"name", v.name},
                      {"dtype", v.type == model::onnx::ElemType::kUint8 ? "uint8" : "float32"},
                      {"shape", shape}});
    }
    return list;
  };
  int64_t nodes = 0;
  for (const auto& [op, n] : s.op_counts) nodes += n;
  out << nlohmann::json{{"model", options.model_dir},
                        {"output", options.out},
                        {"format", "onnx"},
                        {"opset", s.opset},
                        {"ir_version", s.ir_version},
                        {"bytes", bytes.size()},
                        {"inputs", values(s.inputs)},
                        {"outputs", values(s.outputs)},
                        {"nodes", nodes},
                        {"ops", s.op_counts},
                        {"parameters", s.parameters},
                        {"checked", "onnx::checker::check_model and strict shape inference"}}
             .dump()
      << "\n";
  return 0;
}

}  // namespace trainer::train
