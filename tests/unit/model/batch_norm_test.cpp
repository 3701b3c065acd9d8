// model::BatchNorm: torch::nn::BatchNorm2d's names and values; with a StatsReducer (SyncBN) over
// one replica it computes what plain BN computes (forward, backward, running statistics), and
// over two simulated replicas (halves of one batch, summed by a shared reducer) what plain BN
// computes on the whole batch.
#include "common/catch.h"

#include <condition_variable>
#include <cstdint>
#include <ios>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "trainer/model/batch_norm.h"

using namespace trainer::model;

namespace {

// One replica: the sum over replicas is the tensor itself.
struct Alone : StatsReducer {
  int calls = 0;
  void sum_(torch::Tensor&) override { ++calls; }
};

double worst(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs() / b.abs().clamp_min(1e-3)).max().item<double>();
}

}  // namespace

TEST_CASE("SyncBatchNorm over one replica equals BatchNorm2d: forward, backward, statistics",
          "[model][syncbn]") {
  torch::manual_seed(3);
  const torch::Tensor x0 = torch::randn({4, 3, 5, 5}) * 2 + 1;
  const torch::Tensor g = torch::randn({4, 3, 5, 5});
  BatchNorm plain(3, 1e-5, 0.1), synced(3, 1e-5, 0.1);
  {
    torch::NoGradGuard no_grad;
    for (auto* bn : {&plain, &synced}) {
      (*bn)->weight.copy_(torch::tensor({0.5f, 1.5f, -2.0f}));
      (*bn)->bias.copy_(torch::tensor({0.1f, -0.2f, 0.3f}));
    }
  }
  auto alone = std::make_shared<Alone>();
  synced->set_reducer(alone);
  plain->train();
  synced->train();

  torch::Tensor xa = x0.clone().requires_grad_(true);
  torch::Tensor xb = x0.clone().requires_grad_(true);
  const torch::Tensor ya = plain(xa);
  const torch::Tensor yb = synced(xb);
  CHECK(worst(yb, ya) < 1e-5);
  (ya * g).sum().backward();
  (yb * g).sum().backward();
  CHECK(alone->calls == 2);  // one sum in forward, one in backward
  CHECK(worst(xb.grad(), xa.grad()) < 1e-4);
  CHECK(worst(synced->weight.grad(), plain->weight.grad()) < 1e-5);
  CHECK(worst(synced->bias.grad(), plain->bias.grad()) < 1e-5);
  CHECK(worst(synced->running_mean, plain->running_mean) < 1e-6);
  CHECK(worst(synced->running_var, plain->running_var) < 1e-6);
  CHECK(synced->num_batches_tracked.item<int64_t>() == 1);
  CHECK(plain->num_batches_tracked.item<int64_t>() == 1);

  // Eval mode: the running statistics, no reducer call.
  synced->eval();
  plain->eval();
  CHECK(worst(synced(x0), plain(x0)) < 1e-5);
  CHECK(alone->calls == 2);
}

namespace {

// Two replicas as two threads: sum_ adds both threads' tensors and hands each the total.
struct Pair {
  std::mutex m;
  std::condition_variable cv;
  std::vector<torch::Tensor> parts;
  torch::Tensor total;
  int round = 0;
  int taken = 0;
};

struct PairReducer : StatsReducer {
  explicit PairReducer(std::shared_ptr<Pair> p) : pair(std::move(p)) {}
  void sum_(torch::Tensor& t) override {
    std::unique_lock<std::mutex> lock(pair->m);
    const int my_round = pair->round;
    pair->parts.push_back(t.clone());
    if (pair->parts.size() == 2) {
      pair->total = pair->parts[0] + pair->parts[1];
      pair->parts.clear();
      ++pair->round;
      pair->cv.notify_all();
    } else {
      pair->cv.wait(lock, [&] { return pair->round != my_round; });
    }
    t.copy_(pair->total);
  }
  std::shared_ptr<Pair> pair;
};

}  // namespace

