// make_optimizer: the configured LibTorch optimizer with the spec's options; set_learning_rate
// on every parameter group; an unknown name is a ConfigError.
#include "common/catch.h"

#include "train_test_util.h"
#include "trainer/config/job_spec.h"
#include "trainer/loop/optimizer.h"
#include "trainer/util/error.h"

using trainer::config::OptimizerSpec;
using trainer::train::make_optimizer;
using trainer::train::set_learning_rate;
using trainer::train::testing::TinyNet;

namespace {

OptimizerSpec spec_named(const std::string& name) {
  OptimizerSpec s;
  s.name = name;
  s.learning_rate = 0.03;
  s.weight_decay = 0.001;
  s.momentum = 0.8;
  s.nesterov = name == "sgd";
  return s;
}

}  // namespace

TEST_CASE("make_optimizer builds the named LibTorch optimizer with the spec's options",
          "[optimizer]") {
  TinyNet net;
  const size_t num_params = net->parameters().size();

  SECTION("adam") {
    auto opt = make_optimizer(spec_named("adam"), net->parameters());
    auto* adam = dynamic_cast<torch::optim::Adam*>(opt.get());
    REQUIRE(adam != nullptr);
    CHECK(dynamic_cast<torch::optim::AdamW*>(opt.get()) == nullptr);
    const auto& o = static_cast<const torch::optim::AdamOptions&>(adam->defaults());
    CHECK(o.lr() == 0.03);
    CHECK(o.weight_decay() == 0.001);
  }
  SECTION("adamw") {
    auto opt = make_optimizer(spec_named("adamw"), net->parameters());
    auto* adamw = dynamic_cast<torch::optim::AdamW*>(opt.get());
    REQUIRE(adamw != nullptr);
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(adamw->defaults());
    CHECK(o.lr() == 0.03);
    CHECK(o.weight_decay() == 0.001);  // not AdamW's own default of 1e-2
  }
  SECTION("sgd") {
    auto opt = make_optimizer(spec_named("sgd"), net->parameters());
    auto* sgd = dynamic_cast<torch::optim::SGD*>(opt.get());
    REQUIRE(sgd != nullptr);
    const auto& o = static_cast<const torch::optim::SGDOptions&>(sgd->defaults());
    CHECK(o.lr() == 0.03);
    CHECK(o.momentum() == 0.8);
    CHECK(o.nesterov());
    CHECK(o.weight_decay() == 0.001);
  }
  SECTION("every given parameter is in the optimizer") {
    auto opt = make_optimizer(spec_named("adam"), net->parameters());
    size_t n = 0;
    for (const auto& group : opt->param_groups()) n += group.params().size();
    CHECK(n == num_params);
  }
}

TEST_CASE("set_learning_rate changes every parameter group", "[optimizer]") {
  TinyNet net;
  for (const std::string name : {"adam", "adamw", "sgd"}) {
    INFO(name);
    auto opt = make_optimizer(spec_named(name), {net->conv1->weight, net->conv1->bias});
    opt->add_param_group(torch::optim::OptimizerParamGroup({net->fc->weight, net->fc->bias},
                                                           opt->defaults().clone()));
    REQUIRE(opt->param_groups().size() == 2);
    set_learning_rate(*opt, 0.125);
    for (auto& group : opt->param_groups()) CHECK(group.options().get_lr() == 0.125);
    set_learning_rate(*opt, 1e-5);
    for (auto& group : opt->param_groups()) CHECK(group.options().get_lr() == 1e-5);
  }
}

TEST_CASE("set_learning_rate takes effect on the next step", "[optimizer]") {
  // SGD without momentum: the update is exactly lr * grad.
  OptimizerSpec s;
  s.name = "sgd";
  s.momentum = 0;
  s.learning_rate = 1.0;
  torch::Tensor w = torch::zeros({3}, torch::requires_grad());
  auto opt = make_optimizer(s, {w});
  set_learning_rate(*opt, 0.25);
  w.mutable_grad() = torch::ones({3});
  opt->step();
  CHECK(torch::allclose(w.detach(), torch::full({3}, -0.25)));
}

