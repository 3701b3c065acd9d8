// The fp16 loss scaler's rule (GradScaler's: scale 2^16, x2 after growth_interval good steps, x0.5
// and a skipped step on inf/NaN), run on the CPU in fp32 with injected inf gradients, and its
// state through a checkpoint: a resumed run takes the same steps, bit for bit.
#include "common/catch.h"

#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <vector>

#include "train_test_util.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/loss_scaler.h"
#include "trainer/loop/optimizer.h"
#include "trainer/util/error.h"

using namespace trainer::train;
using namespace trainer::train::testing;
using trainer::test::Contains;

namespace {

// One step as the trainer's Stepper takes it with a scaler: scaled backward, unscale and check,
// the optimizer step unless skipped. `poison` puts an inf into fc.weight's gradient first (an
// fp16 overflow). Returns whether the optimizer stepped.
bool scaled_step(TinyNet& net, torch::optim::Optimizer& opt, LossScaler& scaler, int64_t step,
                 bool poison) {
  net->train();
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  const torch::Tensor x = seeded_input({4, 3, 8, 8}, 100 + static_cast<uint64_t>(step));
  const torch::Tensor y = torch::tensor({0, 1, 2, 1});
  scaler.scale_loss(torch::nn::functional::cross_entropy(net->forward(x), y)).backward();
  if (poison) {
    torch::NoGradGuard no_grad;
    net->fc->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  }
  const bool ok = scaler.unscale_and_update(net->parameters());
  if (ok) opt.step();
  return ok;
}

}  // namespace

TEST_CASE("LossScaler: disabled it is the identity", "[loss_scaler]") {
  LossScaler scaler(false);
  const torch::Tensor loss = torch::tensor(2.5f);
  CHECK(scaler.scale_loss(loss).is_same(loss));
  TinyNet net;
  torch::nn::functional::cross_entropy(net->forward(seeded_input({2, 3, 8, 8}, 1)),
                                       torch::tensor({0, 1}))
      .backward();
  const torch::Tensor before = net->fc->weight.grad().clone();
  net->fc->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  CHECK(scaler.unscale_and_update(net->parameters()));  // not even an inf stops it
  CHECK(std::isinf(net->fc->weight.grad()[0][0].item<float>()));
  CHECK(bit_equal(net->fc->weight.grad()[1], before[1]));
  CHECK(scaler.state() == nlohmann::json({{"scale", 65536.0}, {"growth_tracker", 0}}));
}

TEST_CASE("LossScaler: scaled gradients come back exactly as the unscaled ones", "[loss_scaler]") {
  torch::manual_seed(3);
  TinyNet a;
  TinyNet b;
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    torch::NoGradGuard no_grad;
    b->parameters()[i].copy_(a->parameters()[i]);
  }
  const torch::Tensor x = seeded_input({4, 3, 8, 8}, 7);
  const torch::Tensor y = torch::tensor({0, 1, 2, 1});
  torch::nn::functional::cross_entropy(a->forward(x), y).backward();
  LossScaler scaler(true);
  CHECK(scaler.scale() == 65536.0);
  scaler.scale_loss(torch::nn::functional::cross_entropy(b->forward(x), y)).backward();
  CHECK_FALSE(bit_equal(a->fc->weight.grad(), b->fc->weight.grad()));  // really scaled
  CHECK(scaler.unscale_and_update(b->parameters()));
  // A power of two in and out: the same bits as never scaling (fp32 compute, no overflow).
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    INFO("parameter " << i);
    CHECK(bit_equal(a->parameters()[i].grad(), b->parameters()[i].grad()));
  }
  CHECK(scaler.growth_tracker() == 1);
}

