// The training recipes end to end (issue 32): every recipe option on at once still resumes
// bit-exact (mixing drawn from the position, the EMA and the validation decisions in the
// checkpoint); keep_best writes JOB_DIR/model_best; early stopping stops and a restart only
// exports; the plateau schedule lowers the rate; bad recipe input is a clear error.
#include "common/catch.h"

#include "fixtures.h"
#include "harness.h"

#include <cstring>
#include <sstream>

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

std::string weights(const fs::path& dir) { return slurp(dir / "model.safetensors"); }

// Every recipe option away from its default (mixup and CutMix, smoothing, EMA, clipping, class
// weights, the balanced sampler, a non-CE loss, weight-decay groups, the plateau schedule, early
// stopping that does not trigger, keep_best, and the augmentations).
const char* kEverything =
    " --set train.optimizer.name=sgd --set train.optimizer.learning_rate=0.05"
    " --set train.optimizer.weight_decay=1e-4 --set train.optimizer.norm_weight_decay=0"
    " --set train.optimizer.bias_weight_decay=0"
    " --set train.mixup_alpha=0.2 --set train.cutmix_alpha=1.0 --set train.label_smoothing=0.1"
    " --set train.ema.decay=0.99 --set train.ema.every_steps=2 --set train.clip_grad_norm=2"
    " --set train.class_weights=balanced --set data.sampler=balanced"
    " --set train.loss=focal --set train.lr_schedule.name=plateau"
    " --set train.lr_schedule.patience=0 --set train.early_stopping.patience=50"
    " --set checkpoint.keep_best=val_loss"
    " --set data.augment.random_resized_crop=true --set data.augment.horizontal_flip=true"
    " --set data.augment.vertical_flip=true --set data.augment.rotate90=true"
    " --set data.augment.policy=trivial_augment_wide --set data.augment.random_erasing=0.25"
    " --set data.augment.color_jitter.brightness=0.2";

}  // namespace

TEST_CASE("every recipe option on: a resumed job ends bit-identical", "[resume][recipe]") {
  TempDir dir("recipe_resume");
  make_dataset(dir.path(), "data", 6, 32);  // 30 images: 3 steps per epoch
  write_text(dir / "job.yaml", tiny_job_yaml(3) + "\n");
  const std::string common = std::string("--config job.yaml") + kEverything;

  const Result full = run_trainer(dir.path(), common + " --job-dir full");
  INFO(full.err);
  REQUIRE(full.code == 0);
  CHECK_THAT(full.err, Contains("train.ema: decay 0.99 adjusted to"));
  CHECK(fs::exists(dir / "full" / "model_best" / "model.json"));

  // Stopped mid-epoch 2 (step 4 of 9), then resumed.
  const Result first = run_trainer(dir.path(), common + " --job-dir split --set train.max_steps=4");
  INFO(first.err);
  REQUIRE(first.code == 0);
  const Result second = run_trainer(dir.path(), common + " --job-dir split");
  INFO(second.err);
  REQUIRE(second.code == 0);
  CHECK_THAT(second.err, Contains("resumed from"));
  CHECK(weights(dir / "split" / "model") == weights(dir / "full" / "model"));
  CHECK(weights(dir / "split" / "model_best") == weights(dir / "full" / "model_best"));
  CHECK(slurp(dir / "split" / "model_best" / "model.json") ==
        slurp(dir / "full" / "model_best" / "model.json"));
  // The export holds the EMA (export.weights: ema); the raw weights are in the checkpoint.
  fs::path last;
  for (const auto& e : fs::directory_iterator(dir / "full" / "checkpoints")) {
    if (last.empty() || e.path().filename() > last.filename()) last = e.path();
  }
  CHECK(slurp(last / "ema.safetensors").size() > 0);
  CHECK(read_f32(dir / "full" / "model" / "model.safetensors") ==
        read_f32(last / "ema.safetensors"));
  CHECK(read_f32(dir / "full" / "model" / "model.safetensors") !=
        read_f32(last / "model.safetensors"));

  // Validation of both weights is in the metrics.
  bool ema_metrics = false;
  for (const auto& rec : read_metrics(dir / "full" / "metrics.jsonl")) {
    ema_metrics = ema_metrics || rec.contains("val_ema_accuracy");
  }
  CHECK(ema_metrics);

  // One flow, not Catch sections (each would train full and split again).
  // A damaged recipe state is a data error naming the file, and nothing is lost.
  {
    const Result again =
        run_trainer(dir.path(), common + " --job-dir damaged --set train.max_steps=4");
    REQUIRE(again.code == 0);
    fs::path ckpt;
    for (const auto& e : fs::directory_iterator(dir / "damaged" / "checkpoints")) {
      if (ckpt.empty() || e.path().filename() > ckpt.filename()) ckpt = e.path();
    }
    auto state = nlohmann::json::parse(slurp(ckpt / "state.json"));
    state["recipe"]["ema_count"] = "many";
    write_text(ckpt / "state.json", state.dump());
    const Result resumed = run_trainer(dir.path(), common + " --job-dir damaged");
    CHECK(resumed.code == 3);
    CHECK_THAT(resumed.err, Contains((ckpt.filename() / "state.json").string()));
    CHECK_THAT(resumed.err, Contains("ema_count"));
    CHECK(fs::exists(ckpt / "model.safetensors"));
  }

  // export.weights: raw exports the trained weights.
  {
    const Result raw = run_trainer(dir.path(), common + " --job-dir raw --set export.weights=raw");
    INFO(raw.err);
    REQUIRE(raw.code == 0);
    CHECK(read_f32(dir / "raw" / "model" / "model.safetensors") ==
          read_f32(last / "model.safetensors"));
  }
}

