// Sharding: file/data/off/auto plans, their per-epoch orders, the lock-step step agreement and
// distributed evaluation shards, swept over world sizes. The file groups are arithmetic (file f
// holds a known run of example indices), so every expected share is known exactly.
#include "common/catch.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "fixtures.h"
#include "trainer/data/loader.h"
#include "trainer/data/random.h"
#include "trainer/data/shard.h"
#include "trainer/util/error.h"
#include "trainer/util/rng.h"

using namespace trainer;
using namespace trainer::data;
using trainer::test::Contains;

namespace {

// Files with the given example counts; file f holds the next sizes[f] consecutive indices.
std::vector<FileGroup> groups(const std::vector<int64_t>& sizes) {
  std::vector<FileGroup> files;
  int64_t next = 0;
  for (size_t f = 0; f < sizes.size(); ++f) {
    FileGroup g{"part-" + std::to_string(f) + ".tfrecord", {}};
    for (int64_t k = 0; k < sizes[f]; ++k) g.examples.push_back(next++);
    files.push_back(std::move(g));
  }
  return files;
}

// n single-example files, as imagefolder and csv sources give.
std::vector<FileGroup> single_files(int64_t n) { return groups(std::vector<int64_t>(n, 1)); }

std::vector<ShardPlan> plans_for_all(const std::vector<FileGroup>& files, const std::string& policy,
                                     int num_workers, int64_t batch = 1) {
  std::vector<ShardPlan> plans;
  for (int r = 0; r < num_workers; ++r) {
    plans.push_back(plan_shards(files, policy, r, num_workers, batch));
  }
  return plans;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("files_of: one file per example, in listing order", "[data][shard]") {
  Listing listing;
  listing.examples = {{"a/1.jpg", 0}, {"a/2.jpg", 0}, {"b/3.jpg", 1}};
  const std::vector<FileGroup> files = files_of(listing);
  REQUIRE(files.size() == 3);
  for (size_t i = 0; i < files.size(); ++i) {
    CHECK(files[i].path == listing.examples[i].path);
    CHECK(files[i].examples == std::vector<int64_t>{static_cast<int64_t>(i)});
  }
  CHECK(files_of(Listing{}).empty());
}

TEST_CASE("file sharding: disjoint, complete, balanced and fixed, over 2 and 3 workers",
          "[data][shard]") {
  // 60 files of 10..16 examples (uneven enough that balancing matters).
  std::vector<int64_t> sizes;
  for (int f = 0; f < 60; ++f) sizes.push_back(10 + (f * 5) % 7);  // 10..16
  const std::vector<FileGroup> files = groups(sizes);
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());

  for (int workers : {2, 3}) {
    CAPTURE(workers);
    const std::vector<ShardPlan> plans = plans_for_all(files, "file", workers, 8);
    std::vector<int64_t> all_files;
    std::vector<int64_t> all_examples;
    for (int r = 0; r < workers; ++r) {
      const ShardPlan& p = plans[static_cast<size_t>(r)];
      CHECK(p.policy_requested == "file");
      CHECK(p.policy_effective == "file");
      CHECK(p.worker == r);
      CHECK(p.num_workers == workers);
      CHECK(p.total_examples == total);
      CHECK(p.examples_per_worker == plans[0].examples_per_worker);  // all ranks agree
      CHECK(p.examples_this_worker == p.examples_per_worker[static_cast<size_t>(r)]);
      CHECK(static_cast<int64_t>(p.file_examples.size()) == p.examples_this_worker);
      CHECK(std::is_sorted(p.files_this_worker.begin(), p.files_this_worker.end()));
      // file_examples is this worker's files' examples, file by file.
      std::vector<int64_t> expected;
      for (int64_t f : p.files_this_worker) {
        const auto& ex = files[static_cast<size_t>(f)].examples;
        expected.insert(expected.end(), ex.begin(), ex.end());
      }
      CHECK(p.file_examples == expected);
      all_files.insert(all_files.end(), p.files_this_worker.begin(), p.files_this_worker.end());
      all_examples.insert(all_examples.end(), p.file_examples.begin(), p.file_examples.end());
      // Fixed for the whole job: the same plan every time it is made.
      const ShardPlan again = plan_shards(files, "file", r, workers, 8);
      CHECK(again.files_this_worker == p.files_this_worker);
    }
    CHECK(sorted(all_files) == iota(60));        // every file read by exactly one worker
    CHECK(sorted(all_examples) == iota(total));  // so every example is in exactly one shard
    const auto& per = plans[0].examples_per_worker;
    CHECK(std::accumulate(per.begin(), per.end(), int64_t{0}) == total);
    const auto [lo, hi] = std::minmax_element(per.begin(), per.end());
    CHECK(*hi - *lo <= largest);  // balanced within one file's worth
  }
}

TEST_CASE("file sharding: the greedy rule, exactly", "[data][shard]") {
  // By size descending, ties by index: f0(5) f1(3) f2(3) f3(2) f4(2) f5(1); each to the
  // lightest worker, ties to the lower rank:
  // f0->w0 (5,0), f1->w1 (5,3), f2->w1 (5,6), f3->w0 (7,6), f4->w1 (7,8), f5->w0 (8,8).
  const std::vector<FileGroup> files = groups({5, 3, 3, 2, 2, 1});
  const ShardPlan w0 = plan_shards(files, "file", 0, 2, 1);
  const ShardPlan w1 = plan_shards(files, "file", 1, 2, 1);
  CHECK(w0.files_this_worker == std::vector<int64_t>{0, 3, 5});
  CHECK(w1.files_this_worker == std::vector<int64_t>{1, 2, 4});
  CHECK(w0.examples_per_worker == std::vector<int64_t>{8, 8});
  CHECK(w0.file_examples == std::vector<int64_t>{0, 1, 2, 3, 4, 11, 12, 15});

  // Single-example files (imagefolder, csv) come out round-robin by index.
  const ShardPlan p = plan_shards(single_files(10), "file", 1, 3, 1);
  CHECK(p.files_this_worker == std::vector<int64_t>{1, 4, 7});
  CHECK(p.examples_per_worker == std::vector<int64_t>{4, 3, 3});
}

TEST_CASE("file sharding: each worker shuffles its own part every epoch", "[data][shard]") {
  const std::vector<FileGroup> files = groups({4, 5, 6, 4, 5, 6, 4, 5});
  const ShardPlan p0 = plan_shards(files, "file", 0, 2, 2);
  const ShardPlan p1 = plan_shards(files, "file", 1, 2, 2);
  const int64_t n = p0.total_examples;

  const std::vector<int64_t> e0 = worker_epoch_order(p0, n, 7, 0, true, 0, 2);
  const std::vector<int64_t> e1 = worker_epoch_order(p0, n, 7, 1, true, 0, 2);
  CHECK(sorted(e0) == sorted(p0.file_examples));
  CHECK(sorted(e1) == sorted(p0.file_examples));
  CHECK(e0 != e1);                                           // a new order every epoch
  CHECK(e0 == worker_epoch_order(p0, n, 7, 0, true, 0, 2));  // reproducible
  CHECK(e0 != worker_epoch_order(p0, n, 8, 0, true, 0, 2));  // seeded
  CHECK(worker_epoch_order(p0, n, 7, 3, false, 0, 2) == p0.file_examples);  // no shuffle
  const std::vector<int64_t> other = worker_epoch_order(p1, n, 7, 0, true, 1, 2);
  std::vector<int64_t> both = e0;
  both.insert(both.end(), other.begin(), other.end());
  CHECK(sorted(both) == iota(n));  // the epoch covers everything once across workers

  // The shuffle is the documented one: Fisher-Yates from mix_seed(seed, {epoch, worker, tag}).
  std::vector<int64_t> expected = p1.file_examples;
  Rng rng(util::mix_seed(7, {2, 1, kFileShuffleStream}));
  shuffle_in_place(expected, rng);
  CHECK(worker_epoch_order(p1, n, 7, 2, true, 1, 2) == expected);
}

TEST_CASE("data sharding: every example exactly once per epoch across workers", "[data][shard]") {
  for (int64_t n : {0, 1, 5, 23, 100}) {
    for (int workers : {2, 3, 4}) {
      CAPTURE(n, workers);
      const std::vector<FileGroup> files = single_files(n);
      const std::vector<ShardPlan> plans = plans_for_all(files, "data", workers, 1);
      for (int64_t epoch : {0, 1}) {
        const std::vector<int64_t> global = epoch_order(n, 11, epoch, true);
        std::vector<int64_t> all;
        for (int r = 0; r < workers; ++r) {
          const ShardPlan& p = plans[static_cast<size_t>(r)];
          CHECK(p.policy_effective == "data");
          CHECK(p.files_this_worker == iota(n));  // reads everything
          const std::vector<int64_t> mine = worker_epoch_order(p, n, 11, epoch, true, r, workers);
          CHECK(static_cast<int64_t>(mine.size()) == p.examples_this_worker);
          CHECK(mine == worker_epoch_order(p, n, 11, epoch, true, r, workers));  // same seed
          for (size_t k = 0; k < mine.size(); ++k) {  // positions r, r+N, ... of the global order
            REQUIRE(mine[k] == global[static_cast<size_t>(r) + k * static_cast<size_t>(workers)]);
          }
          all.insert(all.end(), mine.begin(), mine.end());
        }
        CHECK(sorted(all) == iota(n));
      }
    }
  }
  const ShardPlan p = plan_shards(single_files(23), "data", 2, 3, 4);
  CHECK(p.examples_per_worker == std::vector<int64_t>{8, 8, 7});
  CHECK(p.examples_this_worker == 7);
  CHECK_THAT(p.reason, Contains("keeps 1 example in 3"));
  // Without shuffle the shards are plain strides.
  CHECK(worker_epoch_order(p, 23, 0, 5, false, 2, 3) ==
        std::vector<int64_t>{2, 5, 8, 11, 14, 17, 20});
}

TEST_CASE("off: every worker reads everything in the single-worker order", "[data][shard]") {
  const std::vector<FileGroup> files = groups({3, 4, 5});
  for (int r = 0; r < 3; ++r) {
    const ShardPlan p = plan_shards(files, "off", r, 3, 2);
    CHECK(p.policy_effective == "off");
    CHECK(p.examples_per_worker == std::vector<int64_t>{12, 12, 12});
    CHECK(worker_epoch_order(p, 12, 3, 1, true, r, 3) == epoch_order(12, 3, 1, true));
  }
}

TEST_CASE("one worker: every policy is effectively off", "[data][shard]") {
  const std::vector<FileGroup> files = groups({2, 9});
  for (const std::string policy : {"auto", "file", "data", "off"}) {
    CAPTURE(policy);
    const ShardPlan p = plan_shards(files, policy, 0, 1, 4);
    CHECK(p.policy_requested == policy);
    CHECK(p.policy_effective == "off");
    CHECK_THAT(p.reason, Contains("1 worker") && Contains("-> off"));
    CHECK(p.examples_per_worker == std::vector<int64_t>{11});
    CHECK(worker_epoch_order(p, 11, 5, 2, true, 0, 1) == epoch_order(11, 5, 2, true));
  }
}

TEST_CASE("auto: file when there are enough, even files, else data with the reason",
          "[data][shard]") {
  SECTION("many single-image files -> file") {
    const ShardPlan p = plan_shards(single_files(500), "auto", 1, 2, 8);
    CHECK(p.policy_requested == "auto");
    CHECK(p.policy_effective == "file");
    CHECK(p.reason == "auto: 500 files >= 2 workers with even sizes (1 example per file) -> file");
    CHECK(p.examples_per_worker == std::vector<int64_t>{250, 250});
  }
  SECTION("fewer files than workers -> data, and it says so") {
    const ShardPlan p = plan_shards(groups({40, 40}), "auto", 2, 3, 4);
    CHECK(p.policy_effective == "data");
    CHECK(p.reason == "auto: 2 files < 3 workers -> data");
    CHECK(p.examples_per_worker == std::vector<int64_t>{27, 27, 26});
  }
  SECTION("empty files do not count") {
    const ShardPlan p = plan_shards(groups({40, 0, 40}), "auto", 0, 3, 4);
    CHECK(p.policy_effective == "data");
    CHECK_THAT(p.reason, Contains("3 files (2 with examples) < 3 workers"));
  }
  SECTION("file sizes more than 1.5x apart -> data") {
    const ShardPlan p = plan_shards(groups({10, 16, 10, 12}), "auto", 0, 2, 1);
    CHECK(p.policy_effective == "data");
    CHECK_THAT(p.reason, Contains("uneven sizes (10..16 examples per file"));
  }
  SECTION("1.5x apart exactly is still even") {
    const ShardPlan p = plan_shards(groups({10, 15, 10, 15}), "auto", 0, 2, 1);
    CHECK(p.policy_effective == "file");
    CHECK_THAT(p.reason, Contains("(10..15 examples per file) -> file"));
  }
  SECTION("even files that balance poorly over the workers -> data") {
    // 3 files of 100 over 2 workers: 200 + 100, so file gives 100/10 = 10 steps against 15.
    const ShardPlan p = plan_shards(groups({100, 100, 100}), "auto", 0, 2, 10);
    CHECK(p.policy_effective == "data");
    CHECK_THAT(p.reason, Contains("balance poorly") && Contains("10 steps vs 15 with data"));
    CHECK(p.examples_per_worker == std::vector<int64_t>{150, 150});
  }
  SECTION("losing under 10% of the steps is still file") {
    // 20 files of 10 over 3 workers: 70/70/60; batch 6: file's lightest worker has 60/6 = 10
    // steps, data 66/6 = 11; 10 >= 0.9 * 11.
    const ShardPlan p = plan_shards(groups(std::vector<int64_t>(20, 10)), "auto", 2, 3, 6);
    CHECK(p.policy_effective == "file");
    CHECK(p.examples_per_worker == std::vector<int64_t>{70, 70, 60});
  }
}

TEST_CASE("file with fewer files than workers is a ConfigError naming data.shard_policy",
          "[data][shard]") {
  try {
    plan_shards(groups({40, 40}), "file", 0, 3, 4);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) ==
          "data.shard_policy: file needs at least 3 files for 3 workers but data.train has 2 "
          "files; use `data` or `auto`");
  }
  CHECK_THROWS_WITH(plan_shards(groups({1, 0, 1}), "file", 0, 3, 1, "data.validation"),
                    Contains("data.validation has 3 files (2 with examples)"));
  CHECK_THROWS_AS(plan_shards(groups({1, 1, 1}), "file", 0, 4, 1), ConfigError);
  CHECK_NOTHROW(plan_shards(groups({1, 1, 1}), "file", 0, 3, 1));
}

