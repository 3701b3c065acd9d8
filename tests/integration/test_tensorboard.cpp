// TensorBoard event files from a real run: the layout of Keras's TensorBoard callback
// (JOB_DIR/logs/train, logs/validation), every step's scalars equal to metrics.jsonl's, the
// epoch curves of both runs under the same tags, the job spec as text, input images per epoch;
// logging.tensorboard: false writes none. (Resume and several workers: test_resume.cpp and
// test_multiworker.cpp check the files there too; the formats: tests/unit/train/events_test.cpp.)
#include <catch2/catch.hpp>

#include <opencv2/imgcodecs.hpp>

#include <regex>

#include "fixtures.h"
#include "harness.h"
#include "summaries.h"

using namespace trainer::testing;
using Catch::Matchers::Contains;

namespace {

// The values of metrics.jsonl's `key`, in file order, as the float an event holds.
std::vector<float> metric(const fs::path& job, const std::string& key) {
  std::vector<float> out;
  for (const auto& rec : read_metrics(job / "metrics.jsonl")) {
    if (rec.contains(key)) out.push_back(static_cast<float>(rec[key].get<double>()));
  }
  return out;
}

std::vector<float> scalars(const fs::path& run, const std::string& tag) {
  std::vector<float> out;
  for (const auto& v : summary_values(run, tag)) {
    REQUIRE(v.floats.size() == 1);
    out.push_back(v.floats[0]);
  }
  return out;
}

}  // namespace

TEST_CASE("the chief writes TensorBoard event files a user can open", "[tensorboard]") {
  TempDir dir("tensorboard");
  make_dataset(dir.path(), "data", 6, 32);  // 30 train images: 3 steps per epoch
  write_text(dir / "job.yaml", tiny_job_yaml(2));
  const Result r = run_trainer(dir.path(), "--config job.yaml --job-dir job");
  INFO(r.err);
  REQUIRE(r.code == 0);

  const fs::path train = dir / "job" / "logs" / "train";
  const fs::path validation = dir / "job" / "logs" / "validation";
  const auto files = tfevents_under(dir / "job");
  REQUIRE(files.size() == 2);
  for (const auto& f : files) {
    CHECK(std::regex_match(f.filename().string(),
                           std::regex(R"(events\.out\.tfevents\.\d{10}\.[^.]+.*\.\d+\.v2)")));
    CHECK((f.parent_path() == train || f.parent_path() == validation));
  }

  // Per step, what metrics.jsonl holds.
  const std::vector<int64_t> steps{1, 2, 3, 4, 5, 6};
  for (const char* tag : {"loss", "accuracy", "learning_rate", "images_per_sec", "data_wait_s"}) {
    INFO(tag);
    CHECK(summary_steps(train, tag) == steps);
    CHECK(scalars(train, tag) == metric(dir / "job", tag));
  }
  CHECK(summary_steps(train, "comm_wait_s").empty());  // one worker

  // Per epoch, training and validation under the same tags, on one chart.
  CHECK(summary_steps(train, "epoch_loss") == std::vector<int64_t>{3, 6});
  CHECK(scalars(train, "epoch_loss") == metric(dir / "job", "train_loss"));
  CHECK(scalars(train, "epoch_accuracy") == metric(dir / "job", "train_accuracy"));
  CHECK(summary_steps(validation, "epoch_loss") == std::vector<int64_t>{3, 6});
  CHECK(scalars(validation, "epoch_loss") == metric(dir / "job", "val_loss"));
  CHECK(scalars(validation, "epoch_accuracy") == metric(dir / "job", "val_accuracy"));

  // The resolved spec, as job.yaml holds it, once at the start.
  const auto spec = summary_values(train, "job_spec");
  REQUIRE(spec.size() == 1);
  REQUIRE(spec[0].strings.size() == 1);
  CHECK(spec[0].plugin == "text");
  std::string indented;
  for (const auto& line : [&] {
         std::vector<std::string> lines;
         std::istringstream in(slurp(dir / "job" / "job.yaml"));
         for (std::string l; std::getline(in, l);) lines.push_back(l);
         return lines;
       }()) {
    indented += "    " + line + "\n";
  }
  CHECK(spec[0].strings[0] == indented);

  // The first 4 input images of each epoch (logging.images_per_epoch), 32x32 PNGs.
  CHECK(summary_steps(train, "input_images") == std::vector<int64_t>{1, 4});
  for (const auto& v : summary_values(train, "input_images")) {
    REQUIRE(v.strings.size() == 2 + 4);
    CHECK(v.strings[0] == "32");
    CHECK(v.strings[1] == "32");
    for (size_t i = 2; i < v.strings.size(); ++i) {
      const cv::Mat img = cv::imdecode(
          std::vector<uint8_t>(v.strings[i].begin(), v.strings[i].end()), cv::IMREAD_UNCHANGED);
      CHECK(img.rows == 32);
      CHECK(img.cols == 32);
      CHECK(img.channels() == 3);
    }
  }

  SECTION("logging.tensorboard: false writes no event files") {
    const Result off =
        run_trainer(dir.path(),
                    "--config job.yaml --job-dir off --set logging.tensorboard=false "
                    "--set train.max_steps=1");
    INFO(off.err);
    REQUIRE(off.code == 0);
    CHECK_FALSE(fs::exists(dir / "off" / "logs"));
  }

  SECTION("a bad flush interval is refused before anything runs") {
    const Result bad =
        run_trainer(dir.path(), "--config job.yaml --job-dir bad --set logging.flush_secs=0");
    CHECK(bad.code == 2);
    CHECK_THAT(bad.err, Contains("logging.flush_secs"));
    CHECK_FALSE(fs::exists(dir / "bad" / "logs"));
  }
}
