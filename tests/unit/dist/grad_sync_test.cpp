// GradientSync over real Gloo, ranks as threads: each rank computes its loss on its own data;
// after backward + finish() every rank's gradients equal the average of the per-rank gradients
// computed independently. A frozen parameter, one never used, one used on rank 0 only; tiny
// buckets (one parameter each) and one big bucket; channels_last; bf16 autocast.
#include "common/catch.h"

#include "dist_test_util.h"
#include "trainer/dist/grad_sync.h"
#include "trainer/util/error.h"
#include "trainer/util/torch_compat.h"

using trainer::dist::GradientSync;
using trainer::dist::GradSyncStats;
using trainer::dist::ProcessGroup;
using trainer::dist::testing::run_ranks;
using trainer::dist::testing::what_of;

namespace {

namespace nn = torch::nn;

// Own parameters: unused, frozen, sometimes; then the children conv, bn, fc.
struct NetImpl : nn::Module {
  NetImpl() {
    unused = register_parameter("unused", torch::randn({7}));
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1)));
    bn = register_module("bn", nn::BatchNorm2d(4));
    frozen = register_parameter("frozen", torch::rand({4}) + 0.5, /*requires_grad=*/false);
    sometimes = register_parameter("sometimes", torch::randn({5}));
    fc = register_module("fc", nn::Linear(4 * 2 * 2, 5));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_sometimes) {
    auto y = torch::relu(bn(conv(x))) * frozen.view({1, 4, 1, 1});
    y = fc(torch::adaptive_avg_pool2d(y, {2, 2}).flatten(1));
    return use_sometimes ? y + sometimes : y;
  }
  torch::Tensor unused, frozen, sometimes;
  nn::Conv2d conv{nullptr};
  nn::BatchNorm2d bn{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

enum class Variant { kPlain, kChannelsLast, kBf16Autocast };

Net make_net(Variant v) {
  torch::manual_seed(17);  // identical replicas (called on the main thread only)
  Net net;
  if (v == Variant::kChannelsLast) {
    torch::NoGradGuard no_grad;
    net->conv->weight.set_data(
        net->conv->weight.data().contiguous(torch::MemoryFormat::ChannelsLast));
  }
  return net;
}

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> make_batches(int world, Variant v) {
  torch::manual_seed(99);
  std::vector<Batch> batches;
  for (int r = 0; r < world; ++r) {
    auto x = torch::randn({4, 3, 6, 6});
    if (v == Variant::kChannelsLast) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
    batches.push_back({x, torch::randint(0, 5, {4}, torch::kLong)});
  }
  return batches;
}

void forward_backward(Net& net, const Batch& b, int rank, Variant v) {
  torch::Tensor loss;
  {
    trainer::compat::AutocastGuard autocast(v == Variant::kBf16Autocast);
    auto out = net->forward(b.x, /*use_sometimes=*/rank == 0);
    loss = torch::nn::functional::cross_entropy(out.to(torch::kFloat), b.y);
  }
  loss.backward();
}

// Gradients (undefined ones stay undefined) in parameter order.
std::vector<torch::Tensor> grads_of(Net& net) {
  std::vector<torch::Tensor> g;
  for (const auto& p : net->parameters())
    g.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  return g;
}

struct RankOut {
  std::vector<torch::Tensor> grads;
  bool conv_grad_channels_last = false;
  GradSyncStats stats;
  int buckets = 0;
  std::vector<std::vector<size_t>> assignment;
};

void check_averaged(int world, double bucket_mb, Variant v) {
  // The reference: each rank's gradients computed alone, then averaged (missing = zero).
  const auto batches = make_batches(world, v);
  std::vector<torch::Tensor> expected;
  for (int r = 0; r < world; ++r) {
    Net net = make_net(v);
    forward_backward(net, batches[r], r, v);
    auto g = grads_of(net);
    if (expected.empty()) expected.resize(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      if (!g[i].defined()) continue;
      expected[i] = expected[i].defined() ? expected[i] + g[i] : g[i].clone();
    }
  }
  for (auto& e : expected) {
    if (e.defined()) e = e / world;
  }

  std::vector<Net> nets;
  for (int r = 0; r < world; ++r) nets.push_back(make_net(v));
  auto outs = run_ranks(world, [&](int r, ProcessGroup& g) {
    Net& net = nets[r];
    GradientSync sync(g, net->parameters(), bucket_mb);
    RankOut out;
    for (int step = 0; step < 2; ++step) {  // the second step proves the state resets
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
      forward_backward(net, batches[r], r, v);
      sync.finish();
    }
    out.grads = grads_of(net);
    out.conv_grad_channels_last =
        net->conv->weight.grad().is_contiguous(torch::MemoryFormat::ChannelsLast);
    out.stats = sync.last_step();
    out.buckets = sync.num_buckets();
    out.assignment = sync.bucket_assignment();
    return out;
  });

  const auto names = nets[0]->named_parameters().keys();
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const RankOut& o = outs[r];
    for (size_t i = 0; i < expected.size(); ++i) {
      CAPTURE(names[i]);
      REQUIRE(o.grads[i].defined() == expected[i].defined());
      if (!expected[i].defined()) continue;
      CHECK(o.grads[i].sizes() == expected[i].sizes());
      CHECK(torch::allclose(o.grads[i], expected[i], /*rtol=*/1e-5, /*atol=*/1e-6));
    }
    if (v == Variant::kChannelsLast) CHECK(o.conv_grad_channels_last);
    CHECK(o.stats.buckets == o.buckets);
    CHECK(o.stats.bytes > 0);
    CHECK(o.stats.wait_s >= 0);
    CHECK(o.stats.finish_s >= o.stats.wait_s);
  }
  // parameters() lists a module's own parameters before its children's: 0 unused, 1 frozen
  // (ignored), 2 sometimes, 3 conv.weight, 4 conv.bias, 5 bn.weight, 6 bn.bias, 7 fc.weight,
  // 8 fc.bias. Buckets take them in reverse.
  const std::vector<std::vector<size_t>> one_each = {{8}, {7}, {6}, {5}, {4}, {3}, {2}, {0}};
  if (bucket_mb < 1e-3) {
    CHECK(outs[0].assignment == one_each);
    // Rank 0 uses every parameter but `unused` (the last bucket): all others overlap backward.
    CHECK(outs[0].stats.launched_in_backward == outs[0].buckets - 1);
    // Rank 1 never produces `sometimes` (bucket 6): launch order holds it and the one after.
    CHECK(outs[1].stats.launched_in_backward == 6);
  } else {
    CHECK(outs[0].assignment == std::vector<std::vector<size_t>>{{8, 7, 6, 5, 4, 3, 2, 0}});
  }
}

}  // namespace

