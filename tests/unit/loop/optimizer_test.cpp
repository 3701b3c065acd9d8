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