TEST_CASE("SyncBatchNorm over two replicas equals BatchNorm2d over the whole batch",
          "[model][syncbn]") {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({8, 3, 4, 4}) * 3 - 1;
  const torch::Tensor g = torch::randn({8, 3, 4, 4});
  BatchNorm whole(3, 1e-5, 0.1);
  whole->train();
  torch::Tensor xw = x.clone().requires_grad_(true);
  // The loss of the whole batch is the mean of the two halves' losses (as replicas average).
  (whole(xw) * g).sum().backward();

  auto pair = std::make_shared<Pair>();
  BatchNorm half[2] = {BatchNorm(3, 1e-5, 0.1), BatchNorm(3, 1e-5, 0.1)};
  torch::Tensor xs[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    half[r]->set_reducer(std::make_shared<PairReducer>(pair));
    half[r]->train();
    xs[r] = x.slice(0, 4 * r, 4 * r + 4).clone().requires_grad_(true);
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back(
        [&, r] { (half[r](xs[r]) * g.slice(0, 4 * r, 4 * r + 4)).sum().backward(); });
  }
  for (auto& t : threads) t.join();
  CHECK(worst(torch::cat({xs[0].grad(), xs[1].grad()}), xw.grad()) < 1e-4);
  CHECK(worst(half[0]->weight.grad() + half[1]->weight.grad(), whole->weight.grad()) < 1e-4);
  CHECK(worst(half[0]->running_mean, whole->running_mean) < 1e-5);
  CHECK(worst(half[1]->running_var, whole->running_var) < 1e-5);
}

TEST_CASE("forward_relu equals BatchNorm2d then relu_: forward, backward, statistics",
          "[model][bn_relu]") {
  torch::manual_seed(5);
  // Odd plane sizes (7x5) reach the kernels' remainder loops; an offset mean and a mix of signs
  // exercise the one-pass variance and the ReLU mask. Both layouts take the own kernel in
  // training mode.
  for (const bool channels_last : {false, true}) {
    for (const bool training : {true, false}) {
      INFO("channels_last " << channels_last << ", training " << training);
      torch::Tensor x0 = torch::randn({3, 6, 7, 5}) * 3 + 2;
      const torch::Tensor g = torch::randn({3, 6, 7, 5});
      if (channels_last) x0 = x0.contiguous(at::MemoryFormat::ChannelsLast);
      BatchNorm plain(6, 1e-5, 0.1), fused(6, 1e-5, 0.1);
      {
        torch::NoGradGuard no_grad;
        for (auto* bn : {&plain, &fused}) {
          (*bn)->weight.copy_(torch::linspace(-1.5, 2.0, 6));
          (*bn)->bias.copy_(torch::linspace(0.4, -0.3, 6));
          (*bn)->running_mean.fill_(0.25);
          (*bn)->running_var.fill_(1.5);
        }
      }
      plain->train(training);
      fused->train(training);
      torch::Tensor xa = x0.clone().requires_grad_(true);
      torch::Tensor xb = x0.clone().requires_grad_(true);
      const torch::Tensor ya = plain(xa).relu_();
      const torch::Tensor yb = fused->forward_relu(xb);
      CHECK((yb - ya).abs().max().item<double>() < 1e-5);
      CHECK(((yb > 0) == (ya > 0)).all().item<bool>());
      (ya * g).sum().backward();
      (yb * g).sum().backward();
      CHECK((xb.grad() - xa.grad()).abs().max().item<double>() < 1e-4);
      CHECK(worst(fused->weight.grad(), plain->weight.grad()) < 1e-4);
      CHECK(worst(fused->bias.grad(), plain->bias.grad()) < 1e-5);
      CHECK(worst(fused->running_mean, plain->running_mean) < 1e-6);
      CHECK(worst(fused->running_var, plain->running_var) < 1e-5);
      CHECK(fused->num_batches_tracked.item<int64_t>() ==
            plain->num_batches_tracked.item<int64_t>());
      CHECK(yb.is_contiguous(channels_last ? at::MemoryFormat::ChannelsLast
                                           : at::MemoryFormat::Contiguous));
    }
  }
}