TEST_CASE("plan_shards refuses bad input", "[data][shard]") {
  const std::vector<FileGroup> files = single_files(4);
  CHECK_THROWS_WITH(plan_shards(files, "files", 0, 2, 1),
                    "data.shard_policy: expected one of auto|file|data|off, got 'files'");
  CHECK_THROWS_AS(plan_shards(files, "files", 0, 2, 1), ConfigError);
  CHECK_THROWS_WITH(plan_shards(files, "data", 0, 2, 0),
                    Contains("train.per_replica_batch_size: expected >= 1, got 0"));
  CHECK_THROWS_AS(plan_shards(files, "data", 2, 2, 1), Error);
  CHECK_THROWS_AS(plan_shards(files, "data", -1, 2, 1), Error);
  CHECK_THROWS_AS(plan_shards(files, "data", 0, 0, 1), Error);

  std::vector<FileGroup> dup = groups({2, 2});
  dup[1].examples[0] = 1;  // example 1 in both files
  CHECK_THROWS_WITH(plan_shards(dup, "data", 0, 2, 1), Contains("example 1 is in two files"));
  std::vector<FileGroup> gap = groups({2, 2});
  gap[1].examples[1] = 9;  // 0, 1, 2, 9: not 0..3
  CHECK_THROWS_AS(plan_shards(gap, "data", 0, 2, 1), Error);

  const ShardPlan p = plan_shards(files, "data", 1, 2, 1);
  CHECK_THROWS_AS(worker_epoch_order(p, 4, 0, 0, false, 0, 2), Error);  // not its worker
  CHECK_THROWS_AS(worker_epoch_order(p, 5, 0, 0, false, 1, 2), Error);  // not its listing
  CHECK_THROWS_AS(worker_epoch_order(p, 4, 0, 0, false, 1, 3), Error);  // not its world
}

