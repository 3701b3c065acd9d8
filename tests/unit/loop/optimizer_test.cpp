// make_optimizer: the configured LibTorch optimizer with the spec's options; set_learning_rate
// on every parameter group; an unknown name is a ConfigError.
#include "common/catch.h"

#include "train_test_util.h"
#include "trainer/config/job_spec.h"
#include "trainer/loop/optimizer.h"
#include "trainer/loop/optimizer_kernels.h"
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

TEST_CASE("a state loaded in other strides than its parameter's is updated element by element",
          "[optimizer]") {
  // A channels_last weight whose Adam state comes back contiguous (as a checkpoint written by
  // another build may give it): the one-pass step must not pair the wrong elements.
  torch::manual_seed(5);
  const torch::Tensor init = torch::randn({3, 4, 2, 2}).contiguous(at::MemoryFormat::ChannelsLast);
  const std::vector<torch::Tensor> grads = {torch::randn({3, 4, 2, 2}), torch::randn({3, 4, 2, 2})};
  OptimizerSpec s = spec_named("adam");
  auto run = [&](bool restride, bool libtorch) {
    torch::Tensor p = init.clone().set_requires_grad(true);
    std::unique_ptr<torch::optim::Optimizer> opt =
        libtorch ? std::make_unique<torch::optim::Adam>(
                       std::vector<torch::Tensor>{p},
                       torch::optim::AdamOptions(s.learning_rate).weight_decay(s.weight_decay))
                 : make_optimizer(s, {p});
    for (size_t i = 0; i < grads.size(); ++i) {
      if (i == 1 && restride) {
        for (auto& item : opt->state()) {
          auto& st = static_cast<torch::optim::AdamParamState&>(*item.second);
          st.exp_avg(st.exp_avg().contiguous());
          st.exp_avg_sq(st.exp_avg_sq().contiguous());
          REQUIRE_FALSE(st.exp_avg().strides() == p.strides());
        }
      }
      p.mutable_grad() = grads[i].clone();
      opt->step();
    }
    return p.detach();
  };
  const torch::Tensor plain = run(false, false);
  CHECK(torch::equal(run(true, false), plain));
  CHECK(torch::allclose(plain, run(false, true), 1e-5, 1e-6));
}

TEST_CASE("the one-pass Adam and SGD updates follow LibTorch's arithmetic, whatever the threads",
          "[optimizer]") {
  using trainer::train::adam_update;
  using trainer::train::AdamHyper;
  using trainer::train::sgd_update;
  using trainer::train::SgdHyper;
  torch::manual_seed(21);
  // 4099 elements: vector lanes, a scalar tail, and more than one task at two threads.
  const int64_t n = 4099;
  const torch::Tensor p0 = torch::randn({n}), g = torch::randn({n});
  const torch::Tensor m0 = torch::randn({n}) * 0.1, v0 = torch::rand({n}) * 0.01;
  const torch::Tensor x0 = torch::rand({n}) * 0.02;  // AMSGrad's maximum
  const int threads = at::get_num_threads();

  for (const bool decoupled : {false, true}) {
    for (const bool amsgrad : {false, true}) {
      INFO("decoupled " << decoupled << ", amsgrad " << amsgrad);
      AdamHyper h;
      h.lr = 0.01;
      h.weight_decay = 0.05;
      h.decoupled = decoupled;
      const int64_t step = 3;
      auto ours = [&](int nthreads, torch::Tensor* m, torch::Tensor* v, torch::Tensor* x) {
        at::set_num_threads(nthreads);
        torch::Tensor p = p0.clone();
        *m = m0.clone();
        *v = v0.clone();
        *x = x0.clone();
        adam_update(p, g, *m, *v, amsgrad ? *x : torch::Tensor(), step, h);
        at::set_num_threads(threads);
        return p;
      };
      torch::Tensor m1, v1, x1, m2, v2, x2;
      const torch::Tensor p1 = ours(1, &m1, &v1, &x1), p2 = ours(2, &m2, &v2, &x2);
      CHECK(torch::equal(p1, p2));
      CHECK(torch::equal(m1, m2));
      CHECK(torch::equal(v1, v2));
      CHECK(torch::equal(x1, x2));
      // LibTorch's per-tensor operations (adam.cpp, adamw.cpp), in double for reference.
      const auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
      torch::Tensor rp = d(p0), rg = d(g), rm = d(m0), rv = d(v0), rx = d(x0);
      if (decoupled) rp = rp * (1 - h.lr * h.weight_decay);
      if (!decoupled) rg = rg + h.weight_decay * rp;
      rm = rm * h.beta1 + (1 - h.beta1) * rg;
      rv = rv * h.beta2 + (1 - h.beta2) * rg * rg;
      rx = torch::maximum(rx, rv);
      const double bc1 = 1 - std::pow(h.beta1, step), bc2 = 1 - std::pow(h.beta2, step);
      const torch::Tensor denom = (amsgrad ? rx : rv).sqrt() / std::sqrt(bc2) + h.eps;
      rp = rp - (h.lr / bc1) * rm / denom;
      CHECK(torch::allclose(d(p1), rp, 1e-6, 1e-7));
      CHECK(torch::allclose(d(m1), rm, 1e-6, 1e-7));
      CHECK(torch::allclose(d(v1), rv, 1e-6, 1e-9));
      if (amsgrad) CHECK(torch::allclose(d(x1), rx, 1e-6, 1e-9));
    }
  }

  for (const bool nesterov : {false, true}) {
    for (const bool first : {false, true}) {
      INFO("nesterov " << nesterov << ", first " << first);
      SgdHyper h;
      h.lr = 0.1;
      h.momentum = 0.9;
      h.dampening = nesterov ? 0 : 0.1;
      h.weight_decay = 1e-4;
      h.nesterov = nesterov;
      auto ours = [&](int nthreads, torch::Tensor* buf) {
        at::set_num_threads(nthreads);
        torch::Tensor p = p0.clone();
        *buf = m0.clone();
        sgd_update(p, g, *buf, first, h);
        at::set_num_threads(threads);
        return p;
      };
      torch::Tensor b1, b2;
      const torch::Tensor p1 = ours(1, &b1), p2 = ours(2, &b2);
      CHECK(torch::equal(p1, p2));
      CHECK(torch::equal(b1, b2));
      const auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
      torch::Tensor dp = d(g) + h.weight_decay * d(p0);
      const torch::Tensor rb = first ? dp : d(m0) * h.momentum + (1 - h.dampening) * dp;
      dp = nesterov ? dp + h.momentum * rb : rb;
      CHECK(torch::allclose(d(b1), rb, 1e-6, 1e-7));
      CHECK(torch::allclose(d(p1), d(p0) - h.lr * dp, 1e-6, 1e-7));
    }
  }

  SECTION("a tensor unlike its parameter is refused with what was expected") {
    AdamHyper h;
    SgdHyper sgd_h;
    sgd_h.momentum = 0.9;
    const torch::Tensor p = torch::zeros({2, 3});
    CHECK_THROWS_WITH(adam_update(p, torch::zeros({3, 2}), torch::zeros({2, 3}),
                                  torch::zeros({2, 3}), torch::Tensor(), 1, h),
                      trainer::test::Contains("the gradient must be a float32 CPU tensor"));
    CHECK_THROWS_WITH(
        sgd_update(p, torch::zeros({2, 3}), torch::zeros({2, 3}, torch::kDouble), false, sgd_h),
        trainer::test::Contains("the momentum buffer"));
  }
}