TEST_CASE("forward in training mode equals torch.batch_norm: output, gradients, statistics",
          "[model][bn_relu]") {
  torch::manual_seed(7);
  const torch::Tensor x0 = torch::randn({2, 5, 9, 3}) * 0.5 - 4;  // a mean far from 0
  const torch::Tensor g = torch::randn({2, 5, 9, 3});
  BatchNorm ours(5, 1e-5, 0.1);
  ours->train();
  torch::Tensor w = torch::linspace(0.5, 1.5, 5).requires_grad_(true);
  torch::Tensor b = torch::linspace(-1, 1, 5).requires_grad_(true);
  {
    torch::NoGradGuard no_grad;
    ours->weight.copy_(w);
    ours->bias.copy_(b);
  }
  torch::Tensor rm = torch::zeros({5}), rv = torch::ones({5});
  torch::Tensor xa = x0.clone().requires_grad_(true);
  torch::Tensor xb = x0.clone().requires_grad_(true);
  const torch::Tensor ya = torch::batch_norm(xa, w, b, rm, rv, true, 0.1, 1e-5, false);
  torch::Tensor yb = ours(xb);
  yb.add_(1.0);  // changed in place after, as a residual block does: backward must not mind
  CHECK((yb - 1.0 - ya).abs().max().item<double>() < 1e-5);
  (ya * g).sum().backward();
  (yb * g).sum().backward();
  CHECK((xb.grad() - xa.grad()).abs().max().item<double>() < 1e-4);
  CHECK(worst(ours->weight.grad(), w.grad()) < 1e-4);
  CHECK(worst(ours->bias.grad(), b.grad()) < 1e-5);
  CHECK(worst(ours->running_mean, rm) < 1e-6);
  CHECK(worst(ours->running_var, rv) < 1e-5);
}

TEST_CASE("forward_relu gives the same bits whatever the thread count", "[model][bn_relu]") {
  torch::manual_seed(6);
  // 4 x 9 x 9 = 324 rows: channels_last sums them in three chunks of at most 128, forward and
  // backward. NCHW: a channel by one thread. Output, running statistics and every gradient.
  for (const bool channels_last : {false, true}) {
    INFO("channels_last " << channels_last);
    torch::Tensor x0 = torch::randn({4, 40, 9, 9});
    const torch::Tensor g = torch::randn({4, 40, 9, 9});
    if (channels_last) x0 = x0.contiguous(at::MemoryFormat::ChannelsLast);
    const int threads = torch::get_num_threads();
    std::vector<torch::Tensor> outs;
    for (const int t : {1, 2, 3}) {
      torch::set_num_threads(t);
      BatchNorm bn(40, 1e-5, 0.1);
      bn->train();
      torch::Tensor x = x0.clone().requires_grad_(true);
      const torch::Tensor y = bn->forward_relu(x);
      (y * g).sum().backward();
      outs.push_back(
          torch::cat({y.contiguous().flatten(), bn->running_mean, bn->running_var,
                      x.grad().contiguous().flatten(), bn->weight.grad(), bn->bias.grad()}));
    }
    torch::set_num_threads(threads);
    CHECK(torch::equal(outs[0], outs[1]));
    CHECK(torch::equal(outs[0], outs[2]));
  }
}

