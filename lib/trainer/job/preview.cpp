// trainer preview: what the model is fed, from the real loader and the real batch mixing.
#include <spdlog/spdlog.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "trainer/cluster/cluster_spec.h"
#include "trainer/config/job_spec.h"
#include "trainer/data/contact_sheet.h"
#include "trainer/data/image.h"
#include "trainer/data/loader.h"
#include "trainer/data/tf_example.h"
#include "trainer/data/tfrecord.h"
#include "trainer/job/commands.h"
#include "trainer/job/data_plan.h"
#include "trainer/loop/mixing.h"
#include "trainer/loop/runtime.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/rng.h"
#include "trainer/util/storage.h"

namespace trainer::train {

namespace {

namespace fs = std::filesystem;

// NumPy's .npy format 1.0 for a C-order float32 array.
std::string npy_f32(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kCPU).to(torch::kFloat32).contiguous();
  std::string shape;
  for (int64_t d = 0; d < c.dim(); ++d) shape += (d ? ", " : "") + std::to_string(c.size(d));
  if (c.dim() == 1) shape += ",";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }";
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64, '\n'.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>((header.size() >> 8) & 0xFF);
  out += header;
  out.append(reinterpret_cast<const char*>(c.data_ptr<float>()),
             static_cast<size_t>(c.numel()) * sizeof(float));
  return out;
}

// The encoded bytes of one listed example (an image file, or record N of a record file).
std::string example_bytes(const data::Example& e, const data::RecordFormat& format,
                          std::string* origin) {
  if (e.record < 0) {
    *origin = e.path;
    return util::read_file(e.path);
  }
  *origin = e.path + " record " + std::to_string(e.record);
  data::RecordReader reader(e.path, data::compression_for(format.compression, e.path));
  for (int64_t i = 0; i < e.record; ++i) {
    if (!reader.skip()) throw DataError("'" + e.path + "': fewer records than listed");
  }
  std::string record;
  if (!reader.read(&record)) throw DataError("'" + e.path + "': fewer records than listed");
  return data::parse_image_example(record, format.image_key, format.label_key, *origin).image;
}

// The model's float input back to displayable uint8 [H, W, 3] RGB.
torch::Tensor displayable(const torch::Tensor& chw, data::Normalize mode) {
  torch::Tensor x = chw.to(torch::kFloat32);
  if (mode == data::Normalize::kImagenet) {
    const data::NormConstants c = data::norm_constants(mode, x.device());
    x = x * c.std[0] + c.mean[0];
  }
  return (x * 255.0).round().clamp(0, 255).to(torch::kUInt8).permute({1, 2, 0}).contiguous();
}

std::string caption_of(const torch::Tensor& target, const std::vector<std::string>& names) {
  // The classes the soft target puts weight on, largest first (at most 2).
  const torch::Tensor sorted_idx = std::get<1>(target.sort(0, /*descending=*/true));
  std::string out;
  for (int64_t k = 0; k < std::min<int64_t>(2, target.size(0)); ++k) {
    const int64_t c = sorted_idx[k].item<int64_t>();
    const double w = target[c].item<double>();
    if (k > 0 && w < 0.05) break;
    out += (k ? " + " : "") + names[static_cast<size_t>(c)] + fmt::format(" {:.2f}", w);
  }
  return out;
}

}  // namespace

