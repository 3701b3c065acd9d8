// The tf.data-style order of record sources: interleave and shuffle-buffer semantics, FILE
// sharding of 8 shards over 3 workers (disjoint, complete, balanced, lock-step), DATA sharding
// (every record exactly once per epoch across workers), and seeds that reproduce the order.
#include "common/catch.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "trainer/data/record_order.h"
#include "trainer/data/shard.h"

using namespace trainer::data;

namespace {

// 8 record files of uneven sizes (like real shards): 30, 28, 27, 25, 25, 24, 22, 20 records.
std::vector<FileGroup> eight_shards() {
  const std::vector<int64_t> sizes = {30, 28, 27, 25, 25, 24, 22, 20};
  std::vector<FileGroup> groups;
  int64_t next = 0;
  for (size_t f = 0; f < sizes.size(); ++f) {
    FileGroup g{"shard-" + std::to_string(f), {}};
    for (int64_t k = 0; k < sizes[f]; ++k) g.examples.push_back(next++);
    groups.push_back(g);
  }
  return groups;
}

int64_t total_of(const std::vector<FileGroup>& g) {
  int64_t n = 0;
  for (const auto& f : g) n += static_cast<int64_t>(f.examples.size());
  return n;
}

// Which file each example is in, and its position there.
std::map<int64_t, std::pair<size_t, size_t>> where(const std::vector<FileGroup>& groups) {
  std::map<int64_t, std::pair<size_t, size_t>> out;
  for (size_t f = 0; f < groups.size(); ++f)
    for (size_t k = 0; k < groups[f].examples.size(); ++k) out[groups[f].examples[k]] = {f, k};
  return out;
}

void check_read_order_is_sequential(const std::vector<FileGroup>& groups,
                                    const std::vector<int64_t>& read) {
  const auto at = where(groups);
  std::map<size_t, int64_t> last;  // file -> last position read
  for (int64_t i : read) {
    const auto [f, k] = at.at(i);
    if (last.count(f)) CHECK(static_cast<int64_t>(k) > last[f]);
    last[f] = static_cast<int64_t>(k);
  }
}

}  // namespace

TEST_CASE("interleave reads files round robin, a finished file's slot takes the next",
          "[records]") {
  CHECK(interleave({{0, 1, 2}, {3}, {4, 5}}, 2) == std::vector<int64_t>{0, 3, 1, 4, 2, 5});
  CHECK(interleave({{0, 1}, {2, 3}, {4}}, 1) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(interleave({{0, 1}, {2, 3}, {4}}, 8) == std::vector<int64_t>{0, 2, 4, 1, 3});
  CHECK(interleave({{}, {0}, {}}, 2) == std::vector<int64_t>{0});
  CHECK(interleave({}, 4).empty());
}

TEST_CASE("the shuffle buffer permutes, stays local, and a buffer of 1 keeps the order",
          "[records]") {
  std::vector<int64_t> input(500);
  std::iota(input.begin(), input.end(), 0);
  Rng a(7), b(7), c(7);
  const auto one = shuffle_buffer(input, 1, a);
  CHECK(one == input);
  const auto x = shuffle_buffer(input, 50, b);
  const auto y = shuffle_buffer(input, 50, c);
  CHECK(x == y);
  CHECK(x != input);
  std::vector<int64_t> sorted = x;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == input);
  // An element can only come out once it has entered the buffer: position p holds an element
  // read by p + buffer.
  for (size_t p = 0; p < x.size(); ++p) CHECK(x[p] < static_cast<int64_t>(p) + 50);
}

