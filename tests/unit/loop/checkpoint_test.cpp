// Checkpoints: a bit-exact round trip of model, optimizer and RNG state; pruning to `keep`;
// damaged, half-written and foreign-version checkpoints are skipped in favour of older ones.
#include <caffe2/serialize/inline_container.h>
#include "common/catch.h"

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "train_test_util.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/optimizer.h"
#include "trainer/model/net.h"
#include "trainer/util/error.h"
#include "trainer/util/torch_compat.h"

using namespace trainer::train;
using namespace trainer::train::testing;
using trainer::test::Contains;

namespace {

// One training step of `net` on (x, y) in training mode (BatchNorm statistics move too).
template <class Net>
void train_step(Net& net, torch::optim::Optimizer& opt, const torch::Tensor& x,
                const torch::Tensor& y) {
  net->train();
  opt.zero_grad();
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  opt.step();
}

// A TinyNet that has taken a step, so its optimizer has state; saves checkpoints of it.
struct Trained {
  TinyNet net;
  std::unique_ptr<torch::optim::Optimizer> opt = make_optimizer(adam_spec(), net->parameters());
  Trained() { train_step(net, *opt, seeded_input({2, 3, 8, 8}, 3), torch::tensor({0, 2})); }
  fs::path save(const fs::path& dir, int64_t step, int keep = 10) {
    return save_checkpoint(dir, {step / 10, step % 10, step}, "fingerprint-a", {}, *net, *opt,
                           keep);
  }
};

std::set<std::string> entries(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

nlohmann::json read_state(const fs::path& ckpt) {
  return nlohmann::json::parse(read_bytes(ckpt / "state.json"));
}

void write_state(const fs::path& ckpt, const nlohmann::json& state) {
  write_bytes(ckpt / "state.json", state.dump(2));
}

// latest_checkpoint must not throw, and must return the checkpoint of `step`.
void require_latest_step(const fs::path& dir, int64_t step) {
  std::optional<CheckpointInfo> latest;
  REQUIRE_NOTHROW(latest = latest_checkpoint(dir));
  REQUIRE(latest.has_value());
  CHECK(latest->position.global_step == step);
}

auto tensor_impl_key(const torch::Tensor& p) { return trainer::compat::optimizer_state_key(p); }

}  // namespace

TEST_CASE("a restored checkpoint continues bit-identically (model, Adam state, RNG)",
          "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  const torch::Tensor y = torch::tensor({0, 2});

  torch::manual_seed(1);
  trainer::model::Net net = trainer::model::make_net({"resnet18", 3, 0});
  auto opt = make_optimizer(adam_spec(), net->parameters());
  train_step(net, *opt, seeded_input({2, 3, 32, 32}, 11), y);

  const TrainPosition position{2, 3, 1};
  const CheckpointPlan plan{2, 7, {"00000000000000aa", "00000000000000bb"}};
  const fs::path written = save_checkpoint(dir, position, "fingerprint-a", plan, *net, *opt, 3);
  CHECK(written == dir / "ckpt-000000001");
  const torch::Tensor draw_after_save = torch::rand({8});

  torch::manual_seed(99);
  trainer::model::Net fresh = trainer::model::make_net({"resnet18", 3, 0});
  auto fresh_opt = make_optimizer(adam_spec(), fresh->parameters());
  REQUIRE(any_state_differs(*net, *fresh));

  const auto latest = latest_checkpoint(dir);
  REQUIRE(latest.has_value());
  CHECK(latest->dir == written);
  CHECK(latest->position.epoch == 2);
  CHECK(latest->position.batch_in_epoch == 3);
  CHECK(latest->position.global_step == 1);
  CHECK(latest->fingerprint == "fingerprint-a");
  CHECK(latest->plan.world_size == 2);
  CHECK(latest->plan.steps_per_epoch == 7);
  CHECK(latest->plan.shard_digests == plan.shard_digests);
  restore_checkpoint(*latest, *fresh, *fresh_opt);

  // RNG: the default CPU generator is back where it was when the checkpoint was written.
  CHECK(bit_equal(torch::rand({8}), draw_after_save));
  // Model: every parameter and buffer (BN running_mean/var, num_batches_tracked).
  require_same_state(*net, *fresh);
  // Optimizer: Adam's per-parameter state, parameter by parameter.
  const auto params = net->parameters();
  const auto fresh_params = fresh->parameters();
  REQUIRE(params.size() == fresh_params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(opt->state().count(tensor_impl_key(params[i])) == 1);
    REQUIRE(fresh_opt->state().count(tensor_impl_key(fresh_params[i])) == 1);
    const auto& a = static_cast<const torch::optim::AdamParamState&>(
        *opt->state().at(tensor_impl_key(params[i])));
    const auto& b = static_cast<const torch::optim::AdamParamState&>(
        *fresh_opt->state().at(tensor_impl_key(fresh_params[i])));
    CHECK(a.step() == b.step());
    CHECK(bit_equal(a.exp_avg(), b.exp_avg()));
    CHECK(bit_equal(a.exp_avg_sq(), b.exp_avg_sq()));
  }
  // And the proof: one more step on each gives the same bits.
  const torch::Tensor x2 = seeded_input({2, 3, 32, 32}, 12);
  train_step(net, *opt, x2, y);
  train_step(fresh, *fresh_opt, x2, y);
  require_same_state(*net, *fresh);
}

TEST_CASE("save_checkpoint keeps the newest `keep` checkpoints", "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Trained t;
  t.save(dir, 10, 2);
  t.save(dir, 20, 2);
  CHECK(entries(dir) == std::set<std::string>{"ckpt-000000010", "ckpt-000000020"});
  t.save(dir, 30, 2);
  CHECK(entries(dir) == std::set<std::string>{"ckpt-000000020", "ckpt-000000030"});
  t.save(dir, 40, 1);
  CHECK(entries(dir) == std::set<std::string>{"ckpt-000000040"});
  require_latest_step(dir, 40);

  SECTION("saving the same step again replaces it, in one exchange") {
    write_bytes(dir / "ckpt-000000040" / "left-by-the-old-run", "x");
    t.save(dir, 40, 2);
    CHECK(entries(dir) == std::set<std::string>{"ckpt-000000040"});           // no temp dir left
    CHECK_FALSE(fs::exists(dir / "ckpt-000000040" / "left-by-the-old-run"));  // the new one
    require_latest_step(dir, 40);
  }
}

TEST_CASE("a damaged newest checkpoint is skipped in favour of the older one", "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Trained t;
  t.save(dir, 5);
  const fs::path newest = t.save(dir, 9);
  require_latest_step(dir, 9);
  const fs::path weights = newest / "model.safetensors";
  std::string bytes = read_bytes(weights);

  SECTION("model.safetensors truncated") {
    write_bytes(weights, bytes.substr(0, bytes.size() / 2));
    require_latest_step(dir, 5);
  }
  SECTION("one byte of model.safetensors flipped (same size)") {
    bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x01);
    write_bytes(weights, bytes);
    require_latest_step(dir, 5);
  }
  SECTION("optimizer.pt missing") {
    fs::remove(newest / "optimizer.pt");
    require_latest_step(dir, 5);
  }
  SECTION("state.json not JSON") {
    write_bytes(newest / "state.json", "{\"format_version\": 1, \"epo");
    require_latest_step(dir, 5);
  }
  SECTION("state.json missing") {
    fs::remove(newest / "state.json");
    require_latest_step(dir, 5);
  }
  SECTION("state.json that does not list the model file") {
    nlohmann::json state = read_state(newest);
    state["files"].erase("model.safetensors");
    write_state(newest, state);
    require_latest_step(dir, 5);
  }
  SECTION("every checkpoint damaged: none") {
    fs::remove(dir / "ckpt-000000005" / "rng.safetensors");
    fs::remove(weights);
    std::optional<CheckpointInfo> latest;
    REQUIRE_NOTHROW(latest = latest_checkpoint(dir));
    CHECK_FALSE(latest.has_value());
  }
}