TEST_CASE("early stopping stops, and the same command again only exports", "[recipe]") {
  TempDir dir("early_stop");
  make_dataset(dir.path(), "data", 6, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(6) + "\n");
  // A rate of ~0 cannot improve the validation loss: patience 1 stops after epoch 2.
  const std::string args =
      "--config job.yaml --job-dir job --set train.optimizer.learning_rate=1e-12"
      " --set train.early_stopping.patience=1 --set train.early_stopping.metric=val_loss"
      " --set train.early_stopping.min_delta=0.5";
  const Result r = run_trainer(dir.path(), args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Contains("train.early_stopping: stopped after epoch 2 of 6"));
  int epochs = 0;
  for (const auto& rec : read_metrics(dir / "job" / "metrics.jsonl")) {
    epochs += rec.contains("val_loss") ? 1 : 0;
  }
  CHECK(epochs == 2);
  const Result again = run_trainer(dir.path(), args);
  INFO(again.err);
  REQUIRE(again.code == 0);
  CHECK_THAT(again.err, Contains("stopped early"));
  CHECK(weights(dir / "job" / "model").size() > 0);
}

TEST_CASE("bad recipe input is a clear error before training", "[recipe]") {
  TempDir dir("recipe_errors");
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1) + "\n");
  const Result weights_len =
      run_trainer(dir.path(), "--config job.yaml --job-dir a --set 'train.class_weights=[1, 2]'");
  CHECK(weights_len.code == 2);
  CHECK_THAT(weights_len.err, Contains("train.class_weights: 2 weights, but"));
  CHECK_THAT(weights_len.err, Contains("has 5 classes (one weight per class)"));
  CHECK_FALSE(fs::exists(dir / "a" / "model"));
  const Result no_val = run_trainer(dir.path(),
                                    "--config job.yaml --job-dir b --set data.validation.path= "
                                    "--set checkpoint.keep_best=val_loss");
  CHECK(no_val.code == 2);
  CHECK_THAT(no_val.err, Contains("checkpoint.keep_best: needs validation data"));
}