TEST_CASE("lock-step: the agreed steps are the minimum over workers, drops are reported",
          "[data][shard]") {
  // file over 2 workers: 10 and 6 examples; batch 3 -> 3 and 2 steps; all run 2.
  const ShardPlan p = plan_shards(groups({10, 6}), "file", 1, 2, 3);
  CHECK(p.examples_per_worker == std::vector<int64_t>{10, 6});
  CHECK(agreed_steps_per_epoch(p, 3) == 2);
  CHECK(dropped_summary(p, 3) ==
        "lock-step: 2 steps per epoch x batch 3 = 6 examples on every worker; dropped per "
        "epoch: worker 0 4 of 10 (1 partial batch, 3 lock-step), worker 1 0 of 6; 4 of 16 in "
        "all");

  // data over 3 workers: 8, 8, 7; batch 4 -> 2, 2, 1 steps; all run 1.
  const ShardPlan d = plan_shards(single_files(23), "data", 0, 3, 4);
  CHECK(agreed_steps_per_epoch(d, 4) == 1);
  CHECK_THAT(dropped_summary(d, 4), Contains("1 step per epoch") &&
                                        Contains("worker 2 3 of 7 (3 partial batch, 0 lock-step)"));
  CHECK(agreed_steps_per_epoch(d, 100) == 0);
  CHECK_THROWS_AS(agreed_steps_per_epoch(d, 0), ConfigError);

  // Every worker's agreement is the same number, computed from the listing alone.
  for (int r = 0; r < 3; ++r) {
    CHECK(agreed_steps_per_epoch(plan_shards(single_files(23), "data", r, 3, 4), 4) == 1);
  }

  // Many workers are summarised after the first 8.
  // 100 over 12: 9 x 4 + 8 x 8; batch 3 -> 2 steps of 6; drops 3 x 4 + 2 x 8.
  const ShardPlan many = plan_shards(single_files(100), "data", 0, 12, 3);
  const std::string summary = dropped_summary(many, 3);
  CHECK_THAT(summary, Contains("worker 7 2 of 8") && Contains(", ... (most: worker 0 drops 3)") &&
                          Contains("; 28 of 100 in all"));
  CHECK_THAT(summary, !Contains("worker 8 "));
}

