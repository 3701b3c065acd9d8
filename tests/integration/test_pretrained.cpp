// A torchvision checkpoint as a user has it on disk: a .pth made by python3-torch at test time is
// model.pretrained as is, and `trainer convert` writes it once as safetensors.
#include "common/catch.h"

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

TEST_CASE("a torchvision .pth starts training as is and converts once to safetensors",
          "[pth][cli]") {
  TempDir dir("pth");
  const int made =
      sh("cd " + quote(dir.path().string()) + " && " + TRAINER_PYTHON +
         " -c 'import torch, torchvision; torch.manual_seed(1); "
         "torch.save(torchvision.models.resnet18().state_dict(), \"resnet18-test.pth\")'");
  if (made != 0) {
    FAIL("this test needs torch and torchvision for " TRAINER_PYTHON
         " (Debian: python3-torch python3-torchvision); run scripts/install-deps.sh as root");
  }
  make_dataset(dir.path(), "data", 4, 32);
  write_text(dir / "job.yaml", tiny_job_yaml(1));

  // convert: JSON summary, and the file holds torchvision's 122 tensors.
  const Result convert = run_trainer(dir.path(), "convert resnet18-test.pth r18.safetensors");
  INFO(convert.err);
  REQUIRE(convert.code == 0);
  const auto summary = nlohmann::json::parse(convert.out);
  CHECK(summary["tensors"] == 122);
  CHECK(summary["elements"] == 11699132);
  const auto converted = read_f32(dir / "r18.safetensors");
  REQUIRE(converted.count("conv1.weight"));
  const std::string before = slurp(dir / "r18.safetensors");

  // An existing OUT is kept unless --overwrite; bad input writes nothing.
  const Result again = run_trainer(dir.path(), "convert resnet18-test.pth r18.safetensors");
  CHECK(again.code == 2);
  CHECK_THAT(again.err, Contains("r18.safetensors") && Contains("--overwrite"));
  CHECK(slurp(dir / "r18.safetensors") == before);
  CHECK(run_trainer(dir.path(), "convert --overwrite resnet18-test.pth r18.safetensors").code == 0);
  const Result not_pth = run_trainer(dir.path(), "convert job.yaml out.safetensors");
  CHECK(not_pth.code == 3);
  CHECK_THAT(not_pth.err, Contains("job.yaml"));
  CHECK_FALSE(fs::exists(dir / "out.safetensors"));
  const Result missing = run_trainer(dir.path(), "convert nowhere.pth out.safetensors");
  CHECK(missing.code == 2);
  CHECK_THAT(missing.err, Contains("nowhere.pth"));
  CHECK(run_trainer(dir.path(), "convert resnet18-test.pth out.bin").code == 2);

  // model.pretrained reads the .pth itself; with the backbone frozen its weights come out as
  // they went in, and the 1000-class fc is replaced by a fresh 5-class one.
  const Result train =
      run_trainer(dir.path(),
                  "--config job.yaml --job-dir j --set model.pretrained=resnet18-test.pth "
                  "--set model.freeze_backbone=true");
  INFO(train.err);
  REQUIRE(train.code == 0);
  CHECK_THAT(train.err, Contains("loaded pretrained weights from resnet18-test.pth"));
  CHECK_THAT(train.err, Contains("classifier differs"));
  const auto trained = read_f32(dir / "j" / "model" / "model.safetensors");
  CHECK(trained.at("conv1.weight") == converted.at("conv1.weight"));
  CHECK(trained.at("layer4.1.conv2.weight") == converted.at("layer4.1.conv2.weight"));
  CHECK(trained.at("fc.weight").size() == 5 * 512);

  // A .pth that is no state dict fails the job by name, before anything is written.
  sh("cd " + quote(dir.path().string()) + " && " + TRAINER_PYTHON +
     " -c 'import torch; torch.save([1, 2], \"list.pth\")'");
  const Result bad =
      run_trainer(dir.path(), "--config job.yaml --job-dir j2 --set model.pretrained=list.pth");
  CHECK(bad.code == 3);
  CHECK_THAT(bad.err, Contains("list.pth") && Contains("not a state dict"));
  CHECK_FALSE(fs::exists(dir / "j2" / "model"));
}
