// Real photos as a user points the trainer at them: ../shared/realdata's hymenoptera subset
// (PyTorch's transfer-learning tutorial data, ImageFolder layout) with a GIF among the JPEGs, a
// file name with a space, a .jpeg extension and progressive JPEGs. The GIF gets the same answer
// in listing, training and predict: left out with one warning (torchvision's ImageFolder does
// not list .gif, whichever OpenCV decodes what); named explicitly, it is a data error.
// Skips with a message where ../shared/realdata does not exist.
#include "common/catch.h"

#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

const fs::path kPhotos = fs::path(TRAINER_SOURCE_DIR) / ".." / "shared" / "realdata" /
                         "zhangtao7750-syn" / "hymenoptera_data";

}  // namespace

TEST_CASE(
    "real photos (a GIF and a space and .jpeg and progressive JPEGs) through train and "
    "evaluate and predict",
    "[photos][realdata]") {
  if (!fs::is_directory(kPhotos)) {
    WARN("skipped: ../shared/realdata not found (" << kPhotos.string() << ")");
    return;
  }
  TempDir dir("photos");
  const std::string root = fs::canonical(kPhotos).string();
  write_text(dir / "job.yaml",
             "model:\n  arch: resnet18\ndata:\n  train:\n    path: " + quote(root + "/train") +
                 "\n  validation:\n    path: " + quote(root + "/val") +
                 "\n  image_size: 32\n  num_workers: 2\ntrain:\n  epochs: 1\n"
                 "  per_replica_batch_size: 8\n  threads: 1\n"
                 "logging:\n  every_steps: 1\n");
  const Result train = run_trainer(dir.path(), "--config job.yaml --job-dir job");
  INFO(train.err);
  REQUIRE(train.code == 0);
  // Listing: 22 JPEGs (the space, the .jpeg, the progressive ones among them), the GIF left out.
  CHECK_THAT(train.err, Contains("1 GIF file not listed") && Contains("imageNotFound.gif") &&
                            Contains("torchvision's ImageFolder"));
  const auto metrics = read_metrics(dir / "job" / "metrics.jsonl");
  int steps = 0;
  for (const auto& m : metrics) steps += m.contains("loss");
  CHECK(steps == 2);  // 22 images, batch 8, the last partial batch dropped

  const Result eval = run_trainer(dir.path(), "evaluate --model job/model --config job.yaml");
  INFO(eval.err);
  REQUIRE(eval.code == 0);
  CHECK(nlohmann::json::parse(eval.out)["num_examples"] == 11);
  CHECK(nlohmann::json::parse(eval.out)["class_names"] == nlohmann::json::array({"ants", "bees"}));

  // predict over the ants directory: the 12 JPEGs, the GIF left out with the same warning.
  const Result ants = run_trainer(
      dir.path(), "predict --model job/model --format csv " + quote(root + "/train/ants"));
  INFO(ants.err);
  REQUIRE(ants.code == 0);
  CHECK_THAT(ants.err, Contains("1 GIF file not listed") && Contains("imageNotFound.gif"));
  CHECK(ants.out.rfind("image_id,label\n", 0) == 0);
  CHECK_THAT(ants.out, Contains("ant photos.jpg,") && Contains("formica.jpeg,"));
  CHECK(std::count(ants.out.begin(), ants.out.end(), '\n') == 13);  // header + 12

  // Named explicitly: the space and the progressive JPEG are read; the GIF is a data error.
  const Result space = run_trainer(
      dir.path(), "predict --model job/model " + quote(root + "/train/ants/ant photos.jpg"));
  CHECK(space.code == 0);
  CHECK_THAT(space.out, Contains("ant photos.jpg"));
  const Result gif = run_trainer(
      dir.path(), "predict --model job/model " + quote(root + "/train/ants/imageNotFound.gif"));
  CHECK(gif.code == 3);
  CHECK_THAT(gif.err, Contains("imageNotFound.gif") && Contains("GIF is not read"));
}
