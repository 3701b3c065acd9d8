#include "trainer/loop/checkpoint.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdio>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "trainer/model/safetensors.h"
#include "trainer/util/error.h"
#include "trainer/util/fs.h"
#include "trainer/util/json.h"

namespace trainer::train {

namespace {

constexpr const char* kPrefix = "ckpt-";
// The files every checkpoint holds besides state.json (restore_checkpoint reads each).
constexpr const char* kFiles[] = {"model.safetensors", "optimizer.pt", "rng.safetensors"};
// The files a checkpoint may hold besides those.
constexpr const char* kOptionalFiles[] = {"ema.safetensors"};

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%09lld", kPrefix, static_cast<long long>(step));
  return buf;
}

std::string optimizer_bytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

std::string rng_bytes() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return model::encode_safetensors({{"cpu_generator", gen.get_state()}});
}

// Every checkpoint dir name with its step, newest first (temp dirs excluded).
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0 || name.find(".tmp") != std::string::npos) continue;
    const std::string digits = name.substr(std::string(kPrefix).size());
    // At most 18 digits, so std::stoll cannot overflow (and throw) on a stray name.
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(),
                     [](unsigned char c) { return std::isdigit(c) != 0; })) {
      continue;
    }
    out.emplace_back(std::stoll(digits), entry.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// Parses and verifies one checkpoint (json exceptions escape; verify_checkpoint wraps them).
CheckpointInfo verify(const fs::path& dir) {
  const fs::path state_path = dir / "state.json";
  const nlohmann::json state = nlohmann::json::parse(util::read_file(state_path));
  if (!state.is_object()) throw DataError("'" + state_path.string() + "': not a JSON object");
  const std::string where = "'" + state_path.string() + "'";
  constexpr int64_t kI64 = INT64_MAX;
  if (!state.contains("format_version") || !state["format_version"].is_number_integer() ||
      util::json_int(state, "format_version", INT32_MIN, INT32_MAX, where) !=
          kCheckpointFormatVersion) {
    throw DataError("'" + state_path.string() + "': format_version " +
                    state.value("format_version", nlohmann::json()).dump() + ", expected " +
                    std::to_string(kCheckpointFormatVersion));
  }
  const nlohmann::json& files = state.at("files");
  if (!files.is_object()) throw DataError("'" + state_path.string() + "': files: not an object");
  for (const char* required : kFiles) {
    if (!files.contains(required)) {
      throw DataError("'" + state_path.string() + "': lists no '" + required + "'");
    }
  }
  for (const auto& [name, meta] : files.items()) {
    // Only the checkpoint's own files: a name is never a path out of the directory (a hostile
    // "../x" or "/dev/zero" would read what it names).
    const auto is_name = [&name = name](const char* f) { return name == f; };
    if (std::find_if(std::begin(kFiles), std::end(kFiles), is_name) == std::end(kFiles) &&
        std::find_if(std::begin(kOptionalFiles), std::end(kOptionalFiles), is_name) ==
            std::end(kOptionalFiles)) {
      throw DataError("'" + state_path.string() + "': lists an unexpected file '" + name +
                      "' (expected only model.safetensors, optimizer.pt, rng.safetensors, "
                      "ema.safetensors)");
    }
    const std::string bytes = util::read_file(dir / name);
    const std::string file_where = where + ": files: " + name;
    if (static_cast<int64_t>(bytes.size()) != util::json_int(meta, "size", 0, kI64, file_where) ||
        util::crc32(bytes.data(), bytes.size()) !=
            util::json_int(meta, "crc32", 0, UINT32_MAX, file_where)) {
      throw DataError("'" + (dir / name).string() + "': size or checksum differs from state.json");
    }
  }
  CheckpointInfo info;
  info.dir = dir;
  info.position.epoch = util::json_int(state, "epoch", 0, kI64, where);
  info.position.batch_in_epoch = util::json_int(state, "batch_in_epoch", 0, kI64, where);
  info.position.global_step = util::json_int(state, "global_step", 0, kI64, where);
  info.fingerprint = state.at("fingerprint").get<std::string>();
  if (state.contains("world_size")) {
    info.plan.world_size =
        static_cast<int>(util::json_int(state, "world_size", 0, INT32_MAX, where));
    info.plan.steps_per_epoch = util::json_int(state, "steps_per_epoch", 0, kI64, where);
    info.plan.shard_digests = state.at("shard_digests").get<std::vector<std::string>>();
  }
  if (state.contains("loss_scaler")) info.loss_scaler = state.at("loss_scaler");
  if (state.contains("recipe")) info.recipe = state.at("recipe");
  info.has_ema = files.contains("ema.safetensors");
  return info;
}

}  // namespace

