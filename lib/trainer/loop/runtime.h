// Run-time set-up shared by train, evaluate and predict: the device from train.device, the
// intra-op thread count, and the model built from the spec (ResNet + pretrained weights +
// freezing + memory format). Not thread-safe (configures process-wide LibTorch state).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/cluster/local_rank.h"
#include "trainer/config/job_spec.h"
#include "trainer/data/image.h"
#include "trainer/loop/kernel_choice.h"
#include "trainer/model/net.h"

namespace trainer::train {

// The device this process runs on, and why (for the log and inspect).
struct DeviceChoice {
  torch::Device device = torch::kCPU;
  std::string why;  // "LOCAL_RANK=1 of LOCAL_WORLD_SIZE=2, 2 visible GPUs"
};

// train.device for the process at `local` on a host where it sees `visible_gpus` GPUs (CUDA has
// applied CUDA_VISIBLE_DEVICES): cpu = the CPU; auto = cuda when a GPU is visible, else the CPU;
// cuda = GPU local.index mod visible_gpus; cuda:N = GPU N. `backend` is distributed.backend:
// NCCL (nccl, or auto on a GPU) needs a GPU of its own for every local rank. Pure. Throws
// ConfigError (exit 2) for cuda or cuda:N without a GPU, cuda:N with N >= visible_gpus, and, under
// NCCL, more local ranks than GPUs or several local ranks on one cuda:N; each names the numbers.
// `no_gpu_reason`, when given, says why no GPU is visible (no driver, none given to the
// container) in the error for cuda without a GPU.
DeviceChoice choose_device(const std::string& device, const std::string& backend,
                           const cluster::LocalRank& local, int visible_gpus,
                           const std::string& no_gpu_reason = "");

// choose_device with the GPUs this LibTorch sees (torch::cuda::device_count(); none is asked
// for train.device: cpu). In a CUDA build the NVIDIA driver is checked first: one too old for
// the build's CUDA is a ConfigError (exit 2) naming the driver found and the release needed,
// for auto as for cuda (a GPU machine whose driver cannot run this build is not a CPU machine).
DeviceChoice resolve_device(const std::string& device, const std::string& backend,
                            const cluster::LocalRank& local);

// Makes `device` the current CUDA device (c10::cuda::set_device) in CUDA builds, so that later
// CUDA work, NCCL's communicator included, runs there and no other GPU gets a context. Call it
// right after resolve_device, before any CUDA work. A no-op for the CPU and in CPU builds.
void activate_device(const torch::Device& device);

// How this process spends the cores it may use (its CPU affinity mask), decided once from
// train.threads and data.num_workers (0 = auto) and logged once:
//  - decode threads: data.num_workers, or auto = 1 per 8 cores (at least 1);
//  - intra-op threads: train.threads, or auto = the cores less the decode threads once there are
//    8 or more cores (below that the decode threads, which wait on a full prefetch queue most of
//    the step, share the cores with compute);
//  - inter-op threads: 1 (the step runs no parallel graph branches);
//  - the record reader: 1 thread for tfrecord sources (mostly blocked on reads);
//  - Gloo: 1 thread below 8 cores, else 2 (c10d's default), for multi-worker jobs.
struct ThreadBudget {
  int cores = 1;
  int intra_op = 1;
  int inter_op = 1;
  int decode = 1;
  int record_reader = 0;
  int gloo = 0;  // 0 = not distributed
  std::string describe() const;
};

ThreadBudget plan_threads(int threads, int num_workers, int cores, bool records, bool distributed);

// plan_threads for `spec` on the cores of this process's affinity mask, in a job of
// `world_size` training processes.
ThreadBudget plan_threads(const config::JobSpec& spec, int world_size);

// Sets LibTorch's intra-op threads and, once per process, its inter-op threads; returns the
// intra-op count in force.
int apply_threads(const ThreadBudget& budget);

// Sets LibTorch's intra-op threads (0 = the cores of the affinity mask) and returns the count in
// force (evaluate, predict).
int configure_threads(int threads);

// train.precision resolved for this device and CPU by the rule of thumb: "fp32", "bf16" or
// "fp16". auto = bf16 where it is computed natively (a CPU with AVX512_BF16 or AMX-BF16, a CUDA GPU
// of compute capability 8+), fp16 on GPUs of compute capability 7.x (V100, T4: tensor cores for
// fp16 only), else fp32. The rule decides on GPUs; on a CPU, model_settings measures instead
// (loop/kernel_choice.h), since the flags do not tell whether bf16 is faster there.
// Throws ConfigError for bf16 on a GPU older than sm80 and for fp16 on a CPU (neither computes
// it: the message says why and what to use).
std::string effective_precision(const std::string& precision, const torch::Device& device);

// The same rule on plain facts, for tests: `cuda_major` is the GPU's compute capability major
// (0 = the CPU), `cpu_native_bf16` whether the CPU computes bf16 natively.
std::string effective_precision(const std::string& precision, int cuda_major, bool cpu_native_bf16);

// The precision a saved model (model.json's `precision`) runs inference in on `device`: fp16
// only on a GPU (CPUs have no fp16 autocast), else fp32; bf16 as saved.
std::string inference_precision(const std::string& saved, const torch::Device& device);

// train.deterministic resolved for the device: auto = on for CPU, off for CUDA.
bool effective_deterministic(const std::string& deterministic, const torch::Device& device);

// Sets LibTorch's process-wide kernel choice for `device`: deterministic = cuDNN deterministic,
// benchmark mode off, deterministic algorithms (CUBLAS_WORKSPACE_CONFIG set when unset, as
// cuBLAS requires); otherwise cuDNN benchmark mode on for CUDA. A no-op for the CPU.
void configure_kernels(const torch::Device& device, bool deterministic);

// Seconds of one bf16 and one fp32 convolution step (forward + backward of a 3x3 conv) on this
// CPU, for the warning that bf16 is emulated here.
std::pair<double, double> measure_bf16_cost();

// What `trainer --version` prints: the trainer's version, then LibTorch's, the CUDA, cuDNN and
// NCCL it was built with ("none" in a CPU build), the GPU architectures LibTorch's kernels were
// compiled for, the NVIDIA driver found and the one this CUDA needs, and the GPUs this process
// sees now (none on a machine without a GPU or driver: a CUDA build starts there and trains on
// the CPU).
std::string version_report(const std::string& trainer_version);

// How the model runs and what its input is: device, precision, layout, and how the uint8 pixels
// of a batch become the float input (data.normalize).
struct ModelSettings {
  torch::Device device = torch::kCPU;
  bool channels_last = false;
  std::string precision = "fp32";  // effective: fp32 | bf16 | fp16 (autocast dtype)
  bool deterministic = true;       // effective train.deterministic
  // How train.precision / train.channels_last auto were decided on the CPU (timings, cache);
  // absent when neither is auto or on a GPU.
  std::optional<FormatChoice> format_choice;
  data::Normalize normalize = data::Normalize::kImagenet;
  // The normalisation constants on `device`, made once (model_settings, or the first
  // prepare_input on a settings object that lacks them).
  data::NormConstants norm;