TEST_CASE("channels_last: a channel's bits do not depend on its place among the channels",
          "[model][bn_relu]") {
  // In a 40-channel input every channel goes through the kernel's vector loop (4 at a time); in
  // the 7 channels 9..15 taken alone, 13..15 go through its scalar loop. Each channel is summed on
  // its own, in row order, so both give the same bits; and both are close to torch.batch_norm and
  // to the NCHW kernel (whose sums are ordered otherwise).
  torch::manual_seed(10);
  const torch::Tensor x = (torch::randn({3, 40, 11, 7}) * 2 - 3);  // 231 rows: two chunks
  auto run = [](const torch::Tensor& in, bool channels_last) {
    BatchNorm bn(in.size(1), 1e-5, 0.1);
    bn->train();
    return bn->forward_relu(channels_last ? in.contiguous(at::MemoryFormat::ChannelsLast)
                                          : in.contiguous());
  };
  const torch::Tensor wide = run(x, true);
  const torch::Tensor narrow = run(x.slice(1, 9, 16), true);
  CHECK(torch::equal(wide.slice(1, 9, 16).contiguous(), narrow.contiguous()));
  const torch::Tensor reference =
      torch::batch_norm(x, torch::ones({40}), torch::zeros({40}), torch::zeros({40}),
                        torch::ones({40}), true, 0.1, 1e-5, false)
          .relu();
  CHECK((wide - reference).abs().max().item<double>() < 1e-5);
  CHECK((wide - run(x, false)).abs().max().item<double>() < 1e-5);
}

TEST_CASE("forward_add_relu gives the bits of forward, += residual, relu_", "[model][bn_relu]") {
  torch::manual_seed(8);
  // Odd planes (7x5) for the remainder loops; training takes the own kernel in both layouts,
  // eval mode the three ATen steps.
  for (const bool channels_last : {false, true}) {
    for (const bool training : {true, false}) {
      INFO("channels_last " << channels_last << ", training " << training);
      torch::Tensor x0 = torch::randn({3, 6, 7, 5}) * 2 + 1;
      torch::Tensor r0 = torch::randn({3, 6, 7, 5});
      if (channels_last) {
        x0 = x0.contiguous(at::MemoryFormat::ChannelsLast);
        r0 = r0.contiguous(at::MemoryFormat::ChannelsLast);
      }
      const torch::Tensor g = torch::randn({3, 6, 7, 5});
      BatchNorm steps(6, 1e-5, 0.1), fused(6, 1e-5, 0.1);
      {
        torch::NoGradGuard no_grad;
        for (auto* bn : {&steps, &fused}) {
          (*bn)->weight.copy_(torch::linspace(-1.5, 2.0, 6));
          (*bn)->bias.copy_(torch::linspace(0.4, -0.3, 6));
        }
      }
      steps->train(training);
      fused->train(training);
      torch::Tensor xa = x0.clone().requires_grad_(true), ra = r0.clone().requires_grad_(true);
      torch::Tensor xb = x0.clone().requires_grad_(true), rb = r0.clone().requires_grad_(true);
      torch::Tensor ya = steps(xa);
      ya += ra;
      ya.relu_();
      const torch::Tensor yb = fused->forward_add_relu(xb, rb);
      CHECK(torch::equal(yb, ya));
      CHECK((yb == 0).any().item<bool>());  // the mask is exercised
      (ya * g).sum().backward();
      (yb * g).sum().backward();
      CHECK(torch::equal(xb.grad(), xa.grad()));
      CHECK(torch::equal(rb.grad(), ra.grad()));
      CHECK(torch::equal(fused->weight.grad(), steps->weight.grad()));
      CHECK(torch::equal(fused->bias.grad(), steps->bias.grad()));
      CHECK(torch::equal(fused->running_mean, steps->running_mean));
      CHECK(torch::equal(fused->running_var, steps->running_var));
      CHECK(fused->num_batches_tracked.item<int64_t>() ==
            steps->num_batches_tracked.item<int64_t>());
    }
  }
}

TEST_CASE("forward_add_relu without a residual gradient, and a residual of another shape",
          "[model][bn_relu]") {
  torch::manual_seed(9);
  BatchNorm bn(4, 1e-5, 0.1);
  bn->train();
  torch::Tensor x = torch::randn({2, 4, 3, 3}).requires_grad_(true);
  const torch::Tensor r = torch::randn({2, 4, 3, 3});  // no gradient wanted
  bn->forward_add_relu(x, r).sum().backward();
  CHECK(x.grad().defined());
  CHECK_FALSE(r.grad().defined());
  // A broadcast residual is not the kernel's: the three steps take it.
  const torch::Tensor y = bn->forward_add_relu(x.detach(), torch::ones({1, 4, 1, 1}));
  CHECK(y.sizes() == x.sizes());
}

