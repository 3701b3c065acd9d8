// The training recipe's pieces against PyTorch and torchvision themselves
// (tests/parity/recipe_parity.py): ReduceLROnPlateau on a fixed metric trace, mixup/CutMix for a
// given lambda and box (torchvision.transforms.v2 where the Python has it, else the
// classification reference's arithmetic), clip_grad_norm_, the EMA decay adjustment. Run with
// TRAINER_PYTHON (Debian's torch 1.13; required) and, where it exists, the pip venv's Python
// (torch 2.11, torchvision 0.26).
#include "common/catch.h"

#include "common/run_command.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "trainer/loop/ema.h"
#include "trainer/loop/mixing.h"
#include "trainer/loop/step.h"
#include "trainer/loop/watch.h"

using namespace trainer::train;

namespace {

constexpr const char* kVenvPython = "/opt/trainer/venv-torch-2.11.0/bin/python";

// The Pythons to compare against: Debian's (required) and the pip venv's (when present).
std::vector<std::string> pythons() {
  std::vector<std::string> out = {TRAINER_PYTHON};
  if (std::filesystem::exists(kVenvPython)) {
    out.emplace_back(kVenvPython);
  } else {
    WARN("no " << kVenvPython << " (scripts/install-deps.sh --torch pip): compared with "
               << TRAINER_PYTHON << " only");
  }
  return out;
}

nlohmann::json script(const std::string& python, const std::string& args) {
  const std::string path = std::string(TRAINER_SOURCE_DIR) + "/tests/parity/recipe_parity.py";
  const trainer::test_support::Run r =
      trainer::test_support::run_command(python + " '" + path + "' " + args);
  INFO(python << " " << args << "\n" << r.output);
  REQUIRE(r.rc == 0);
  const size_t line = r.output.rfind('{');
  REQUIRE(line != std::string::npos);
  return nlohmann::json::parse(r.output.substr(line));
}

// Many cases in one interpreter start: each case is the argument list of one subcommand.
nlohmann::json batch(const std::string& python, const std::vector<std::vector<std::string>>& cases,
                     const std::filesystem::path& dir) {
  const std::string file = (dir / "cases.json").string();
  std::ofstream(file) << nlohmann::json(cases).dump();
  const std::string path = std::string(TRAINER_SOURCE_DIR) + "/tests/parity/recipe_parity.py";
  const trainer::test_support::Run r =
      trainer::test_support::run_command(python + " '" + path + "' batch --cases '" + file + "'");
  INFO(python << "\n" << r.output);
  REQUIRE(r.rc == 0);
  const size_t start = r.output.rfind("\n[");
  const nlohmann::json out =
      nlohmann::json::parse(start == std::string::npos ? r.output : r.output.substr(start + 1));
  REQUIRE(out.size() == cases.size());
  return out;
}

std::string exact(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

void write_f32(const std::string& path, const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kFloat32).contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * 4);
  REQUIRE(f.good());
}

torch::Tensor read_f32(const std::string& path, std::vector<int64_t> shape) {
  torch::Tensor t = torch::empty(shape, torch::kFloat32);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(t.data_ptr<float>()), t.numel() * 4);
  REQUIRE(f.gcount() == t.numel() * 4);
  return t;
}

std::string join(const std::vector<double>& v) {
  std::ostringstream s;
  s.precision(17);
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str();
}

}  // namespace

