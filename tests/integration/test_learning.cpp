// End to end as a user runs it: make-dataset -> train (real JPEGs, real decode threads) ->
// the exported model dir -> evaluate reproduces the trainer's final validation accuracy and
// predict agrees with evaluate image by image; with export.onnx, model.onnx run by OpenCV's DNN
// agrees with predict; predict over a directory, a glob and a csv manifest writes Kaggle's CSV.
#include "common/catch.h"

#include "fixtures.h"
#include "harness.h"
#include "onnx_check.h"

using namespace trainer::testing;
using trainer::test::Contains;

TEST_CASE("a small ResNet learns the synthetic data and evaluate and predict agree with it",
          "[learning]") {
  TempDir dir("learn");
  make_dataset(dir.path(), "data", 40, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(3));
  const Result train =
      run_trainer(dir.path(), "--config job.yaml --job-dir job --set export.onnx=true");
  INFO(train.err);
  REQUIRE(train.code == 0);
  CHECK_THAT(train.out, Contains("model: job/model"));

  // The job dir holds what the README promises.
  for (const char* p : {"job.yaml", "metrics.jsonl", "model/model.safetensors", "model/model.json",
                        "model/model.onnx"}) {
    CHECK(fs::exists(dir / "job" / p));
  }
  double final_val = -1;
  int64_t steps = 0;
  for (const auto& rec : read_metrics(dir / "job" / "metrics.jsonl")) {
    if (rec.contains("val_accuracy")) final_val = rec["val_accuracy"].get<double>();
    if (rec.contains("loss")) ++steps;
  }
  CHECK(steps == 3 * 20);  // 200 images / batch 10, 3 epochs, each step recorded once
  INFO("final validation accuracy " << final_val);
  CHECK(final_val >= 0.6);  // chance is 0.2

  const Result eval = run_trainer(dir.path(), "evaluate --model job/model --config job.yaml");
  INFO(eval.err);
  REQUIRE(eval.code == 0);
  const auto e = nlohmann::json::parse(eval.out);
  CHECK(e["num_examples"] == 50);
  CHECK(e["accuracy"].get<double>() == Approx(final_val).margin(1e-12));
  CHECK(e["per_class"].size() == 5);
  CHECK(e["confusion_matrix"].size() == 5);

  // predict on every validation image of two classes; its answers must be evaluate's answers on
  // exactly those images (a csv manifest of them).
  std::string images, csv = "image_id,label\n";
  int n = 0;
  for (const char* cls : {"cbb", "healthy"}) {
    for (const auto& f : fs::directory_iterator(dir / "data" / "validation" / cls)) {
      images += " " + quote(f.path().string());
      csv += std::string(cls) + "/" + f.path().filename().string() + "," + cls + "\n";
      ++n;
    }
  }
  const Result pred = run_trainer(dir.path(), "predict --model job/model" + images);
  INFO(pred.err);
  REQUIRE(pred.code == 0);
  std::vector<std::vector<int64_t>> confusion(5, std::vector<int64_t>(5, 0));
  std::istringstream lines(pred.out);
  int seen = 0;
  for (std::string line; std::getline(lines, line); ++seen) {
    const auto p = nlohmann::json::parse(line);
    const std::string path = p["path"];
    const int truth = path.find("/cbb/") != std::string::npos ? 0 : 4;
    confusion[truth][p["index"].get<size_t>()]++;
    double total = 0;
    for (double v : p["probabilities"]) total += v;
    CHECK(total == Approx(1.0).margin(1e-4));
    CHECK(p["label"] == e["class_names"][p["index"].get<size_t>()]);
  }
  CHECK(seen == n);
  write_text(dir / "subset.csv", csv);

  // The trained model's model.onnx (export.onnx: true), run by OpenCV, agrees with predict.
  std::vector<std::string> paths;
  for (const auto& [path, probs] : predicted(pred.out)) paths.push_back(path);
  const torch::Tensor by_opencv =
      opencv_probabilities((dir / "job" / "model" / "model.onnx").string(),
                           decoded_images(paths, 32), 8, "imagenet", false);
  CHECK(max_difference(by_opencv, paths, predicted(pred.out)) <= 1e-4);

  // A directory, a glob and a manifest, to Kaggle's CSV (file name, class index).
  std::map<std::string, int64_t> index_of;
  std::istringstream in(pred.out);
  for (std::string line; std::getline(in, line);) {
    const auto p = nlohmann::json::parse(line);
    index_of[fs::path(p["path"].get<std::string>()).filename().string()] = p["index"];
  }
  const auto check_csv = [&](const std::string& inputs, size_t rows) {
    fs::remove(dir / "sub.csv");
    const Result r = run_trainer(dir.path(),
                                 "predict --model job/model --batch-size 7 --out "
                                 "sub.csv " +
                                     inputs);
    INFO(inputs << ": " << r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.empty());
    CHECK_THAT(r.err, Contains("images/s"));
    std::istringstream csv_in(slurp(dir / "sub.csv"));
    std::string row;
    std::getline(csv_in, row);
    CHECK(row == "image_id,label");
    size_t count = 0;
    for (; std::getline(csv_in, row); ++count) {
      const std::string name = row.substr(0, row.find(','));
      if (index_of.count(name)) CHECK(std::stoll(row.substr(row.find(',') + 1)) == index_of[name]);
    }
    CHECK(count == rows);
  };
  check_csv("data/validation", 50);
  check_csv("'data/validation/cbb/*.jpg' data/validation/healthy", 20);
  check_csv("subset.csv --image-root data/validation --image-column image_id", 20);
  const Result taken =
      run_trainer(dir.path(), "predict --model job/model --out sub.csv subset.csv");
  CHECK(taken.code == 2);
  CHECK_THAT(taken.err, Contains("--overwrite"));
  const Result sub = run_trainer(
      dir.path(),
      "evaluate --model job/model --config job.yaml --set data.validation.format=csv "
      "--set data.validation.path=subset.csv --set data.validation.image_root=data/validation "
      "--set data.class_names=[cbb,cbsd,cgm,cmd,healthy]");
  INFO(sub.err);
  REQUIRE(sub.code == 0);
  CHECK(nlohmann::json::parse(sub.out)["confusion_matrix"] == nlohmann::json(confusion));
}