TEST_CASE("a state.json of another format_version is skipped", "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Trained t;
  t.save(dir, 5);
  const fs::path newest = t.save(dir, 9);
  nlohmann::json state = read_state(newest);
  REQUIRE(state.at("format_version") == kCheckpointFormatVersion);

  SECTION("a newer version") { state["format_version"] = kCheckpointFormatVersion + 1; }
  SECTION("version 0") { state["format_version"] = 0; }
  SECTION("no version") { state.erase("format_version"); }
  SECTION("a string") { state["format_version"] = "1"; }
  write_state(newest, state);
  require_latest_step(dir, 5);
}

TEST_CASE("a half-written (temp) checkpoint dir is never picked", "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Trained t;
  const fs::path older = t.save(dir, 5);
  // A complete-looking copy under the temp name a crash in save_checkpoint leaves behind.
  const fs::path leftover = dir / "ckpt-000000009.tmp-123";
  fs::copy(older, leftover, fs::copy_options::recursive);
  nlohmann::json state = read_state(leftover);
  state["global_step"] = 9;
  write_state(leftover, state);
  require_latest_step(dir, 5);

  // Nor are other stray names (one with too many digits for int64 included).
  fs::create_directories(dir / "ckpt-");
  fs::create_directories(dir / "ckpt-12x");
  fs::create_directories(dir / "ckpt-99999999999999999999999999");
  fs::create_directories(dir / "notes");
  require_latest_step(dir, 5);
  REQUIRE_NOTHROW(t.save(dir, 7, 1));
  require_latest_step(dir, 7);
}

