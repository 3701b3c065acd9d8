// The loader: epoch order, batching, determinism across thread counts, corrupt-image handling,
// restarts and shutdown. Fixtures are small JPEGs written at test time.
#include "common/catch.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "fixtures.h"
#include "loader_fixtures.h"
#include "trainer/data/loader.h"
#include "trainer/util/error.h"
#include "trainer/util/rng.h"

using namespace trainer;
using namespace trainer::data;
using trainer::test::Contains;
namespace fs = std::filesystem;
using testing::TempDir;
using testing::whole_epoch;

namespace {

// n distinct JPEGs (sizes vary), label = i % 3.
std::vector<Example> make_examples(const TempDir& tmp, int n) {
  std::vector<Example> examples;
  for (int i = 0; i < n; ++i) {
    const fs::path p = tmp / ("img_" + std::to_string(i) + ".jpg");
    testing::write_jpeg(p, testing::pattern_image(24 + (i % 5) * 4, 20 + (i % 3) * 6, i));
    examples.push_back(Example{p.string(), i % 3});
  }
  return examples;
}

LoaderOptions options(int64_t batch, int workers, bool augment) {
  LoaderOptions o;
  o.preprocess.image_size = 16;
  o.preprocess.train = augment;
  o.preprocess.random_resized_crop = augment;
  o.preprocess.horizontal_flip = augment;
  o.batch_size = batch;
  o.num_workers = workers;
  o.prefetch_batches = 2;
  o.seed = 5;
  o.shuffle = true;
  return o;
}

void truncate_file(const std::string& path) {
  const std::string bytes = testing::read_bytes(path);
  testing::write_text(path, bytes.substr(0, bytes.size() / 2));
}

}  // namespace

TEST_CASE("epoch_order: a fixed permutation for a fixed seed", "[data][loader]") {
  // Hard-coded so that any change of the shuffle (engine, draw, Fisher-Yates) is caught.
  const std::vector<int64_t> expected = {6, 9, 3, 5, 7, 8, 1, 0, 2, 4};
  CHECK(epoch_order(10, 1234, 0, true) == expected);
  CHECK(epoch_order(10, 1234, 0, true) == epoch_order(10, 1234, 0, true));
  CHECK(epoch_order(10, 1234, 1, true) != expected);
  CHECK(epoch_order(10, 1235, 0, true) != expected);
  std::vector<int64_t> identity(10);
  for (int i = 0; i < 10; ++i) identity[i] = i;
  CHECK(epoch_order(10, 1234, 3, false) == identity);
  CHECK(epoch_order(0, 1, 0, true).empty());

  std::vector<int64_t> big = epoch_order(1000, 9, 2, true);
  std::sort(big.begin(), big.end());
  for (int i = 0; i < 1000; ++i) REQUIRE(big[i] == i);
}

TEST_CASE("loader: every example exactly once per epoch, in batches of the right size",
          "[data][loader]") {
  TempDir tmp;
  const std::vector<Example> examples = make_examples(tmp, 23);
  LoaderOptions o = options(5, 2, false);
  Loader loader(examples, o);
  CHECK(loader.num_examples() == 23);
  CHECK(loader.batches_per_epoch() == 5);

  const std::vector<Batch> batches = whole_epoch(loader, 0);
  REQUIRE(batches.size() == 5);
  std::vector<int64_t> seen;
  const std::vector<int64_t> order = epoch_order(23, o.seed, 0, true);
  for (size_t b = 0; b < batches.size(); ++b) {
    const Batch& batch = batches[b];
    const int64_t rows = b < 4 ? 5 : 3;
    CHECK(batch.index == static_cast<int64_t>(b));
    CHECK(batch.skipped == 0);
    REQUIRE(batch.images.sizes() == torch::IntArrayRef({rows, 16, 16, 3}));
    CHECK(batch.images.scalar_type() == torch::kUInt8);
    REQUIRE(batch.labels.sizes() == torch::IntArrayRef({rows}));
    CHECK(batch.labels.scalar_type() == torch::kInt64);
    REQUIRE(static_cast<int64_t>(batch.indices.size()) == rows);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = batch.indices[r];
      CHECK(i == order[b * 5 + r]);  // in epoch order
      CHECK(batch.labels[r].item<int64_t>() == examples[i].label);
      seen.push_back(i);
    }
  }
  std::sort(seen.begin(), seen.end());
  for (int i = 0; i < 23; ++i) REQUIRE(seen[i] == i);
  CHECK_FALSE(loader.next().has_value());  // stays finished

  SECTION("the rows are the pipeline's output with seed mix_seed(seed, {epoch, index})") {
    o.preprocess.train = o.preprocess.random_resized_crop = o.preprocess.horizontal_flip = true;
    Loader aug(examples, o);
    aug.start_epoch(3);
    const Batch first = *aug.next();
    const ImagePipeline pipe(o.preprocess);
    for (size_t r = 0; r < first.indices.size(); ++r) {
      const int64_t i = first.indices[r];
      const torch::Tensor expected =
          pipe.load(examples[i].path, util::mix_seed(o.seed, {3, static_cast<uint64_t>(i)}));
      CHECK(torch::equal(first.images[static_cast<int64_t>(r)], expected));
    }
  }
}

