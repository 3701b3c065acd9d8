// TFDS prepared directories without label.labels.txt: class names from features.json in its
// three real forms, and a split whose shard file dataset_info.json declares but the directory
// lacks. Checked on generated directories and, where ../shared/realdata exists, on real ones
// written by TFDS (mnist and fashion_mnist; /work/shared/realdata/README.md describes them).
#include "common/catch.h"

#include "common/message_of.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "fixtures.h"
#include "trainer/data/record_source.h"
#include "trainer/data/source.h"
#include "trainer/synth/synthetic.h"
#include "trainer/util/error.h"

using trainer::test::Contains;
using namespace trainer;
using namespace trainer::data;
using namespace trainer::synth;
namespace fs = std::filesystem;
using trainer::data::testing::read_bytes;
using trainer::data::testing::TempDir;
using trainer::data::testing::write_text;

namespace {

const fs::path kRealdata = TRAINER_SOURCE_DIR "/../shared/realdata";

// A TFDS directory of make-dataset's 5 classes without its label.labels.txt.
fs::path tfds_without_labels(const fs::path& root) {
  SyntheticOptions o;
  o.out_dir = (root / "cassava" / "0.1.0").string();
  o.per_class = 2;
  o.image_size = 16;
  o.format = "tfrecord";
  o.tfds = true;
  o.shards = 2;
  make_synthetic_dataset(o);
  fs::remove(fs::path(o.out_dir) / "label.labels.txt");
  return o.out_dir;
}

SourceOptions tfds_source(const fs::path& dir, const std::string& split) {
  SourceOptions s;
  s.format = "tfrecord";
  s.path = {dir.string()};
  s.split = split;
  return s;
}

using trainer::test_support::message_of;

std::vector<std::string> digits(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(std::to_string(i));
  return out;
}

}  // namespace