TEST_CASE("eval_shard: every validation example exactly once across the cluster", "[data][shard]") {
  for (int64_t n : {0, 1, 7, 100}) {
    for (int workers : {1, 2, 3, 5}) {
      CAPTURE(n, workers);
      std::vector<int64_t> all;
      size_t smallest = SIZE_MAX;
      size_t largest = 0;
      for (int r = 0; r < workers; ++r) {
        const std::vector<int64_t> mine = eval_shard(n, r, workers);
        CHECK(std::is_sorted(mine.begin(), mine.end()));
        for (int64_t i : mine) CHECK(i % workers == r);
        smallest = std::min(smallest, mine.size());
        largest = std::max(largest, mine.size());
        all.insert(all.end(), mine.begin(), mine.end());
      }
      CHECK(all.size() == static_cast<size_t>(n));  // no padding
      CHECK(sorted(all) == iota(n));                // no duplicates, nothing missing
      CHECK(largest - smallest <= 1);
    }
  }
  CHECK(eval_shard(10, 1, 4) == std::vector<int64_t>{1, 5, 9});
  CHECK_THROWS_AS(eval_shard(10, 4, 4), Error);
}

TEST_CASE("loaders fed by the shard orders run the same steps and cover the epoch",
          "[data][shard][loader]") {
  testing::TempDir tmp;
  std::vector<Example> examples;
  for (int i = 0; i < 11; ++i) {
    const auto p = tmp / ("img_" + std::to_string(i) + ".jpg");
    testing::write_jpeg(p, testing::pattern_image(20, 18, i));
    examples.push_back(Example{p.string(), i % 2});
  }
  const std::vector<FileGroup> files = single_files(11);
  const int workers = 3;
  const int64_t batch = 2;
  // data: 4, 4, 3 examples -> 2, 2, 1 full batches; every worker runs 1 step.
  const int64_t steps =
      agreed_steps_per_epoch(plan_shards(files, "data", 0, workers, batch), batch);
  REQUIRE(steps == 1);
  for (int64_t epoch : {0, 1}) {
    std::set<int64_t> seen;
    for (int r = 0; r < workers; ++r) {
      const ShardPlan plan = plan_shards(files, "data", r, workers, batch);
      LoaderOptions o;
      o.preprocess.image_size = 8;
      o.batch_size = batch;
      o.drop_last = true;
      o.seed = 3;
      o.num_workers = 2;
      o.order = [plan, r, workers](int64_t e) {
        return worker_epoch_order(plan, 11, 3, e, true, r, workers);
      };
      o.max_batches = steps;
      Loader loader(examples, o);
      CHECK(loader.epoch_size() == plan.examples_this_worker);
      CHECK(loader.batches_per_epoch() == steps);
      loader.start_epoch(epoch);
      int64_t got = 0;
      const std::vector<int64_t> order = worker_epoch_order(plan, 11, 3, epoch, true, r, workers);
      while (auto b = loader.next()) {
        CHECK(b->indices ==
              std::vector<int64_t>(order.begin() + got * batch, order.begin() + (got + 1) * batch));
        seen.insert(b->indices.begin(), b->indices.end());
        ++got;
      }
      CHECK(got == steps);  // the same number of steps on every worker
    }
    CHECK(seen.size() == static_cast<size_t>(workers * steps * batch));  // disjoint shards
  }
}
