// The training recipe's loop pieces: losses (focal, bi-tempered, class weights), mixup/CutMix
// draws, the EMA, parameter groups for weight decay, gradient clipping, and the validation
// decisions (plateau, early stopping, best). Parity with PyTorch/torchvision is in
// recipe_parity_test.cpp.
#include "common/catch.h"

#include <torch/torch.h>

#include <cmath>
#include <set>

#include "trainer/config/job_spec.h"
#include "trainer/loop/ema.h"
#include "trainer/loop/losses.h"
#include "trainer/loop/mixing.h"
#include "trainer/loop/optimizer.h"
#include "trainer/loop/runtime.h"
#include "trainer/loop/step.h"
#include "trainer/loop/watch.h"
#include "trainer/model/net.h"
#include "trainer/util/error.h"

using namespace trainer;
using namespace trainer::train;

namespace {

torch::Tensor seeded(std::vector<int64_t> shape, int64_t seed) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  return torch::randn(shape);
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

TEST_CASE("bi-tempered loss with t1 = t2 = 1 is cross-entropy", "[recipe]") {
  const torch::Tensor logits = seeded({6, 5}, 1) * 3;
  const torch::Tensor labels = torch::tensor({0, 4, 2, 2, 1, 3}, torch::kInt64);
  LossOptions ce;
  LossOptions bt;
  bt.kind = "bi_tempered";
  for (double smoothing : {0.0, 0.1}) {
    ce.label_smoothing = bt.label_smoothing = smoothing;
    const double expected = training_loss(logits, labels, ce).item<double>();
    const double got = training_loss(logits, labels, bt).item<double>();
    INFO("label_smoothing " << smoothing);
    if (smoothing == 0) {
      CHECK(got == Approx(expected).epsilon(1e-6));
    } else {
      // The reference smooths as t (1 - e C / (C - 1)) + e / (C - 1), and the loss adds the
      // targets' (constant) negative entropy to the cross-entropy against them.
      const torch::Tensor t =
          torch::nn::functional::one_hot(labels, 5).to(torch::kFloat) * (1 - smoothing * 5 / 4) +
          smoothing / 4;
      LossOptions soft;
      const double ce_soft = training_loss(logits, t, soft).item<double>();
      const double neg_entropy = (t * (t + 1e-10).log()).sum(1).mean().item<double>();
      CHECK(got == Approx(ce_soft + neg_entropy).epsilon(1e-5));
    }
  }
  // Other temperatures give another, finite loss; the tempered softmax rows sum to one.
  bt.t1 = 0.8;
  bt.t2 = 1.2;
  bt.label_smoothing = 0;
  const double tempered = training_loss(logits, labels, bt).item<double>();
  CHECK(std::isfinite(tempered));
  CHECK(tempered != Approx(training_loss(logits, labels, ce).item<double>()).epsilon(1e-3));
  const torch::Tensor p = tempered_softmax(logits, 1.5);
  CHECK(max_diff(p.sum(1), torch::ones({6})) < 1e-4);
  CHECK(p.min().item<double>() >= 0);
}

TEST_CASE("focal loss with gamma 0 is cross-entropy, and gamma > 0 down-weights easy examples",
          "[recipe]") {
  const torch::Tensor logits = seeded({8, 4}, 2) * 2;
  const torch::Tensor labels = torch::tensor({0, 1, 2, 3, 3, 2, 1, 0}, torch::kInt64);
  LossOptions ce;
  LossOptions focal;
  focal.kind = "focal";
  focal.focal_gamma = 0;
  CHECK(training_loss(logits, labels, focal).item<double>() ==
        Approx(training_loss(logits, labels, ce).item<double>()).epsilon(1e-6));
  focal.focal_gamma = 2;
  CHECK(training_loss(logits, labels, focal).item<double>() <
        training_loss(logits, labels, ce).item<double>());
}

TEST_CASE("class weights follow nn.CrossEntropyLoss(weight=...)", "[recipe]") {
  const torch::Tensor logits = seeded({5, 3}, 3);
  const torch::Tensor labels = torch::tensor({0, 1, 2, 2, 0}, torch::kInt64);
  LossOptions o;
  o.class_weights = torch::tensor({1.0f, 2.0f, 0.5f});
  // Hard labels: sum_i w[y_i] nll_i / sum_i w[y_i].
  const torch::Tensor nll = -logits.log_softmax(1).gather(1, labels.unsqueeze(1)).squeeze(1);
  const torch::Tensor w = o.class_weights.index_select(0, labels);
  CHECK(training_loss(logits, labels, o).item<double>() ==
        Approx(((w * nll).sum() / w.sum()).item<double>()).epsilon(1e-6));

  CHECK(class_weights({"none"}, 3, {}).empty());
  const auto balanced = class_weights({"balanced"}, 3, {6, 3, 1});
  REQUIRE(balanced.size() == 3);
  CHECK(balanced[0] == Approx(10.0 / 18));
  CHECK(balanced[1] == Approx(10.0 / 9));
  CHECK(balanced[2] == Approx(10.0 / 3));
  CHECK(class_weights({"1", "2.5"}, 2, {}) == std::vector<double>{1, 2.5});
  CHECK_THROWS_AS(class_weights({"1", "2"}, 3, {}), ConfigError);
  CHECK_THROWS_AS(class_weights({"balanced"}, 3, {}), ConfigError);
}

TEST_CASE("class-weighted cross-entropy: micro-batch sums over the batch's weight add up",
          "[recipe]") {
  const torch::Tensor logits = seeded({8, 3}, 11);
  const torch::Tensor labels = torch::tensor({0, 0, 0, 1, 2, 0, 1, 1}, torch::kInt64);
  LossOptions o;
  o.class_weights = torch::tensor({0.25f, 2.0f, 1.0f});
  o.label_smoothing = 0.1;
  const double batch = training_loss(logits, labels, o).item<double>();
  const torch::Tensor total = o.class_weights.index_select(0, labels).sum();
  double parts = 0;
  for (int64_t start : {0, 3, 6}) {
    const int64_t len = std::min<int64_t>(3, 8 - start);
    parts +=
        (weighted_cross_entropy_sum(logits.narrow(0, start, len), labels.narrow(0, start, len), o) /
         total)
            .item<double>();
  }
  CHECK(parts == Approx(batch).epsilon(1e-6));
}

TEST_CASE("mixing rows with their partners equals mixing the whole batch", "[recipe]") {
  const torch::Tensor images = seeded({5, 3, 4, 4}, 12);
  const torch::Tensor labels = torch::tensor({0, 1, 2, 1, 0}, torch::kInt64);
  for (const uint64_t seed : {1, 2, 3, 4}) {
    const MixDraw d = draw_mix(MixOptions{0.4, 1.0}, 4, 4, seed);
    const Mixed whole = apply_mix(images, labels, 3, d);
    const torch::Tensor rows = torch::tensor({1, 2, 3}, torch::kInt64);
    const torch::Tensor partners = torch::tensor({0, 1, 2}, torch::kInt64);
    const Mixed part =
        apply_mix_rows(images.index_select(0, rows), images.index_select(0, partners),
                       labels.index_select(0, rows), labels.index_select(0, partners), 3, d);
    CHECK(torch::equal(part.images, whole.images.narrow(0, 1, 3)));
    CHECK(torch::equal(part.targets, whole.targets.narrow(0, 1, 3)));
  }
}

TEST_CASE("mixup/CutMix draws: lambda ~ Beta(alpha, alpha), one of the two per batch", "[recipe]") {
  MixOptions both{0.2, 1.0};
  int mixup = 0;
  int cutmix = 0;
  double sum_cut = 0;
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    const MixDraw d = draw_mix(both, 32, 48, seed);
    REQUIRE(d.lambda >= 0);
    REQUIRE(d.lambda <= 1);
    if (d.kind == "mixup") {
      ++mixup;
    } else {
      REQUIRE(d.kind == "cutmix");
      ++cutmix;
      REQUIRE(0 <= d.x1);
      REQUIRE(d.x1 <= d.x2);
      REQUIRE(d.x2 <= 48);
      REQUIRE(0 <= d.y1);
      REQUIRE(d.y1 <= d.y2);
      REQUIRE(d.y2 <= 32);
      REQUIRE(d.lambda == Approx(1.0 - double((d.x2 - d.x1) * (d.y2 - d.y1)) / (32 * 48)));
      sum_cut += d.lambda;
    }
  }
  CHECK(std::abs(mixup - 2000) < 150);  // half and half (5 sigma: 158)
  CHECK(cutmix + mixup == 4000);
  // Beta(a, a) has mean 1/2 and variance 1 / (4 (2a + 1)).
  for (double alpha : {0.2, 1.0, 4.0}) {
    MixOptions m{alpha, 0};
    double sum = 0;
    double sum2 = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
      const double l = draw_mix(m, 8, 8, static_cast<uint64_t>(i) + 77).lambda;
      sum += l;
      sum2 += l * l;
    }
    const double mean = sum / n;
    const double var = sum2 / n - mean * mean;
    INFO("alpha " << alpha);
    CHECK(mean == Approx(0.5).margin(0.01));
    CHECK(var == Approx(1.0 / (4 * (2 * alpha + 1))).epsilon(0.05));
  }
  CHECK(draw_mix(MixOptions{}, 8, 8, 1).kind == "none");
  // The draw is a function of the seed.
  const MixDraw a = draw_mix(both, 32, 32, 99);
  const MixDraw b = draw_mix(both, 32, 32, 99);
  CHECK(a.kind == b.kind);
  CHECK(a.lambda == b.lambda);
}