TEST_CASE("class names from features.json in each form TFDS has written", "[tfds]") {
  TempDir tmp("tfds_features");
  const fs::path dir = tfds_without_labels(tmp.path());
  const auto names = [&dir] { return list_source(tfds_source(dir, "train"), "data.train"); };

  SECTION("proto JSON (2024): numClasses as a string gives \"0\"..\"N-1\"") {
    write_text(dir / "features.json", R"({"pythonClassName": "x.FeaturesDict", "featuresDict":
      {"features": {"label": {"classLabel": {"numClasses": "5"}}, "image": {"image": {}}}}})");
    CHECK(names().class_names == digits(5));
    CHECK(read_tfds_info(dir.string()).class_names_from ==
          "features.json (ClassLabel num_classes 5)");
  }
  SECTION("the older {type, content} form, num_classes as a number") {
    write_text(dir / "features.json", R"({"type": "x.FeaturesDict", "content": {
      "image": {"type": "x.Image", "content": {"shape": [16, 16, 3]}},
      "label": {"type": "x.class_label_feature.ClassLabel", "content": {"num_classes": 5}}}})");
    CHECK(names().class_names == digits(5));
  }
  SECTION("content as a JSON string (2023)") {
    const nlohmann::json inner = {
        {"features", {{"label", {{"classLabel", {{"numClasses", "5"}}}}}}}};
    write_text(dir / "features.json",
               nlohmann::json{{"type", "x.FeaturesDict"}, {"content", inner.dump()}}.dump());
    CHECK(names().class_names == digits(5));
  }
  SECTION("explicit names win over numbers; label.labels.txt wins over features.json") {
    write_text(dir / "features.json", R"({"featuresDict": {"features": {"label": {"classLabel":
      {"numClasses": "5", "names": ["a", "b", "c", "d", "e"]}}}}})");
    CHECK(names().class_names == std::vector<std::string>{"a", "b", "c", "d", "e"});
    write_text(dir / "label.labels.txt", "v\nw\nx\ny\nz\n");
    CHECK(names().class_names == std::vector<std::string>{"v", "w", "x", "y", "z"});
  }
  SECTION("a nested label key and TFDS's file name for its labels") {
    write_text(dir / "features.json", R"({"featuresDict": {"features": {"objects": {
      "featuresDict": {"features": {"label": {"classLabel": {"numClasses": "3"}}}}}}}})");
    CHECK(read_tfds_info(dir.string(), "objects/label").class_names == digits(3));
    write_text(dir / "objects-label.labels.txt", "p\nq\nr\n");
    CHECK(read_tfds_info(dir.string(), "objects/label").class_names ==
          std::vector<std::string>{"p", "q", "r"});
  }
  SECTION("no class label for the key: data.class_names is asked for, naming what is there") {
    write_text(dir / "features.json", R"({"featuresDict": {"features": {
      "species": {"classLabel": {"numClasses": "5"}}, "image": {"image": {}}}}})");
    CHECK_THROWS_AS(names(), ConfigError);
    const std::string m = message_of(names);
    CHECK_THAT(m, Contains("data.class_names: required") &&
                      Contains("features.json has no feature 'label'") &&
                      Contains("its features: image, species"));
    // Given names are enough.
    CHECK(list_source(tfds_source(dir, "train"), "data.train", {"a", "b", "c", "d", "e"})
              .examples.size() == 10);
    // supervisedKeys naming another feature: the message says which key to set.
    nlohmann::json info = nlohmann::json::parse(read_bytes(dir / "dataset_info.json"));
    info["supervisedKeys"] = {
        {"tuple", {{"items", {{{"featureKey", "image"}}, {{"featureKey", "species"}}}}}}};
    write_text(dir / "dataset_info.json", info.dump());
    CHECK_THAT(message_of(names), Contains("supervisedKeys name 'species' as the label") &&
                                      Contains("data.train.label_key: species"));
    SourceOptions species = tfds_source(dir, "train");
    species.label_key = "species";
    CHECK(list_source(species, "data.train").class_names == digits(5));
  }
  SECTION("a features.json that does not parse, or a bad num_classes: DataError naming it") {
    for (const std::string& text :
         {std::string("{\"featuresDict\": "),
          std::string(
              R"({"featuresDict": {"features": {"label": {"classLabel": {"numClasses": "-2"}}}}})"),
          std::string(R"({"featuresDict": {"features": {"label": {"classLabel": {}}}}})"),
          std::string(R"({"type": "F", "content": "{not json"})")}) {
      INFO(text);
      write_text(dir / "features.json", text);
      CHECK_THROWS_AS(names(), DataError);
      CHECK_THAT(message_of(names), Contains((dir / "features.json").string()));
      // Given names are enough.
      CHECK(list_source(tfds_source(dir, "train"), "data.train", {"a", "b", "c", "d", "e"})
                .class_names.size() == 5);
    }
  }
  SECTION("no features.json: as before, data.class_names is required") {
    CHECK_THROWS_AS(names(), ConfigError);
    CHECK_THAT(message_of(names), Contains("no label.labels.txt and no features.json"));
  }
}

TEST_CASE("a declared shard that is missing is named, with the directory", "[tfds]") {
  TempDir tmp("tfds_missing");
  const fs::path dir = tfds_without_labels(tmp.path());
  write_text(dir / "label.labels.txt", "a\nb\nc\nd\ne\n");
  fs::remove(dir / "cassava-train.tfrecord-00000-of-00002");
  fs::remove(dir / "cassava-train.tfrecord-00001-of-00002");
  const auto list = [&dir] { return list_source(tfds_source(dir, "train"), "data.train"); };
  CHECK_THROWS_AS(list(), DataError);
  CHECK_THAT(message_of(list),
             Contains("the 'train' split's shard file 'cassava-train.tfrecord-00000-of-00002' is "
                      "missing in '" +
                      dir.string() + "'") &&
                 Contains("declares 2 shards of 10 examples for it, 2 of them are missing") &&
                 Contains("the split with all shards here: validation"));

  // A filepathTemplate of its own: the declared files are found by it, or named by it.
  nlohmann::json info = nlohmann::json::parse(read_bytes(dir / "dataset_info.json"));
  for (auto& s : info["splits"]) s["filepathTemplate"] = "{SPLIT}_{SHARD_INDEX}.{FILEFORMAT}";
  write_text(dir / "dataset_info.json", info.dump());
  CHECK(declared_shard_files(read_tfds_info(dir.string()), "validation") ==
        std::vector<std::string>{"validation_00000.tfrecord", "validation_00001.tfrecord"});
  fs::rename(dir / "cassava-validation.tfrecord-00000-of-00002", dir / "validation_00000.tfrecord");
  fs::rename(dir / "cassava-validation.tfrecord-00001-of-00002", dir / "validation_00001.tfrecord");
  const Listing validation = list_source(tfds_source(dir, "validation"), "data.validation");
  CHECK(validation.counts_from == "dataset_info.json");
  CHECK(static_cast<int64_t>(validation.examples.size()) ==
        read_tfds_info(dir.string()).split_info[1].declared_examples);
  CHECK_THAT(message_of(list), Contains("shard file 'train_00000.tfrecord' is missing"));

  // A file format other than tfrecord is refused by name.
  info["fileFormat"] = "array_record";
  write_text(dir / "dataset_info.json", info.dump());
  CHECK_THAT(message_of(list), Contains("stored as 'array_record'"));
}