TEST_CASE("the NCHW backward: ReLU's and ATen's batch-norm backward, gradients asked for or not",
          "[model][bn_relu]") {
  torch::manual_seed(11);
  // 7x5 planes reach both passes' remainder loops; a mean far from 0 and both signs of the output.
  const torch::Tensor x0 = torch::randn({3, 6, 7, 5}) * 2 + 3;
  const torch::Tensor g = torch::randn({3, 6, 7, 5});
  auto make = [] {
    BatchNorm bn(6, 1e-5, 0.1);
    torch::NoGradGuard no_grad;
    bn->weight.copy_(torch::linspace(-1.5, 2.0, 6));
    bn->bias.copy_(torch::linspace(0.4, -0.3, 6));
    bn->train();
    return bn;
  };
  for (const bool relu : {false, true}) {
    INFO("relu " << relu);
    BatchNorm bn = make();
    torch::Tensor x = x0.clone().requires_grad_(true);
    const torch::Tensor y = relu ? bn->forward_relu(x) : bn->forward(x);
    (y * g).sum().backward();
    // ATen's two steps on the batch's own statistics (biased variance), in double.
    const torch::Tensor xd = x0.to(torch::kDouble);
    const torch::Tensor mean = xd.mean({0, 2, 3});
    const torch::Tensor invstd = (xd.var({0, 2, 3}, /*unbiased=*/false) + 1e-5).rsqrt();
    const torch::Tensor gd =
        relu ? at::threshold_backward(g.to(torch::kDouble), y.detach().to(torch::kDouble), 0)
             : g.to(torch::kDouble);
    auto [dx, dw, db] =
        at::native_batch_norm_backward(gd, xd, bn->weight.detach().to(torch::kDouble), {}, {}, mean,
                                       invstd, true, 1e-5, {true, true, true});
    CHECK((x.grad().to(torch::kDouble) - dx).abs().max().item<double>() < 1e-5);
    CHECK(worst(bn->weight.grad().to(torch::kDouble), dw) < 1e-5);
    CHECK(worst(bn->bias.grad().to(torch::kDouble), db) < 1e-5);

    // No gradient for the input: the parameters' gradients keep their bits.
    BatchNorm frozen_input = make();
    const torch::Tensor y2 = relu ? frozen_input->forward_relu(x0) : frozen_input->forward(x0);
    (y2 * g).sum().backward();
    CHECK(torch::equal(frozen_input->weight.grad(), bn->weight.grad()));
    CHECK(torch::equal(frozen_input->bias.grad(), bn->bias.grad()));

    // A gradient that is not contiguous (sum's backward expands one value): made contiguous.
    BatchNorm expanded = make();
    torch::Tensor x3 = x0.clone().requires_grad_(true);
    (relu ? expanded->forward_relu(x3) : expanded->forward(x3)).sum().backward();
    BatchNorm dense = make();
    torch::Tensor x4 = x0.clone().requires_grad_(true);
    (relu ? dense->forward_relu(x4) : dense->forward(x4)).backward(torch::ones_like(x0));
    CHECK(torch::equal(x3.grad(), x4.grad()));
    CHECK(torch::equal(expanded->weight.grad(), dense->weight.grad()));
  }
  // With a residual, its gradient is ReLU's (and the input's gradient the same with or without
  // one asked for the residual).
  BatchNorm with = make(), without = make();
  torch::Tensor xa = x0.clone().requires_grad_(true), xb = x0.clone().requires_grad_(true);
  const torch::Tensor r = torch::randn({3, 6, 7, 5});
  torch::Tensor ra = r.clone().requires_grad_(true);
  const torch::Tensor ya = with->forward_add_relu(xa, ra);
  (ya * g).sum().backward();
  (without->forward_add_relu(xb, r) * g).sum().backward();
  CHECK(torch::equal(ra.grad(), at::threshold_backward(g, ya.detach(), 0)));
  CHECK(torch::equal(xa.grad(), xb.grad()));
  CHECK(torch::equal(with->weight.grad(), without->weight.grad()));
}