TEST_CASE("LossScaler: inf/NaN skips the step and halves the scale, good steps grow it",
          "[loss_scaler]") {
  torch::manual_seed(5);
  TinyNet net;
  auto opt = make_optimizer(adam_spec(), net->parameters());
  LossScalerOptions o;
  o.growth_interval = 3;
  LossScaler scaler(true, o);

  std::vector<torch::Tensor> before;
  for (const auto& p : net->parameters()) before.push_back(p.detach().clone());
  CHECK_FALSE(scaled_step(net, *opt, scaler, 0, /*poison=*/true));
  CHECK(scaler.scale() == 32768.0);
  CHECK(scaler.growth_tracker() == 0);
  CHECK(scaler.skipped_steps() == 1);
  // A skipped step changes no parameter, and Adam took no step (BN's running statistics moved in
  // the forward pass, as in PyTorch).
  for (size_t i = 0; i < before.size(); ++i) CHECK(bit_equal(before[i], net->parameters()[i]));
  CHECK(opt->state().empty());

  // A NaN counts as well.
  net->fc->bias.mutable_grad() = torch::full_like(net->fc->bias, std::nan(""));
  CHECK_FALSE(scaler.unscale_and_update(net->parameters()));
  CHECK(scaler.scale() == 16384.0);

  // Three good steps in a row: the scale doubles and the count starts again.
  for (int64_t s = 1; s <= 3; ++s) CHECK(scaled_step(net, *opt, scaler, s, false));
  CHECK(scaler.scale() == 32768.0);
  CHECK(scaler.growth_tracker() == 0);
  CHECK(scaled_step(net, *opt, scaler, 4, false));
  CHECK(scaler.growth_tracker() == 1);
  CHECK(scaler.skipped_steps() == 2);
}

TEST_CASE("LossScaler: resumed from a checkpoint, the run takes the same steps bit for bit",
          "[loss_scaler]") {
  TempDir tmp;
  LossScalerOptions o;
  o.growth_interval = 2;
  // Overflows at steps 1 and 5 (the second after the resume point), growth every 2 good steps.
  const std::set<int64_t> poisoned = {1, 5};
  constexpr int64_t kSteps = 8, kResumeAt = 4;

  torch::manual_seed(11);
  TinyNet straight;
  auto straight_opt = make_optimizer(adam_spec(), straight->parameters());
  LossScaler straight_scaler(true, o);
  fs::path ckpt;
  for (int64_t s = 0; s < kSteps; ++s) {
    scaled_step(straight, *straight_opt, straight_scaler, s, poisoned.count(s) > 0);
    if (s + 1 == kResumeAt) {
      ckpt = save_checkpoint(tmp / "checkpoints", {0, s + 1, s + 1}, "fp", {}, *straight,
                             *straight_opt, 3, straight_scaler.state());
    }
  }
  CHECK(straight_scaler.skipped_steps() == 2);

  torch::manual_seed(12);  // other initial weights: the restore must bring everything back
  TinyNet resumed;
  auto resumed_opt = make_optimizer(adam_spec(), resumed->parameters());
  LossScaler resumed_scaler(true, o);
  const CheckpointInfo info = verify_checkpoint(ckpt);
  REQUIRE_FALSE(info.loss_scaler.is_null());
  restore_checkpoint(info, *resumed, *resumed_opt, torch::kCPU);
  resumed_scaler.restore(info.loss_scaler, "state.json");
  CHECK(resumed_scaler.scale() == 65536.0);  // 2^16 -> 2^15 at step 1 -> 2^16 after 2 good
  CHECK(resumed_scaler.growth_tracker() == 0);
  for (int64_t s = kResumeAt; s < kSteps; ++s) {
    scaled_step(resumed, *resumed_opt, resumed_scaler, s, poisoned.count(s) > 0);
  }
  require_same_state(*straight, *resumed);
  CHECK(resumed_scaler.state() == straight_scaler.state());
}

TEST_CASE("LossScaler: a damaged state is a data error naming its origin", "[loss_scaler]") {
  LossScaler scaler(true);
  CHECK_THROWS_WITH(
      scaler.restore(nlohmann::json{{"scale", -1.0}, {"growth_tracker", 0}}, "'ckpt/state.json'"),
      Contains("'ckpt/state.json': loss_scaler") && Contains("positive finite"));
  CHECK_THROWS_AS(scaler.restore(nlohmann::json{{"scale", "big"}}, "x"), trainer::DataError);
  CHECK(scaler.scale() == 65536.0);  // unchanged by the refused states
}
