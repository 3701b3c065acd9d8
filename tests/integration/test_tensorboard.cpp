// TensorBoard event files from a real run: the layout of Keras's TensorBoard callback
// (JOB_DIR/logs/train, logs/validation), every step's scalars equal to metrics.jsonl's, the
// epoch curves of both runs under the same tags, the job spec as text, input images per epoch;
// logging.tensorboard: false writes none. Read with the same reader, they look like the real
// files TensorFlow wrote in ../shared/realdata (tf.summary.scalar's and Keras's), field by field.
// (Resume and several workers: test_resume.cpp and test_multiworker.cpp check the files there
// too; the formats: tests/unit/loop/events_test.cpp.)
#include "common/catch.h"

#include <opencv2/imgcodecs.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include "fixtures.h"
#include "harness.h"
#include "summaries.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

// The values of metrics.jsonl's `key`, in file order, as the float an event holds.
std::vector<float> metric(const fs::path& job, const std::string& key) {
  std::vector<float> out;
  for (const auto& rec : read_metrics(job / "metrics.jsonl")) {
    if (rec.contains(key)) out.push_back(static_cast<float>(rec[key].get<double>()));
  }
  return out;
}

const fs::path kRealdata = TRAINER_SOURCE_DIR "/../shared/realdata";

// What a reader sees of one run (a directory of events files), read with the project's reader.
struct RunView {
  size_t files = 0;
  bool first_records_ok = true;     // each file opens with file_version "brain.Event:2" alone
  bool wall_times_ok = true;        // every record has one, never going back within a file
  bool one_value_per_event = true;  // no event holds two summary values
  std::map<std::string, std::vector<int64_t>> steps;                        // per tag
  std::map<std::string, std::vector<trainer::train::SummaryValue>> values;  // per tag
};

RunView view_run(const fs::path& run) {
  RunView v;
  for (const fs::path& file : trainer::train::event_files(run)) {
    ++v.files;
    const auto records = trainer::train::read_events(file);
    v.first_records_ok = v.first_records_ok && !records.empty() &&
                         records[0].file_version == "brain.Event:2" && records[0].values.empty() &&
                         records[0].step == 0;
    double last = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      const auto& r = records[i];
      v.wall_times_ok = v.wall_times_ok && r.wall_time > 1.5e9 && r.wall_time >= last;
      last = r.wall_time;
      // (Keras also writes events without a summary: graph_def)
      v.one_value_per_event = v.one_value_per_event && r.values.size() <= 1;
      for (const auto& value : r.values) {
        v.steps[value.tag].push_back(r.step);
        v.values[value.tag].push_back(value);
      }
    }
  }
  return v;
}

std::set<std::string> tags_of(const RunView& v) {
  std::set<std::string> tags;
  for (const auto& [tag, steps] : v.steps) tags.insert(tag);
  return tags;
}

bool increasing(const std::vector<int64_t>& steps) {
  return std::adjacent_find(steps.begin(), steps.end(), std::greater_equal<int64_t>()) ==
         steps.end();
}

