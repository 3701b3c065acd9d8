// export_model / load_model_dir: a round trip of info and weights; a directory that is not a
// model directory is a UsageError; damaged or inconsistent files are DataErrors.
#include "common/catch.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "train_test_util.h"
#include "trainer/loop/model_dir.h"
#include "trainer/model/net.h"
#include "trainer/util/error.h"

using namespace trainer::train;
using namespace trainer::train::testing;
using trainer::test::Contains;

namespace {

ModelInfo sample_info(int64_t head_hidden) {
  ModelInfo info;
  info.arch = "resnet18";
  info.num_classes = 3;
  info.head_hidden = head_hidden;
  info.class_names = {"cbb", "healthy", "other"};
  info.image_size = 64;
  info.normalize = "unit";
  info.precision = "bf16";
  info.channels_last = true;
  info.global_step = 123;
  info.epochs = 4;
  return info;
}

trainer::model::Net trained_net(const ModelInfo& info) {
  torch::manual_seed(5);
  trainer::model::Net net =
      trainer::model::make_net({info.arch, info.num_classes, info.head_hidden});
  // One training-mode pass so the BatchNorm buffers are not the trivial 0 / 1 / 0.
  torch::NoGradGuard no_grad;
  net->train();
  net->forward(seeded_input({2, 3, 32, 32}, 8));
  return net;
}

// A model directory holding only model.json (the checks below come before the weights).
void write_model_json(const fs::path& dir, const nlohmann::json& j) {
  fs::create_directories(dir);
  write_bytes(dir / "model.json", j.dump(2));
}

void check_data_error(const fs::path& dir, const std::string& expected_part) {
  try {
    load_model_dir(dir);
    FAIL("no DataError thrown");
  } catch (const trainer::DataError& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find("model.json") != std::string::npos);
    CHECK(message.find(expected_part) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("export_model then load_model_dir gives the same model back", "[model_dir]") {
  const int64_t head_hidden = GENERATE(0, 16);
  INFO("head_hidden " << head_hidden);
  TempDir tmp;
  const ModelInfo info = sample_info(head_hidden);
  trainer::model::Net net = trained_net(info);
  export_model(tmp / "model", net, info);
  CHECK(fs::is_regular_file(tmp / "model" / "model.safetensors"));

  const nlohmann::json written = nlohmann::json::parse(read_bytes(tmp / "model" / "model.json"));
  CHECK(written.at("format_version") == kModelFormatVersion);
  CHECK(written.at("weights") == "model.safetensors");
  CHECK(written.at("trainer_version").is_string());

  LoadedModel loaded = load_model_dir(tmp / "model");
  const ModelInfo& got = loaded.info;
  CHECK(got.arch == info.arch);
  CHECK(got.num_classes == info.num_classes);
  CHECK(got.head_hidden == info.head_hidden);
  CHECK(got.class_names == info.class_names);
  CHECK(got.image_size == info.image_size);
  CHECK(got.normalize == info.normalize);
  CHECK(got.precision == info.precision);
  CHECK(got.channels_last == info.channels_last);
  CHECK(got.global_step == info.global_step);
  CHECK(got.epochs == info.epochs);
  CHECK(got.to_json() == info.to_json());

  REQUIRE(loaded.net);
  require_same_state(*net, *loaded.net);
  for (const auto& module : loaded.net->modules(/*include_self=*/true)) {
    CHECK_FALSE(module->is_training());
  }
  // The loaded model computes what the exported one does.
  net->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor x = seeded_input({1, 3, 32, 32}, 9);
  CHECK(bit_equal(net->forward(x), loaded.net->forward(x)));
}

TEST_CASE("a model directory is complete or absent: built aside, renamed into place",
          "[model_dir]") {
  TempDir tmp;
  const ModelInfo info = sample_info(0);
  trainer::model::Net net = trained_net(info);
  auto names = [&] {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(tmp.path()))
      out.insert(e.path().filename().string());
    return out;
  };
  SECTION("with ONNX: all three files, nothing left beside it; a second export replaces it") {
    OnnxOptions onnx;
    export_model(tmp / "model", net, info, &onnx);
    CHECK(names() == std::set<std::string>{"model"});
    for (const char* f : {"model.safetensors", "model.json", "model.onnx"}) {
      CHECK(fs::is_regular_file(tmp / "model" / f));
    }
    write_bytes(tmp / "model" / "stale.txt", "from the first export");
    ModelInfo later = info;
    later.global_step = 456;
    export_model(tmp / "model", net, later, &onnx);
    CHECK(names() == std::set<std::string>{"model"});
    CHECK_FALSE(fs::exists(tmp / "model" / "stale.txt"));
    CHECK(load_model_dir(tmp / "model").info.global_step == 456);
  }
  SECTION("a failed ONNX export names it and keeps the weights in model.without-onnx") {
    OnnxOptions bad;
    bad.opset = 99;  // refused by the ONNX writer, after the weights are written
    try {
      export_model(tmp / "model", net, info, &bad);
      FAIL("no error");
    } catch (const trainer::Error& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK(e.kind() == trainer::ErrorKind::kConfig);
      CHECK_THAT(m, Contains("export.onnx: the ONNX export of") && Contains("--opset") &&
                        Contains("model.without-onnx") && Contains("was not written"));
    }
    CHECK(names() == std::set<std::string>{"model.without-onnx"});
    CHECK(load_model_dir(tmp / "model.without-onnx").info.to_json() == info.to_json());
    CHECK_FALSE(fs::exists(tmp / "model.without-onnx" / "model.onnx"));
  }
}

TEST_CASE("load_model_dir of a directory without model.json is a UsageError", "[model_dir]") {
  TempDir tmp;
  CHECK_THROWS_AS(load_model_dir(tmp.path()), trainer::UsageError);
  CHECK_THROWS_AS(load_model_dir(tmp / "missing"), trainer::UsageError);
  fs::create_directories(tmp / "job" / "model.json");  // a directory of that name
  CHECK_THROWS_AS(load_model_dir(tmp / "job"), trainer::UsageError);
}

TEST_CASE("load_model_dir of a damaged or inconsistent model.json is a DataError", "[model_dir]") {
  TempDir tmp;
  const fs::path dir = tmp / "model";
  nlohmann::json j = sample_info(0).to_json();

  SECTION("not JSON") {
    fs::create_directories(dir);
    write_bytes(dir / "model.json", "{\"format_version\": 1, \"arch\": \"res");
    check_data_error(dir, "parse");
  }
  SECTION("empty") {
    fs::create_directories(dir);
    write_bytes(dir / "model.json", "");
    check_data_error(dir, "model.json");
  }
  SECTION("not an object") {
    write_model_json(dir, nlohmann::json::array({1, 2}));
    check_data_error(dir, "model.json");
  }
  SECTION("a required field missing") {
    j.erase("arch");
    write_model_json(dir, j);
    check_data_error(dir, "arch");
  }
  SECTION("a field of the wrong type") {
    j["num_classes"] = "three";
    write_model_json(dir, j);
    check_data_error(dir, "model.json");
  }
  SECTION("another format_version") {
    j["format_version"] = kModelFormatVersion + 1;
    write_model_json(dir, j);
    check_data_error(dir, "format_version");
  }
  SECTION("fewer class_names than num_classes") {
    j["class_names"] = {"a", "b"};
    write_model_json(dir, j);
    check_data_error(dir, "class_names");
  }
  SECTION("more class_names than num_classes") {
    j["num_classes"] = 2;
    write_model_json(dir, j);
    check_data_error(dir, "class_names");
  }
  SECTION("an unknown arch") {
    j["arch"] = "resnet19";
    write_model_json(dir, j);
    check_data_error(dir, "resnet19");
  }
  SECTION("an unknown normalize") {
    j["normalize"] = "zscore";
    write_model_json(dir, j);
    check_data_error(dir, "normalize");
  }
  SECTION("an unknown precision") {
    j["precision"] = "fp8";
    write_model_json(dir, j);
    check_data_error(dir, "precision");
  }
  SECTION("a zero image_size") {
    j["image_size"] = 0;
    write_model_json(dir, j);
    check_data_error(dir, "image_size");
  }
}

TEST_CASE("load_model_dir with missing or mismatched weights is a DataError", "[model_dir]") {
  TempDir tmp;
  const fs::path pristine = tmp / "pristine";
  const ModelInfo info = sample_info(0);
  export_model(pristine, trained_net(info), info);
  REQUIRE_NOTHROW(load_model_dir(pristine));
  int copies = 0;
  // A copy of the exported directory (one export serves every case).
  const auto copy = [&] {
    const fs::path dir = tmp / ("copy" + std::to_string(copies++));
    fs::copy(pristine, dir, fs::copy_options::recursive);
    return dir;
  };

  {
    INFO("weights missing");
    const fs::path dir = copy();
    fs::remove(dir / "model.safetensors");
    CHECK_THROWS_AS(load_model_dir(dir), trainer::DataError);
  }
  {
    INFO("weights truncated");
    const fs::path dir = copy();
    const std::string bytes = read_bytes(dir / "model.safetensors");
    write_bytes(dir / "model.safetensors", bytes.substr(0, bytes.size() - 100));
    CHECK_THROWS_AS(load_model_dir(dir), trainer::DataError);
  }
  {
    INFO("model.json says a different head than the weights have");
    const fs::path dir = copy();
    nlohmann::json j = info.to_json();
    j["head_hidden"] = 8;
    write_model_json(dir, j);
    CHECK_THROWS_AS(load_model_dir(dir), trainer::DataError);
  }
  {
    INFO("model.json says another arch than the weights are");
    const fs::path dir = copy();
    nlohmann::json j = info.to_json();
    j["arch"] = "resnet34";
    write_model_json(dir, j);
    CHECK_THROWS_AS(load_model_dir(dir), trainer::DataError);
  }
}

TEST_CASE("read_model_info bounds what model.json may ask to build", "[model_dir]") {
  TempDir tmp;
  const fs::path path = tmp / "model.json";
  const nlohmann::json good = sample_info(0).to_json();
  const auto problem = [&path](const nlohmann::json& j) {
    std::ofstream(path) << j.dump();
    try {
      read_model_info(path);
      return std::string("no error");
    } catch (const trainer::DataError& e) {
      return std::string(e.what());
    }
  };
  CHECK(problem(good) == "no error");
  nlohmann::json j = good;
  j["head_hidden"] = 1000000000;
  CHECK_THAT(problem(j), Contains("head_hidden") && Contains("1000000000"));
  j = good;
  j["arch"] = "resnet9000";
  CHECK_THAT(problem(j), Contains("arch") && Contains("resnet9000"));
  j = good;
  j["image_size"] = 100000;
  CHECK_THAT(problem(j), Contains("image_size"));
  j = good;
  j["num_classes"] = 0;
  j["class_names"] = nlohmann::json::array();
  CHECK_THAT(problem(j), Contains("num_classes"));
  // Found by fuzz_model_json: a float out of range was cast to an integer (undefined).
  j = good;
  j["num_classes"] = 7.7e46;
  CHECK_THAT(problem(j), Contains("num_classes: expected an integer"));
  j = good;
  j["epochs"] = -1e300;
  CHECK_THAT(problem(j), Contains("epochs"));
  j = good;
  j["class_names"] = 7;
  CHECK_THAT(problem(j), Contains(path.string()));
  std::ofstream(path) << "[1, 2";
  CHECK_THROWS_AS(read_model_info(path), trainer::DataError);
}