TEST_CASE("real TFDS directories: mnist without label.labels.txt, fashion_mnist without shards",
          "[tfds][realdata]") {
  if (!fs::is_directory(kRealdata)) {
    WARN("real TFDS directories skipped: ../shared/realdata not found");
    return;
  }
  const fs::path learnit = kRealdata / "Learnit06-tensorflow_datasets" / "mnist";
  const fs::path redhat =
      kRealdata / "red-hat-data-services-notebook-benchmarks" / "tensorflow_datasets" / "mnist";
  const fs::path fashion =
      kRealdata / "gablooge-GSP631" / "tensorflow_datasets" / "fashion_mnist" / "3.0.1";

  for (const fs::path& root : {learnit, redhat}) {
    INFO(root.string());
    const fs::path dir = root / "3.0.1";
    const TfdsInfo info = read_tfds_info(dir.string());
    CHECK(info.name == "mnist");
    CHECK(info.splits == std::vector<std::string>{"train", "test"});
    CHECK(info.supervised_label == "label");  // both supervisedKeys forms
    CHECK(info.class_names == digits(10));
    CHECK(info.class_names_from == "features.json (ClassLabel num_classes 10)");
    CHECK(declared_shard_files(info, "train") ==
          std::vector<std::string>{"mnist-train.tfrecord-00000-of-00001"});

    // split test: listed from the dataset dir (its version dir found), counts from the metadata.
    const Listing test = list_source(tfds_source(root, "test"), "data.train");
    CHECK(test.examples.size() == 10000);
    CHECK(test.counts_from == "dataset_info.json");
    CHECK(test.class_names == digits(10));

    // split train: declared, its shard is not there.
    const auto train = [&root] { list_source(tfds_source(root, "train"), "data.train"); };
    CHECK_THROWS_AS(train(), DataError);
    CHECK_THAT(message_of(train),
               Contains("shard file 'mnist-train.tfrecord-00000-of-00001' is missing in '" +
                        dir.string() + "'") &&
                   Contains("1 shard of 60000 examples") &&
                   Contains("the split with all shards here: test"));
  }

  // The 2023 form (content as a string) and its label.labels.txt, which wins.
  const TfdsInfo fm = read_tfds_info(fashion.string());
  CHECK(fm.class_names_from == "label.labels.txt");
  CHECK(fm.class_names == std::vector<std::string>{"T-shirt/top", "Trouser", "Pullover", "Dress",
                                                   "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                                                   "Ankle boot"});
  CHECK(fm.supervised_label == "label");
  // Without the labels file (a copy of the metadata), features.json's numClasses is read.
  TempDir tmp("tfds_fashion");
  fs::copy_file(fashion / "dataset_info.json", tmp.path() / "dataset_info.json");
  fs::copy_file(fashion / "features.json", tmp.path() / "features.json");
  CHECK(read_tfds_info(tmp.path().string()).class_names == digits(10));
  const auto test = [&fashion] { list_source(tfds_source(fashion, "test"), "data.train"); };
  CHECK_THAT(message_of(test),
             Contains("shard file 'fashion_mnist-test.tfrecord-00000-of-00001' is missing") &&
                 Contains("no split has all its shards here"));
}
