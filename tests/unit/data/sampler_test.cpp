// data.sampler: balanced: every class drawn about equally often, the same order for a seed on
// every rank, the workers' shares disjoint positions of one global draw.
#include "common/catch.h"

#include <algorithm>
#include <map>

#include "trainer/data/shard.h"
#include "trainer/util/error.h"

using namespace trainer;

TEST_CASE("balanced sampler draws each class about equally often", "[sampler]") {
  // 61 % of the examples in class 3, as in Cassava.
  std::vector<int64_t> labels;
  const std::vector<int64_t> counts = {60, 120, 130, 610, 80};
  for (size_t c = 0; c < counts.size(); ++c) labels.insert(labels.end(), counts[c], c);
  std::map<int64_t, int64_t> drawn;
  int64_t total = 0;
  for (int64_t epoch = 0; epoch < 10; ++epoch) {
    for (const int64_t i : data::balanced_epoch_order(labels, 5, epoch, 0, 1, 1000)) {
      REQUIRE(i >= 0);
      REQUIRE(i < static_cast<int64_t>(labels.size()));
      ++drawn[labels[static_cast<size_t>(i)]];
      ++total;
    }
  }
  CHECK(total == 10000);
  for (const auto& [label, n] : drawn) {
    INFO("class " << label);
    CHECK(std::abs(n - 2000) < 200);  // 5 sigma of Binomial(10000, 0.2) is 200
  }
  CHECK(drawn.size() == 5);
}

TEST_CASE("balanced sampler: reproducible, epochs differ, workers split one global draw",
          "[sampler]") {
  std::vector<int64_t> labels = {0, 0, 0, 1, 2, 2, 1, 0, 0, 0, 0};
  const auto a = data::balanced_epoch_order(labels, 9, 0, 0, 1, 10);
  CHECK(a.size() == 10);
  CHECK(a == data::balanced_epoch_order(labels, 9, 0, 0, 1, 10));
  CHECK(a != data::balanced_epoch_order(labels, 9, 1, 0, 1, 10));
  CHECK(a != data::balanced_epoch_order(labels, 10, 0, 0, 1, 10));
  // Two workers take alternate positions of one global draw, exactly their count each (the
  // lock-step steps x the batch), so no rank runs out of batches before another.
  const auto w0 = data::balanced_epoch_order(labels, 9, 0, 0, 2, 5);
  const auto w1 = data::balanced_epoch_order(labels, 9, 0, 1, 2, 5);
  REQUIRE(w0.size() == 5);
  REQUIRE(w1.size() == 5);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == (i % 2 == 0 ? w0[i / 2] : w1[i / 2]));
  CHECK_THROWS_AS(data::balanced_epoch_order({0, -1}, 1, 0, 0, 1, 2), Error);
}

TEST_CASE("data.validation_split holds out a reproducible fraction", "[sampler]") {
  const auto a = data::held_out_positions(100, 0.2, 7);
  CHECK(a.size() == 20);
  CHECK(std::is_sorted(a.begin(), a.end()));
  CHECK(std::adjacent_find(a.begin(), a.end()) == a.end());
  CHECK(a == data::held_out_positions(100, 0.2, 7));
  CHECK(a != data::held_out_positions(100, 0.2, 8));
  CHECK(data::held_out_positions(10, 0.25, 1).size() == 3);  // llround(2.5) = 3
  CHECK(data::held_out_positions(5, 0.0, 1).empty());
  CHECK_THROWS_AS(data::held_out_positions(5, 1.0, 1), Error);
}
