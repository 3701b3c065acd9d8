// The real binary on real TFDS output (../shared/realdata, described in its README.md; skipped
// where it is absent): mnist as two TFDS versions prepared it, 28x28 grayscale PNGs with an int64
// label and no label.labels.txt. inspect lists both directories' test split with the class names
// from features.json; asking for the train split, declared but without its shard, is exit 3
// naming the file; a few steps train on one directory and `trainer evaluate` scores the other.
#include "common/catch.h"

#include <nlohmann/json.hpp>

#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

const fs::path kRealdata = TRAINER_SOURCE_DIR "/../shared/realdata";

// TFDS 2024 (proto JSON features.json, filepathTemplate) and TFDS 2021 ({type, content}).
const fs::path kLearnit = kRealdata / "Learnit06-tensorflow_datasets" / "mnist";
const fs::path kRedHat =
    kRealdata / "red-hat-data-services-notebook-benchmarks" / "tensorflow_datasets" / "mnist";

std::string mnist_job_yaml(const fs::path& train, const fs::path& validation) {
  std::string yaml = R"(model:
  arch: resnet18
data:
  train: {format: tfrecord, path: )" +
                     train.string() + R"(, split: test}
)";
  if (!validation.empty()) {
    yaml += "  validation: {format: tfrecord, path: " + validation.string() + ", split: test}\n";
  }
  return yaml + R"(  image_size: 32
  seed: 3
  num_workers: 1
train:
  epochs: 1
  max_steps: 3
  per_replica_batch_size: 8
  threads: 1
logging:
  every_steps: 1
)";
}

std::vector<std::string> digits() {
  std::vector<std::string> out;
  for (int i = 0; i < 10; ++i) out.push_back(std::to_string(i));
  return out;
}

}  // namespace

TEST_CASE("realdata: TFDS mnist directories train and evaluate and name a missing shard",
          "[realdata][tfrecord]") {
  if (!fs::is_directory(kRealdata)) {
    WARN("real TFDS mnist skipped: ../shared/realdata not found");
    return;
  }
  TempDir dir("realdata");

  // Both directories listed: 10 classes named as ClassLabel(num_classes=10) names them, the
  // counts from dataset_info.json (no scan of the 10000 records).
  write_text(dir / "both.yaml", mnist_job_yaml(kLearnit, kRedHat / "3.0.1"));
  const Result plan = run_trainer(dir.path(), "inspect --config both.yaml --job-dir plan");
  INFO(plan.err);
  REQUIRE(plan.code == 0);
  const nlohmann::json data = nlohmann::json::parse(plan.out)["data"];
  CHECK(data["class_names"].get<std::vector<std::string>>() == digits());
  CHECK(data["num_examples"] == 10000);
  CHECK(data["validation_examples"] == 10000);
  CHECK(data["record_counts_from"] == "dataset_info.json");
  CHECK_THAT(data["workers"][0]["record_files"][0].get<std::string>(),
             Contains("Learnit06-tensorflow_datasets/mnist/3.0.1/"
                      "mnist-test.tfrecord-00000-of-00001"));

  // The train split is declared (60000 examples in 1 shard) but its file is not there.
  for (const fs::path& root : {kLearnit, kRedHat}) {
    INFO(root.string());
    const Result missing =
        run_trainer(dir.path(), "inspect --config both.yaml --job-dir plan --set data.train.path=" +
                                    quote(root.string()) + " --set data.train.split=train");
    CHECK(missing.code == 3);
    CHECK_THAT(missing.err, Contains("shard file 'mnist-train.tfrecord-00000-of-00001' is "
                                     "missing in '" +
                                     (root / "3.0.1").string() + "'") &&
                                Contains("1 shard of 60000 examples"));
  }

  // A few steps on one directory's 28x28 grayscale PNGs (decoded to RGB, resized to 32)...
  write_text(dir / "train.yaml", mnist_job_yaml(kLearnit, {}));
  const Result trained = run_trainer(dir.path(), "--config train.yaml --job-dir job");
  INFO(trained.err);
  REQUIRE(trained.code == 0);
  const auto metrics = read_metrics(dir / "job" / "metrics.jsonl");
  int steps = 0;
  for (const auto& m : metrics) {
    if (!m.contains("loss") || !m.contains("step")) continue;
    ++steps;
    CHECK(std::isfinite(m["loss"].get<double>()));
  }
  CHECK(steps == 3);

  // ...and evaluated on the other's: all 10000 examples, none skipped, every label where the
  // README's per-class counts put it (the confusion matrix's rows are the true labels).
  const Result eval = run_trainer(dir.path(), "evaluate --model job/model --config both.yaml");
  INFO(eval.err);
  REQUIRE(eval.code == 0);
  const nlohmann::json report = nlohmann::json::parse(eval.out);
  CHECK(report["num_examples"] == 10000);
  CHECK(report["skipped"] == 0);
  CHECK(report["class_names"].get<std::vector<std::string>>() == digits());
  std::vector<int64_t> per_label;
  for (const auto& row : report["confusion_matrix"]) {
    int64_t n = 0;
    for (const auto& x : row) n += x.get<int64_t>();
    per_label.push_back(n);
  }
  CHECK(per_label == std::vector<int64_t>{980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009});
}
