// TFRecord data end to end with the real binary: make-dataset writes a TFDS directory and
// Kaggle-style gzip files; inspect shows each worker's record files under a 3-worker TF_CONFIG;
// two processes train over the TFDS directory with shard_policy file; a corrupt record is exit 3
// naming the file and offset, or skipped and counted.
#include "common/catch.h"

#include <set>

#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

namespace {

std::string tfds_job_yaml(const std::string& policy) {
  return R"(model:
  arch: resnet18
data:
  train: {format: tfrecord, path: tfds}
  validation: {format: tfrecord, path: tfds}
  image_size: 32
  seed: 3
  shuffle_buffer: 40
  interleave: 2
  cache: memory
  shard_policy: )" +
         policy + R"(
train:
  epochs: 2
  per_replica_batch_size: 8
  threads: 1
logging:
  every_steps: 1
distributed:
  rendezvous_timeout_s: 60
  timeout_s: 60
)";
}

void make_tfds(const fs::path& cwd, int per_class = 16) {
  const Result r = run_trainer(cwd,
                               "make-dataset --out tfds --format tfrecord --tfds --shards 8 "
                               "--image-size 32 --per-class " +
                                   std::to_string(per_class));
  INFO(r.err);
  REQUIRE(r.code == 0);
}

}  // namespace

TEST_CASE("make-dataset --tfds writes a TFDS directory the trainer reads in place", "[tfrecord]") {
  TempDir dir("tfds_layout");
  make_tfds(dir.path());
  CHECK(fs::exists(dir / "tfds" / "dataset_info.json"));
  CHECK(slurp(dir / "tfds" / "label.labels.txt") == "cbb\ncbsd\ncgm\ncmd\nhealthy\n");
  CHECK(fs::exists(dir / "tfds" / "cassava-train.tfrecord-00007-of-00008"));
  CHECK(fs::exists(dir / "tfds" / "cassava-validation.tfrecord-00000-of-00008"));

  // inspect under a 3-worker TF_CONFIG: every worker's files, disjoint, within one shard.
  write_text(dir / "job.yaml", tfds_job_yaml("file"));
  std::set<std::string> files;
  std::vector<int64_t> counts;
  for (int w = 0; w < 3; ++w) {
    const Result r = run_trainer(dir.path(), "inspect --config job.yaml",
                                 {tf_config(3, false, 30000, "worker", w)});
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto doc = nlohmann::json::parse(r.out);
    const auto& data = doc["data"];
    CHECK(data["shard_policy_effective"] == "file");
    CHECK(data["record_files"] == 8);
    CHECK(data["record_counts_from"] == "dataset_info.json");
    REQUIRE(data["workers"].size() == 3);
    const auto& me = data["workers"][w];
    CHECK(me["worker"] == w);
    for (const auto& f : me["record_files"]) CHECK(files.insert(f.get<std::string>()).second);
    counts.push_back(me["examples"].get<int64_t>());
    CHECK(data["examples_this_worker"] == me["examples"]);
  }
  CHECK(files.size() == 8);
  CHECK(*std::max_element(counts.begin(), counts.end()) -
            *std::min_element(counts.begin(), counts.end()) <=
        10);  // one shard holds 10 of the 80 train records
}

TEST_CASE("2 processes train over a TFDS directory with shard_policy file", "[tfrecord]") {
  TempDir dir("tfds_train");
  make_tfds(dir.path());
  write_text(dir / "job.yaml", tfds_job_yaml("file"));
  const std::vector<Result> results = run_cluster(dir.path(), 2, "--config job.yaml --job-dir job");
  for (const auto& r : results) {
    INFO(r.err);
    CHECK(r.code == 0);
  }
  const std::string log = results[0].err;
  CHECK_THAT(log, Contains("data: 8 record files, counts from dataset_info.json"));
  CHECK_THAT(log, Contains("file: 8 files over 2 workers, balanced by example count"));
  CHECK_THAT(log, Contains("data.cache: memory holds"));
  CHECK_THAT(results[0].out, Contains("model: job/model"));
  CHECK(fs::exists(dir / "job" / "model" / "model.safetensors"));
  CHECK_FALSE(fs::exists(dir / "job" / "workertemp_1"));
  // The record counts came from metadata, so nothing needed caching.
  CHECK_FALSE(fs::exists(dir / "job" / "record_counts.json"));
  // evaluate reads the TFDS validation split the same way.
  const Result ev = run_trainer(dir.path(), "evaluate --model job/model --config job.yaml");
  INFO(ev.err);
  REQUIRE(ev.code == 0);
  CHECK(nlohmann::json::parse(ev.out)["num_examples"] == 20);
}