TEST_CASE("no checkpoints: nullopt", "[checkpoint]") {
  TempDir tmp;
  CHECK_FALSE(latest_checkpoint(tmp / "does-not-exist").has_value());
  CHECK_FALSE(latest_checkpoint(tmp.path()).has_value());
  fs::create_directories(tmp / "ckpt-000000003.tmp-77");
  CHECK_FALSE(latest_checkpoint(tmp.path()).has_value());
}

TEST_CASE("after resuming past a damaged newer checkpoint, the new one is kept", "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Trained t;
  t.save(dir, 10, 2);
  const fs::path damaged = t.save(dir, 20, 2);
  fs::remove(damaged / "model.safetensors");
  require_latest_step(dir, 10);  // the run resumes here...
  t.save(dir, 15, 1);            // ...and writes its next checkpoint with keep 1
  require_latest_step(dir, 15);
  CHECK(entries(dir) == std::set<std::string>{"ckpt-000000015"});
}

TEST_CASE("restore_checkpoint throws DataError for a damaged file", "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Trained t;
  t.save(dir, 3);
  const auto latest = latest_checkpoint(dir);
  REQUIRE(latest.has_value());
  TinyNet other;
  auto other_opt = make_optimizer(adam_spec(), other->parameters());

  SECTION("optimizer.pt") { write_bytes(latest->dir / "optimizer.pt", "not an archive"); }
  SECTION("model.safetensors") { write_bytes(latest->dir / "model.safetensors", "xx"); }
  CHECK_THROWS_AS(restore_checkpoint(*latest, *other, *other_opt), trainer::DataError);
}