TEST_CASE("plateau schedule steps as PyTorch's ReduceLROnPlateau", "[parity][recipe]") {
  trainer::test_support::TempDir dir;
  const std::vector<double> trace = {1.0,  0.9,  0.95, 0.96, 0.97, 0.5, 0.6,  0.4999, 0.7,  0.8,
                                     0.81, 0.82, 0.83, 0.84, 0.85, 0.3, 0.31, 0.32,   0.33, 0.34};
  struct Case {
    std::string mode;
    double factor;
    int patience;
    double min_lr;
  };
  const std::vector<Case> cases = {Case{"min", 0.5, 1, 0.01}, Case{"min", 0.1, 0, 0.0},
                                   Case{"max", 0.3, 2, 0.001}, Case{"min", 0.5, 3, 0.05}};
  std::vector<std::vector<std::string>> args;
  for (const Case& c : cases) {
    args.push_back({"plateau", "--mode", c.mode, "--factor", exact(c.factor), "--patience",
                    std::to_string(c.patience), "--min-lr", exact(c.min_lr), "--lr", "0.1",
                    "--trace", join(trace)});
  }
  for (const std::string& python : pythons()) {
    const nlohmann::json expected = batch(python, args, dir.path());
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      ReduceOnPlateau ours(c.mode == "max", c.factor, c.patience, c.min_lr, 0.1);
      for (size_t i = 0; i < trace.size(); ++i) {
        ours.step(trace[i]);
        INFO(python << " mode " << c.mode << " patience " << c.patience << " epoch " << i);
        CHECK(ours.lr() == Approx(expected[k]["lrs"][i].get<double>()).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("mixup and CutMix match torchvision for a given lambda and box", "[parity][recipe]") {
  trainer::test_support::TempDir dir;
  torch::manual_seed(5);
  const torch::Tensor images = torch::randn({4, 3, 6, 7});
  const torch::Tensor labels = torch::tensor({3, 0, 2, 3}, torch::kInt64);
  const std::string in = (dir.path() / "images.f32").string();
  write_f32(in, images);
  std::vector<MixDraw> draws;
  MixDraw m;
  m.kind = "mixup";
  m.lambda = 0.3719;
  draws.push_back(m);
  for (uint64_t seed : {1, 2, 3, 4, 5, 6}) {
    const MixDraw d = draw_mix(MixOptions{0, 1.0}, 6, 7, seed);
    draws.push_back(d);
  }
  std::vector<std::vector<std::string>> args;
  for (size_t k = 0; k < draws.size(); ++k) {
    const MixDraw& d = draws[k];
    const std::string n = std::to_string(k);
    std::vector<std::string> a = {"mix",
                                  "--kind",
                                  d.kind,
                                  "--shape",
                                  "4,3,6,7",
                                  "--classes",
                                  "4",
                                  "--images",
                                  in,
                                  "--labels",
                                  "3,0,2,3",
                                  "--out-images",
                                  (dir.path() / ("o" + n + ".f32")).string(),
                                  "--out-targets",
                                  (dir.path() / ("t" + n + ".f32")).string()};
    if (d.kind == "mixup") a.insert(a.end(), {"--lam", exact(d.lambda)});
    if (d.kind == "cutmix") {
      a.insert(a.end(), {"--box", std::to_string(d.x1) + "," + std::to_string(d.y1) + "," +
                                      std::to_string(d.x2) + "," + std::to_string(d.y2)});
    }
    args.push_back(a);
  }
  for (const std::string& python : pythons()) {
    const nlohmann::json r = batch(python, args, dir.path());
    for (size_t k = 0; k < draws.size(); ++k) {
      const MixDraw& d = draws[k];
      const Mixed ours = apply_mix(images, labels, 4, d);
      const std::string n = std::to_string(k);
      INFO(python << ": " << r[k].dump() << " kind " << d.kind << " lambda " << d.lambda);
      const torch::Tensor theirs_images =
          read_f32((dir.path() / ("o" + n + ".f32")).string(), {4, 3, 6, 7});
      const torch::Tensor theirs_targets =
          read_f32((dir.path() / ("t" + n + ".f32")).string(), {4, 4});
      CHECK(torch::equal(ours.images, theirs_images));
      CHECK(torch::equal(ours.targets, theirs_targets));
    }
  }
}

TEST_CASE("clip_grad_norm and the EMA decay match PyTorch and torchvision's reference",
          "[parity][recipe]") {
  trainer::test_support::TempDir dir;
  torch::manual_seed(6);
  const std::vector<int64_t> sizes = {5, 11, 3};
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> grads;
  for (int64_t n : sizes) {
    params.push_back(torch::zeros({n}, torch::requires_grad()));
    grads.push_back(torch::randn({n}) * 3);
  }
  const std::string path = (dir.path() / "grads.f32").string();
  write_f32(path, torch::cat(grads));
  for (const std::string& python : pythons()) {
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].clone();
    const nlohmann::json r =
        script(python, "clip --max-norm 2.5 --grads '" + path + "' --sizes 5,11,3");
    const torch::Tensor total = clip_grad_norm(params, 2.5);
    CHECK(total.item<double>() == Approx(r["total"].get<double>()).epsilon(1e-6));
    std::vector<torch::Tensor> ours;
    for (auto& p : params) ours.push_back(p.grad());
    const torch::Tensor theirs = read_f32(path + ".out", {19});
    CHECK((torch::cat(ours) - theirs).abs().max().item<double>() <= 1e-6);

    const nlohmann::json e =
        script(python, "ema --decay 0.99998 --batch 256 --steps 32 --epochs 90");
    CHECK(adjusted_ema_decay(0.99998, 256, 32, 90) ==
          Approx(e["decay"].get<double>()).epsilon(1e-14));
  }
}
