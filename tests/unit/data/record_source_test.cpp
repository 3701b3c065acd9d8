// Listing tfrecord sources: TFDS directories (split selection, class names, counts from
// dataset_info.json), Kaggle-style files through globs and lists, the header scan and its
// count cache, and the errors for what is missing. Fixtures: make-dataset's TFRecord writer.
#include "common/catch.h"

#include "common/message_of.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>
#include <thread>

#include "fixtures.h"
#include "trainer/data/record_source.h"
#include "trainer/data/source.h"
#include "trainer/data/tf_example.h"
#include "trainer/data/tfrecord.h"
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

SyntheticSummary write_records(const fs::path& out, bool tfds, int shards, int per_class = 8,
                               const std::string& label_key = "label",
                               const std::string& compression = "none") {
  SyntheticOptions o;
  o.out_dir = out.string();
  o.per_class = per_class;
  o.image_size = 16;
  o.format = "tfrecord";
  o.tfds = tfds;
  o.shards = shards;
  o.label_key = label_key;
  o.compression = compression;
  return make_synthetic_dataset(o);
}

SourceOptions tfrecord_spec(std::vector<std::string> paths) {
  SourceOptions s;
  s.format = "tfrecord";
  s.path = std::move(paths);
  return s;
}

using trainer::test_support::message_of;

}  // namespace

TEST_CASE("a TFDS directory: the split's shards, class names and counts from its metadata",
          "[records]") {
  TempDir tmp("tfds");
  const fs::path dir = tmp.path() / "cassava" / "0.1.0";
  write_records(dir, true, 8);  // train 40 in 8 shards of 5, validation 20 in 8

  const Listing train = list_source(tfrecord_spec({dir.string()}), "data.train");
  REQUIRE(train.record_files.size() == 8);
  CHECK_THAT(train.record_files[3].path, Contains("cassava-train.tfrecord-00003-of-00008"));
  CHECK(train.examples.size() == 40);
  CHECK(train.class_names == std::vector<std::string>{"cbb", "cbsd", "cgm", "cmd", "healthy"});
  CHECK(train.counts_from == "dataset_info.json");
  CHECK(train.record_files[2].first == 10);
  CHECK(train.examples[12].record == 2);
  CHECK(train.examples[12].path == train.record_files[2].path);
  CHECK(train.examples[12].label == -1);

  // The source's own name picks the split; `split` overrides it; the dataset dir (above the
  // version dir) works as well.
  const Listing validation =
      list_source(tfrecord_spec({(tmp.path() / "cassava").string()}), "data.validation");
  CHECK(validation.examples.size() == 20);
  CHECK_THAT(validation.record_files[0].path, Contains("cassava-validation.tfrecord-00000"));
  SourceOptions as_train = tfrecord_spec({dir.string()});
  as_train.split = "validation";
  CHECK(list_source(as_train, "data.train").examples.size() == 20);

  as_train.split = "test";
  CHECK_THROWS_AS(list_source(as_train, "data.train"), ConfigError);
  CHECK_THAT(message_of([&] { list_source(as_train, "data.train"); }),
             Contains("data.train.split: 'test' is not a split of the TFDS dataset") &&
                 Contains("its splits: train, validation"));

  // Class names given in the spec must agree in number with label.labels.txt.
  CHECK_THAT(message_of([&] {
               list_source(tfrecord_spec({dir.string()}), "data.train", {"a", "b"});
             }),
             Contains("data.class_names: 2 names") && Contains("5 labels in label.labels.txt"));
}