namespace {

// A BatchNorm with the given weight and bias (c channels, linearly spaced), in training mode.
BatchNorm trained_bn(int64_t c, double w0, double w1, double b0, double b1) {
  BatchNorm bn(c, 1e-5, 0.1);
  torch::NoGradGuard no_grad;
  bn->weight.copy_(torch::linspace(w0, w1, c));
  bn->bias.copy_(torch::linspace(b0, b1, c));
  bn->train();
  return bn;
}

torch::Tensor cl(const torch::Tensor& t) { return t.contiguous(at::MemoryFormat::ChannelsLast); }

// The largest |a - b| beyond a relative part of |b| (bf16 rounds to 8 significant bits).
double beyond(const torch::Tensor& a, const torch::Tensor& b, double rel) {
  return ((a.to(torch::kDouble) - b.to(torch::kDouble)).abs() - b.to(torch::kDouble).abs() * rel)
      .max()
      .item<double>();
}

}  // namespace

TEST_CASE("bf16 channels_last: the own kernel computes BN + ReLU in float, rounded once",
          "[model][bn_relu][bf16]") {
  // 4 x 9 x 9 = 324 rows (three chunks); 40 channels: two 16-lane vectors and 8 in the scalar
  // loop. The reference is float32 BatchNorm2d + ReLU on the same (bf16-exact) values: the own
  // output is that rounded to bf16 (2^-8 relative at most), its gradients that within bf16's
  // rounding of dx and float sums' order.
  torch::manual_seed(12);
  const torch::Tensor x0 = cl((torch::randn({4, 40, 9, 9}) * 2 + 1).to(torch::kBFloat16));
  const torch::Tensor g0 = cl(torch::randn({4, 40, 9, 9}).to(torch::kBFloat16));
  BatchNorm ours = trained_bn(40, -1.5, 2.0, 0.4, -0.3);
  BatchNorm ref = trained_bn(40, -1.5, 2.0, 0.4, -0.3);
  torch::Tensor xb = x0.clone().requires_grad_(true);
  torch::Tensor xf = x0.to(torch::kFloat).requires_grad_(true);
  const torch::Tensor yb = ours->forward_relu(xb);
  const torch::Tensor yf = ref(xf).relu_();
  CHECK(yb.scalar_type() == torch::kBFloat16);
  CHECK(yb.is_contiguous(at::MemoryFormat::ChannelsLast));
  CHECK(beyond(yb, yf, 1.0 / 256) < 1e-5);
  CHECK(((yb > 0) == (yf > 0)).all().item<bool>());
  (yb * g0).sum().backward();
  (yf * g0.to(torch::kFloat)).sum().backward();
  const double dx_scale = xf.grad().abs().max().item<double>();
  CHECK(beyond(xb.grad(), xf.grad(), 1.0 / 256) < 1e-4 * dx_scale);
  CHECK(worst(ours->weight.grad(), ref->weight.grad()) < 1e-4);
  CHECK(worst(ours->bias.grad(), ref->bias.grad()) < 1e-4);
  CHECK(worst(ours->running_mean, ref->running_mean) < 1e-5);
  CHECK(worst(ours->running_var, ref->running_var) < 1e-5);

  // And close to what ATen's bf16 batch norm, relu_ and threshold_backward give (the trainer's
  // path before the own kernel took bf16).
  torch::Tensor xa = x0.clone().requires_grad_(true);
  BatchNorm aten = trained_bn(40, -1.5, 2.0, 0.4, -0.3);
  const torch::Tensor ya = torch::batch_norm(xa, aten->weight, aten->bias, aten->running_mean,
                                             aten->running_var, true, 0.1, 1e-5, false)
                               .relu_();
  CHECK(beyond(yb, ya, 1.0 / 128) < 1e-5);
  (ya * g0).sum().backward();
  CHECK(beyond(xb.grad(), xa.grad(), 1.0 / 64) < 1e-3 * dx_scale);
}