// How `tag`'s values are stored, as one line that is the same for every value of a uniform tag:
// "dtype shape plugin data_class metadata source", e.g. "1 [] scalars 1 meta content".
std::set<std::string> representation(const RunView& v, const std::string& tag) {
  std::set<std::string> forms;
  for (const auto& x : v.values.at(tag)) {
    std::string shape = "[";
    for (const int64_t d : x.shape) shape += std::to_string(d) + ",";
    forms.insert(std::to_string(x.dtype) + " " + shape + "] " +
                 (x.plugin.empty() ? "-" : x.plugin) + " " + std::to_string(x.data_class) + " " +
                 (x.has_metadata ? "meta" : "nometa") + " " +
                 (x.simple_value   ? "simple_value"
                  : x.from_content ? "content"
                                   : "float_val") +
                 " n=" + std::to_string(x.floats.size()));
  }
  return forms;
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

  // Ours beside real files written by TensorFlow, read with the same reader: TF 2.7's
  // tf.summary.scalar in a custom loop (kubeflow-katib, logs/{train,test}) and Keras 2.4's
  // TensorBoard callback (tensorflow-tfx PR 2393, model_run/8/{train,validation}).
  const RunView ours_train = view_run(train), ours_val = view_run(validation);
  for (const RunView* v : {&ours_train, &ours_val}) {
    CHECK(v->files == 1);
    CHECK(v->first_records_ok);
    CHECK(v->wall_times_ok);
    CHECK(v->one_value_per_event);
    for (const auto& [tag, steps] : v->steps) CHECK(increasing(steps));
  }
  const std::set<std::string> scalar_form{"1 [] scalars 1 meta content n=1"};
  for (const auto& tag : {"loss", "accuracy", "learning_rate", "epoch_loss", "epoch_accuracy"}) {
    INFO(tag);
    CHECK(representation(ours_train, tag) == scalar_form);
  }
  CHECK(tags_of(ours_val) == std::set<std::string>{"epoch_accuracy", "epoch_loss"});
  for (const auto& tag : tags_of(ours_val)) CHECK(tags_of(ours_train).count(tag) == 1);
  CHECK(representation(ours_val, "epoch_loss") == scalar_form);

  const fs::path katib = kRealdata /
                         "kubeflow-katib/test/unit/v1beta1/metricscollector/testdata/"
                         "tfevent-metricscollector/logs";
  const fs::path keras = kRealdata /
                         "tensorflow-tfx-pr2393/tfx/examples/iris/iris_native_keras_custom_splits/"
                         "Trainer/model_run/8";
  if (!fs::is_directory(kRealdata)) {
    WARN("the comparison with TensorFlow's event files skipped: ../shared/realdata not found");
  } else {
    // tf.summary.scalar: ours differs only in data_class (1, DATA_CLASS_SCALAR, as TensorBoard's
    // own scalar summary sets it since 2020; this TF 2.7 file leaves it unset).
    const std::set<std::string> tf_form{"1 [] scalars 0 meta content n=1"};
    for (const char* run : {"train", "test"}) {
      INFO(run);
      const RunView v = view_run(katib / run);
      CHECK(v.files == 1);
      CHECK(v.first_records_ok);
      CHECK(v.wall_times_ok);
      CHECK(v.one_value_per_event);
      CHECK(tags_of(v) == std::set<std::string>{"accuracy", "loss"});
      for (const char* tag : {"loss", "accuracy"}) {
        CHECK(representation(v, tag) == tf_form);
        CHECK(v.steps.at(tag) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
      }
    }
    const RunView katib_train = view_run(katib / "train");
    CHECK(katib_train.values.at("loss").front().floats[0] == Approx(0.205).margin(5e-4));
    CHECK(katib_train.values.at("accuracy").back().floats[0] == Approx(0.990).margin(5e-4));

    // Keras: the same run layout, the epoch_ tags of validation also in train (one chart for
    // both), per-batch values under batch_<metric>; every scalar a legacy simple_value without
    // metadata. Epoch steps count epochs from 0 there; ours are the global step.
    const RunView k_train = view_run(keras / "train"), k_val = view_run(keras / "validation");
    CHECK(k_train.files == 2);  // and the profiler's marker file, a file_version record only
    for (const RunView* v : {&k_train, &k_val}) {
      CHECK(v->first_records_ok);
      CHECK(v->wall_times_ok);
      CHECK(v->one_value_per_event);
      for (const auto& [tag, steps] : v->steps) CHECK(increasing(steps));
    }
    CHECK(tags_of(k_val) ==
          std::set<std::string>{"epoch_loss", "epoch_sparse_categorical_accuracy"});
    for (const auto& tag : tags_of(k_val)) CHECK(tags_of(k_train).count(tag) == 1);
    CHECK(tags_of(k_train).count("batch_loss") == 1);
    CHECK(representation(k_val, "epoch_loss") ==
          std::set<std::string>{"0 [] - 0 nometa simple_value n=1"});
    CHECK(k_val.steps.at("epoch_loss").front() == 0);
    CHECK(k_val.steps.at("epoch_loss").size() == 20);
    CHECK(k_val.values.at("epoch_loss").front().floats[0] == Approx(0.674).margin(5e-4));
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
