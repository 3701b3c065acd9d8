// Replica consistency: broadcast_parameters makes every rank hold the chief's tensors bit for
// bit; checksum is bitwise and layout-independent; check_replicas_agree names diverged ranks.
// Also a hidden benchmark ([.bench]): 100 MB float all-reduce across 2 ranks on loopback.
#include "common/catch.h"

#include <algorithm>
#include <iostream>

#include "dist_test_util.h"
#include "trainer/dist/replicas.h"
#include "trainer/util/error.h"

using trainer::DistributedError;
using trainer::dist::broadcast_parameters;
using trainer::dist::check_replicas_agree;
using trainer::dist::checksum;
using trainer::dist::ProcessGroup;
using trainer::dist::testing::run_ranks;
using trainer::dist::testing::seconds_since;
using trainer::test::Contains;

TEST_CASE("checksum is bitwise, covers shapes and ignores memory layout", "[dist][replicas]") {
  auto a = torch::arange(2 * 3 * 4 * 5, torch::kFloat).view({2, 3, 4, 5}) / 7;
  const uint64_t h = checksum({a});
  CHECK(checksum({a.clone()}) == h);
  CHECK(checksum({a.contiguous(torch::MemoryFormat::ChannelsLast)}) == h);
  CHECK(checksum({a.view({6, 20})}) != h);       // same bytes, other shape
  CHECK(checksum({a.to(torch::kDouble)}) != h);  // same values, other dtype
  auto b = a.clone();
  b.view(-1)[17] = std::nextafter(b.view(-1)[17].item<float>(), 1e9f);  // one ulp
  CHECK(checksum({b}) != h);
  CHECK(checksum({torch::zeros({1})}) != checksum({-torch::zeros({1})}));  // 0.0 vs -0.0
  CHECK(checksum({a, b}) != checksum({b, a}));
  CHECK(checksum({}) == checksum({}));
  CHECK(checksum({torch::zeros({0})}) != checksum({}));
}

TEST_CASE("broadcast_parameters gives every rank the chief's tensors", "[dist][replicas]") {
  auto outs = run_ranks(3, [](int r, ProcessGroup& g) {
    torch::manual_seed(0);  // the same shapes everywhere; rank-specific values below
    std::vector<torch::Tensor> ts = {
        torch::randn({4, 3, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast) + r,
        torch::randn({7}, torch::requires_grad()),  // a parameter (leaf requiring grad)
        torch::full({3}, r, torch::kBFloat16),      // a bf16 buffer
        torch::tensor(int64_t{100 + r}),            // num_batches_tracked
    };
    {
      torch::NoGradGuard no_grad;
      ts[1].add_(r);
    }
    broadcast_parameters(g, ts, 0);
    return std::make_pair(checksum(ts), ts);
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(outs[r].first == outs[0].first);
    CHECK(outs[r].second[0].is_contiguous(torch::MemoryFormat::ChannelsLast));
    CHECK(outs[r].second[1].requires_grad());
    CHECK(outs[r].second[3].item<int64_t>() == 100);
    CHECK(torch::equal(outs[r].second[2], torch::zeros({3}, torch::kBFloat16)));
  }
}

TEST_CASE("check_replicas_agree names the ranks that diverged, on every rank", "[dist][replicas]") {
  auto outs = run_ranks(3, [](int r, ProcessGroup& g) {
    std::vector<torch::Tensor> params = {torch::ones({10}), torch::arange(5)};
    check_replicas_agree(g, params, "at the start");  // identical: no error
    if (r == 2) params[0][3] = 1.0001;
    std::string error;
    try {
      check_replicas_agree(g, params, "at checkpoint step 40");
    } catch (const DistributedError& e) {
      error = e.what();
    }
    return error;
  });
  for (const auto& e : outs) {
    CHECK_THAT(e,
               Contains("replicas diverged at checkpoint step 40: the parameters of rank(s) 2 ("));
    CHECK_THAT(e, !Contains("rank(s) 1"));
  }
}

TEST_CASE("benchmark: 100 MB float all-reduce across 2 ranks on loopback", "[.bench]") {
  constexpr int64_t kFloats = 25 * 1024 * 1024;  // 100 MiB
  auto times = run_ranks(2, [](int r, ProcessGroup& g) {
    auto t = torch::full({kFloats}, static_cast<float>(r + 1));
    g.all_reduce_sum({t});  // warm-up (allocations, connections)
    std::vector<double> seconds;
    for (int i = 0; i < 5; ++i) {
      g.barrier();
      const auto start = std::chrono::steady_clock::now();
      g.all_reduce_sum({t});
      seconds.push_back(seconds_since(start));
    }
    std::sort(seconds.begin(), seconds.end());
    return seconds[seconds.size() / 2];
  });
  const double s = std::max(times[0], times[1]);
  const double mb = kFloats * 4 / 1e6;
  std::cout << "all_reduce of 100 MiB float, 2 ranks (threads), Gloo over loopback: median " << s
            << " s, " << mb / s << " MB/s (with 2 ranks a ring all-reduce sends and receives the "
            << "whole buffer once per rank)\n";
  CHECK(s > 0);
}