TEST_CASE("loader: drop_last gives only full batches", "[data][loader]") {
  TempDir tmp;
  LoaderOptions o = options(5, 3, false);
  o.drop_last = true;
  Loader loader(make_examples(tmp, 23), o);
  CHECK(loader.batches_per_epoch() == 4);
  const std::vector<Batch> batches = whole_epoch(loader, 1);
  REQUIRE(batches.size() == 4);
  std::set<int64_t> seen;
  for (const Batch& b : batches) {
    CHECK(b.images.size(0) == 5);
    seen.insert(b.indices.begin(), b.indices.end());
  }
  CHECK(seen.size() == 20);
}

TEST_CASE("loader: batches are bit-identical for 1 and 4 decode threads", "[data][loader]") {
  TempDir tmp;
  const std::vector<Example> examples = make_examples(tmp, 19);
  for (bool augment : {false, true}) {
    CAPTURE(augment);
    Loader one(examples, options(4, 1, augment));
    LoaderOptions o4 = options(4, 4, augment);
    o4.prefetch_batches = 3;
    Loader four(examples, o4);
    for (int64_t epoch : {0, 1}) {
      const std::vector<Batch> a = whole_epoch(one, epoch);
      const std::vector<Batch> b = whole_epoch(four, epoch);
      REQUIRE(a.size() == b.size());
      for (size_t k = 0; k < a.size(); ++k) {
        CHECK(a[k].indices == b[k].indices);
        CHECK(torch::equal(a[k].images, b[k].images));
        CHECK(torch::equal(a[k].labels, b[k].labels));
      }
    }
    // Different epochs see different orders and (with augmentation) different pixels.
    one.start_epoch(0);
    const Batch e0 = *one.next();
    one.start_epoch(1);
    const Batch e1 = *one.next();
    CHECK(e0.indices != e1.indices);
  }
}

TEST_CASE("loader: start_epoch restarts mid-epoch and resumes at a batch", "[data][loader]") {
  TempDir tmp;
  const std::vector<Example> examples = make_examples(tmp, 20);
  const LoaderOptions o = options(3, 3, true);
  Loader reference(examples, o);
  const std::vector<Batch> epoch2 = whole_epoch(reference, 2);

  Loader loader(examples, o);
  loader.start_epoch(0);
  REQUIRE(loader.next().has_value());  // in-flight work of epoch 0 gets discarded
  loader.start_epoch(2, 4);
  std::vector<Batch> rest;
  while (auto b = loader.next()) rest.push_back(std::move(*b));
  REQUIRE(rest.size() == epoch2.size() - 4);
  for (size_t k = 0; k < rest.size(); ++k) {
    CHECK(rest[k].index == static_cast<int64_t>(k + 4));
    CHECK(rest[k].indices == epoch2[k + 4].indices);
    CHECK(torch::equal(rest[k].images, epoch2[k + 4].images));
  }
  loader.start_epoch(2, loader.batches_per_epoch());
  CHECK_FALSE(loader.next().has_value());
  CHECK_THROWS_AS(loader.start_epoch(0, loader.batches_per_epoch() + 1), Error);
  Loader fresh(examples, o);
  CHECK_THROWS_AS(fresh.next(), Error);  // before start_epoch
}

TEST_CASE("loader: a corrupt image fails the epoch by default", "[data][loader]") {
  TempDir tmp;
  std::vector<Example> examples = make_examples(tmp, 12);
  truncate_file(examples[7].path);
  LoaderOptions o = options(4, 4, false);
  o.shuffle = false;  // example 7 is in batch 1
  Loader loader(examples, o);
  loader.start_epoch(0);
  REQUIRE(loader.next().has_value());  // batch 0 is fine
  try {
    loader.next();
    FAIL("expected a DataError");
  } catch (const DataError& e) {
    CHECK_THAT(e.what(), Contains(examples[7].path) && Contains("truncated"));
  }
  CHECK_FALSE(loader.next().has_value());  // the epoch is abandoned
  // A new epoch starts again (and fails again at the same place).
  loader.start_epoch(1);
  REQUIRE(loader.next().has_value());
  CHECK_THROWS_AS(loader.next(), DataError);
}

