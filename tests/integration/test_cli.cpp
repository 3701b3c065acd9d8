// The command line as a user meets it: every subcommand's --help, --version, and every exit
// code produced by a real bad input (2 usage/config/cluster, 3 data, 143 SIGTERM).
#include "common/catch.h"

#include <torch/version.h>

#include <csignal>
#include <thread>

#include "fixtures.h"
#include "harness.h"

using namespace trainer::testing;
using trainer::test::Contains;

TEST_CASE("every subcommand has --help", "[cli]") {
  TempDir dir("help");
  const Result top = run_trainer(dir.path(), "--help");
  REQUIRE(top.code == 0);
  CHECK_THAT(top.out, Contains("Exit codes: 0 ok; 1 internal error"));
  for (const char* sub : {"train", "make-dataset", "predict", "evaluate", "inspect", "convert",
                          "export", "preview"}) {
    CHECK_THAT(top.out, Contains(sub));
    const Result r = run_trainer(dir.path(), std::string(sub) + " --help");
    INFO(sub << ": " << r.err);
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Contains("--"));
    // It ends with the exit codes the command can return.
    const size_t codes = r.out.rfind("Exit codes: 0 ok; 1 internal error");
    REQUIRE(codes != std::string::npos);
    CHECK(r.out.find('\n', codes) + 1 >= r.out.size());
    CHECK_THAT(r.out.substr(codes), Contains("2 usage") && Contains("3 data or I/O error"));
    if (std::string(sub) == "train") CHECK_THAT(r.out.substr(codes), Contains("143 stopped"));
  }
  const Result train_help = run_trainer(dir.path(), "train --help");
  CHECK_THAT(train_help.out, Contains("--job-dir"));
  CHECK_THAT(train_help.out, Contains("train.optimizer.learning_rate"));  // the field reference
  const Result version = run_trainer(dir.path(), "--version");
  CHECK(version.code == 0);
  CHECK_THAT(version.out, Contains("trainer " TRAINER_VERSION "\n"));
  // The LibTorch it was built with, and the CUDA stack: named in a CUDA build (which starts and
  // says so on a machine without a GPU or driver), "none" in a CPU one.
  CHECK_THAT(version.out, Contains("LibTorch " TORCH_VERSION "\n"));
#ifdef TRAINER_WITH_CUDA
  CHECK_THAT(version.out, Contains("CUDA ") && Contains(" (built with)") && Contains("cuDNN ") &&
                              Contains("NCCL 2.") && Contains("GPU"));
  CHECK_THAT(version.out, !Contains("CUDA none"));
#else
  CHECK_THAT(version.out, Contains("CUDA none") && Contains("NCCL none"));
#endif
}

