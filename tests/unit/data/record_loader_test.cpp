// The loader over TFRecord files: every record once with the label it carries, the tf.data
// order (interleave + shuffle buffer) reproduced for a seed, corrupt records failing with the
// file and offset or skipped and counted, the memory cache giving the same batches without
// reading again, and reduced-scale JPEG decoding. Fixtures: real record files written here.
#include "common/catch.h"

#include <map>
#include <set>

#include "fixtures.h"
#include "loader_fixtures.h"
#include "trainer/data/image.h"
#include "trainer/data/loader.h"
#include "trainer/data/record_feed.h"
#include "trainer/data/record_order.h"
#include "trainer/data/source.h"
#include "trainer/data/tf_example.h"
#include "trainer/data/tfrecord.h"
#include "trainer/data/transforms.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::data;
using trainer::test::Contains;
namespace fs = std::filesystem;
using testing::TempDir;
using testing::whole_epoch;

namespace {

// `files` record files of `per_file` JPEG records each; record k of file f has label
// (f * per_file + k) % 5 and an image whose colour encodes its number.
Listing make_records(const TempDir& tmp, int files, int per_file,
                     Compression c = Compression::kNone) {
  std::vector<std::string> paths;
  for (int f = 0; f < files; ++f) {
    const fs::path p = tmp / ("part-" + std::to_string(f) + ".tfrecord");
    RecordWriter w(p.string(), c);
    for (int k = 0; k < per_file; ++k) {
      const int n = f * per_file + k;
      w.write(make_image_example(testing::encode(testing::pattern_image(40, 30, n)), n % 5));
    }
    w.close();
    paths.push_back(p.string());
  }
  SourceOptions s;
  s.format = "tfrecord";
  s.path = paths;
  return list_source(s, "data.train", {"a", "b", "c", "d", "e"});
}

LoaderOptions record_options(const Listing& listing, int64_t batch, int workers) {
  LoaderOptions o;
  o.preprocess.image_size = 16;
  o.preprocess.train = true;
  o.preprocess.horizontal_flip = true;
  o.batch_size = batch;
  o.num_workers = workers;
  o.seed = 9;
  o.num_classes = 5;
  testing::use_record_order(o, listing, RecordOrderOptions{9, true, 2, 7});
  return o;
}

// Flips one byte `at` bytes into record `record` of a plain record file (0 = its length).
void flip_byte(const std::string& path, int record, size_t at) {
  RecordReader r(path, Compression::kNone);
  for (int i = 0; i < record; ++i) r.skip();
  const auto offset = static_cast<size_t>(r.offset());
  std::string bytes = testing::read_bytes(path);
  bytes[offset + at] = static_cast<char>(bytes[offset + at] ^ 0x40);
  testing::write_text(path, bytes);
}

}  // namespace

TEST_CASE("record loader: every record once, labels from the records, order from the seed",
          "[records]") {
  TempDir tmp("rec_loader");
  const Listing listing = make_records(tmp, 3, 10);
  REQUIRE(listing.examples.size() == 30);
  std::vector<std::vector<int64_t>> orders;
  for (int workers : {1, 3}) {
    Loader loader(listing.examples, record_options(listing, 4, workers));
    CHECK(loader.batches_per_epoch() == 8);  // ceil(30 / 4), drop_last off
    const auto batches = whole_epoch(loader, 1);
    std::vector<int64_t> seen;
    for (const Batch& b : batches) {
      for (size_t k = 0; k < b.indices.size(); ++k) {
        seen.push_back(b.indices[k]);
        CHECK(b.labels[static_cast<int64_t>(k)].item<int64_t>() == b.indices[k] % 5);
      }
    }
    CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 30);
    orders.push_back(seen);
  }
  CHECK(orders[0] == orders[1]);  // the order does not depend on the decode threads
  const auto groups = files_of(listing);
  const auto plan = plan_shards(groups, "off", 0, 1, 4);
  CHECK(orders[0] == record_epoch_order(groups, plan, RecordOrderOptions{9, true, 2, 7}, 1).emit);
}

TEST_CASE("record loader: gzip files and resuming mid-epoch", "[records]") {
  TempDir tmp("rec_gzip");
  const Listing listing = make_records(tmp, 2, 9, Compression::kGzip);
  Loader loader(listing.examples, record_options(listing, 3, 2));
  const auto full = whole_epoch(loader, 0);
  REQUIRE(full.size() == 6);
  loader.start_epoch(0, 4);  // resume at batch 4
  auto b = loader.next();
  REQUIRE(b);
  CHECK(b->index == 4);
  CHECK(b->indices == full[4].indices);
  CHECK(torch::equal(b->images, full[4].images));
}

TEST_CASE("record loader: corrupt records fail with file and offset, or are skipped", "[records]") {
  TempDir tmp("rec_corrupt");
  const Listing listing = make_records(tmp, 2, 6);
  const std::string bad = listing.record_files[1].path;
  flip_byte(bad, 2, 20);  // inside record 2's data

  {
    Loader loader(listing.examples, record_options(listing, 4, 2));
    loader.start_epoch(0);
    std::string message;
    try {
      while (loader.next()) {
      }
    } catch (const DataError& e) {
      message = e.what();
    }
    CHECK_THAT(message, Contains(bad) && Contains("record 2") && Contains("byte offset") &&
                            Contains("data CRC mismatch") && Contains("data.on_corrupt: skip"));
  }
  {
    LoaderOptions o = record_options(listing, 4, 2);
    o.skip_corrupt = true;
    Loader loader(listing.examples, o);
    int64_t rows = 0;
    for (const Batch& b : whole_epoch(loader, 0)) rows += b.images.size(0);
    CHECK(rows == 11);
    CHECK(loader.skipped_total() == 1);
    REQUIRE(loader.skipped_paths().size() == 1);
    CHECK(loader.skipped_paths()[0] == bad + " record 2");
  }
  // A damaged length loses the rest of the file: skipped and counted, one by one.
  flip_byte(bad, 4, 1);
  {
    LoaderOptions o = record_options(listing, 4, 1);
    o.skip_corrupt = true;
    Loader loader(listing.examples, o);
    int64_t rows = 0;
    for (const Batch& b : whole_epoch(loader, 0)) rows += b.images.size(0);
    CHECK(loader.skipped_total() == 3);  // record 2 (data), 4 and 5 (after the bad length)
    CHECK(rows == 9);
  }
}

