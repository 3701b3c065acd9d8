// Writes the seed corpus of every fuzz target into OUT/<target>/, from the project's own writers
// (make-dataset's synthetic images and TFRecord shards, the Example builder, the job spec's YAML
// writer, the launcher's TF_CONFIG, the safetensors encoder, the model exporter's model.json, a
// real checkpoint's state.json), plus the job specs in configs/. Nothing is downloaded.
// Usage: make_seeds OUT [CONFIGS_DIR]
#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "small_module.h"
#include "trainer/config/job_spec.h"
#include "trainer/data/tf_example.h"
#include "trainer/data/tfrecord.h"
#include "trainer/launch/plan.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/model_dir.h"
#include "trainer/model/safetensors.h"
#include "trainer/synth/synthetic.h"
#include "trainer/util/fs.h"

using namespace trainer;
namespace fs = std::filesystem;

namespace {

int counter = 0;

void put(const fs::path& out, const std::string& target, const std::string& bytes) {
  fs::create_directories(out / target);
  util::write_file_atomic(out / target / ("seed-" + std::to_string(counter++)), bytes);
}

std::string read_all(const fs::path& path) { return util::read_file(path); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: make_seeds OUT [CONFIGS_DIR]\n");
    return 2;
  }
  const fs::path out = argv[1];
  // Always the seeds of this build's writers: an old seeds directory (it has the marker file) is
  // replaced; anything else that exists is never touched.
  const fs::path marker = out / ".trainer-fuzz-seeds";
  if (fs::exists(out)) {
    if (!fs::is_directory(out) || (!fs::exists(marker) && !fs::is_empty(out))) {
      std::fprintf(stderr,
                   "make_seeds: '%s' exists and is not a seeds directory; not touching it\n",
                   out.c_str());
      return 2;
    }
    fs::remove_all(out);
  }
  fs::create_directories(out);
  util::write_file_atomic(marker, "seeds written by fuzz/make_seeds\n");
  const fs::path work = out / ".work";
  fs::create_directories(work);

  // Images (JPEG as make-dataset writes them; PNG and BMP re-encoded by the same renderer) and
  // the csv manifest over them.
  synth::SyntheticOptions images;
  images.out_dir = (work / "jpeg").string();
  images.classes = 3;
  images.per_class = 2;
  images.image_size = 24;
  images.splits = {"train"};
  synth::make_synthetic_dataset(images);
  std::string csv = "image_id,label\n";
  for (const auto& entry : fs::recursive_directory_iterator(work / "jpeg")) {
    if (!entry.is_regular_file()) continue;
    const std::string jpeg = read_all(entry.path());
    for (uint8_t mode : {0, 4, 8, 17, 29}) put(out, "image", std::string(1, char(mode)) + jpeg);
    csv += fs::relative(entry.path(), work / "jpeg").string() + "," +
           entry.path().parent_path().filename().string() + "\n";
  }
  put(out, "csv", csv);
  put(out, "csv", "\xEF\xBB\xBF\"image_id\",\"label\"\r\n\"a,b.jpg\",0\r\n\"c\"\"d.jpg\",1\r\n");

  // TFRecord shards (plain and gzip) of tf.train.Example records, as make-dataset writes them.
  for (const char* compression : {"none", "gzip"}) {
    synth::SyntheticOptions records = images;
    records.out_dir = (work / compression).string();
    records.format = "tfrecord";
    records.shards = 1;
    records.per_class = 1;
    records.compression = compression;
    const synth::SyntheticSummary summary = synth::make_synthetic_dataset(records);
    for (const std::string& file : summary.files) {
      const char selector = compression == std::string("gzip") ? 1 : 0;
      put(out, "tfrecord", std::string(1, selector) + read_all(file));
      put(out, "tfrecord", std::string(1, 2) + read_all(file));  // auto
      if (selector == 0) {
        data::RecordReader reader(file, data::Compression::kNone);
        std::string record;
        while (reader.read(&record)) put(out, "example", record);
      }
    }
  }
  put(out, "example", data::make_image_example("jpegbytes", 3, "image", "target"));