CheckpointInfo verify_checkpoint(const fs::path& dir) {
  try {
    return verify(dir);
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError("'" + (dir / "state.json").string() + "': not valid JSON (" + e.what() + ")");
  } catch (const nlohmann::json::exception& e) {
    throw DataError("'" + (dir / "state.json").string() + "': " + e.what());
  }
}

namespace {

fs::path write_checkpoint(const fs::path& checkpoints_dir, const TrainPosition& position,
                          const std::string& fingerprint, const CheckpointPlan& plan,
                          const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                          int keep, const nlohmann::json& loss_scaler, const nlohmann::json& recipe,
                          const model::StateDict* ema) {
  const fs::path final_dir = checkpoints_dir / checkpoint_name(position.global_step);
  const fs::path tmp_dir = fs::path(final_dir.string() + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);

  std::vector<std::pair<std::string, std::string>> files = {
      {"model.safetensors", model::encode_safetensors(model::state_dict(model))},
      {"optimizer.pt", optimizer_bytes(optimizer)},
      {"rng.safetensors", rng_bytes()},
  };
  if (ema != nullptr) files.emplace_back("ema.safetensors", model::encode_safetensors(*ema));
  nlohmann::json state = {{"format_version", kCheckpointFormatVersion},
                          {"epoch", position.epoch},
                          {"batch_in_epoch", position.batch_in_epoch},
                          {"global_step", position.global_step},
                          {"fingerprint", fingerprint},
                          {"world_size", plan.world_size},
                          {"steps_per_epoch", plan.steps_per_epoch},
                          {"shard_digests", plan.shard_digests},
                          {"files", nlohmann::json::object()}};
  if (!loss_scaler.is_null()) state["loss_scaler"] = loss_scaler;
  if (!recipe.is_null()) state["recipe"] = recipe;
  for (const auto& [name, bytes] : files) {
    util::write_file_atomic(tmp_dir / name, bytes);
    state["files"][name] = {{"size", bytes.size()},
                            {"crc32", util::crc32(bytes.data(), bytes.size())}};
  }
  util::write_file_atomic(tmp_dir / "state.json", state.dump(2) + "\n");

  std::error_code ec;
  if (fs::exists(final_dir)) {
    // A same-step checkpoint from an interrupted earlier run: swap the two directories in one
    // step (renameat2 RENAME_EXCHANGE), so that a complete checkpoint of this step exists at
    // every moment, then remove the old one, which now has the temp name. File systems without
    // the exchange fall back to remove-then-rename.
    if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(tmp_dir, ec);
    } else {
      fs::remove_all(final_dir);
      fs::rename(tmp_dir, final_dir);
    }
  } else {
    fs::rename(tmp_dir, final_dir);
  }
  util::fsync_dir(checkpoints_dir);

  // Checkpoints newer than this one belong to a history this run has left (it resumed from an
  // older checkpoint because those were damaged): remove them, or they would count against
  // `keep` and push this one out. Then keep the newest `keep`.
  size_t kept = 0;
  for (const auto& [step, dir] : list_checkpoints(checkpoints_dir)) {
    if (step > position.global_step || ++kept > static_cast<size_t>(std::max(keep, 1))) {
      fs::remove_all(dir, ec);
    }
  }
  // Temp dirs left by saves that crashed half-way are never read; clear them.
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) == 0 && name.find(".tmp-") != std::string::npos) {
      fs::remove_all(entry.path(), ec);
    }
  }
  return final_dir;
}

}  // namespace

fs::path save_checkpoint(const fs::path& checkpoints_dir, const TrainPosition& position,
                         const std::string& fingerprint, const CheckpointPlan& plan,
                         const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                         int keep, const nlohmann::json& loss_scaler, const nlohmann::json& recipe,
                         const model::StateDict* ema) {
  const fs::path final_dir = checkpoints_dir / checkpoint_name(position.global_step);
  try {
    return write_checkpoint(checkpoints_dir, position, fingerprint, plan, model, optimizer, keep,
                            loss_scaler, recipe, ema);
  } catch (...) {
    const ErrorSummary why = describe_exception(std::current_exception());
    if (why.kind != ErrorKind::kData) throw;
    // A full disk, a read-only or vanished directory: say which checkpoint, drop its temp dir;
    // the checkpoints written before it are untouched (they are only pruned after a success).
    std::error_code ec;
    fs::remove_all(fs::path(final_dir.string() + ".tmp-" + std::to_string(::getpid())), ec);
    throw DataError("cannot write checkpoint '" + final_dir.string() + "': " + why.message +
                    "; the checkpoints written before it are kept");
  }
}