TEST_CASE("check_resume_plan: another world size only from an epoch boundary",
          "[train][checkpoint]") {
  CheckpointInfo mid;
  mid.dir = "job/checkpoints/ckpt-000000005";
  mid.position = {1, 2, 5};  // epoch 2, after batch 2
  mid.plan = {1, 3, {"aaaaaaaaaaaaaaaa"}};
  const CheckpointPlan same = mid.plan;
  const CheckpointPlan two{2, 2, {"bbbbbbbbbbbbbbbb", "cccccccccccccccc"}};
  const CheckpointPlan reshard{1, 4, {"dddddddddddddddd"}};

  CHECK_NOTHROW(check_resume_plan(mid, same));
  CHECK_THROWS_AS(check_resume_plan(mid, two), trainer::ConfigError);
  CHECK_THROWS_WITH(check_resume_plan(mid, two),
                    Contains("ckpt-000000005") && Contains("middle of epoch 2") &&
                        Contains("1 workers wrote it, this run has 2") &&
                        Contains("Resume with 1 workers"));
  CHECK_THROWS_WITH(check_resume_plan(mid, reshard), Contains("sharded differently"));

  CheckpointInfo boundary = mid;
  boundary.position = {2, 0, 6};
  CHECK_NOTHROW(check_resume_plan(boundary, two));
  CHECK_NOTHROW(check_resume_plan(boundary, reshard));

  CheckpointInfo old = mid;  // a checkpoint from before plans were recorded
  old.plan = {};
  CHECK_NOTHROW(check_resume_plan(old, two));
}

TEST_CASE("a checkpoint that cannot be written is a data error naming it, older ones are kept",
          "[train][checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Trained t;
  t.save(dir, 5);
  // The checkpoints dir replaced by a file (root ignores permissions, a file does not).
  const fs::path kept = tmp / "kept";
  fs::rename(dir, kept);
  write_bytes(dir, "not a directory");
  try {
    t.save(dir, 9);
    FAIL("no error");
  } catch (const trainer::DataError& e) {
    CHECK_THAT(std::string(e.what()), Contains("cannot write checkpoint") &&
                                          Contains("ckpt-000000009") &&
                                          Contains("checkpoints written before it are kept"));
  }
  fs::remove(dir);
  fs::rename(kept, dir);
  require_latest_step(dir, 5);
}

TEST_CASE(
    "verify_checkpoint: a state.json that names other files, or has the wrong shape, is a "
    "data error",
    "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Trained t;
  const fs::path ckpt = t.save(dir, 3);
  REQUIRE_NOTHROW(verify_checkpoint(ckpt));
  const nlohmann::json good = read_state(ckpt);
  const auto problem = [&ckpt](const nlohmann::json& state) {
    write_state(ckpt, state);
    try {
      verify_checkpoint(ckpt);
      return std::string("no error");
    } catch (const trainer::DataError& e) {
      return std::string(e.what());
    }
  };
  // A name that is a path would read what it names (/dev/zero never ends).
  for (const char* name : {"/dev/zero", "../../etc/passwd", "extra.bin"}) {
    nlohmann::json state = good;
    state["files"][name] = {{"size", 1}, {"crc32", 0}};
    CHECK_THAT(problem(state), Contains("unexpected file") && Contains(name));
  }
  nlohmann::json state = good;
  state["files"] = "model.safetensors";
  CHECK_THAT(problem(state), Contains("state.json"));
  state = good;
  state["files"]["optimizer.pt"]["size"] = "big";
  CHECK_THAT(problem(state), Contains("state.json"));
  state = good;
  state["global_step"] = -4;
  CHECK_THAT(problem(state), Contains("global_step: expected an integer in [0,"));
  // Found by fuzz_state_json: a float out of range was cast to an integer (undefined).
  state = good;
  state["format_version"] = 2e122;
  CHECK_THAT(problem(state), Contains("format_version"));
  state = good;
  state["epoch"] = 1e300;
  CHECK_THAT(problem(state), Contains("epoch: expected an integer"));
  state = good;
  state["epoch"] = nullptr;
  CHECK_THAT(problem(state), Contains("state.json"));
  CHECK_THAT(problem(nlohmann::json::array()), Contains("not a JSON object"));
  write_state(ckpt, good);
  CHECK(verify_checkpoint(ckpt).position.global_step == 3);
}