  bool autocast() const { return precision != "fp32"; }
  c10::ScalarType autocast_dtype() const {
    return precision == "fp16" ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
  }
  bool loss_scaling() const { return precision == "fp16"; }
};

// The device, effective precision and layout of spec.train, the normalisation of spec.data.
// When bf16 is requested explicitly on a CPU that only emulates it, logs a warning with the
// measured cost (warn_emulated_bf16). `device` is resolve_device's choice. On a GPU, auto
// precision follows effective_precision and auto channels_last is true under fp16/bf16 autocast.
// On a CPU, auto precision or layout is choose_cpu_format's timing at torch's current intra-op
// threads (set them first) and logged; with `measure` false (a worker, which takes the chief's
// choice with adopt_format_choice) the first candidate stands in until then.
ModelSettings model_settings(const config::JobSpec& spec, const torch::Device& device,
                             bool warn_emulated_bf16 = true, bool measure = true);

// A worker's settings with the chief's choice (FormatChoice::to_json), source "chief"; warns
// when the chief's CPU is another model than this one's (its timings need not hold here).
void adopt_format_choice(ModelSettings& settings, const nlohmann::json& chief);

// Moves the model to the device (and channels_last memory format when asked).
void place_model(model::Net& net, const ModelSettings& settings);

// Builds the ResNet of `spec` for `num_classes`, seeded with `seed`, loads `spec.pretrained`
// (classifier may differ in shape: freshly initialised, logged), applies freeze_backbone.
model::Net build_model(const config::ModelSpec& spec, int64_t num_classes, int64_t seed);

// The model's input from a loader batch ([B, S, S, 3] uint8): moved to the model's device as
// uint8 (asynchronously from pinned memory), then normalised there into float32 in the model's
// memory format (normalize_images with settings.norm).
torch::Tensor prepare_input(const torch::Tensor& images, const ModelSettings& settings);

// Labels to the model's device (asynchronously from pinned memory).
torch::Tensor prepare_labels(const torch::Tensor& labels, const ModelSettings& settings);

// Step times measured where the work runs: CUDA events on the current stream for a GPU (the host
// runs ahead of the GPU, so its clock says when work was queued, not done), the host's steady
// clock for the CPU. mark() records a point; intervals() returns the seconds between
// consecutive marks not yet returned (the first mark of all only starts the count). For a GPU,
// call intervals() only after the marks are known to be complete (after a wait on the device).
class StepTimer {
 public:
  explicit StepTimer(const torch::Device& device);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;
  void mark();
  std::vector<double> intervals();
  void reset();  // forgets every mark

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// TRAINER_CUDA_SYNC_DEBUG=warn|error (a check's knob, as torch.cuda.set_sync_debug_mode): on a
// GPU, inside every training step after the first (warm-up allocates and may synchronise), each
// host synchronisation that CUDA's sync-debug mode notices (a blocking copy, .item(), a stream
// or device synchronize) warns or throws; outside the steps (checkpoints, the reads between
// them) and inside a HostSyncAllowed scope it is off. Evaluation uses one of its own over its
// batches (loop/evaluate.cpp), which read nothing back until the last. The constructor reads
// the variable (and logs the mode when `announce`): any value but warn or error is a
// ConfigError; unset, on the CPU or in a CPU-only build every call is a no-op.
class StepSyncCheck {
 public:
  explicit StepSyncCheck(const torch::Device& device, bool announce = true);
  void begin_step();
  void end_step();

 private:
  int mode_ = 0;  // c10::cuda::SyncDebugMode
  int64_t steps_ = 0;
};

// Scope in which a host synchronisation is intended (reading the metrics every
// logging.every_steps, the fp16 scaler's overflow flag): sync-debug mode off, restored after.
class HostSyncAllowed {
 public:
  HostSyncAllowed();
  ~HostSyncAllowed();
  HostSyncAllowed(const HostSyncAllowed&) = delete;
  HostSyncAllowed& operator=(const HostSyncAllowed&) = delete;

 private:
  int saved_ = 0;
};

// Forward pass under autocast (bf16 or fp16) when settings.autocast(); returns float32 logits.
torch::Tensor forward_logits(model::Net& net, const torch::Tensor& input,
                             const ModelSettings& settings);

}  // namespace trainer::train