int run_preview(const PreviewOptions& options, std::ostream& out) {
  if (options.count < 1 || options.count > 1024) {
    throw UsageError("--count: expected 1 to 1024 examples, got " + std::to_string(options.count));
  }
  if (options.split != "train" && options.split != "validation") {
    throw UsageError("--split: expected train or validation, got '" + options.split + "'");
  }
  if (options.out.empty()) throw UsageError("--out: required");
  const config::JobSpec spec = config::load_job_spec(options.config, options.overrides);
  const cluster::ClusterSpec single;  // one process: rank 0 of 1, as a one-worker job
  const bool train = options.split == "train";
  // The validation split is read with its own plan: the training batch is no concern of it.
  const DataPlan plan =
      plan_data(spec, single, {}, train ? PlanFor::kTraining : PlanFor::kListingOnly);
  if (!train && !plan.validation) {
    throw ConfigError(
        "--split validation: the job has no validation data (data.validation.path or "
        "data.validation_split)");
  }
  const ThreadBudget budget = plan_threads(spec, 1);
  apply_threads(budget);
  const data::Listing& listing = train ? plan.train : *plan.validation;

  std::unique_ptr<data::Loader> loader;
  data::PreprocessOptions preprocess;
  if (train) {
    data::LoaderOptions o = train_loader_options(spec.data, spec.train, plan, budget.decode);
    preprocess = o.preprocess;
    loader = std::make_unique<data::Loader>(listing.examples, std::move(o));
  } else {
    loader = make_eval_loader(
        spec.data, listing,
        EvalReading{spec.train.per_replica_batch_size, plan.num_classes, budget.decode, 0, 1});
    preprocess = eval_preprocess(spec.data);
  }
  const data::ImagePipeline pipeline(preprocess);
  const data::Normalize mode = data::parse_normalize(spec.data.normalize);
  const MixOptions mix{train ? spec.train.mixup_alpha : 0, train ? spec.train.cutmix_alpha : 0};
  const double smoothing = train ? spec.train.label_smoothing : 0;
  const int64_t classes = plan.num_classes;

  loader->start_epoch(options.epoch);
  std::vector<torch::Tensor> inputs, targets, shown;
  std::vector<std::vector<std::string>> captions;
  std::string jsonl;
  int64_t n = 0;
  while (n < options.count) {
    std::optional<data::Batch> batch = loader->next();
    if (!batch) break;
    if (batch->images.size(0) == 0) continue;
    // Exactly the step's input: normalised (prepare_input on the CPU), then mixed as the step
    // mixes this batch on replica 0.
    const torch::Tensor images =
        data::normalize_images(batch->images, mode, /*channels_last=*/false);
    const MixDraw draw = draw_mix(mix, images.size(2), images.size(3),
                                  batch_mix_seed(spec.data.seed, options.epoch, batch->index, 0));
    const Mixed mixed = apply_mix(images, batch->labels, classes, draw);
    // What the loss compares with: the (mixed) one-hot target, smoothed as the loss smooths it.
    const torch::Tensor target =
        smoothing > 0 ? mixed.targets * (1.0 - smoothing) + smoothing / static_cast<double>(classes)
                      : mixed.targets;
    const int64_t b = images.size(0);
    for (int64_t i = 0; i < b && n < options.count; ++i, ++n) {
      const int64_t index = batch->indices[static_cast<size_t>(i)];
      const data::Example& e = listing.examples[static_cast<size_t>(index)];
      const int64_t label = batch->labels[i].item<int64_t>();
      nlohmann::json line = {{"source", e.path},
                             {"label", plan.class_names[static_cast<size_t>(label)]},
                             {"label_index", label},
                             {"batch", batch->index},
                             {"position", i}};
      if (e.record >= 0) line["record"] = e.record;
      // The augmentation drawn for it: the loader's per-example seed (loader.h), redrawn here and
      // checked against the image the loader made.
      if (train) {
        const uint64_t seed =
            util::mix_seed(static_cast<uint64_t>(spec.data.seed),
                           {static_cast<uint64_t>(options.epoch), static_cast<uint64_t>(index)});
        std::string origin;
        const std::string bytes = example_bytes(e, listing.record_format, &origin);
        nlohmann::json drawn = nlohmann::json::object();
        const torch::Tensor again =
            spec.data.cache == "memory"
                ? pipeline.augment(pipeline.decode_resized(bytes, origin), seed, &drawn)
                : pipeline.decode(bytes, origin, seed, &drawn);
        if (!torch::equal(again, batch->images[i])) {
          throw Error(ErrorKind::kInternal, "preview: redrawing the augmentation of '" + origin +
                                                "' gave another image than the loader's");
        }
        line["augment"] = drawn;
      }
      if (draw.kind != "none") {
        nlohmann::json m = {
            {"kind", draw.kind}, {"lambda", draw.lambda}, {"partner_position", (i + b - 1) % b}};
        if (draw.kind == "cutmix") m["box"] = {draw.x1, draw.y1, draw.x2, draw.y2};
        line["mix"] = m;
      }
      std::vector<double> soft(static_cast<size_t>(classes));
      for (int64_t c = 0; c < classes; ++c)
        soft[static_cast<size_t>(c)] = target[i][c].item<double>();
      line["target"] = soft;
      jsonl += line.dump() + "\n";
      inputs.push_back(mixed.images[i]);
      targets.push_back(target[i]);
      shown.push_back(displayable(mixed.images[i], mode));
      captions.push_back({fs::path(e.path).filename().string() +
                              (e.record >= 0 ? "#" + std::to_string(e.record) : ""),
                          caption_of(target[i], plan.class_names)});
    }
  }
  if (n == 0) throw DataError("preview: " + listing.origin + " gave no examples");

  const fs::path dir = util::local_path(options.out, "--out");
  fs::create_directories(dir);
  util::write_file_atomic(dir / "inputs.npy", npy_f32(torch::stack(inputs)));
  util::write_file_atomic(dir / "targets.npy", npy_f32(torch::stack(targets)));
  util::write_file_atomic(dir / "examples.jsonl", jsonl);
  util::write_file_atomic(dir / "preview.png", data::encode_contact_sheet(shown, captions, 8));
  out << fmt::format(
      "preview of {} {} examples (epoch {}) in {}: preview.png, inputs.npy "
      "[{}, 3, {}, {}], targets.npy [{}, {}], examples.jsonl\n",
      n, options.split, options.epoch, dir.string(), n, inputs[0].size(1), inputs[0].size(2), n,
      classes);
  return 0;
}

}  // namespace trainer::train