TEST_CASE("make_optimizer rejects an unknown name with a ConfigError naming it", "[optimizer]") {
  TinyNet net;
  OptimizerSpec s;
  s.name = "rmsprop";
  try {
    make_optimizer(s, net->parameters());
    FAIL("no ConfigError thrown");
  } catch (const trainer::ConfigError& e) {
    const std::string message = e.what();
    CHECK(message.find("train.optimizer.name") != std::string::npos);
    CHECK(message.find("rmsprop") != std::string::npos);
  }
}

namespace {

// Three steps of `make` over a copy of `init`, with the gradients `grads` (one list per step);
// `split` > 0: the optimizer is saved after that many steps and a fresh one loads it (a resume).
std::vector<torch::Tensor> run_steps(
    const std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>& make,
    const std::vector<torch::Tensor>& init, const std::vector<std::vector<torch::Tensor>>& grads,
    size_t split = 0) {
  std::vector<torch::Tensor> params;
  for (const auto& t : init) params.push_back(t.clone().set_requires_grad(true));
  auto opt = make(params);
  for (size_t s = 0; s < grads.size(); ++s) {
    if (split > 0 && s == split) {
      std::ostringstream bytes;
      torch::serialize::OutputArchive out;
      opt->save(out);
      out.save_to(bytes);
      opt = make(params);
      torch::serialize::InputArchive in;
      std::istringstream read(bytes.str());
      in.load_from(read);
      opt->load(in);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = grads[s][i].defined() ? grads[s][i].clone() : torch::Tensor();
    }
    opt->step();
  }
  return params;
}

}  // namespace

TEST_CASE("the optimizers step as LibTorch's per-tensor ones and resume bit-exactly",
          "[optimizer]") {
  torch::manual_seed(11);
  // A channels_last weight whose gradient arrives contiguous, a bias, a parameter without a
  // gradient in the second step (frozen for a step).
  const std::vector<torch::Tensor> init = {
      torch::randn({4, 3, 3, 3}).contiguous(at::MemoryFormat::ChannelsLast), torch::randn({7}),
      torch::randn({5, 2})};
  std::vector<std::vector<torch::Tensor>> grads;
  for (int s = 0; s < 4; ++s) {
    grads.push_back({torch::randn({4, 3, 3, 3}), torch::randn({7}),
                     s == 1 ? torch::Tensor() : torch::randn({5, 2})});
  }
  for (const std::string name : {"adam", "adamw", "sgd"}) {
    INFO(name);
    OptimizerSpec s = spec_named(name);
    s.weight_decay = 0.01;
    auto ours = [&](std::vector<torch::Tensor> p) { return make_optimizer(s, std::move(p)); };
    auto libtorch = [&](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
      if (name == "adam") {
        return std::make_unique<torch::optim::Adam>(
            p, torch::optim::AdamOptions(s.learning_rate).weight_decay(s.weight_decay));
      }
      if (name == "adamw") {
        return std::make_unique<torch::optim::AdamW>(
            p, torch::optim::AdamWOptions(s.learning_rate).weight_decay(s.weight_decay));
      }
      return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(s.learning_rate)
                                                        .momentum(s.momentum)
                                                        .nesterov(s.nesterov)
                                                        .weight_decay(s.weight_decay));
    };
    const auto a = run_steps(ours, init, grads);
    const auto b = run_steps(libtorch, init, grads);
    const auto resumed = run_steps(ours, init, grads, 2);
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("parameter " << i);
      // The same update up to rounding (the fused kernels order the arithmetic their own way).
      CHECK(torch::allclose(a[i], b[i], 1e-5, 1e-6));
      CHECK(torch::equal(a[i], resumed[i]));  // save, load, go on: the same bits
      CHECK(a[i].is_contiguous(at::MemoryFormat::ChannelsLast) ==
            init[i].is_contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
}