namespace {

// A .npy file's shape (format 1.0) and its float32 data.
std::vector<int64_t> npy_shape(const std::string& bytes, std::vector<float>* data) {
  REQUIRE(bytes.size() > 10);
  REQUIRE(bytes.substr(0, 6) == "\x93NUMPY");
  const size_t header_len = static_cast<unsigned char>(bytes[8]) |
                            (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  const std::string header = bytes.substr(10, header_len);
  CHECK_THAT(header, Contains("'descr': '<f4'"));
  CHECK((10 + header_len) % 64 == 0);
  const size_t open = header.find("'shape': (") + 10;
  const size_t close = header.find(')', open);
  std::vector<int64_t> shape;
  std::istringstream dims(header.substr(open, close - open));
  for (std::string d; std::getline(dims, d, ',');) {
    if (d.find_first_of("0123456789") != std::string::npos) shape.push_back(std::stoll(d));
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  REQUIRE(bytes.size() == 10 + header_len + static_cast<size_t>(n) * 4);
  data->resize(static_cast<size_t>(n));
  std::memcpy(data->data(), bytes.data() + 10 + header_len, static_cast<size_t>(n) * 4);
  return shape;
}

}  // namespace

TEST_CASE("trainer preview writes what the model is fed", "[recipe][preview]") {
  TempDir dir("preview");
  make_dataset(dir.path(), "data", 6, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1) + "\n");
  const std::string recipe =
      " --set train.mixup_alpha=0.2 --set train.cutmix_alpha=1.0 --set train.label_smoothing=0.1"
      " --set data.augment.random_resized_crop=true --set data.augment.policy=trivial_augment_wide"
      " --set data.augment.random_erasing=0.5";
  const Result r =
      run_trainer(dir.path(), "preview --config job.yaml --count 12 --out pv" + recipe);
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("preview of 12 train examples"));
  std::vector<float> inputs, targets;
  CHECK(npy_shape(slurp(dir / "pv" / "inputs.npy"), &inputs) ==
        std::vector<int64_t>{12, 3, 32, 32});
  CHECK(npy_shape(slurp(dir / "pv" / "targets.npy"), &targets) == std::vector<int64_t>{12, 5});
  bool soft = false;
  for (int i = 0; i < 12; ++i) {
    float sum = 0;
    float top = 0;
    for (int c = 0; c < 5; ++c) {
      sum += targets[static_cast<size_t>(i * 5 + c)];
      top = std::max(top, targets[static_cast<size_t>(i * 5 + c)]);
    }
    CHECK(sum == Approx(1.0).epsilon(1e-5));
    CHECK(top <= 0.92 + 1e-6);  // smoothing 0.1 over 5 classes: at most 0.9 + 0.02
    soft = soft || top < 0.9;   // mixed with another class
  }
  CHECK(soft);
  CHECK(slurp(dir / "pv" / "preview.png").substr(1, 3) == "PNG");
  std::istringstream lines(slurp(dir / "pv" / "examples.jsonl"));
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const auto j = nlohmann::json::parse(line);
    CHECK(j.contains("source"));
    CHECK(fs::exists(dir / j["source"].get<std::string>()));
    CHECK(j["label"].is_string());
    CHECK(j["augment"].contains("crop"));
    CHECK(j["augment"].contains("policy"));
    CHECK(j["augment"].contains("erase"));
    CHECK(j.contains("mix"));
    CHECK(j["target"].size() == 5);
  }
  CHECK(n == 12);
  // The same command draws the same.
  const Result again =
      run_trainer(dir.path(), "preview --config job.yaml --count 12 --out pv2" + recipe);
  REQUIRE(again.code == 0);
  CHECK(slurp(dir / "pv2" / "inputs.npy") == slurp(dir / "pv" / "inputs.npy"));

  SECTION("validation: no augmentation, one-hot targets") {
    const Result val = run_trainer(
        dir.path(), "preview --config job.yaml --split validation --count 4 --out pv3" + recipe);
    INFO(val.err);
    REQUIRE(val.code == 0);
    std::vector<float> t;
    npy_shape(slurp(dir / "pv3" / "targets.npy"), &t);
    for (float v : t) CHECK((v == 0.0f || v == 1.0f));
  }
  SECTION("validation needs no training batch: a batch larger than the training set") {
    // 6 x 5 = 30 training images, a batch of 64: training refuses it, preview of validation
    // reads the validation split with its own plan.
    const std::string big = " --set train.per_replica_batch_size=64";
    const Result val = run_trainer(
        dir.path(), "preview --config job.yaml --split validation --count 8 --out pv6" + big);
    INFO(val.err);
    REQUIRE(val.code == 0);
    std::vector<float> pixels;
    CHECK(npy_shape(slurp(dir / "pv6" / "inputs.npy"), &pixels) ==
          std::vector<int64_t>{8, 3, 32, 32});
    CHECK(fs::exists(dir / "pv6" / "preview.png"));
    const Result train_split =
        run_trainer(dir.path(), "preview --config job.yaml --count 8 --out pv7" + big);
    CHECK(train_split.code == 2);
    CHECK_THAT(train_split.err, Contains("train.per_replica_batch_size: 64 is more than"));
  }
  SECTION("bad input is a usage error") {
    const Result bad = run_trainer(dir.path(), "preview --config job.yaml --count 0 --out pv4");
    CHECK(bad.code == 2);
    CHECK_THAT(bad.err, Contains("--count"));
    const Result none = run_trainer(
        dir.path(),
        "preview --config job.yaml --split validation --set data.validation.path= --out pv5");
    CHECK(none.code == 2);
    CHECK_THAT(none.err, Contains("no validation data"));
    CHECK_FALSE(fs::exists(dir / "pv5"));
  }
}