TEST_CASE("apply_mix mixes images and one-hot targets with the rolled batch", "[recipe]") {
  const torch::Tensor images = seeded({3, 3, 4, 5}, 4);
  const torch::Tensor labels = torch::tensor({2, 0, 1}, torch::kInt64);
  MixDraw d;
  d.kind = "mixup";
  d.lambda = 0.25;
  const Mixed m = apply_mix(images, labels, 3, d);
  CHECK(max_diff(m.images[0], images[0] * 0.25 + images[2] * 0.75) < 1e-6);
  CHECK(max_diff(m.targets[1], torch::tensor({0.25f, 0.f, 0.75f})) == 0);
  d.kind = "cutmix";
  d.x1 = 1, d.y1 = 0, d.x2 = 3, d.y2 = 2;
  d.lambda = 1.0 - 4.0 / 20;
  const Mixed c = apply_mix(images, labels, 3, d);
  using torch::indexing::Slice;
  CHECK(max_diff(c.images.index({1, Slice(), Slice(0, 2), Slice(1, 3)}),
                 images.index({0, Slice(), Slice(0, 2), Slice(1, 3)})) == 0);
  CHECK(max_diff(c.images.index({1, Slice(), Slice(2, 4)}),
                 images.index({1, Slice(), Slice(2, 4)})) == 0);
  CHECK(c.targets[1][0].item<float>() == Approx(0.8));
  CHECK(c.targets[1][2].item<float>() == Approx(0.2));
  // The input is not modified.
  CHECK(max_diff(images, seeded({3, 3, 4, 5}, 4)) == 0);
}