TEST_CASE("record loader: a label outside the classes is a data error naming the record",
          "[records]") {
  TempDir tmp("rec_label");
  const Listing listing = make_records(tmp, 1, 6);
  LoaderOptions o = record_options(listing, 6, 1);
  o.num_classes = 3;  // labels go up to 4
  Loader loader(listing.examples, o);
  loader.start_epoch(0);
  CHECK_THROWS_WITH(loader.next(), Contains("part-0.tfrecord record ") &&
                                       Contains("(feature 'label') is outside [0, 3)"));
}

TEST_CASE("the memory cache gives the same batches and holds every image after one epoch",
          "[records]") {
  TempDir tmp("rec_cache");
  const Listing listing = make_records(tmp, 2, 8);
  Loader plain(listing.examples, record_options(listing, 4, 2));
  LoaderOptions o = record_options(listing, 4, 2);
  o.cache = true;
  Loader cached(listing.examples, o);
  for (int64_t epoch : {0, 1, 2}) {
    const auto a = whole_epoch(plain, epoch);
    const auto b = whole_epoch(cached, epoch);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].indices == b[i].indices);
      CHECK(torch::equal(a[i].labels, b[i].labels));
      CHECK(torch::allclose(a[i].images, b[i].images));
    }
    CHECK(cached.cached_examples() == 16);
    CHECK(cached.cached_bytes() == 16 * 16 * 16 * 3);
  }
  // Once cached, the files are not read again: deleting them changes nothing.
  for (const auto& f : listing.record_files) fs::remove(f.path);
  CHECK(whole_epoch(cached, 3).size() == 4);
}

TEST_CASE("image sources use the cache too", "[records]") {
  TempDir tmp("img_cache");
  std::vector<Example> examples;
  for (int i = 0; i < 6; ++i) {
    const fs::path p = tmp / ("i" + std::to_string(i) + ".jpg");
    testing::write_jpeg(p, testing::pattern_image(30, 20, i));
    examples.push_back(Example{p.string(), i % 2});
  }
  LoaderOptions o;
  o.preprocess.image_size = 16;
  o.batch_size = 3;
  o.cache = true;
  Loader loader(examples, o);
  const auto first = whole_epoch(loader, 0);
  CHECK(loader.cached_examples() == 6);
  for (const auto& e : examples) fs::remove(e.path);
  const auto second = whole_epoch(loader, 0);
  REQUIRE(second.size() == 2);
  CHECK(torch::equal(first[1].images, second[1].images));
  CHECK(torch::equal(first[1].labels, second[1].labels));
}

TEST_CASE("reduced-scale JPEG decoding: the factor from the header, close to a full decode",
          "[records]") {
  const std::string jpeg = testing::encode(testing::pattern_image(800, 600, 3));
  int w = 0;
  int h = 0;
  REQUIRE(transforms::jpeg_size(jpeg, &w, &h));
  CHECK(w == 800);
  CHECK(h == 600);
  CHECK(transforms::jpeg_reduction_for(jpeg, 300) == 2);
  CHECK(transforms::jpeg_reduction_for(jpeg, 150) == 4);
  CHECK(transforms::jpeg_reduction_for(jpeg, 64) == 8);
  CHECK(transforms::jpeg_reduction_for(jpeg, 301) == 1);
  CHECK(transforms::jpeg_reduction_for(testing::encode(testing::pattern_image(64, 64, 1), ".png"),
                                       8) == 1);
  CHECK(transforms::decode_bgr(jpeg, "x", 2).cols == 400);
  CHECK(transforms::decode_bgr(jpeg, "x", 8).rows == 75);

  PreprocessOptions full;
  full.image_size = 64;
  full.reduced_decode = false;
  PreprocessOptions reduced = full;
  reduced.reduced_decode = true;
  const torch::Tensor a = ImagePipeline(full).decode(jpeg, "x", 0);
  const torch::Tensor b = ImagePipeline(reduced).decode(jpeg, "x", 0);
  CHECK(a.sizes() == b.sizes());
  // The same picture, smoothed differently: within 10% of full scale on average.
  CHECK((a.to(torch::kFloat) - b.to(torch::kFloat)).abs().mean().item<double>() < 25.5);
  // decode_resized + augment is decode, when nothing is cropped.
  const ImagePipeline p(reduced);
  CHECK(torch::equal(p.augment(p.decode_resized(jpeg, "x"), 0), b));
}

TEST_CASE("an exception in the record reader thread reaches the takers, not std::terminate",
          "[data][tfrecord]") {
  TempDir tmp;
  const Listing listing = make_records(tmp, 1, 3);
  // An unknown compression throws a ConfigError (not a record's DataError) inside the reader
  // thread when it opens the file: every take() rethrows it, the destructor still joins.
  RecordFeed feed(&listing.examples, "zstd", 4);
  const uint64_t gen = feed.start({0, 1, 2});
  CHECK_THROWS_WITH(feed.take(0, gen), Contains("zstd"));
  CHECK_THROWS_AS(feed.take(1, gen), ConfigError);
}
