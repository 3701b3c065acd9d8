// train.precision: auto and train.channels_last: auto on the CPU, decided by measurement: CPU
// flags cannot tell a Xeon that runs bf16 at 2.3x fp32 (AMX usable) from one that runs it at
// 0.6x (AMX hidden by the hypervisor), nor say whether channels_last pays for a given LibTorch.
// So at start-up the job's own heaviest convolutions are timed, forward + backward, in each
// candidate format and the fastest is used. A small cache keyed by CPU model and vector units,
// LibTorch version, threads and shapes makes the next start immediate. Not thread-safe (runs
// LibTorch kernels on the process's intra-op pool, whose thread count the caller has set).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config/job_spec.h"

namespace trainer::train {

// One convolution of the model as the probe runs it: stride 1, padding kernel / 2.
struct ConvProbe {
  std::string name;  // the module's name in the model ("layer1.0.conv2")
  int64_t in_channels = 0, out_channels = 0, kernel = 0, groups = 1;
  int64_t size = 0;              // input height = width at the job's image size
  std::string describe() const;  // "layer1.0.conv2 (3x3, 64->64 at 56x56)"
};

// The model's 3x3 and 1x1 stride-1 convolutions with the most multiply-adds per image at
// `image_size` (the first, at the higher resolution, on a tie); a model without one of them
// gives the other only. Input sizes follow the convolutions' and max pools' strides in
// registration order (torchvision's forward order; each convolution padded by (k - 1) / 2, as
// every one of the supported families is), leaving out the side branches that do not
// change the main path's size (ResNet's `downsample`, squeeze-and-excitation's `fc1`/`fc2`,
// which see a 1x1 pooled map).
std::vector<ConvProbe> probe_convolutions(const torch::nn::Module& model, int64_t image_size);

// A format the step can run in.
struct Format {
  std::string precision = "fp32";  // fp32 | bf16
  bool channels_last = false;
  std::string label() const;  // "fp32 NCHW", "bf16 channels_last"
  bool operator==(const Format& o) const {
    return precision == o.precision && channels_last == o.channels_last;
  }
};

// The candidates of train.precision and train.channels_last on a CPU: auto precision offers
// fp32 and, where the CPU can run bf16 at all (`cpu_can_bf16`), bf16; auto layout offers NCHW
// and channels_last; with both auto, bf16 is tried in channels_last only (oneDNN's bf16 kernels
// are NHWC). An explicit value is the only candidate of its axis. `excluded` receives why a
// candidate was left out ("" when none).
std::vector<Format> format_candidates(const std::string& precision,
                                      const std::string& channels_last, bool cpu_can_bf16,
                                      std::string* excluded = nullptr);

// Whether LibTorch can run bf16 convolutions here at a useful speed: natively (AVX512_BF16 or
// AMX-BF16), or on a CPU that is not x86 (no CPUID to ask: measured like the others). An x86 CPU
// without them emulates bf16 at a twentieth of fp32's speed: not worth two seconds to confirm.
bool cpu_can_bf16();

// The timing of one candidate: seconds of one forward + backward pass of every probe, the best
// of the rounds it ran (0 = not timed).
struct FormatTiming {
  Format format;
  double seconds = 0;
  int rounds = 0;
};

struct FormatChoice {
  Format format;
  // measured | cached | chief (a worker takes the chief's) | only (one candidate: no timing)
  std::string source;
  std::vector<FormatTiming> timings;  // the candidates, in the order tried
  std::vector<ConvProbe> probes;
  int64_t batch = 0;
  int threads = 0;
  double spent_s = 0;           // wall time of the measurement (0 when cached)
  std::string excluded;         // why a candidate was not tried ("" = none)
  std::string cpu_model;        // the CPU the timings were taken on
  std::string key;              // the cache key
  std::string summary() const;  // one line for the log
  nlohmann::json to_json() const;
  static FormatChoice from_json(const nlohmann::json& j);  // throws DataError
};

// What a job asks for, on a CPU.
struct FormatRequest {
  std::string precision = "fp32";       // train.precision: fp32 | bf16 | auto
  std::string channels_last = "false";  // train.channels_last: false | true | auto
  std::string arch = "resnet50";
  int64_t head_hidden = 0;
  int64_t image_size = 224;
  int64_t batch = 16;  // examples per forward (the micro-batch, or the per-replica batch)
};

// The probe's batch: the job's, at most 16 (the formats' order does not change with the batch
// beyond that, and a 64-image pass of the widest layers takes seconds on a small CPU).
constexpr int64_t kMaxProbeBatch = 16;

// This CPU as the choice names it: the brand string and its vector units ("AMD EPYC (avx2,
// avx512f, avx512_bf16)"), which tell apart machines a hypervisor names alike.
std::string cpu_description();

// The cache file: $TRAINER_CACHE_DIR/kernel_choice.json, else $XDG_CACHE_HOME/trainer/..., else
// $HOME/.cache/trainer/...; "" when none of them is set.
std::string kernel_choice_cache_file();

// Decides the format of `request` on this CPU with torch's current intra-op threads: the one
// candidate when there is one; else the cached choice for the same key; else the candidates
// timed in alternation (a warm-up pass each, then rounds until about two seconds have passed,
// at least one; a candidate 1.5x slower than the best after a round stops early), the fastest
// chosen and written to the cache (an unreadable or unwritable cache is logged and skipped).
FormatChoice choose_cpu_format(const FormatRequest& request,
                               const std::string& cache_file = kernel_choice_cache_file());

}  // namespace trainer::train