TEST_CASE("GradientSync averages gradients across ranks", "[dist][grad_sync]") {
  const int world = GENERATE(2, 3);
  const double bucket_mb = GENERATE(1e-6, 25.0);
  CAPTURE(world, bucket_mb);
  check_averaged(world, bucket_mb, Variant::kPlain);
}

TEST_CASE("GradientSync keeps channels_last gradients channels_last", "[dist][grad_sync]") {
  check_averaged(2, 1e-6, Variant::kChannelsLast);
}

TEST_CASE("GradientSync under bf16 autocast averages the fp32 gradients", "[dist][grad_sync]") {
  check_averaged(2, 25.0, Variant::kBf16Autocast);
}

TEST_CASE("GradientSync with one process leaves the gradients alone", "[dist][grad_sync]") {
  auto group = ProcessGroup::connect({});
  Net net = make_net(Variant::kPlain);
  GradientSync sync(*group, net->parameters());
  CHECK(sync.num_buckets() == 0);
  forward_backward(net, make_batches(1, Variant::kPlain)[0], 0, Variant::kPlain);
  const auto before = grads_of(net);
  sync.finish();
  const auto after = grads_of(net);
  for (size_t i = 0; i < before.size(); ++i) {
    REQUIRE(before[i].defined() == after[i].defined());
    if (before[i].defined()) CHECK(torch::equal(before[i], after[i]));
  }
}

TEST_CASE("GradientSync refuses a second backward before finish()", "[dist][grad_sync]") {
  std::vector<Net> nets{make_net(Variant::kPlain), make_net(Variant::kPlain)};
  const auto batches = make_batches(2, Variant::kPlain);
  auto errors = run_ranks(2, [&](int r, ProcessGroup& g) {
    GradientSync sync(g, nets[r]->parameters(), 1e-6);  // buckets launch during backward
    forward_backward(nets[r], batches[r], r, Variant::kPlain);
    forward_backward(nets[r], batches[r], r, Variant::kPlain);
    std::string error;
    try {
      sync.finish();
    } catch (const trainer::Error& e) {
      error = e.what();
    }
    // The ranks stay in step (finish() completed the launched buckets before refusing).
    for (auto& p : nets[r]->parameters()) p.mutable_grad() = torch::Tensor();
    forward_backward(nets[r], batches[r], r, Variant::kPlain);
    sync.finish();
    return error;
  });
  for (const auto& e : errors) CHECK_THAT(e, trainer::test::Contains("second gradient"));
}