// A CUDA build on a machine whose NVIDIA driver is missing or too old for its CUDA (13.0 needs
// R580): --version names the architectures, the driver found and the one needed; the first CUDA
// use exits 2 naming both, for train.device cuda and auto alike. The old driver is a stand-in
// libcuda.so.1 (tests/support/fake_libcuda.cpp) that answers cuDriverGetVersion.
TEST_CASE(
    "a CUDA build names its GPU architectures and the driver it needs, and refuses an old one",
    "[cli][cuda]") {
#ifndef TRAINER_WITH_CUDA
  WARN("skipped: a CPU build has no CUDA and no driver to check");
#else
  TempDir dir("driver");
  write_text(dir / "job.yaml", tiny_job_yaml());
  make_dataset(dir.path(), "data", 4, 32);
  const std::string fake_dir = FAKE_CUDA_DRIVER_DIR;
  REQUIRE(fs::exists(fake_dir + "/libcuda.so.1"));

  const Result version = run_trainer(dir.path(), "--version");
  REQUIRE(version.code == 0);
  CHECK_THAT(version.out, Contains("GPU architectures: sm_") && Contains("needs R580 or newer"));
  if (version.out.find("NVIDIA driver: none") != std::string::npos) {
    // No driver: cuda is refused naming that, auto trains on the CPU.
    const Result cuda =
        run_trainer(dir.path(), "inspect --config job.yaml --set train.device=cuda");
    CHECK(cuda.code == 2);
    CHECK_THAT(cuda.err, Contains("train.device: 'cuda' requested") &&
                             Contains("no NVIDIA driver (libcuda.so.1 not found)") &&
                             Contains("--gpus all"));
    CHECK(run_trainer(dir.path(), "inspect --config job.yaml --set train.device=auto").code == 0);
  }

  const std::vector<std::string> old_driver = {"LD_LIBRARY_PATH=" + fake_dir,
                                               "FAKE_CUDA_DRIVER_VERSION=12040"};
  const Result old_version = run_trainer(dir.path(), "--version", old_driver);
  INFO(old_version.out << old_version.err);
  CHECK(old_version.code == 0);
  CHECK_THAT(old_version.out, Contains("NVIDIA driver: ") && Contains("CUDA 12.4") &&
                                  Contains("TOO OLD") && Contains("GPUs: not asked"));
  for (const char* device : {"cuda", "auto", "cuda:0"}) {
    for (const char* command : {"inspect --config job.yaml", "--config job.yaml --job-dir j"}) {
      const Result r = run_trainer(
          dir.path(), std::string(command) + " --set train.device=" + device, old_driver);
      INFO(device << " " << command << ": " << r.err);
      CHECK(r.code == 2);
      CHECK_THAT(r.err, Contains(std::string("train.device: ") + device + ": the NVIDIA driver") &&
                            Contains("CUDA 12.4") && Contains("R580 or newer") &&
                            !Contains("terminate called") && !Contains("Exception raised from"));
    }
  }
  // Refused before anything was trained: no checkpoint, no model.
  CHECK_FALSE(fs::exists(dir / "j" / "checkpoints" / "ckpt-000000001"));
  CHECK_FALSE(fs::exists(dir / "j" / "model"));
  // train.device: cpu never asks the driver.
  CHECK(run_trainer(dir.path(), "inspect --config job.yaml --set train.device=cpu", old_driver)
            .code == 0);
#endif
}

TEST_CASE("usage errors exit 2", "[cli]") {
  TempDir dir("usage");
  CHECK(run_trainer(dir.path(), "").code == 2);  // no subcommand
  CHECK(run_trainer(dir.path(), "train --bogus-flag --job-dir j").code == 2);
  const Result no_job_dir = run_trainer(dir.path(), "train");
  CHECK(no_job_dir.code == 2);
  CHECK_THAT(no_job_dir.err + no_job_dir.out, Contains("--job-dir"));
  const Result missing_config = run_trainer(dir.path(), "--config nope.yaml --job-dir j");
  CHECK(missing_config.code == 2);
  CHECK_THAT(missing_config.err + missing_config.out, Contains("nope.yaml"));
  CHECK(run_trainer(dir.path(), "predict --model m").code == 2);  // no IMAGE
  const Result not_model = run_trainer(dir.path(), "predict --model nowhere x.jpg");
  CHECK(not_model.code == 2);
  CHECK_THAT(not_model.err, Contains("model.json"));
}

TEST_CASE("config errors exit 2 and name the field", "[cli]") {
  TempDir dir("config");
  write_text(dir / "typo.yaml", "train:\n  optimzer:\n    name: sgd\n");
  const Result typo = run_trainer(dir.path(), "--config typo.yaml --job-dir j");
  CHECK(typo.code == 2);
  CHECK_THAT(typo.err, Contains("train.optimzer"));
  CHECK_THAT(typo.err, Contains("typo.yaml"));

  write_text(dir / "ok.yaml", tiny_job_yaml());
  const Result bad_set =
      run_trainer(dir.path(), "--config ok.yaml --job-dir j --set data.normalize=none");
  CHECK(bad_set.code == 2);
  CHECK_THAT(bad_set.err, Contains("data.normalize"));
  CHECK_FALSE(fs::exists(dir / "j" / "job.yaml"));  // nothing written for a bad spec

  const Result cluster = run_trainer(
      dir.path(), "inspect --config ok.yaml",
      {R"(TF_CONFIG={"cluster": {"worker": ["a:1", "b:2"], "ps": ["c:3"]}, "task": {"type": "worker", "index": 0}})"});
  CHECK(cluster.code == 2);
  CHECK_THAT(cluster.err, Contains("TF_CONFIG"));
  CHECK_THAT(cluster.err, Contains("parameter"));
  const Result bad_json = run_trainer(dir.path(), "inspect --config ok.yaml", {"TF_CONFIG={oops"});
  CHECK(bad_json.code == 2);
  CHECK_THAT(bad_json.err, Contains("TF_CONFIG"));
}

