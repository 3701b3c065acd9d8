// The Cassava configs with validation: the tutorial's job on TFDS (train / validation splits)
// and on the Kaggle competition's train.csv with a held-out part (data.validation_split), each
// through inspect, a training step and `trainer evaluate --config` on generated data in their
// formats.
#include "common/catch.h"

#include <fstream>

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

const fs::path kConfigs = fs::path(TRAINER_SOURCE_DIR) / "configs";
const char* kSmall =
    " --set model.arch=resnet18 --set model.head_hidden=16 --set data.image_size=32"
    " --set train.per_replica_batch_size=4 --set train.threads=1 --set data.num_workers=1";

}  // namespace

TEST_CASE("cassava_kaggle_csv.yaml: validation held out of train.csv, the same for evaluate",
          "[configs]") {
  TempDir dir("config_csv");
  make_dataset(dir.path(), "gen", 8, 40);  // 40 training images in 5 class folders
  // The competition's manifest: image_id,label (a class index), paths under train_images/.
  fs::create_directories(dir / "data" / "cassava");
  std::ofstream csv(dir / "data" / "cassava" / "train.csv");
  csv << "image_id,label\n";
  const std::vector<std::string> classes = {"cbb", "cbsd", "cgm", "cmd", "healthy"};
  int n = 0;
  for (size_t c = 0; c < classes.size(); ++c) {
    for (const auto& e : fs::directory_iterator(dir / "gen" / "train" / classes[c])) {
      csv << classes[c] << "/" << e.path().filename().string() << "," << c << "\n";
      ++n;
    }
  }
  csv.close();
  REQUIRE(n == 40);
  fs::create_symlink(dir / "gen" / "train", dir / "data" / "cassava" / "train_images");
  const std::string config = " --config " + (kConfigs / "cassava_kaggle_csv.yaml").string();

  const Result inspect = run_trainer(dir.path(), "inspect" + config + kSmall);
  INFO(inspect.err);
  REQUIRE(inspect.code == 0);
  const auto plan = nlohmann::json::parse(inspect.out)["data"];
  CHECK(plan["num_examples"] == 32);        // 40 - 8
  CHECK(plan["validation_examples"] == 8);  // 20 % held out

  const Result train =
      run_trainer(dir.path(), "train" + config + kSmall + " --job-dir job --set train.max_steps=2");
  INFO(train.err);
  REQUIRE(train.code == 0);
  CHECK_THAT(train.err, Contains("validation loss"));
  CHECK_THAT(train.err, Contains("data.validation_split 0.2"));
  const Result eval =
      run_trainer(dir.path(), "evaluate --model job/model" + config + std::string(kSmall));
  INFO(eval.err);
  REQUIRE(eval.code == 0);
  CHECK(nlohmann::json::parse(eval.out)["num_examples"] == 8);
  // The training split is the rest: evaluating it sees the other 32.
  const Result eval_train = run_trainer(
      dir.path(), "evaluate --split train --model job/model" + config + std::string(kSmall));
  REQUIRE(eval_train.code == 0);
  CHECK(nlohmann::json::parse(eval_train.out)["num_examples"] == 32);
}

TEST_CASE("cassava_resnet50.yaml: the tutorial's job validates on TFDS's validation split",
          "[configs]") {
  TempDir dir("config_tfds");
  const Result made = run_trainer(
      dir.path(),
      "make-dataset --out data/tensorflow_datasets/cassava --format tfrecord --tfds --per-class 8 "
      "--image-size 40 --shards 2");
  INFO(made.err);
  REQUIRE(made.code == 0);
  const std::string config = " --config " + (kConfigs / "cassava_resnet50.yaml").string();
  const Result inspect = run_trainer(dir.path(), "inspect" + config + kSmall);
  INFO(inspect.err);
  REQUIRE(inspect.code == 0);
  const auto plan = nlohmann::json::parse(inspect.out)["data"];
  CHECK(plan["num_examples"] == 40);
  const int64_t validation = plan["validation_examples"].get<int64_t>();
  CHECK(validation > 0);
  const Result train =
      run_trainer(dir.path(), "train" + config + kSmall + " --job-dir job --set train.max_steps=2");
  INFO(train.err);
  REQUIRE(train.code == 0);
  CHECK_THAT(train.err, Contains("validation loss"));
  const Result eval =
      run_trainer(dir.path(), "evaluate --model job/model" + config + std::string(kSmall));
  INFO(eval.err);
  REQUIRE(eval.code == 0);
  CHECK(nlohmann::json::parse(eval.out)["num_examples"] == validation);
}