TEST_CASE("Kaggle-style gzip record files by glob: scanned once, cached, corrupt records",
          "[tfrecord]") {
  TempDir dir("kaggle_train");
  const Result made = run_trainer(dir.path(),
                                  "make-dataset --out recs --format tfrecord --shards 3 "
                                  "--image-size 32 --per-class 8 --label-key target "
                                  "--compression gzip --splits train");
  INFO(made.err);
  REQUIRE(made.code == 0);
  write_text(dir / "job.yaml", R"(model: {arch: resnet18}
data:
  train:
    format: tfrecord
    path: recs/train-*.tfrecord
    label_key: target
  class_names: [cbb, cbsd, cgm, cmd, healthy]
  image_size: 32
  shuffle_buffer: 16
train: {epochs: 1, per_replica_batch_size: 8, threads: 1, max_steps: 2}
)");
  const Result r = run_trainer(dir.path(), "--config job.yaml --job-dir job");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.err, Contains("counts from a scan of the record headers"));
  REQUIRE(fs::exists(dir / "job" / "record_counts.json"));
  const Result again = run_trainer(dir.path(), "inspect --config job.yaml --job-dir job");
  REQUIRE(again.code == 0);
  CHECK(nlohmann::json::parse(again.out)["data"]["record_counts_from"] == "the count cache");

  // A wrong label key names the key, the file and the record.
  const Result wrong =
      run_trainer(dir.path(), "--config job.yaml --job-dir j2 --set data.train.label_key=label");
  CHECK(wrong.code == 3);
  CHECK_THAT(wrong.err, Contains("no feature 'label'") && Contains("recs/train-") &&
                            Contains("(features: image, image/filename, target)"));
}

TEST_CASE("a corrupt record is exit 3 with the file and offset, or skipped with on_corrupt",
          "[tfrecord]") {
  TempDir dir("corrupt_record");
  const Result made = run_trainer(dir.path(),
                                  "make-dataset --out recs --format tfrecord --shards 2 "
                                  "--image-size 32 --per-class 4 --splits train");
  REQUIRE(made.code == 0);
  // Flip a byte well inside the first record's data.
  const fs::path file = dir / "recs" / "train-00000-of-00002.tfrecord";
  std::string bytes = slurp(file);
  bytes[40] = static_cast<char>(bytes[40] ^ 0x01);
  write_text(file, bytes);
  write_text(dir / "job.yaml", R"(model: {arch: resnet18}
data:
  train: {format: tfrecord, path: "recs/*.tfrecord"}
  class_names: [cbb, cbsd, cgm, cmd, healthy]
  image_size: 32
  shuffle: false
train: {epochs: 1, per_replica_batch_size: 4, threads: 1}
)");
  const Result failed = run_trainer(dir.path(), "--config job.yaml --job-dir job");
  CHECK(failed.code == 3);
  CHECK_THAT(failed.err, Contains("train-00000-of-00002.tfrecord: record 0 at byte offset 0") &&
                             Contains("data CRC mismatch"));
  const Result skipped =
      run_trainer(dir.path(), "--config job.yaml --job-dir job2 --set data.on_corrupt=skip");
  INFO(skipped.err);
  CHECK(skipped.code == 0);
  CHECK_THAT(skipped.err, Contains("1 corrupt training images skipped"));
}

TEST_CASE("fewer record files than workers: auto trains 3 processes with data", "[tfrecord]") {
  TempDir dir("few_record_files");
  const Result made = run_trainer(dir.path(),
                                  "make-dataset --out recs --format tfrecord --shards 2 "
                                  "--image-size 32 --per-class 6 --splits train");
  REQUIRE(made.code == 0);
  write_text(dir / "job.yaml", R"(model: {arch: resnet18}
data:
  train: {format: tfrecord, path: "recs/*.tfrecord"}
  class_names: [cbb, cbsd, cgm, cmd, healthy]
  image_size: 32
  shuffle_buffer: 8
train: {epochs: 1, per_replica_batch_size: 4, threads: 1}
distributed: {rendezvous_timeout_s: 60, timeout_s: 60}
)");
  const std::vector<Result> results = run_cluster(dir.path(), 3, "--config job.yaml --job-dir job");
  for (const auto& r : results) {
    INFO(r.err);
    CHECK(r.code == 0);
  }
  // 30 records, 10 per worker: 2 lock-step steps of 4.
  CHECK_THAT(results[0].err, Contains("auto: 2 files < 3 workers -> data"));
  CHECK_THAT(results[0].err, Contains("2 steps per epoch"));
  CHECK(fs::exists(dir / "job" / "model" / "model.json"));
}
