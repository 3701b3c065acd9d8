// data.eval_resize: shorter_side end to end: a tiny job validates on torchvision's eval preset
// (resize the shorter side, centre crop, bicubic) at an eval crop other than the training size;
// model.json records it; `trainer evaluate` on the exported model gives what the last
// validation gave; the ONNX export's input is the eval crop; `trainer predict --tta flip` and
// `trainer evaluate --tta dihedral` run; --tta bogus is exit 2 naming --tta.
#include "common/catch.h"

#include <cmath>
#include <sstream>

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

TEST_CASE("shorter_side eval preprocessing through train, model.json, evaluate, predict --tta",
          "[eval_preset][tta]") {
  TempDir dir("eval_preset");
  // 40 x 30 landscape images: 3 classes, 4 per class and split.
  const Result made = run_trainer(dir.path(),
                                  "make-dataset --out data --per-class 4 --image-size 40 "
                                  "--image-height 30 --classes 3 --seed 1");
  INFO(made.err);
  REQUIRE(made.code == 0);
  write_text(dir / "job.yaml", tiny_job_yaml(1));
  const std::string sets =
      " --set data.eval_resize=shorter_side --set data.eval_crop_size=24"
      " --set data.interpolation=bicubic --set train.per_replica_batch_size=4";
  const Result train = run_trainer(dir.path(), "--config job.yaml --job-dir job" + sets);
  INFO(train.err);
  REQUIRE(train.code == 0);

  const auto model = nlohmann::json::parse(slurp(dir / "job" / "model" / "model.json"));
  CHECK(model["image_size"] == 32);  // the training crop
  CHECK(model["eval_resize"] == "shorter_side");
  CHECK(model["eval_crop_size"] == 24);
  CHECK(model["eval_resize_size"] == 27);  // round(24 / 0.875)
  CHECK(model["interpolation"] == "bicubic");
  CHECK(model["preprocessing"]["image_size"] == 24);
  CHECK(model["preprocessing"]["resize_size"] == 27);

  // evaluate reads the preprocessing from model.json: the same figures as the last validation.
  double val_loss = -1;
  double val_accuracy = -1;
  for (const auto& rec : read_metrics(dir / "job" / "metrics.jsonl")) {
    if (rec.contains("val_loss")) {
      val_loss = rec["val_loss"].get<double>();
      val_accuracy = rec["val_accuracy"].get<double>();
    }
  }
  REQUIRE(val_loss >= 0);
  const Result eval =
      run_trainer(dir.path(), "evaluate --model job/model --config job.yaml" + sets);
  INFO(eval.err);
  REQUIRE(eval.code == 0);
  const auto e = nlohmann::json::parse(eval.out);
  CHECK(e["num_examples"] == 12);
  CHECK(e["accuracy"].get<double>() == val_accuracy);
  CHECK(std::abs(e["loss"].get<double>() - val_loss) <= 1e-5 * std::max(val_loss, 1.0));
  CHECK_FALSE(e.contains("tta"));

  const Result eval_tta =
      run_trainer(dir.path(), "evaluate --model job/model --config job.yaml --tta dihedral" + sets);
  INFO(eval_tta.err);
  REQUIRE(eval_tta.code == 0);
  const auto et = nlohmann::json::parse(eval_tta.out);
  CHECK(et["tta"] == "dihedral");
  CHECK(et["num_examples"] == 12);
  CHECK(std::isfinite(et["loss"].get<double>()));

  // predict --tta flip: averaged probabilities (sum 1), the label their argmax; CSV agrees.
  const Result pred =
      run_trainer(dir.path(), "predict --model job/model --tta flip data/validation");
  INFO(pred.err);
  REQUIRE(pred.code == 0);
  std::istringstream lines(pred.out);
  int rows = 0;
  std::map<std::string, int64_t> index_of;
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    const auto p = j["probabilities"].get<std::vector<float>>();
    REQUIRE(p.size() == 3);
    double sum = 0;
    for (const float v : p) sum += v;
    CHECK(std::abs(sum - 1.0) < 1e-4);
    const auto best = std::max_element(p.begin(), p.end()) - p.begin();
    CHECK(j["index"] == best);
    index_of[fs::path(j["path"].get<std::string>()).filename().string()] = best;
    ++rows;
  }
  CHECK(rows == 12);
  const Result csv =
      run_trainer(dir.path(), "predict --model job/model --tta flip --format csv data/validation");
  REQUIRE(csv.code == 0);
  std::istringstream csv_lines(csv.out);
  std::string line;
  std::getline(csv_lines, line);
  CHECK(line == "image_id,label");
  int csv_rows = 0;
  while (std::getline(csv_lines, line)) {
    const auto comma = line.rfind(',');
    CHECK(index_of.at(line.substr(0, comma)) == std::stoll(line.substr(comma + 1)));
    ++csv_rows;
  }
  CHECK(csv_rows == 12);

  // The ONNX export takes the eval crop.
  const Result onnx = run_trainer(dir.path(), "export --model job/model --out m.onnx");
  INFO(onnx.err);
  REQUIRE(onnx.code == 0);
  const auto x = nlohmann::json::parse(onnx.out)["inputs"][0]["shape"];
  CHECK(x == nlohmann::json::parse(R"(["batch", 3, 24, 24])"));

  // A bad --tta: the usage exit code, naming the option and its values.
  for (const std::string cmd : {"predict --model job/model --tta bogus data/validation",
                                "evaluate --model job/model --config job.yaml --tta bogus"}) {
    const Result bad = run_trainer(dir.path(), cmd);
    INFO(cmd << "\n" << bad.err);
    CHECK(bad.code == 2);
    CHECK_THAT(bad.err + bad.out, Contains("--tta") && Contains("bogus") && Contains("dihedral"));
  }
}