namespace {

// `bytes` (a LibTorch archive) with every tensor's device rewritten from "cpu" to "cuda": the
// optimizer.pt a run on a GPU writes. The archive's pickle names the device once (LibTorch's
// pickler memoises the string) as BINUNICODE; the records are copied into a new zip.
std::string as_if_saved_on_cuda(const std::string& bytes) {
  std::istringstream in(bytes);
  caffe2::serialize::PyTorchStreamReader reader(&in);
  std::ostringstream out;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
      return n;
    });
    const std::string cpu(
        "X\x03\x00\x00\x00"
        "cpu",
        8);
    const std::string cuda(
        "X\x04\x00\x00\x00"
        "cuda",
        9);
    for (const std::string& name : reader.getAllRecords()) {
      if (name == "version" || name.rfind(".data/", 0) == 0) continue;  // the writer adds its own
      auto [data, size] = reader.getRecord(name);
      std::string record(static_cast<const char*>(data.get()), size);
      if (name == "data.pkl") {
        size_t at = 0, replaced = 0;
        while ((at = record.find(cpu, at)) != std::string::npos) {
          record.replace(at, cpu.size(), cuda);
          at += cuda.size();
          ++replaced;
        }
        REQUIRE(replaced >= 1);
      }
      writer.writeRecord(name, record.data(), record.size());
    }
    writer.writeEndOfFile();
  }
  return out.str();
}

}  // namespace

TEST_CASE("optimizer state saved on a GPU loads onto the run's device (the CPU here)",
          "[checkpoint]") {
  Trained saved;
  torch::serialize::OutputArchive archive;
  saved.opt->save(archive);
  std::ostringstream cpu_bytes;
  archive.save_to(cpu_bytes);
  const std::string cuda_bytes = as_if_saved_on_cuda(cpu_bytes.str());

  // The rewritten archive really asks for CUDA: LibTorch's plain load cannot place it here.
  if (!torch::cuda::is_available()) {
    TinyNet other;
    auto other_opt = make_optimizer(adam_spec(), other->parameters());
    CHECK_THROWS([&] {
      std::istringstream in(cuda_bytes);
      torch::serialize::InputArchive plain;
      plain.load_from(in);
      other_opt->load(plain);
    }());
  }

  // Mapped onto the CPU, it is the state that was saved, bit for bit.
  TinyNet fresh;
  auto fresh_opt = make_optimizer(adam_spec(), fresh->parameters());
  load_optimizer_state(cuda_bytes, *fresh_opt, torch::kCPU, "optimizer.pt");
  const auto params = saved.net->parameters();
  const auto fresh_params = fresh->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << i);
    const auto& a = static_cast<const torch::optim::AdamParamState&>(
        *saved.opt->state().at(tensor_impl_key(params[i])));
    const auto& b = static_cast<const torch::optim::AdamParamState&>(
        *fresh_opt->state().at(tensor_impl_key(fresh_params[i])));
    CHECK(b.exp_avg().device() == torch::Device(torch::kCPU));
    CHECK(bit_equal(a.exp_avg(), b.exp_avg()));
    CHECK(bit_equal(a.exp_avg_sq(), b.exp_avg_sq()));
  }
  // A damaged archive is a data error naming the file.
  CHECK_THROWS_WITH(load_optimizer_state("not a zip", *fresh_opt, torch::kCPU, "ckpt/optimizer.pt"),
                    Contains("'ckpt/optimizer.pt': cannot restore optimizer state"));
}

TEST_CASE("the loss scaler's state rides in state.json", "[checkpoint]") {
  TempDir tmp;
  Trained t;
  const fs::path without = t.save(tmp / "a", 5);
  CHECK(verify_checkpoint(without).loss_scaler.is_null());
  const nlohmann::json scaler = {{"scale", 1024.0}, {"growth_tracker", 17}};
  const fs::path with =
      save_checkpoint(tmp / "b", {0, 5, 5}, "fingerprint-a", {}, *t.net, *t.opt, 3, scaler);
  CHECK(verify_checkpoint(with).loss_scaler == scaler);
}
