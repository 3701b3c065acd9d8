#include "trainer/loop/model_dir.h"

#include <fmt/format.h>
#include <unistd.h>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <tuple>

#include "trainer/config/job_spec.h"
#include "trainer/data/image.h"
#include "trainer/model/onnx_export.h"
#include "trainer/model/safetensors.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/json.h"
#include "trainer/util/storage.h"

namespace trainer::train {

namespace fs = std::filesystem;

int ModelInfo::input_size() const { return eval_crop_size > 0 ? eval_crop_size : image_size; }

nlohmann::json ModelInfo::to_json() const {
  const data::PreprocessOptions p = inference_preprocess(*this);
  return {{"format_version", kModelFormatVersion},
          {"arch", arch},
          {"num_classes", num_classes},
          {"head_hidden", head_hidden},
          {"class_names", class_names},
          {"image_size", image_size},
          {"normalize", normalize},
          {"reduced_decode", reduced_decode},
          {"precision", precision},
          {"channels_last", channels_last},
          {"global_step", global_step},
          {"epochs", epochs},
          {"batch_size", batch_size},
          {"interpolation", interpolation},
          {"eval_resize", eval_resize},
          {"eval_resize_size", eval_resize == "shorter_side" ? p.eval_resize_side() : 0},
          {"eval_crop_size", p.eval_crop()},
          {"trainer_version", TRAINER_VERSION},
          {"weights", "model.safetensors"},
          {"preprocessing", preprocessing_contract(*this)}};
}

namespace {

// torchvision's ImageNet mean and std, as data::normalize_images uses them.
std::pair<std::vector<float>, std::vector<float>> mean_std(const ModelInfo& info) {
  if (data::parse_normalize(info.normalize, "model.json normalize") != data::Normalize::kImagenet)
    return {};
  const data::NormConstants c = data::norm_constants(data::Normalize::kImagenet, torch::kCPU);
  const auto floats = [](const torch::Tensor& t) {
    const torch::Tensor f = t.to(torch::kFloat).contiguous();
    return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
  };
  return {floats(c.mean), floats(c.std)};
}

}  // namespace

nlohmann::json preprocessing_contract(const ModelInfo& info) {
  const auto [mean, std] = mean_std(info);
  const data::PreprocessOptions p = inference_preprocess(info);
  const std::string side = std::to_string(p.eval_crop());
  const bool bicubic = info.interpolation == "bicubic";
  const bool shorter_side = info.eval_resize == "shorter_side";
  std::string resize;
  if (shorter_side) {
    const std::string r = std::to_string(p.eval_resize_side());
    resize = "the shorter side to " + r + " pixels and the longer to int(" + r +
             " * long / short), " + (bicubic ? "bicubic" : "bilinear") +
             " with antialiasing as PIL's Image.resize (torchvision's Resize on PIL images), "
             "then the central " +
             side + "x" + side + " crop (offsets round((side - " + side +
             ") / 2)), as torchvision's ClassificationPresetEval";
    if (info.reduced_decode) {
      resize += "; a JPEG whose sides are still at least twice " + r +
                " pixels at 1/2, 1/4 or 1/8 scale is first decoded at that scale (libjpeg DCT "
                "scaling) and resampled with the full image's geometry";
    }
  } else {
    resize = "the whole image to " + side + "x" + side + " pixels, " +
             (bicubic ? "bicubic (OpenCV INTER_CUBIC)" : "bilinear (OpenCV INTER_LINEAR)") +
             ", aspect ratio not kept, no crop";
    if (info.reduced_decode) {
      resize +=
          "; a JPEG at least twice that size is first decoded at 1/2, 1/4 or 1/8 scale "
          "(libjpeg DCT scaling)";
    }
  }
  // As written (0.485, not the float's 0.48500001430511475): the shortest text of each float.
  const auto as_written = [](const std::vector<float>& v) {
    nlohmann::json out = nlohmann::json::array();
    for (const float f : v) out.push_back(std::stod(fmt::format("{}", f)));
    return out;
  };
  return {{"image_size", p.eval_crop()},
          {"resize", resize},
          {"eval_resize", info.eval_resize},
          {"resize_size", shorter_side ? nlohmann::json(p.eval_resize_side()) : nullptr},
          {"interpolation", info.interpolation},
          {"color", "RGB"},
          {"layout", "NCHW"},
          {"dtype", "float32"},
          {"scale", "x / 255"},
          {"normalize", info.normalize},
          {"mean", mean.empty() ? nlohmann::json(nullptr) : as_written(mean)},
          {"std", std.empty() ? nlohmann::json(nullptr) : as_written(std)}};
}

std::string onnx_model(model::Net net, const ModelInfo& info, const OnnxOptions& options) {
  model::OnnxExportOptions o;
  o.opset = options.opset;
  o.image_size = info.input_size();
  o.include_preprocessing = options.include_preprocessing;
  std::tie(o.mean, o.std) = mean_std(info);
  o.graph_name = info.arch;
  o.model_version = info.global_step;
  const nlohmann::json contract = preprocessing_contract(info);
  const std::string input =
      options.include_preprocessing ? model::kOnnxImageInput : model::kOnnxInput;
  const std::string size = std::to_string(info.input_size());
  o.doc = info.arch + " image classifier over " + std::to_string(info.num_classes) +
          " classes, trained by trainer " + TRAINER_VERSION + ". Input '" + input + "': " +
          (options.include_preprocessing ? "[batch, " + size + ", " + size +
                                               ", 3] uint8 RGB, resized as 'resize' says; "
                                               "the graph does x / 255 and the normalisation"
                                         : "[batch, 3, " + size + ", " + size +
                                               "] float32 RGB, resized as 'resize' "
                                               "says, x / 255, then (x - mean) / std (metadata)") +
          ". Outputs 'logits' and 'probabilities' (softmax), [batch, classes], in the order of "
          "'class_names'. BatchNorm is folded into the convolutions.";
  o.properties = {{"class_names", nlohmann::json(info.class_names).dump()},
                  {"image_size", size},
                  {"input", input},
                  {"input_layout", options.include_preprocessing ? "NHWC" : "NCHW"},
                  {"input_dtype", options.include_preprocessing ? "uint8" : "float32"},
                  {"color", "RGB"},
                  {"resize", contract["resize"].get<std::string>()},
                  {"scale", options.include_preprocessing ? "in the graph" : "x / 255"},
                  {"normalize", info.normalize},
                  {"mean", contract["mean"].dump()},
                  {"std", contract["std"].dump()},
                  {"preprocessing_in_graph", options.include_preprocessing ? "true" : "false"},
                  {"outputs", "logits, probabilities"},
                  {"batchnorm", "folded into Conv"},
                  {"arch", info.arch},
                  {"trainer.model_json", info.to_json().dump()}};
  return model::export_onnx(*net, o);
}

void export_model(const fs::path& dir, const model::Net& net, const ModelInfo& info,
                  const OnnxOptions* onnx) {
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  const std::string name = dir.filename().string();
  fs::create_directories(parent);
  // Built under a hidden name beside its place, so the job dir's readers (the evaluator,
  // predict) see no model until every file of it is written.
  const fs::path building = parent / fmt::format(".{}.building-{}", name, ::getpid());
  fs::remove_all(building);
  fs::create_directories(building);
  model::save_safetensors((building / "model.safetensors").string(), model::state_dict(*net),
                          {{"format", "pt"}, {"arch", info.arch}});
  util::write_file_atomic(building / "model.json", info.to_json().dump(2) + "\n");
  if (onnx) {
    std::string bytes;
    try {
      bytes = onnx_model(net, info, *onnx);
    } catch (const std::exception& e) {
      // The weights are good: keep them where predict and evaluate can read them, under a name
      // that says what is missing, and fail naming the ONNX step.
      const fs::path kept = parent / (name + ".without-onnx");
      util::replace_dir(building, kept);
      const auto* known = dynamic_cast<const Error*>(&e);
      throw Error(known ? known->kind() : ErrorKind::kInternal,
                  fmt::format("export.onnx: the ONNX export of {} failed: {}. {} was not written "
                              "(a model directory holds every file the job spec asks for); the "
                              "trained model without model.onnx is in {} (trainer predict and "
                              "evaluate read it; `trainer export --model {} --format onnx "
                              "--out FILE.onnx` retries the ONNX file)",
                              dir.string(), e.what(), dir.string(), kept.string(), kept.string()));
    }
    util::write_file_atomic(building / "model.onnx", bytes);
  }
  util::replace_dir(building, dir);
}

ModelInfo read_model_info(const fs::path& json_path) {
  ModelInfo info;
  try {
    const auto j = nlohmann::json::parse(util::read_file(json_path));
    const std::string where = "'" + json_path.string() + "'";
    constexpr int64_t kI64 = INT64_MAX;
    if (util::json_int(j, "format_version", INT32_MIN, INT32_MAX, where) != kModelFormatVersion) {
      throw DataError("'" + json_path.string() + "': format_version " +
                      j.at("format_version").dump() + ", expected " +
                      std::to_string(kModelFormatVersion));
    }
    ModelInfo& i = info;
    i.arch = j.at("arch").get<std::string>();
    i.num_classes = util::json_int(j, "num_classes", 1, config::kMaxClasses, where);
    i.head_hidden = util::json_int(j, "head_hidden", 0, config::kMaxHeadHidden, where);
    i.class_names = j.at("class_names").get<std::vector<std::string>>();
    i.image_size =
        static_cast<int>(util::json_int(j, "image_size", 1, config::kMaxImageSize, where));
    i.normalize = j.at("normalize").get<std::string>();
    i.reduced_decode = j.value("reduced_decode", false);  // absent: trained before it existed
    i.precision = j.value("precision", "fp32");
    i.channels_last = j.value("channels_last", false);
    i.global_step = util::json_int_or(j, "global_step", 0, 0, kI64, where);
    i.epochs = util::json_int_or(j, "epochs", 0, 0, kI64, where);
    i.batch_size = util::json_int_or(j, "batch_size", 32, 1, config::kMaxBatchSize, where);
    // Absent: written before they existed, when evaluation resized the whole image.
    i.interpolation = j.value("interpolation", "bilinear");
    i.eval_resize = j.value("eval_resize", "square");
    i.eval_resize_size = static_cast<int>(
        util::json_int_or(j, "eval_resize_size", 0, 0, 2 * config::kMaxImageSize, where));
    i.eval_crop_size = static_cast<int>(
        util::json_int_or(j, "eval_crop_size", 0, 0, config::kMaxImageSize, where));
  } catch (const nlohmann::json::exception& e) {
    throw DataError("'" + json_path.string() + "': " + e.what());
  }
  // Values predict/evaluate pass on as settings: a bad one is this file's fault, not the
  // user's job spec, so say so here.
  const auto bad_field = [&json_path](const std::string& field, const std::string& value) {
    return DataError("'" + json_path.string() + "': " + field + ": unexpected value '" + value +
                     "'");
  };
  if (info.image_size < 1 || info.image_size > config::kMaxImageSize) {
    throw bad_field("image_size", std::to_string(info.image_size));
  }
  if (info.num_classes < 1 || info.num_classes > config::kMaxClasses) {
    throw bad_field("num_classes", std::to_string(info.num_classes));
  }
  if (info.head_hidden < 0 || info.head_hidden > config::kMaxHeadHidden) {
    throw bad_field("head_hidden", std::to_string(info.head_hidden));
  }
  const auto& archs = model::supported_archs();
  if (std::find(archs.begin(), archs.end(), info.arch) == archs.end()) {
    throw bad_field("arch", info.arch);
  }
  if (info.normalize != "unit" && info.normalize != "imagenet") {
    throw bad_field("normalize", info.normalize);
  }
  if (info.precision != "fp32" && info.precision != "bf16" && info.precision != "fp16") {
    throw bad_field("precision", info.precision);
  }
  if (info.interpolation != "bilinear" && info.interpolation != "bicubic") {
    throw bad_field("interpolation", info.interpolation);
  }
  if (info.eval_resize != "square" && info.eval_resize != "shorter_side") {
    throw bad_field("eval_resize", info.eval_resize);
  }
  if (static_cast<int64_t>(info.class_names.size()) != info.num_classes) {
    throw DataError("'" + json_path.string() + "': " + std::to_string(info.class_names.size()) +
                    " class_names for num_classes " + std::to_string(info.num_classes));
  }
  return info;
}

LoadedModel load_model_dir(const fs::path& given) {
  const fs::path dir = util::local_path(given.string(), "--model");
  const fs::path json_path = dir / "model.json";
  if (!fs::is_regular_file(json_path)) {
    throw UsageError("--model '" + dir.string() +
                     "': not a model directory (no model.json); expected JOB_DIR/model as "
                     "written by `trainer train`");
  }
  LoadedModel out;
  out.info = read_model_info(json_path);
  try {
    out.net = model::make_net({out.info.arch, out.info.num_classes, out.info.head_hidden});
  } catch (const Error& e) {
    throw DataError("'" + json_path.string() + "': " + e.what());
  }
  const fs::path weights = dir / "model.safetensors";
  model::load_state_dict(*out.net, model::load_safetensors(weights.string()), weights.string());
  out.net->eval();
  return out;
}

data::PreprocessOptions inference_preprocess(const ModelInfo& info) {
  data::PreprocessOptions p;
  p.image_size = info.image_size;
  p.reduced_decode = info.reduced_decode;
  p.train = false;
  p.interpolation = info.interpolation;
  p.eval_resize = info.eval_resize;
  p.eval_resize_size = info.eval_resize == "shorter_side" ? info.eval_resize_size : 0;
  p.eval_crop_size = info.eval_crop_size;
  return p;
}

ModelSettings inference_settings(const ModelInfo& info, const torch::Device& device) {
  ModelSettings settings;
  settings.device = device;
  settings.precision = inference_precision(info.precision, device);
  settings.channels_last = info.channels_last;
  settings.normalize = data::parse_normalize(info.normalize, "model.json normalize");
  return settings;
}

}  // namespace trainer::train