TEST_CASE("a TFDS directory with a missing shard or no shard lengths", "[records]") {
  TempDir tmp("tfds_broken");
  const fs::path dir = tmp.path() / "ds";
  write_records(dir, true, 4);

  // No shardLengths: the records are counted from their headers instead, to the same numbers.
  nlohmann::json info = nlohmann::json::parse(read_bytes(dir / "dataset_info.json"));
  for (auto& s : info["splits"]) s.erase("shardLengths");
  write_text(dir / "dataset_info.json", info.dump());
  const Listing scanned = list_source(tfrecord_spec({dir.string()}), "data.train");
  CHECK(scanned.counts_from == "a scan of the record headers");
  CHECK(scanned.examples.size() == 40);

  fs::remove(dir / "cassava-train.tfrecord-00002-of-00004");
  const std::string m =
      message_of([&] { list_source(tfrecord_spec({dir.string()}), "data.train"); });
  CHECK_THAT(m, Contains("shard 00002 of 4 of the 'train' split is missing"));
  CHECK_THAT(m, Contains("cassava-train.tfrecord-NNNNN-of-MMMMM"));

  // A plain directory is not a TFDS directory: the message says what to give instead.
  const fs::path plain = tmp.path() / "plain";
  fs::create_directories(plain);
  CHECK_THAT(message_of([&] { list_source(tfrecord_spec({plain.string()}), "data.train"); }),
             Contains("without dataset_info.json") && Contains("*.tfrec"));
}

TEST_CASE("record files by glob and list (Kaggle style) need class names", "[records]") {
  TempDir tmp("kaggle");
  write_records(tmp.path() / "recs", false, 4, 8, "target", "gzip");
  SourceOptions spec = tfrecord_spec({(tmp.path() / "recs" / "train-*.tfrecord").string()});
  spec.label_key = "target";

  CHECK_THAT(message_of([&] { list_source(spec, "data.train"); }),
             Contains("data.class_names: required"));
  const std::vector<std::string> names = {"cbb", "cbsd", "cgm", "cmd", "healthy"};
  const Listing all = list_source(spec, "data.train", names);
  CHECK(all.record_files.size() == 4);
  CHECK(all.examples.size() == 40);
  CHECK(all.record_format.label_key == "target");
  CHECK(all.counts_from == "a scan of the record headers");  // gzip files, scanned

  // A list of a file and a glob, in the order given.
  spec.path = {(tmp.path() / "recs" / "train-00003-of-00004.tfrecord").string(),
               (tmp.path() / "recs" / "train-0000[01]-*.tfrecord").string()};
  const Listing some = list_source(spec, "data.train", names);
  REQUIRE(some.record_files.size() == 3);
  CHECK_THAT(some.record_files[0].path, Contains("train-00003"));
  CHECK_THAT(some.record_files[2].path, Contains("train-00001"));

  spec.path = {(tmp.path() / "recs" / "nothing-*.tfrec").string()};
  CHECK_THAT(message_of([&] { list_source(spec, "data.train", names); }),
             Contains("no record files match") && Contains("nothing-*.tfrec"));
  spec.path = {(tmp.path() / "no_such_dir" / "ld_train*.tfrec").string()};
  CHECK_THAT(message_of([&] { list_source(spec, "data.train", names); }),
             Contains("no_such_dir' does not exist"));
  spec.path = {(tmp.path() / "recs" / "absent.tfrec").string()};
  CHECK_THAT(message_of([&] { list_source(spec, "data.train", names); }),
             Contains("record file") && Contains("absent.tfrec' does not exist"));
  spec.path = {(tmp.path() / "recs" / "train-00000-of-00004.tfrecord").string(),
               (tmp.path() / "recs" / "train-0000[0]-*.tfrecord").string()};
  CHECK_THAT(message_of([&] { list_source(spec, "data.train", names); }),
             Contains("is listed twice"));
}

TEST_CASE("record counts are scanned once and cached by size and mtime", "[records]") {
  TempDir tmp("count_cache");
  write_records(tmp.path() / "recs", false, 3);
  const SourceOptions spec = tfrecord_spec({(tmp.path() / "recs" / "train-*.tfrecord").string()});
  const std::vector<std::string> names = {"a", "b", "c", "d", "e"};
  ListOptions cache;
  cache.count_cache = (tmp.path() / "record_counts.json").string();

  // A reader that may not write (a worker) scans and leaves no file behind.
  CHECK(list_source(spec, "data.train", names, cache).counts_from ==
        "a scan of the record headers");
  CHECK_FALSE(fs::exists(cache.count_cache));

  cache.write_count_cache = true;
  CHECK(list_source(spec, "data.train", names, cache).counts_from ==
        "a scan of the record headers");
  REQUIRE(fs::exists(cache.count_cache));
  const Listing again = list_source(spec, "data.train", names, cache);
  CHECK(again.counts_from == "the count cache");
  CHECK(again.examples.size() == 40);

  // A file that changed is counted again; the others still come from the cache.
  const fs::path changed = tmp.path() / "recs" / "train-00001-of-00003.tfrecord";
  {
    RecordWriter w(changed.string());
    w.write("one");
    w.write("two");
    w.close();
  }
  const Listing after = list_source(spec, "data.train", names, cache);
  CHECK(after.counts_from == "a scan of 1 files and the count cache");
  CHECK(after.record_files[1].records == 2);
  CHECK(static_cast<int64_t>(after.examples.size()) ==
        after.record_files[0].records + 2 + after.record_files[2].records);
}