TEST_CASE("loader: a missing file fails with its path", "[data][loader]") {
  TempDir tmp;
  std::vector<Example> examples = make_examples(tmp, 6);
  fs::remove(examples[2].path);
  LoaderOptions o = options(8, 2, false);
  Loader loader(examples, o);
  loader.start_epoch(0);
  CHECK_THROWS_WITH(loader.next(), Contains(examples[2].path));
}

TEST_CASE("loader: skip mode drops, counts and remembers corrupt images", "[data][loader]") {
  TempDir tmp;
  std::vector<Example> examples = make_examples(tmp, 12);
  truncate_file(examples[5].path);
  fs::remove(examples[9].path);
  LoaderOptions o = options(4, 3, true);
  o.shuffle = false;
  o.skip_corrupt = true;
  Loader loader(examples, o);
  const std::vector<Batch> batches = whole_epoch(loader, 0);
  REQUIRE(batches.size() == 3);
  CHECK(batches[0].images.size(0) == 4);
  CHECK(batches[1].images.size(0) == 3);
  CHECK(batches[1].skipped == 1);
  CHECK(batches[1].labels.size(0) == 3);
  CHECK(batches[1].indices == std::vector<int64_t>{4, 6, 7});
  CHECK(batches[2].skipped == 1);
  CHECK(batches[2].indices == std::vector<int64_t>{8, 10, 11});
  CHECK(loader.skipped_total() == 2);
  CHECK(loader.skipped_paths() == std::vector<std::string>{examples[5].path, examples[9].path});

  SECTION("a batch of only corrupt images comes back with 0 rows") {
    LoaderOptions one = o;
    one.batch_size = 1;
    Loader l(examples, one);
    l.start_epoch(0, 5);
    const Batch b = *l.next();
    CHECK(b.images.sizes() == torch::IntArrayRef({0, 16, 16, 3}));
    CHECK(b.labels.size(0) == 0);
    CHECK(b.skipped == 1);
    CHECK(l.next()->images.size(0) == 1);
  }
}