TEST_CASE("bf16 channels_last: forward_add_relu rounds as BN, += residual, relu_ in bf16",
          "[model][bn_relu][bf16]") {
  torch::manual_seed(13);
  const torch::Tensor x0 = cl((torch::randn({3, 24, 7, 5}) * 2 + 1).to(torch::kBFloat16));
  const torch::Tensor r0 = cl(torch::randn({3, 24, 7, 5}).to(torch::kBFloat16));
  const torch::Tensor g0 = cl(torch::randn({3, 24, 7, 5}).to(torch::kBFloat16));
  BatchNorm fused = trained_bn(24, -1.5, 2.0, 0.4, -0.3);
  BatchNorm steps = trained_bn(24, -1.5, 2.0, 0.4, -0.3);
  torch::Tensor xb = x0.clone().requires_grad_(true), rb = r0.clone().requires_grad_(true);
  torch::Tensor xa = x0.clone().requires_grad_(true), ra = r0.clone().requires_grad_(true);
  const torch::Tensor yb = fused->forward_add_relu(xb, rb);
  // The three steps with the own BN (bf16 out), then bf16 addition and ReLU: the same roundings.
  torch::Tensor ya = steps(xa);
  ya += ra;
  ya.relu_();
  CHECK(yb.scalar_type() == torch::kBFloat16);
  CHECK(torch::equal(yb, ya));
  CHECK((yb == 0).any().item<bool>());
  (yb * g0).sum().backward();
  (ya * g0).sum().backward();
  CHECK(torch::equal(rb.grad(), ra.grad()));  // g: dy masked, exact in bf16
  CHECK(torch::equal(xb.grad(), xa.grad()));
  CHECK(torch::equal(fused->weight.grad(), steps->weight.grad()));
  CHECK(torch::equal(fused->bias.grad(), steps->bias.grad()));
}

TEST_CASE("backward: the ReLU mask recomputed from x gives the saved output's bits",
          "[model][bn_relu]") {
  // forward_relu saves no output and the backward recomputes ReLU's mask from x; a zero residual
  // (bits of BN's output unchanged) makes the kernel save y and read the mask from it. The
  // gradients must be the same bits, in NCHW float32 and channels_last float32 and bf16, whatever
  // the thread count.
  torch::manual_seed(14);
  for (const auto& [dtype, channels_last] :
       {std::pair{torch::kFloat, false}, std::pair{torch::kFloat, true},
        std::pair{torch::kBFloat16, true}}) {
    INFO("dtype " << dtype << ", channels_last " << channels_last);
    const auto layout =
        channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    const torch::Tensor x0 = (torch::randn({4, 40, 9, 9}) * 2 + 1).to(dtype).contiguous(layout);
    const torch::Tensor g0 = torch::randn({4, 40, 9, 9}).to(dtype).contiguous(layout);
    const int threads = torch::get_num_threads();
    std::vector<torch::Tensor> outs;
    for (const int t : {1, 2, 3}) {
      torch::set_num_threads(t);
      for (const bool with_residual : {false, true}) {
        BatchNorm bn = trained_bn(40, -1.5, 2.0, 0.4, -0.3);
        torch::Tensor x = x0.clone().requires_grad_(true);
        const torch::Tensor y =
            with_residual ? bn->forward_add_relu(x, torch::zeros_like(x0)) : bn->forward_relu(x);
        (y * g0).sum().backward();
        outs.push_back(
            torch::cat({y.contiguous().flatten().to(torch::kFloat),
                        x.grad().contiguous().flatten().to(torch::kFloat), bn->weight.grad(),
                        bn->bias.grad(), bn->running_mean, bn->running_var}));
      }
    }
    torch::set_num_threads(threads);
    CHECK((outs[0].slice(0, 0, x0.numel()) == 0).any().item<bool>());  // the mask is exercised
    for (size_t i = 1; i < outs.size(); ++i) CHECK(torch::equal(outs[i], outs[0]));
  }
}

