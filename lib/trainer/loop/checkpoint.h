// Checkpoints: everything needed to go on, in JOB_DIR/checkpoints/ckpt-<step>/ :
//   model.safetensors (torchvision keys), optimizer.pt (LibTorch archive), rng.safetensors
//   (the CPU generator), state.json (format version, epoch/batch position, global step, the
//   job fingerprint, the data plan it was written under: world size, steps per epoch and every
//   worker's shard digest; the loss scaler's state for fp16 runs; the training recipe's state:
//   the validation decisions and the EMA's count; and the size + CRC-32 of every other file),
//   and ema.safetensors (the EMA of the weights, train.ema) when the job keeps one.
// Tensors are stored from whatever device they were on and loaded onto the run's device, so a
// job resumes CPU-to-GPU, GPU-to-CPU and onto another GPU index.
// A checkpoint is written under a temp name, each file fsynced, then the directory renamed, so a
// reader never sees a half-written one; on load every file is checked against state.json and
// a damaged checkpoint is skipped (logged) in favour of the next older one. Not thread-safe.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/model/safetensors.h"

namespace trainer::train {

namespace fs = std::filesystem;

inline constexpr int kCheckpointFormatVersion = 1;

struct TrainPosition {
  int64_t epoch = 0;           // the epoch to run next (0-based)
  int64_t batch_in_epoch = 0;  // the first batch of `epoch` not yet trained
  int64_t global_step = 0;     // optimizer steps taken so far
};

// The data plan a checkpoint's position means something under: a batch number within an epoch
// names the same examples only with the same workers and shards.
struct CheckpointPlan {
  int world_size = 0;                      // 0 = not recorded (a checkpoint from before)
  int64_t steps_per_epoch = 0;             // lock-step batches per epoch
  std::vector<std::string> shard_digests;  // per rank: data::shard_digest of its shard plan
};

struct CheckpointInfo {
  fs::path dir;
  TrainPosition position;
  std::string fingerprint;
  CheckpointPlan plan;
  nlohmann::json loss_scaler;  // LossScaler::state() of an fp16 run; null when none was saved
  nlohmann::json recipe;       // the recipe's state (train_job); null when none was saved
  bool has_ema = false;        // ema.safetensors is there
};

// Reads one checkpoint directory's state.json and checks every file it lists (size and CRC).
// Throws DataError naming the file and the damage (bad JSON, a missing or mistyped field, a
// file that is missing, differs, or is not one of the checkpoint's own).
CheckpointInfo verify_checkpoint(const fs::path& dir);

// Writes a checkpoint for `position`, then removes every checkpoint of a later step (a history
// this run left by resuming from an older one) and all but the newest `keep`.
fs::path save_checkpoint(const fs::path& checkpoints_dir, const TrainPosition& position,
                         const std::string& fingerprint, const CheckpointPlan& plan,
                         const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                         int keep, const nlohmann::json& loss_scaler = nlohmann::json(),
                         const nlohmann::json& recipe = nlohmann::json(),
                         const model::StateDict* ema = nullptr);

// The EMA weights of a checkpoint that has them (has_ema). Throws DataError on damage.
model::StateDict load_checkpoint_ema(const CheckpointInfo& checkpoint);

// Whether `resume` may continue under `now`: the same plan always; another world size or shard
// plan only from a checkpoint at an epoch boundary (batch_in_epoch 0; the new plan then starts
// that epoch, and is logged). From a mid-epoch checkpoint that is a ConfigError (exit 2) naming
// both world sizes: the batch number would name other examples, silently a different epoch.
void check_resume_plan(const CheckpointInfo& resume, const CheckpointPlan& now);

// Every complete checkpoint that verifies, oldest first (the damaged, and any deleted while being
// read, are left out quietly: for a reader that polls, such as the evaluator task).
std::vector<CheckpointInfo> complete_checkpoints(const fs::path& checkpoints_dir);

// The newest complete, undamaged checkpoint, or nullopt. Damaged ones are logged and skipped.
std::optional<CheckpointInfo> latest_checkpoint(const fs::path& checkpoints_dir);

// Loads model, optimizer and RNG state from `checkpoint`, every tensor onto `device` (the
// model's parameters keep their device; the optimizer's state is mapped there whatever device
// wrote it). Throws DataError on damage.
void restore_checkpoint(const CheckpointInfo& checkpoint, torch::nn::Module& model,
                        torch::optim::Optimizer& optimizer,
                        const torch::Device& device = torch::kCPU);

// The optimizer state in `bytes` (an optimizer.pt) loaded into `optimizer` onto `device`.
// Throws DataError naming `origin`.
void load_optimizer_state(const std::string& bytes, torch::optim::Optimizer& optimizer,
                          const torch::Device& device, const std::string& origin);

}  // namespace trainer::train