TEST_CASE(
    "EMA: the first update copies, then avg = d avg + (1 - d) w, with torchvision's adjustment",
    "[recipe]") {
  config::ModelSpec spec;
  spec.arch = "resnet18";
  torch::manual_seed(1);
  model::Net net = model::make_net({"resnet18", 3, 0});
  ModelSettings settings;
  WeightEma ema(net, spec, 3, settings, 0.5);
  const torch::Tensor w0 = net->parameters()[0].detach().clone();
  {
    torch::NoGradGuard g;
    net->parameters()[0].add_(1.0);
  }
  ema.update(net);  // count 0: copy
  CHECK(max_diff(ema.net()->parameters()[0], w0 + 1.0) == 0);
  {
    torch::NoGradGuard g;
    net->parameters()[0].add_(2.0);
  }
  ema.update(net);
  CHECK(max_diff(ema.net()->parameters()[0], (w0 + 1.0) * 0.5 + (w0 + 3.0) * 0.5) < 1e-6);
  CHECK(ema.count() == 2);
  ema.reset_count();
  ema.update(net);
  CHECK(max_diff(ema.net()->parameters()[0], net->parameters()[0]) == 0);
  // The reference's numbers: decay 0.99998, batch 1024, every 32 steps, 600 epochs.
  CHECK(adjusted_ema_decay(0.99998, 1024, 32, 600) == Approx(0.9989077333333323).epsilon(1e-12));
  CHECK(adjusted_ema_decay(0.9, 1024, 32, 1) == 0.0);  // alpha clamped to 1
}