TEST_CASE("data errors exit 3 and name the file", "[cli]") {
  TempDir dir("data");
  write_text(dir / "job.yaml", tiny_job_yaml());
  const Result missing = run_trainer(dir.path(), "--config job.yaml --job-dir j");
  CHECK(missing.code == 3);
  CHECK_THAT(missing.err, Contains("data/train"));

  make_dataset(dir.path(), "data", 4, 32);
  // A truncated JPEG under on_corrupt: fail.
  fs::path victim;
  for (const auto& e : fs::recursive_directory_iterator(dir / "data" / "train")) {
    if (e.path().extension() == ".jpg") {
      victim = e.path();
      break;
    }
  }
  REQUIRE(!victim.empty());
  fs::resize_file(victim, fs::file_size(victim) / 2);
  const Result corrupt = run_trainer(dir.path(), "--config job.yaml --job-dir j --epochs 1");
  CHECK(corrupt.code == 3);
  CHECK_THAT(corrupt.err, Contains(victim.filename().string()));
  // Under skip it trains and says what it skipped.
  const Result skipped = run_trainer(
      dir.path(), "--config job.yaml --job-dir j2 --epochs 1 --set data.on_corrupt=skip");
  INFO(skipped.err);
  CHECK(skipped.code == 0);
  CHECK_THAT(skipped.err, Contains(victim.filename().string()));
}

TEST_CASE("inspect prints the job, the role and the data plan", "[cli]") {
  TempDir dir("inspect");
  write_text(dir / "job.yaml", tiny_job_yaml());
  make_dataset(dir.path(), "data", 8, 32);
  const Result r = run_trainer(dir.path(), "inspect --config job.yaml --set train.epochs=9");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["job"]["train"]["epochs"] == 9);
  CHECK(j["cluster"]["is_chief"] == true);
  CHECK(j["cluster"]["world_size"] == 1);
  CHECK(j["data"]["num_examples"] == 40);
  CHECK(j["data"]["num_classes"] == 5);
  CHECK(j["data"]["class_names"][0] == "cbb");
  CHECK(j["data"]["global_batch_size"] == 10);
  CHECK(j["data"]["steps_per_epoch"] == 4);
  // The device and why: one process is local rank 0; a CPU LibTorch sees no GPU.
  CHECK(j["runtime"]["local_rank"] ==
        nlohmann::json::parse(
            R"({"index": 0, "world_size": 1, "source": "one process: local index 0"})"));
  if (j["runtime"]["device"] == "cpu") {
    CHECK(j["runtime"]["device_reason"] ==
          "train.device: auto, no CUDA GPU visible to this LibTorch");
  } else {
    CHECK(j["runtime"]["device"] == "cuda:0");
    CHECK_THAT(j["runtime"]["device_reason"].get<std::string>(),
               Contains("one process: local index 0"));
  }
  CHECK_FALSE(fs::exists(dir / "j"));  // a dry run writes nothing
}

TEST_CASE("SIGTERM stops training with 143 after writing a checkpoint", "[cli][signal]") {
  TempDir dir("sigterm");
  write_text(dir / "job.yaml", tiny_job_yaml(50));
  make_dataset(dir.path(), "data", 8, 32);
  const fs::path job = dir / "j";
  std::thread killer([&] {
    // Wait for the first metrics record, then ask the trainer to stop.
    for (int i = 0; i < 600 && !fs::exists(job / "metrics.jsonl"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Only the trainer process itself (its command line starts with the binary), not the shell.
    std::system(
        ("pkill -TERM -f " + quote("^" + std::string(TRAINER_BIN) + " .*" + job.string())).c_str());
  });
  const Result r = run_trainer(dir.path(), "--config job.yaml --job-dir " + job.string());
  killer.join();
  INFO(r.err);
  CHECK(r.code == 143);
  CHECK_THAT(r.err, Contains("resume"));
  bool have_checkpoint = false;
  for (const auto& e : fs::directory_iterator(job / "checkpoints")) {
    have_checkpoint |= fs::exists(e.path() / "state.json");
  }
  CHECK(have_checkpoint);
}