TEST_CASE("GradientSync refuses a parameter unfrozen after it was built", "[dist][grad_sync]") {
  std::vector<Net> nets{make_net(Variant::kPlain), make_net(Variant::kPlain)};
  const auto batches = make_batches(2, Variant::kPlain);
  auto errors = run_ranks(2, [&](int r, ProcessGroup& g) {
    GradientSync sync(g, nets[r]->parameters());
    nets[r]->frozen.set_requires_grad(true);
    forward_backward(nets[r], batches[r], r, Variant::kPlain);
    return what_of<trainer::Error>([&] { sync.finish(); });
  });
  for (const auto& e : errors) CHECK_THAT(e, trainer::test::Contains("#1 was frozen"));
}

TEST_CASE("GradientSync averages BN statistics and counts stop votes in the last bucket",
          "[dist][grad_sync]") {
  const int world = 3;
  std::vector<Net> nets;
  for (int r = 0; r < world; ++r) nets.push_back(make_net(Variant::kPlain));
  const auto batches = make_batches(world, Variant::kPlain);
  struct Out {
    torch::Tensor mean, var;
    int votes = 0;
  };
  std::vector<torch::Tensor> means(world), vars(world);
  auto outs = run_ranks(world, [&](int r, ProcessGroup& g) {
    Net& net = nets[r];
    trainer::dist::GradSyncOptions o;
    o.bucket_mb = 1e-6;  // one bucket per parameter: the statistics ride in the last one only
    o.averaged_buffers = {net->bn->running_mean, net->bn->running_var};
    o.stop_vote = [r] { return r != 1; };
    GradientSync sync(g, net->parameters(), std::move(o));
    forward_backward(net, batches[r], r, Variant::kPlain);
    means[r] = net->bn->running_mean.clone();  // this rank's own, before the average
    vars[r] = net->bn->running_var.clone();
    sync.finish();
    return Out{net->bn->running_mean.clone(), net->bn->running_var.clone(),
               sync.last_step().stop_votes};
  });
  const auto mean = (means[0] + means[1] + means[2]) / 3;
  const auto var = (vars[0] + vars[1] + vars[2]) / 3;
  CHECK_FALSE(torch::equal(means[0], means[1]));  // the ranks saw different data
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(torch::allclose(outs[r].mean, mean, 1e-6, 1e-7));
    CHECK(torch::allclose(outs[r].var, var, 1e-6, 1e-7));
    CHECK(torch::equal(outs[r].mean, outs[0].mean));  // bit for bit the same everywhere
    CHECK(torch::equal(outs[r].var, outs[0].var));
    CHECK(outs[r].votes == 2);
  }
}

TEST_CASE("GradientSync leaves each gradient in its bucket and accumulates micro-batches",
          "[dist][grad_sync]") {
  const int world = 2;
  const Variant v = GENERATE(Variant::kPlain, Variant::kChannelsLast);
  const auto batches = make_batches(world, v);
  // Reference: each rank's two half-batches accumulated alone, then averaged over ranks.
  std::vector<torch::Tensor> expected;
  for (int r = 0; r < world; ++r) {
    Net net = make_net(v);
    for (int half = 0; half < 2; ++half) {
      Batch b{batches[r].x.narrow(0, 2 * half, 2), batches[r].y.narrow(0, 2 * half, 2)};
      forward_backward(net, b, r, v);
    }
    auto g = grads_of(net);
    if (expected.empty()) expected.resize(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i].defined()) expected[i] = expected[i].defined() ? expected[i] + g[i] : g[i].clone();
    }
  }
  std::vector<Net> nets;
  for (int r = 0; r < world; ++r) nets.push_back(make_net(v));
  auto outs = run_ranks(world, [&](int r, ProcessGroup& g) {
    Net& net = nets[r];
    GradientSync sync(g, net->parameters(), 25.0);
    std::vector<torch::Tensor> grads;
    bool shares = true;
    for (int step = 0; step < 2; ++step) {
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
      for (int half = 0; half < 2; ++half) {
        sync.set_accumulating(half == 0);
        Batch b{batches[r].x.narrow(0, 2 * half, 2), batches[r].y.narrow(0, 2 * half, 2)};
        forward_backward(net, b, r, v);
      }
      sync.finish();
    }
    // Every averaged gradient is a view into one bucket (one storage), in the parameter's layout.
    const auto conv_grad = net->conv->weight.grad();
    const auto fc_grad = net->fc->weight.grad();
    shares = conv_grad.storage().data() == fc_grad.storage().data() &&
             conv_grad.strides() == net->conv->weight.strides();
    return std::make_pair(grads_of(net), shares);
  });
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(outs[r].second);
    for (size_t i = 0; i < expected.size(); ++i) {
      CAPTURE(i);
      REQUIRE(outs[r].first[i].defined() == expected[i].defined());
      if (expected[i].defined()) {
        CHECK(torch::allclose(outs[r].first[i], expected[i] / world, 1e-5, 1e-6));
      }
    }
  }
}