TEST_CASE("the recipe configs are accepted by inspect and train end to end", "[recipe][configs]") {
  TempDir dir("recipe_configs");
  make_dataset(dir.path(), "data", 4, 48);  // 5 classes: cbb, cbsd, cgm, cmd, healthy
  const fs::path configs = fs::path(TRAINER_SOURCE_DIR) / "configs";
  // Each on the generated sample (the recipes' own data paths are not here), small and short.
  const std::string here =
      " --set data.train.format=imagefolder --set data.train.path=data/train"
      " --set data.validation.format=imagefolder --set data.validation.path=data/validation"
      " --set train.per_replica_batch_size=4 --set train.threads=1"
      " --set train.ema.every_steps=1";
  // The EfficientNet recipe as EfficientNet-B0, without its download (tests/integration/
  // test_hub.cpp fetches weights from a loopback server).
  for (const std::string name :
       {"torchvision_resnet50.yaml", "cassava_kaggle.yaml", "cassava_efficientnet.yaml"}) {
    INFO(name);
    const bool effnet = name == "cassava_efficientnet.yaml";
    const std::string config = " --config " + (configs / name).string() +
                               (effnet ? " --set model.arch=efficientnet_b0 --set model.pretrained="
                                       : " --set model.arch=resnet18");
    const Result inspect = run_trainer(dir.path(), "inspect" + config + here);
    INFO(inspect.err);
    REQUIRE(inspect.code == 0);
    const auto doc = nlohmann::json::parse(inspect.out);
    CHECK(doc["job"]["train"]["ema"]["decay"].get<double>() > 0);
    CHECK(doc["job"]["checkpoint"]["keep_best"] == "val_accuracy");
    const Result train =
        run_trainer(dir.path(), "train" + config + here + " --job-dir job_" + name +
                                    " --set train.max_steps=2 --set data.image_size=32"
                                    " --set data.eval_crop_size=32 --set data.eval_resize_size=auto"
                                    " --set train.scale_lr=off");
    INFO(train.err);
    REQUIRE(train.code == 0);
    CHECK(fs::exists(dir / ("job_" + name) / "model" / "model.json"));
  }
}