  // Job specs: the defaults as job.yaml holds them, the repository's configs, overrides.
  const config::JobSpec defaults =
      config::parse_job_spec("", {"data.train.path=data/train"}, "defaults");
  put(out, "job_spec", config::to_yaml(defaults));
  put(out, "job_spec",
      "#set train.epochs=3\n#set data.train.path=[a.csv, b.csv]\nmodel:\n  arch: resnet18\n");
  if (argc > 2 && fs::is_directory(argv[2])) {
    for (const auto& entry : fs::directory_iterator(argv[2])) {
      if (entry.path().extension() == ".yaml") put(out, "job_spec", read_all(entry.path()));
    }
  }

  // TF_CONFIG as the launcher sets it (workers only; with a chief; with an evaluator).
  for (const bool chief : {false, true}) {
    launch::LaunchOptions launch;
    launch.workers = 2;
    launch.chief = chief;
    launch.evaluator = chief;
    launch.args = {"--job-dir", "x"};
    std::vector<int> ports;
    for (int i = 0; i < launch.workers + (chief ? 2 : 0); ++i) ports.push_back(2222 + i);
    for (const launch::LaunchTask& task : launch::plan_launch(launch, ports)) {
      put(out, "tf_config", task.tf_config);
    }
  }
  put(out, "tf_config",
      R"({"cluster":{"master":["[::1]:2222"],"worker":["h1:2222"]},"task":{"type":"master","index":0}})");

  // safetensors: a module's state dict (float, int64) with metadata, and the RNG state file.
  fuzz::SmallModule small;
  put(out, "safetensors", model::encode_safetensors(model::state_dict(small), {{"format", "pt"}}));
  put(out, "safetensors",
      model::encode_safetensors({{"x", torch::arange(6, torch::kBFloat16).reshape({2, 3})},
                                 {"b", torch::ones({2}, torch::kBool)}}));

  // pth: the zip torch::pickle_save writes of the module's state dict, and the same pickle and
  // storages as a legacy (pre-1.6) torch.save stream.
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : model::state_dict(small)) dict.insert(name, tensor);
  const std::vector<char> zip = torch::pickle_save(dict);
  put(out, "pth", std::string(zip.begin(), zip.end()));
  {
    const std::string zip_bytes(zip.begin(), zip.end());
    std::istringstream in(zip_bytes);
    caffe2::serialize::PyTorchStreamReader reader(&in);
    const auto record = [&](const std::string& name) {
      auto [ptr, n] = reader.getRecord(name);
      return std::string(static_cast<const char*>(ptr.get()), n);
    };
    std::string legacy("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15);
    legacy += std::string("\x80\x02M\xe9\x03.", 6);  // protocol version 1001
    legacy += std::string("\x80\x02}.", 4);          // sys_info: {}
    legacy += record("data.pkl");
    std::vector<std::string> keys;
    for (size_t k = 0; reader.hasRecord("data/" + std::to_string(k)); ++k) {
      keys.push_back(std::to_string(k));
    }
    legacy += "\x80\x02](";
    for (const std::string& key : keys) {
      legacy += 'X';
      for (int b = 0; b < 4; ++b) legacy += static_cast<char>((key.size() >> (8 * b)) & 0xff);
      legacy += key;
    }
    legacy += "e.";
    // pickle_save gives each tensor its own storage, keyed 0, 1, ... in the dict's order; the
    // stream stores each storage's element count before its bytes.
    const model::StateDict tensors = model::state_dict(small);
    for (size_t k = 0; k < keys.size() && k < tensors.size(); ++k) {
      const std::string raw = record("data/" + keys[k]);
      const uint64_t count = raw.size() / tensors[k].second.element_size();
      for (int b = 0; b < 8; ++b) legacy += static_cast<char>((count >> (8 * b)) & 0xff);
      legacy += raw;
    }
    put(out, "pth", legacy);
  }

  // model.json as the exporter writes it.
  train::ModelInfo info;
  info.arch = "resnet18";
  info.num_classes = 3;
  info.class_names = {"a", "b", "c"};
  info.image_size = 32;
  put(out, "model_json", info.to_json().dump(2) + "\n");

  // state.json of a real checkpoint.
  torch::optim::Adam adam(small.parameters());
  const fs::path ckpt = train::save_checkpoint(work / "checkpoints", {1, 2, 7}, "f00d",
                                               {2, 5, {"aa", "bb"}}, small, adam, 1);
  put(out, "state_json", read_all(ckpt / "state.json"));

  fs::remove_all(work);
  std::printf("seeds in %s\n", out.c_str());
  return 0;
}