TEST_CASE("loader: destruction mid-epoch is prompt, bad options are refused", "[data][loader]") {
  TempDir tmp;
  const std::vector<Example> examples = make_examples(tmp, 40);
  const auto t0 = std::chrono::steady_clock::now();
  {
    LoaderOptions o = options(2, 4, true);
    o.prefetch_batches = 8;
    Loader loader(examples, o);
    loader.start_epoch(0);
    REQUIRE(loader.next().has_value());
  }
  {
    Loader idle(examples, options(2, 2, false));  // never started
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(seconds < 2.0);

  LoaderOptions bad = options(0, 2, false);
  CHECK_THROWS_AS(Loader(examples, bad), ConfigError);
  bad = options(2, 0, false);
  CHECK_THROWS_AS(Loader(examples, bad), ConfigError);
  bad = options(2, 1, false);
  bad.prefetch_batches = 0;
  CHECK_THROWS_AS(Loader(examples, bad), ConfigError);

  Loader empty(std::vector<Example>{}, options(4, 1, false));
  CHECK(empty.batches_per_epoch() == 0);
  empty.start_epoch(0);
  CHECK_FALSE(empty.next().has_value());
}

TEST_CASE("loader: an order function replaces epoch_order, seeds stay per example",
          "[data][loader]") {
  TempDir tmp;
  const std::vector<Example> examples = make_examples(tmp, 10);
  LoaderOptions o = options(2, 3, true);
  // A subset in a per-epoch order: the odd examples, rotated by the epoch.
  o.order = [](int64_t epoch) {
    std::vector<int64_t> odd = {1, 3, 5, 7, 9};
    std::rotate(odd.begin(), odd.begin() + epoch % 5, odd.end());
    return odd;
  };
  Loader loader(examples, o);
  CHECK(loader.num_examples() == 10);
  CHECK(loader.epoch_size() == 5);
  CHECK(loader.batches_per_epoch() == 3);  // ceil(5 / 2): no drop_last

  const ImagePipeline pipe(o.preprocess);
  for (int64_t epoch : {0, 2}) {
    const std::vector<Batch> batches = whole_epoch(loader, epoch);
    REQUIRE(batches.size() == 3);
    std::vector<int64_t> got;
    for (const Batch& b : batches) {
      for (size_t r = 0; r < b.indices.size(); ++r) {
        const int64_t i = b.indices[r];
        got.push_back(i);
        CHECK(b.labels[static_cast<int64_t>(r)].item<int64_t>() == examples[i].label);
        // Augmented with the example's own seed, whatever its position in the order.
        const torch::Tensor expected = pipe.load(
            examples[i].path,
            util::mix_seed(o.seed, {static_cast<uint64_t>(epoch), static_cast<uint64_t>(i)}));
        CHECK(torch::equal(b.images[static_cast<int64_t>(r)], expected));
      }
    }
    CHECK(got == o.order(epoch));
  }

  SECTION("drop_last counts the order's length") {
    LoaderOptions d = o;
    d.drop_last = true;
    Loader l(examples, d);
    CHECK(l.batches_per_epoch() == 2);
    CHECK(whole_epoch(l, 1).size() == 2);
  }
  SECTION("identical batches for 1 and 4 decode threads") {
    LoaderOptions one = o;
    one.num_workers = 1;
    LoaderOptions four = o;
    four.num_workers = 4;
    Loader a(examples, one);
    Loader b(examples, four);
    const std::vector<Batch> x = whole_epoch(a, 3);
    const std::vector<Batch> y = whole_epoch(b, 3);
    REQUIRE(x.size() == y.size());
    for (size_t k = 0; k < x.size(); ++k) {
      CHECK(x[k].indices == y[k].indices);
      CHECK(torch::equal(x[k].images, y[k].images));
    }
  }
}

TEST_CASE("loader: max_batches caps every epoch, also on resume", "[data][loader]") {
  TempDir tmp;
  const std::vector<Example> examples = make_examples(tmp, 23);
  LoaderOptions o = options(5, 2, false);
  o.drop_last = true;
  o.max_batches = 2;  // of 4
  Loader loader(examples, o);
  CHECK(loader.batches_per_epoch() == 2);
  const std::vector<Batch> batches = whole_epoch(loader, 1);
  REQUIRE(batches.size() == 2);
  const std::vector<int64_t> order = epoch_order(23, o.seed, 1, true);
  CHECK(batches[1].indices == std::vector<int64_t>(order.begin() + 5, order.begin() + 10));
  loader.start_epoch(1, 1);
  CHECK(loader.next()->index == 1);
  CHECK_FALSE(loader.next().has_value());
  CHECK_THROWS_AS(loader.start_epoch(1, 3), Error);

  o.max_batches = 9;  // more than there are: no effect
  CHECK(Loader(examples, o).batches_per_epoch() == 4);
  o.drop_last = false;
  o.max_batches = 5;  // the partial last batch counts
  Loader partial(examples, o);
  const std::vector<Batch> all = whole_epoch(partial, 0);
  REQUIRE(all.size() == 5);
  CHECK(all.back().indices.size() == 3);
  o.max_batches = 0;
  Loader none(examples, o);
  CHECK(none.batches_per_epoch() == 0);
  none.start_epoch(0);
  CHECK_FALSE(none.next().has_value());
  o.max_batches = -2;
  CHECK_THROWS_AS(Loader(examples, o), ConfigError);
}

TEST_CASE("loader: a bad order function is an internal error", "[data][loader]") {
  TempDir tmp;
  const std::vector<Example> examples = make_examples(tmp, 6);
  LoaderOptions o = options(2, 2, false);
  o.order = [](int64_t epoch) { return std::vector<int64_t>(static_cast<size_t>(3 + epoch), 0); };
  Loader loader(examples, o);
  CHECK(loader.epoch_size() == 3);
  loader.start_epoch(0);
  CHECK_THROWS_WITH(loader.start_epoch(1), Contains("has 4 indices, epoch 0's had 3"));

  o.order = [](int64_t) { return std::vector<int64_t>{0, 6}; };
  CHECK_THROWS_WITH(Loader(examples, o), Contains("index 6 outside [0, 6)"));
  o.order = [](int64_t epoch) { return std::vector<int64_t>{0, epoch == 0 ? 1 : -1}; };
  Loader late(examples, o);
  CHECK_THROWS_AS(late.start_epoch(1), Error);
}

TEST_CASE("loader: data.cache: memory that cannot fit is refused at the start, saying how much",
          "[data][loader]") {
  // 20000 examples at 4096 x 4096 would need ~940 GiB; nothing is read before the check.
  std::vector<Example> examples;
  for (int i = 0; i < 20000; ++i)
    examples.push_back(Example{"/nonexistent/" + std::to_string(i), 0});
  LoaderOptions o = options(8, 1, false);
  o.preprocess.image_size = 4096;
  o.cache = true;
  try {
    Loader loader(examples, o);
    FAIL("no error");
  } catch (const trainer::ConfigError& e) {
    CHECK_THAT(e.what(), Contains("data.cache: memory needs about") && Contains("GiB") &&
                             Contains("20000 examples") && Contains("available"));
  }
  o.preprocess.image_size = 16;  // ~15 MiB: fine
  CHECK_NOTHROW(Loader(examples, o));
}
