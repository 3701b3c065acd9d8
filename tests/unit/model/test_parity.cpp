// Parity with torchvision: our weights give torchvision's logits and torchvision's weights give
// ours (tests/parity/torchvision_parity.py), against TRAINER_PYTHON's torchvision (Debian's 0.14)
// and, where it exists, the PyTorch 2.11 venv's (0.26). Needs python3-torchvision; without it
// the test fails and says how to install it.
#include "common/catch.h"

#include <filesystem>
#include <iostream>

#include "model_test_util.h"
#include "trainer/model/net.h"
#include "trainer/model/safetensors.h"

using namespace trainer::model;
using trainer::model::testing::calibrate_batchnorm;
using trainer::model::testing::find;
using trainer::model::testing::quoted;
using trainer::model::testing::require_torchvision;
using trainer::model::testing::Run;
using trainer::model::testing::run_command;
using trainer::model::testing::seeded_input;
using trainer::model::testing::TempDir;

namespace {

constexpr double kTolerance = 1e-4;
constexpr int kInitSeed = 7;  // our model's torch seed, passed on to the script
const char* const kVenvPython = "/opt/trainer/venv-torch-2.11.0/bin/python";

}  // namespace

TEST_CASE("ResNet, ResNeXt, Wide ResNet and EfficientNet match torchvision both ways", "[parity]") {
  require_torchvision();
  const int threads = torch::get_num_threads();
  torch::set_num_threads(2);
  const std::string script =
      std::string(TRAINER_SOURCE_DIR) + "/tests/parity/torchvision_parity.py";

  const std::vector<NetOptions> variants = {{"resnet50", 5, 0},
                                            {"resnet18", 3, 16},
                                            {"resnext50_32x4d", 5, 0},
                                            {"wide_resnet50_2", 4, 0},
                                            {"efficientnet_b0", 3, 16}};
  std::vector<std::string> pythons = {TRAINER_PYTHON};
  if (std::filesystem::exists(kVenvPython) && pythons[0] != kVenvPython) {
    pythons.push_back(kVenvPython);
  } else {
    WARN(kVenvPython << " is absent (the PyTorch 2.11 venv is optional): torchvision 0.26 not "
                        "compared");
  }
  // Against 0.26, one network of each family with the hidden head (the classes are the same
  // code in both torchvisions; the big ones cost CI a minute).
  const std::vector<NetOptions> second = {{"resnet18", 3, 16}, {"efficientnet_b0", 3, 16}};
  for (const std::string& python : pythons) {
    for (const NetOptions& options : python == pythons[0] ? variants : second) {
      INFO(python << ": " << options.arch << " num_classes " << options.num_classes
                  << " head_hidden " << options.head_hidden);
      TempDir dir;

      // (1) Our model, weights and logits.
      torch::manual_seed(kInitSeed);
      Net ours = make_net(options);
      calibrate_batchnorm(
          *ours, [&](torch::Tensor x) { return ours->forward(x); }, 8);
      const torch::Tensor input = seeded_input({2, 3, 64, 64}, 9);
      torch::Tensor logits;
      {
        torch::NoGradGuard no_grad;
        logits = ours->forward(input);
      }
      save_safetensors(dir.file("ours_state.safetensors"), state_dict(*ours),
                       {{"arch", options.arch}});
      save_safetensors(dir.file("ours_io.safetensors"), {{"input", input}, {"logits", logits}});

      // (2) torchvision loads ours (strict) and compares; it writes its own model and logits.
      const std::string command =
          python + " " + quoted(script) + " --arch " + options.arch + " --num-classes " +
          std::to_string(options.num_classes) + " --head-hidden " +
          std::to_string(options.head_hidden) + " --ours-state " +
          quoted(dir.file("ours_state.safetensors")) + " --ours-io " +
          quoted(dir.file("ours_io.safetensors")) + " --theirs-state " +
          quoted(dir.file("theirs_state.safetensors")) + " --theirs-io " +
          quoted(dir.file("theirs_io.safetensors")) + " --seed 4321 --tol 1e-4 --init-seed " +
          std::to_string(kInitSeed);
      const Run run = run_command(command);
      INFO("command: " << command << "\noutput:\n" << run.output);
      REQUIRE(run.rc == 0);
      std::cout << "[parity] " << options.arch << "/" << options.num_classes << "/"
                << options.head_hidden << " torchvision side: " << run.output;

      // (3) torchvision's weights in our model (strict) give torchvision's logits.
      torch::manual_seed(99);
      Net theirs = make_net(options);
      Metadata meta;
      const LoadReport report =
          load_state_dict(*theirs, load_safetensors(dir.file("theirs_state.safetensors"), &meta),
                          "theirs_state.safetensors");
      CHECK(report.reinitialised.empty());
      CHECK(meta["source"] == "torchvision");
      const StateDict io = load_safetensors(dir.file("theirs_io.safetensors"));
      REQUIRE(torch::equal(find(io, "input"), input));
      const torch::Tensor& expected = find(io, "logits");
      theirs->eval();
      torch::NoGradGuard no_grad;
      const torch::Tensor got = theirs->forward(input);
      REQUIRE(got.sizes() == expected.sizes());
      const double diff = (got - expected).abs().max().item<double>();
      std::cout << "[parity] " << options.arch << "/" << options.num_classes << "/"
                << options.head_hidden << " torchvision weights in ours: max |diff| = " << diff
                << " (logits max |x| = " << expected.abs().max().item<double>() << ")\n";
      CHECK(diff <= kTolerance);
      // The two models really differ (so the comparison is not vacuous).
      CHECK((expected - logits).abs().max().item<double>() > 1e-2);
    }
  }
  torch::set_num_threads(threads);
}