TEST_CASE("weight decay groups follow torchvision's set_weight_decay", "[recipe]") {
  torch::manual_seed(2);
  model::Net net = model::make_net({"resnet18", 4, 0});
  config::OptimizerSpec spec;
  spec.name = "sgd";
  spec.weight_decay = 1e-4;
  auto one = weight_decay_groups(*net, spec);
  REQUIRE(one.size() == 1);
  CHECK(one[0].params.size() == net->parameters().size());
  spec.norm_weight_decay = "0";
  auto two = weight_decay_groups(*net, spec);
  REQUIRE(two.size() == 2);
  // resnet18: 20 BN layers (weight + bias each) -> 40 norm parameters; 20 convs + fc w + fc b.
  CHECK(two[1].name == "norm");
  CHECK(two[1].params.size() == 40);
  CHECK(two[0].params.size() == 22);
  CHECK(two[1].weight_decay == 0);
  spec.bias_weight_decay = "2e-5";
  auto three = weight_decay_groups(*net, spec);
  REQUIRE(three.size() == 3);
  CHECK(three[2].name == "bias");
  CHECK(three[2].params.size() == 21);  // every bias, BN's included (the reference's custom key)
  CHECK(three[1].params.size() == 20);  // BN weights
  CHECK(three[2].weight_decay == 2e-5);
  auto optimizer = make_optimizer(spec, three);
  REQUIRE(optimizer->param_groups().size() == 3);
  CHECK(static_cast<torch::optim::SGDOptions&>(optimizer->param_groups()[1].options())
            .weight_decay() == 0);
  CHECK(static_cast<torch::optim::SGDOptions&>(optimizer->param_groups()[0].options())
            .weight_decay() == 1e-4);
  set_learning_rate(*optimizer, 0.25);
  for (auto& g : optimizer->param_groups()) CHECK(g.options().get_lr() == 0.25);
  // Frozen parameters are in no group.
  model::freeze_backbone(*net);
  size_t n = 0;
  for (const auto& g : weight_decay_groups(*net, spec)) n += g.params.size();
  CHECK(n == 2);
}

TEST_CASE("clip_grad_norm scales the gradients to the max norm", "[recipe]") {
  std::vector<torch::Tensor> params = {torch::zeros({3}, torch::requires_grad()),
                                       torch::zeros({2}, torch::requires_grad())};
  params[0].mutable_grad() = torch::tensor({3.0f, 0.0f, 0.0f});
  params[1].mutable_grad() = torch::tensor({0.0f, 4.0f});
  const torch::Tensor total = clip_grad_norm(params, 1.0);
  CHECK(total.item<double>() == Approx(5.0));
  const double norm = std::sqrt(params[0].grad().pow(2).sum().item<double>() +
                                params[1].grad().pow(2).sum().item<double>());
  CHECK(norm == Approx(1.0).epsilon(1e-5));
  clip_grad_norm(params, 10.0);  // below the max: unchanged
  CHECK(std::sqrt(params[0].grad().pow(2).sum().item<double>() +
                  params[1].grad().pow(2).sum().item<double>()) == Approx(norm));
}

TEST_CASE("early stopping and best tracking decide on a fixed trace", "[recipe]") {
  EarlyStopping es(/*maximize=*/true, 0.01, 2);
  const std::vector<double> acc = {0.5, 0.6, 0.605, 0.61, 0.7, 0.69};
  std::vector<bool> stops;
  for (double a : acc) stops.push_back(es.step(a));
  // 0.605 and 0.61 are within min_delta of 0.6: two epochs without improvement -> stop.
  CHECK(stops == std::vector<bool>{false, false, false, true, false, false});
  BestTracker best(/*maximize=*/false);
  CHECK(best.step(1.0, 0));
  CHECK_FALSE(best.step(1.0, 1));
  CHECK(best.step(0.5, 2));
  CHECK(best.best_epoch() == 2);
  // State survives a checkpoint.
  BestTracker back(false);
  back.restore(best.state(), "test");
  CHECK(back.best() == 0.5);
  CHECK(back.best_epoch() == 2);
  EarlyStopping fresh(true, 0.01, 2);
  CHECK_THROWS_AS(fresh.restore(nlohmann::json::object(), "state.json: recipe"), DataError);
  BestTracker none(true);
  BestTracker none_back(true);
  none_back.restore(none.state(), "test");  // infinity survives as null
  CHECK(none_back.step(-1e300, 0));
}