std::vector<CheckpointInfo> complete_checkpoints(const fs::path& checkpoints_dir) {
  std::vector<CheckpointInfo> out;
  for (const auto& [step, dir] : list_checkpoints(checkpoints_dir)) {
    try {
      out.push_back(verify_checkpoint(dir));
    } catch (const std::exception& e) {
      spdlog::debug("not (yet, or no longer) a complete checkpoint: {}: {}", dir.string(),
                    e.what());
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::optional<CheckpointInfo> latest_checkpoint(const fs::path& checkpoints_dir) {
  for (const auto& [step, dir] : list_checkpoints(checkpoints_dir)) {
    try {
      return verify_checkpoint(dir);
    } catch (const std::exception& e) {
      spdlog::warn("skipping damaged checkpoint {}: {}", dir.string(), e.what());
    }
  }
  return std::nullopt;
}

void load_optimizer_state(const std::string& bytes, torch::optim::Optimizer& optimizer,
                          const torch::Device& device, const std::string& origin) {
  try {
    std::istringstream in(bytes);
    torch::serialize::InputArchive archive;
    // Every tensor onto the run's device, whatever device saved it (LibTorch would otherwise
    // restore CUDA state onto the GPU it came from, or fail where there is none).
    archive.load_from(in, device);
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    throw DataError("'" + origin +
                    "': cannot restore optimizer state: " + e.what_without_backtrace());
  }
}

void restore_checkpoint(const CheckpointInfo& checkpoint, torch::nn::Module& model,
                        torch::optim::Optimizer& optimizer, const torch::Device& device) {
  const fs::path model_path = checkpoint.dir / "model.safetensors";
  model::load_state_dict(model, model::load_safetensors(model_path.string()), model_path.string());

  const fs::path opt_path = checkpoint.dir / "optimizer.pt";
  load_optimizer_state(util::read_file(opt_path), optimizer, device, opt_path.string());

  const fs::path rng_path = checkpoint.dir / "rng.safetensors";
  for (const auto& [name, tensor] : model::load_safetensors(rng_path.string())) {
    if (name != "cpu_generator") continue;
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    try {
      gen.set_state(tensor);
    } catch (const c10::Error& e) {
      throw DataError("'" + rng_path.string() +
                      "': cannot restore the CPU generator: " + e.what_without_backtrace());
    }
  }
}

model::StateDict load_checkpoint_ema(const CheckpointInfo& checkpoint) {
  if (!checkpoint.has_ema) {
    throw DataError("'" + checkpoint.dir.string() +
                    "': holds no ema.safetensors (written without train.ema)");
  }
  return model::load_safetensors((checkpoint.dir / "ema.safetensors").string());
}

void check_resume_plan(const CheckpointInfo& resume, const CheckpointPlan& now) {
  const CheckpointPlan& then = resume.plan;
  if (then.world_size == 0) return;  // written before plans were recorded
  const bool same = then.world_size == now.world_size &&
                    then.steps_per_epoch == now.steps_per_epoch &&
                    then.shard_digests == now.shard_digests;
  if (same) return;
  const std::string change =
      then.world_size != now.world_size
          ? fmt::format("{} workers wrote it, this run has {}", then.world_size, now.world_size)
          : fmt::format(
                "the same {} workers, but the data is sharded differently ({} steps per "
                "epoch then, {} now)",
                now.world_size, then.steps_per_epoch, now.steps_per_epoch);
  const TrainPosition& at = resume.position;
  if (at.batch_in_epoch != 0) {
    throw ConfigError(fmt::format(
        "cannot resume from {}: it was written in the middle of epoch {} (after batch {} of {}) "
        "and {}; the batches left in that epoch would be other examples. Resume with {} workers, "
        "or from a checkpoint at the end of an epoch (checkpoint.every_epochs)",
        resume.dir.string(), at.epoch + 1, at.batch_in_epoch, then.steps_per_epoch, change,
        then.world_size));
  }
  spdlog::info(
      "resuming at the start of epoch {} with a new data plan: {}; {} steps per epoch (was {})",
      at.epoch + 1, change, now.steps_per_epoch, then.steps_per_epoch);
}

}  // namespace trainer::train