TEST_CASE("make-dataset's shards mix the classes and it removes only its own old shards",
          "[records]") {
  TempDir tmp("shard_mix");
  const fs::path out = tmp.path() / "recs";
  write_text(out / "train-notes-of-2023.tfrecord", "not ours");
  write_records(out, false, 8);  // 8 shards, then 5: the 8-shard files must go
  const SyntheticSummary s = write_records(out, false, 5);
  CHECK(s.files.size() == 10);  // train and validation
  CHECK_FALSE(fs::exists(out / "train-00007-of-00008.tfrecord"));
  CHECK(fs::exists(out / "train-notes-of-2023.tfrecord"));
  for (const std::string& f : s.files) {
    if (f.find("train-") == std::string::npos) continue;
    RecordReader r(f, Compression::kNone);
    std::set<int64_t> labels;
    std::string record;
    while (r.read(&record)) labels.insert(parse_image_example(record, "image", "label", f).label);
    INFO(f);
    CHECK(labels.size() >= 2);  // 5 classes over 5 shards: not one class per shard
  }
}

TEST_CASE("damaged count caches and metadata fall back to counting", "[records]") {
  TempDir tmp("bad_meta");
  write_records(tmp.path() / "recs", false, 2);
  const SourceOptions spec = tfrecord_spec({(tmp.path() / "recs" / "train-*.tfrecord").string()});
  const std::vector<std::string> names = {"a", "b", "c", "d", "e"};
  ListOptions cache;
  cache.count_cache = (tmp.path() / "record_counts.json").string();
  cache.write_count_cache = true;
  for (const std::string& text :
       {std::string("{oops"), std::string(R"({"version": 1, "files": []})"),
        std::string(R"({"version": 1, "files": {"x": 5}})"),
        std::string(R"({"version": "1", "files": {}})")}) {
    INFO(text);
    write_text(cache.count_cache, text);
    const Listing l = list_source(spec, "data.train", names, cache);
    CHECK(l.examples.size() == 40);
    CHECK(l.counts_from == "a scan of the record headers");
  }
  // A cache entry with the right stamp but a nonsense count is dropped, not trusted.
  nlohmann::json j = nlohmann::json::parse(read_bytes(cache.count_cache));
  for (auto& [key, e] : j["files"].items()) e["records"] = -3;
  write_text(cache.count_cache, j.dump());
  CHECK(list_source(spec, "data.train", names, cache).examples.size() == 40);

  // A TFDS directory whose shardLengths are negative is counted instead.
  const fs::path dir = tmp.path() / "tfds";
  write_records(dir, true, 2);
  nlohmann::json info = nlohmann::json::parse(read_bytes(dir / "dataset_info.json"));
  info["splits"][0]["shardLengths"] = {"-1", "20"};
  write_text(dir / "dataset_info.json", info.dump());
  const Listing t = list_source(tfrecord_spec({dir.string()}), "data.train");
  CHECK(t.counts_from == "a scan of the record headers");
  CHECK(t.examples.size() == 40);

  // A file whose name looks like a glob is still the file.
  const fs::path odd = tmp.path() / "part[1].tfrecord";
  fs::copy_file(tmp.path() / "recs" / "train-00000-of-00002.tfrecord", odd);
  CHECK(list_source(tfrecord_spec({odd.string()}), "data.train", names).examples.size() == 20);
}