namespace {

// Values exact on every machine (integer arithmetic, one IEEE division, RNE to bf16), unlike
// torch::randn, whose vectorised fill may differ by machine.
torch::Tensor exact_values(at::IntArrayRef shape, int64_t prime, double scale, double shift) {
  int64_t numel = 1;
  for (const int64_t d : shape) numel *= d;
  return ((torch::arange(numel, torch::kLong) * prime) % 1009)
      .to(torch::kFloat)
      .div_(scale)
      .sub_(shift)
      .view(shape);
}

// FNV-1a over a tensor's bytes in its logical (contiguous NCHW) order.
uint64_t fnv1a(uint64_t h, const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  for (size_t i = 0; i < c.numel() * c.element_size(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

TEST_CASE("the own kernels give the same bits on every machine", "[model][bn_relu][golden]") {
  // Each kernel is compiled for AVX-512, AVX2 and the baseline and its sums' order is the code's:
  // whichever clone this CPU runs (valgrind, which has no AVX-512, runs the AVX2 one) and whatever
  // LibTorch, the output, input gradient and parameter gradients hash to the values below. A
  // change to a kernel's arithmetic changes them: update them only on purpose.
  struct Case {
    const char* name;
    torch::ScalarType dtype;
    bool channels_last, residual;
    uint64_t want;
  };
  const Case cases[] = {
      {"NCHW float32", torch::kFloat, false, false, 0xfb7dfe4cf9675499ull},
      {"NCHW float32 + residual", torch::kFloat, false, true, 0xaadcfa08b33ebf79ull},
      {"channels_last float32", torch::kFloat, true, false, 0x304c1b9c30855954ull},
      {"channels_last float32 + residual", torch::kFloat, true, true, 0xb4d9f7d674ba9637ull},
      {"channels_last bf16", torch::kBFloat16, true, false, 0xcadd5d27b2b09eeeull},
      {"channels_last bf16 + residual", torch::kBFloat16, true, true, 0xef0534ace2a45912ull},
  };
  for (const Case& k : cases) {
    INFO(k.name);
    const auto layout =
        k.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    // 4 x 9 x 9 = 324 rows (three chunks), 9 x 9 planes (an 8-lane loop and a remainder), 40
    // channels (two 16-lane vectors and a remainder).
    const torch::Tensor x0 =
        exact_values({4, 40, 9, 9}, 7919, 97, 4).to(k.dtype).contiguous(layout);
    const torch::Tensor r0 =
        exact_values({4, 40, 9, 9}, 104729, 211, 2).to(k.dtype).contiguous(layout);
    const torch::Tensor g0 =
        exact_values({4, 40, 9, 9}, 15485863, 331, 1.5).to(k.dtype).contiguous(layout);
    BatchNorm bn(40, 1e-5, 0.1);
    {
      torch::NoGradGuard no_grad;
      bn->weight.copy_((torch::arange(40).to(torch::kFloat) - 15) / 8);
      bn->bias.copy_((torch::arange(40).to(torch::kFloat) - 20) / 16);
    }
    bn->train();
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor r = r0.clone().requires_grad_(true);
    const torch::Tensor y = k.residual ? bn->forward_add_relu(x, r) : bn->forward_relu(x);
    (y * g0).sum().backward();
    uint64_t h = 1469598103934665603ull;
    for (const torch::Tensor& t : {y, x.grad(), bn->weight.grad(), bn->bias.grad()})
      h = fnv1a(h, t);
    if (k.residual) h = fnv1a(h, r.grad());
    INFO("hash 0x" << std::hex << h);
    CHECK(h == k.want);
  }
}
