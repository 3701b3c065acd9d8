// Benchmark (hidden "[.bench]" case, run by scripts/bench/input_pipeline.sh; not a test): the
// input pipeline alone (read TFRecords, parse, decode, resize, augment, batch) in examples/s per
// decode thread, on generated 800x600 JPEGs resized to 300, with full and reduced-scale
// decoding and with the memory cache warm. TRAINER_BENCH_IMAGES (default 240) and
// TRAINER_BENCH_THREADS (default "1,2") size it.
#include "common/catch.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "fixtures.h"
#include "loader_fixtures.h"
#include "trainer/data/loader.h"
#include "trainer/data/record_order.h"
#include "trainer/data/source.h"
#include "trainer/synth/synthetic.h"

using namespace trainer;
using namespace trainer::data;
using namespace trainer::synth;
using testing::env_int;
using testing::TempDir;

namespace {

std::vector<int> env_threads() {
  const char* v = std::getenv("TRAINER_BENCH_THREADS");
  std::stringstream ss(v && *v ? v : "1,2");
  std::vector<int> out;
  std::string part;
  while (std::getline(ss, part, ',')) out.push_back(std::stoi(part));
  return out;
}

// Examples per second over one epoch (after `warm` untimed epochs).
double examples_per_second(const Listing& listing, int threads, bool reduced, bool cache,
                           int warm) {
  LoaderOptions o;
  o.preprocess.image_size = 300;
  o.preprocess.train = true;
  o.preprocess.horizontal_flip = true;
  o.preprocess.reduced_decode = reduced;
  o.batch_size = 32;
  o.num_workers = threads;
  o.prefetch_batches = 2;
  o.num_classes = static_cast<int64_t>(listing.class_names.size());
  o.cache = cache;
  testing::use_record_order(o, listing, RecordOrderOptions{1, true, 4, 1000});
  Loader loader(listing.examples, o);
  int64_t epoch = 0;
  for (; epoch < warm; ++epoch) {
    loader.start_epoch(epoch);
    while (loader.next()) {
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  loader.start_epoch(epoch);
  int64_t n = 0;
  while (auto b = loader.next()) n += b->images.size(0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(n) / s;
}

}  // namespace

TEST_CASE("benchmark: input pipeline examples/s per decode thread (800x600 JPEG -> 300)",
          "[.bench]") {
  TempDir tmp("input_bench");
  const int images = env_int("TRAINER_BENCH_IMAGES", 240);
  SyntheticOptions s;
  s.out_dir = (tmp / "recs").string();
  s.classes = 5;
  s.per_class = std::max(1, images / 5);
  s.image_size = 800;
  s.image_height = 600;
  s.splits = {"train"};
  s.format = "tfrecord";
  s.shards = 4;
  make_synthetic_dataset(s);
  SourceOptions spec;
  spec.format = "tfrecord";
  spec.path = {s.out_dir + "/train-*.tfrecord"};
  const Listing listing = list_source(spec, "data.train", synthetic_class_names(5));
  std::printf(
      "input pipeline: %zu records of 800x600 JPEG (quality 90) in 4 files, resized to "
      "300, flip, batch 32\n",
      listing.examples.size());
  std::printf("%-8s %-22s %12s %22s\n", "threads", "mode", "examples/s", "examples/s per thread");
  for (const int t : env_threads()) {
    const double full = examples_per_second(listing, t, false, false, 0);
    const double reduced = examples_per_second(listing, t, true, false, 0);
    const double cached = examples_per_second(listing, t, true, true, 1);
    std::printf("%-8d %-22s %12.1f %22.1f\n", t, "full decode", full, full / t);
    std::printf("%-8d %-22s %12.1f %22.1f\n", t, "reduced decode (1/2)", reduced, reduced / t);
    std::printf("%-8d %-22s %12.1f %22.1f\n", t, "memory cache warm", cached, cached / t);
    std::printf("%-8d reduced/full %.2fx, cache/full %.2fx\n", t, reduced / full, cached / full);
  }
  SUCCEED();
}