TEST_CASE("FILE sharding of 8 shards over 3 workers: disjoint, complete, balanced", "[records]") {
  const auto groups = eight_shards();
  const int64_t n = total_of(groups);
  const int64_t batch = 8;
  std::set<int64_t> seen_files;
  std::set<int64_t> seen_examples;
  std::vector<int64_t> per_worker;
  int64_t steps = -1;
  for (int w = 0; w < 3; ++w) {
    const ShardPlan plan = plan_shards(groups, "file", w, 3, batch);
    REQUIRE(plan.policy_effective == "file");
    for (int64_t f : plan.files_this_worker) CHECK(seen_files.insert(f).second);  // disjoint
    const EpochOrder order =
        record_epoch_order(groups, plan, RecordOrderOptions{11, true, 4, 16}, 0);
    CHECK(static_cast<int64_t>(order.emit.size()) == plan.examples_this_worker);
    for (int64_t i : order.emit) CHECK(seen_examples.insert(i).second);
    std::set<int64_t> mine(plan.file_examples.begin(), plan.file_examples.end());
    CHECK(std::set<int64_t>(order.emit.begin(), order.emit.end()) == mine);
    CHECK(std::multiset<int64_t>(order.read.begin(), order.read.end()) ==
          std::multiset<int64_t>(order.emit.begin(), order.emit.end()));
    check_read_order_is_sequential(groups, order.read);
    per_worker.push_back(plan.examples_this_worker);
    const int64_t s = agreed_steps_per_epoch(plan, batch);
    if (steps >= 0) CHECK(s == steps);  // every worker computes the same lock-step count
    steps = s;
  }
  CHECK(seen_files.size() == 8);                           // complete
  CHECK(static_cast<int64_t>(seen_examples.size()) == n);  // every record once
  const auto [lo, hi] = std::minmax_element(per_worker.begin(), per_worker.end());
  CHECK(*hi - *lo <= 30);  // within one shard's worth (the largest shard)
  CHECK(steps == *lo / batch);
  // auto picks file only when it keeps 90% of data's steps: 8 even shards split 4/4 over 2
  // workers, but 3/3/2 over 3 workers leaves a quarter of the steps, so auto reads data there.
  std::vector<FileGroup> even;
  for (int f = 0; f < 8; ++f) {
    FileGroup g{"even-" + std::to_string(f), {}};
    for (int k = 0; k < 25; ++k) g.examples.push_back(f * 25 + k);
    even.push_back(g);
  }
  CHECK(plan_shards(even, "auto", 0, 2, batch).policy_effective == "file");
  const ShardPlan three = plan_shards(even, "auto", 0, 3, batch);
  CHECK(three.policy_effective == "data");
  CHECK_THAT(three.reason, trainer::test::Contains("balance poorly"));
}

TEST_CASE("DATA sharding over record files: every record exactly once per epoch", "[records]") {
  const auto groups = eight_shards();
  const int64_t n = total_of(groups);
  for (int64_t epoch : {0, 1}) {
    std::multiset<int64_t> all;
    for (int w = 0; w < 3; ++w) {
      const ShardPlan plan = plan_shards(groups, "data", w, 3, 8);
      const EpochOrder order =
          record_epoch_order(groups, plan, RecordOrderOptions{5, true, 4, 32}, epoch);
      CHECK(static_cast<int64_t>(order.emit.size()) == plan.examples_this_worker);
      CHECK(std::multiset<int64_t>(order.read.begin(), order.read.end()) ==
            std::multiset<int64_t>(order.emit.begin(), order.emit.end()));
      check_read_order_is_sequential(groups, order.read);
      all.insert(order.emit.begin(), order.emit.end());
    }
    CHECK(static_cast<int64_t>(all.size()) == n);
    CHECK(std::set<int64_t>(all.begin(), all.end()).size() == all.size());
  }
}

TEST_CASE("the same seed gives the same order, epochs and seeds change it", "[records]") {
  const auto groups = eight_shards();
  const ShardPlan off = plan_shards(groups, "off", 0, 1, 8);
  const RecordOrderOptions o{3, true, 4, 64};
  const EpochOrder a = record_epoch_order(groups, off, o, 2);
  const EpochOrder b = record_epoch_order(groups, off, o, 2);
  CHECK(a.emit == b.emit);
  CHECK(a.read == b.read);
  CHECK(record_epoch_order(groups, off, o, 3).emit != a.emit);
  CHECK(record_epoch_order(groups, off, RecordOrderOptions{4, true, 4, 64}, 2).emit != a.emit);
  // No shuffling: the files in listing order, one after another.
  const EpochOrder plain = record_epoch_order(groups, off, RecordOrderOptions{3, false, 4, 64}, 0);
  std::vector<int64_t> all(static_cast<size_t>(total_of(groups)));
  std::iota(all.begin(), all.end(), 0);
  CHECK(plain.emit == all);
  CHECK(plain.read == all);
}
