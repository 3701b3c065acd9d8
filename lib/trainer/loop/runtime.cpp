#include "trainer/loop/runtime.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <regex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#ifdef TRAINER_WITH_CUDA
#include <link.h>

#include <cstring>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "trainer/dist/process_group.h"
#include "trainer/model/hub.h"
#include "trainer/model/pth.h"
#include "trainer/model/safetensors.h"
#include "trainer/util/cpu.h"
#include "trainer/util/cuda_driver.h"
#include "trainer/util/device.h"
#include "trainer/util/error.h"
#include "trainer/util/storage.h"
#include "trainer/util/torch_compat.h"

namespace trainer::train {

namespace {

// The GPU's compute capability major (0 in a build without CUDA).
int cuda_major(const torch::Device& device) {
#ifdef TRAINER_WITH_CUDA
  return at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->major;
#else
  (void)device;
  return 0;
#endif
}

}  // namespace

namespace {

std::string gpus_text(int n) { return fmt::format("{} visible GPU{}", n, n == 1 ? "" : "s"); }

}  // namespace

DeviceChoice choose_device(const std::string& device, const std::string& backend,
                           const cluster::LocalRank& local, int visible_gpus,
                           const std::string& no_gpu_reason) {
  const int fixed = config::cuda_device_index(device);
  if (device != "auto" && device != "cpu" && device != "cuda" && fixed < 0) {
    throw ConfigError("train.device: expected auto, cpu, cuda or cuda:N, got '" + device + "'");
  }
  if (device == "cpu") return {torch::Device(torch::kCPU), "train.device: cpu"};
  if (visible_gpus <= 0) {
    if (device == "auto") {
      return {torch::Device(torch::kCPU),
              "train.device: auto, no CUDA GPU visible to this LibTorch"};
    }
    throw ConfigError("train.device: '" + device + "' requested, but " +
                      (no_gpu_reason.empty()
                           ? std::string("this LibTorch build sees no CUDA GPU (Debian's libtorch "
                                         "is CPU-only; build against a CUDA LibTorch with "
                                         "-DCMAKE_PREFIX_PATH)")
                           : no_gpu_reason));
  }
  if (fixed >= visible_gpus) {
    throw ConfigError(fmt::format(
        "train.device: {}, but this process sees {} (cuda:0 to cuda:{}; CUDA_VISIBLE_DEVICES "
        "numbers the GPUs it lists from 0)",
        device, gpus_text(visible_gpus), visible_gpus - 1));
  }
  // Local ranks on this host: LOCAL_WORLD_SIZE or its like, else at least this one's index + 1.
  const int local_ranks = std::max(local.world_size, local.index + 1);
  const bool nccl = backend == "nccl" || backend == "auto";  // auto: NCCL on a GPU
  const std::string nccl_name =
      backend == "auto" ? "distributed.backend: auto (NCCL on GPUs)" : "distributed.backend: nccl";
  if (nccl && fixed >= 0 && local_ranks > 1) {
    throw ConfigError(fmt::format(
        "train.device: {} puts all {} local ranks on this host ({}) on one GPU, and {} needs a "
        "GPU for each; use train.device: cuda (local rank mod GPUs) or distributed.backend: gloo",
        device, local_ranks, local.source, nccl_name));
  }
  if (nccl && local_ranks > visible_gpus) {
    throw ConfigError(fmt::format(
        "{} needs a GPU for each process, but this host runs {} local ranks ({}) and this "
        "process sees {}; run at most {} process(es) per host, make more GPUs visible "
        "(CUDA_VISIBLE_DEVICES), or use distributed.backend: gloo",
        nccl_name, local_ranks, local.source, gpus_text(visible_gpus), visible_gpus));
  }
  if (fixed >= 0) {
    return {torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(fixed)),
            fmt::format("train.device: {}, {}", device, gpus_text(visible_gpus))};
  }
  const int index = local.index % visible_gpus;
  std::string why = local.source + ", " + gpus_text(visible_gpus);
  if (index != local.index) {
    why += fmt::format(": {} mod {} = {}", local.index, visible_gpus, index);
  }
  return {torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index)), why};
}

DeviceChoice resolve_device(const std::string& device, const std::string& backend,
                            const cluster::LocalRank& local) {
  if (device == "cpu") return choose_device(device, backend, local, 0);
  std::string no_gpu;
#ifdef TRAINER_WITH_CUDA
  // The driver first: LibTorch would only warn that it is too old and see no GPU, and auto
  // would then train on the CPU of a GPU machine without a word.
  const util::CudaDriver driver = util::probe_cuda_driver();
  const std::string problem = util::cuda_driver_problem(driver, CUDART_VERSION);
  if (!problem.empty()) throw ConfigError("train.device: " + device + ": " + problem);
  if (driver.cuda_version == 0) {
    no_gpu = "this machine has " + driver.missing +
             " (in Docker: run with --gpus all on a host with the NVIDIA container toolkit)";
  }
#endif
  const int gpus = no_gpu.empty() && torch::cuda::is_available()
                       ? static_cast<int>(torch::cuda::device_count())
                       : 0;
  if (gpus == 0 && no_gpu.empty()) {
#ifdef TRAINER_WITH_CUDA
    no_gpu = "the NVIDIA driver here (" + util::describe_cuda_driver(driver, CUDART_VERSION) +
             ") shows no GPU to this process (CUDA_VISIBLE_DEVICES, or the GPUs the container "
             "was given)";
#endif
  }
  return choose_device(device, backend, local, gpus, no_gpu);
}

void activate_device(const torch::Device& device) {
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

std::string ThreadBudget::describe() const {
  std::string out = fmt::format(
      "{} core(s) in this process's CPU affinity: {} intra-op, {} "
      "inter-op, {} decode",
      cores, intra_op, inter_op, decode);
  if (record_reader > 0) out += fmt::format(", {} record reader", record_reader);
  if (gloo > 0) out += fmt::format(", {} Gloo", gloo);
  return out + " thread(s)";
}

ThreadBudget plan_threads(int threads, int num_workers, int cores, bool records, bool distributed) {
  ThreadBudget b;
  b.cores = std::max(1, cores);
  b.decode = num_workers > 0 ? num_workers : std::max(1, b.cores / 8);
  b.intra_op = threads > 0 ? threads : std::max(1, b.cores - (b.cores >= 8 ? b.decode : 0));
  b.inter_op = 1;
  b.record_reader = records ? 1 : 0;
  b.gloo = distributed ? (b.cores >= 8 ? 2 : 1) : 0;
  return b;
}

ThreadBudget plan_threads(const config::JobSpec& spec, int world_size) {
  return plan_threads(spec.train.threads, spec.data.num_workers, util::usable_cores(),
                      spec.data.train.format == "tfrecord", world_size > 1);
}

int apply_threads(const ThreadBudget& budget) {
  static std::once_flag inter_op_once;
  std::call_once(inter_op_once, [&] {
    try {
      at::set_num_interop_threads(budget.inter_op);
    } catch (const std::exception& e) {  // parallel work already started: keep LibTorch's
      spdlog::debug("inter-op threads left as they are: {}", e.what());
    }
  });
  torch::set_num_threads(budget.intra_op);
  return torch::get_num_threads();
}

int configure_threads(int threads) {
  return apply_threads(plan_threads(threads, 1, util::usable_cores(), false, false));
}

std::string effective_precision(const std::string& precision, int cuda_major,
                                bool cpu_native_bf16) {
  const bool cuda = cuda_major > 0;
  if (precision == "auto") {
    if (cuda) return cuda_major >= 8 ? "bf16" : cuda_major == 7 ? "fp16" : "fp32";
    return cpu_native_bf16 ? "bf16" : "fp32";
  }
  if (precision == "bf16" && cuda && cuda_major < 8) {
    throw ConfigError(fmt::format(
        "train.precision: bf16 needs a GPU of compute capability 8.0 or newer (A100, L4, H100), "
        "and this one is {}.x, which has no bf16 arithmetic; use fp16 (autocast with loss "
        "scaling, as Keras' mixed_float16) or auto, which picks fp16 here",
        cuda_major));
  }
  if (precision == "fp16" && !cuda) {
    throw ConfigError(
        "train.precision: fp16 trains on CUDA GPUs only (LibTorch has no fp16 autocast for the "
        "CPU); use bf16 on a CPU that computes it natively, or auto");
  }
  return precision;
}

std::string effective_precision(const std::string& precision, const torch::Device& device) {
  if (device.is_cuda()) return effective_precision(precision, cuda_major(device), false);
  return effective_precision(precision, 0, util::cpu_features().native_bf16());
}

std::string inference_precision(const std::string& saved, const torch::Device& device) {
  if (saved == "fp16" && !device.is_cuda()) return "fp32";
  return saved;
}

bool effective_deterministic(const std::string& deterministic, const torch::Device& device) {
  if (deterministic == "auto") return !device.is_cuda();
  return deterministic == "true";
}

void configure_kernels(const torch::Device& device, bool deterministic) {
  if (!device.is_cuda()) return;
  auto& ctx = at::globalContext();
  if (deterministic) {
    // cuBLAS is deterministic only with a fixed workspace; it reads this when its first handle
    // is created, which is after this call (nothing has run on the GPU yet).
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    ctx.setDeterministicCuDNN(true);
    ctx.setBenchmarkCuDNN(false);
    ctx.setDeterministicAlgorithms(true, /*warn_only=*/false);
  } else {
    ctx.setDeterministicCuDNN(false);
    ctx.setBenchmarkCuDNN(true);
  }
}

#ifdef TRAINER_WITH_CUDA
namespace {

// "9.19.0" for cuDNN's 91900 (major * 10000 from cuDNN 9 on, * 1000 before).
std::string cudnn_version_text(long v) {
  if (v >= 90000) return fmt::format("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100);
  return fmt::format("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100);
}

// The GPU architectures LibTorch's kernels were compiled for: its build records the NVCC flags
// ("-gencode;arch=compute_75,code=sm_75;...") in libtorch_cuda.so, and its CUDA hooks print
// them only where a driver answers, so they are read from the loaded library's segments here.
// "sm_75 sm_80 ... sm_120", with "+ PTX compute_X" when it carries PTX that newer GPUs can
// compile.
std::string compiled_architectures() {
  struct Found {
    std::string flags;
  } found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* out = static_cast<Found*>(data);
        const std::string name = info->dlpi_name == nullptr ? "" : info->dlpi_name;
        if (name.find("libtorch_cuda.so") == std::string::npos) return 0;
        static const std::string kNeedle = "arch=compute_";
        for (int i = 0; i < info->dlpi_phnum && out->flags.empty(); ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || (ph.p_flags & PF_R) == 0 || (ph.p_flags & PF_W) != 0)
            continue;
          const char* begin = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
          const char* end = begin + ph.p_filesz;
          const void* hit = ::memmem(begin, ph.p_filesz, kNeedle.data(), kNeedle.size());
          if (hit == nullptr) continue;
          const char* first = static_cast<const char*>(hit);
          while (first > begin && first[-1] != '\0') --first;
          const char* last = static_cast<const char*>(hit);
          while (last < end && *last != '\0') ++last;
          out->flags.assign(first, last);
        }
        return out->flags.empty() ? 0 : 1;
      },
      &found);
  std::vector<std::string> sass, ptx;
  const std::regex code("code=(sm|compute)_([0-9]+[af]?)");
  for (auto it = std::sregex_iterator(found.flags.begin(), found.flags.end(), code);
       it != std::sregex_iterator(); ++it) {
    auto& list = (*it)[1] == "sm" ? sass : ptx;
    const std::string name = (*it)[1].str() + "_" + (*it)[2].str();
    if (std::find(list.begin(), list.end(), name) == list.end()) list.push_back(name);
  }
  if (sass.empty() && ptx.empty()) return "unknown (not found in libtorch_cuda.so)";
  std::string out = fmt::format("{}", fmt::join(sass, " "));
  if (!ptx.empty()) out += fmt::format("{}+ PTX {}", out.empty() ? "" : " ", fmt::join(ptx, " "));
  return out;
}

}  // namespace
#endif

std::string version_report(const std::string& trainer_version) {
  std::string out = "trainer " + trainer_version + "\n";
  out += fmt::format("LibTorch {}\n", TORCH_VERSION);
#ifdef TRAINER_WITH_CUDA
  const auto& hooks = at::detail::getCUDAHooks();
  out += "CUDA " + util::cuda_version_text(static_cast<int>(hooks.versionCUDART())) +
         " (built with)\n";
  long cudnn = 0;
  try {
    cudnn = hooks.versionCuDNN();
  } catch (const c10::Error&) {
    // A LibTorch built without cuDNN.
  }
  out += "cuDNN " + (cudnn > 0 ? cudnn_version_text(cudnn) : std::string("none")) + "\n";
  out += "NCCL " + dist::nccl_version() + "\n";
  out += "GPU architectures: " + compiled_architectures() + "\n";
  const util::CudaDriver driver = util::probe_cuda_driver();
  out += util::describe_cuda_driver(driver, CUDART_VERSION) + "\n";
  // A driver too old for this CUDA: LibTorch would only warn, so it is not asked.
  const bool usable =
      driver.cuda_version > 0 && util::cuda_driver_problem(driver, CUDART_VERSION).empty();
  const int gpus =
      usable && torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (driver.cuda_version > 0 && !usable) {
    out +=
        "GPUs: not asked (the driver is too old for this CUDA: train.device auto or cuda exits "
        "2)\n";
  } else if (gpus == 0) {
    out += "GPUs: none visible (no GPU or no driver: training runs on the CPU)\n";
  }
  for (int i = 0; i < gpus; ++i) {
    const auto* p = at::cuda::getDeviceProperties(i);
    out += fmt::format("GPU cuda:{}: {}, compute capability {}.{}, {:.0f} GiB\n", i, p->name,
                       p->major, p->minor, static_cast<double>(p->totalGlobalMem) / (1 << 30));
  }
#else
  out +=
      "CUDA none (a CPU build)\ncuDNN none\nNCCL none\nGPU architectures: none (a CPU build)\n"
      "GPUs: none (a CPU build)\n";
#endif
  out.pop_back();  // CLI11 ends the line
  return out;
}

std::pair<double, double> measure_bf16_cost() {
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({8, 64, 28, 28});
  const auto w = torch::randn({64, 64, 3, 3});
  auto time = [&](torch::ScalarType t) {
    const auto xt = x.to(t), wt = w.to(t);
    torch::conv2d(xt, wt, {}, 1, 1);  // warm-up
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) torch::conv2d(xt, wt, {}, 1, 1);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 3;
  };
  return {time(torch::kBFloat16), time(torch::kFloat)};
}

ModelSettings model_settings(const config::JobSpec& spec, const torch::Device& device,
                             bool warn_emulated_bf16, bool measure) {
  const config::TrainSpec& train = spec.train;
  ModelSettings s;
  s.normalize = data::parse_normalize(spec.data.normalize);
  s.device = device;
  s.precision = effective_precision(train.precision, s.device);
  s.deterministic = effective_deterministic(train.deterministic, s.device);
  s.channels_last = train.channels_last == "true" ||
                    (train.channels_last == "auto" && s.device.is_cuda() && s.precision != "fp32");
  if (s.device.is_cpu() && (train.precision == "auto" || train.channels_last == "auto")) {
    FormatRequest request;
    request.precision = train.precision;
    request.channels_last = train.channels_last;
    request.arch = spec.model.arch;
    request.head_hidden = spec.model.head_hidden;
    request.image_size = spec.data.image_size;
    request.batch =
        train.micro_batch_size > 0 ? train.micro_batch_size : train.per_replica_batch_size;
    FormatChoice choice;
    if (measure) {
      choice = choose_cpu_format(request);
    } else {
      choice.format = format_candidates(train.precision, train.channels_last, cpu_can_bf16())[0];
      choice.source = "pending";
    }
    s.precision = choice.format.precision;
    s.channels_last = choice.format.channels_last;
    if (measure) spdlog::info("train.precision/channels_last auto: {}", choice.summary());
    s.format_choice = std::move(choice);
  }
  s.norm = data::norm_constants(s.normalize, s.device);
  if (warn_emulated_bf16 && train.precision == "bf16" && s.device.is_cpu() &&
      !util::cpu_features().native_bf16()) {
    const auto [bf16_s, fp32_s] = measure_bf16_cost();
    spdlog::warn(
        "train.precision: bf16 on a CPU without native bf16 (no AVX512_BF16 or AMX-BF16): "
        "LibTorch emulates it here, and a convolution took {:.1f}x as long in bf16 as in fp32 "
        "({:.1f} ms vs {:.1f} ms); train.precision: auto picks fp32 on this CPU",
        bf16_s / fp32_s, 1e3 * bf16_s, 1e3 * fp32_s);
  }
  return s;
}

void adopt_format_choice(ModelSettings& settings, const nlohmann::json& chief) {
  FormatChoice choice = FormatChoice::from_json(chief);
  const std::string here = cpu_description();
  if (!choice.cpu_model.empty() && choice.cpu_model != here) {
    spdlog::warn(
        "train.precision/channels_last auto: the chief chose {} on {}; this host's CPU is {}, "
        "where that choice was not measured (set train.precision and train.channels_last "
        "explicitly for hosts of different kinds)",
        choice.format.label(), choice.cpu_model, here);
  }
  choice.source = "chief";
  settings.precision = choice.format.precision;
  settings.channels_last = choice.format.channels_last;
  spdlog::info("train.precision/channels_last auto: {}", choice.summary());
  settings.format_choice = std::move(choice);
}

void place_model(model::Net& net, const ModelSettings& settings) {
  net->to(settings.device);
  if (!settings.channels_last) return;
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }
}

model::Net build_model(const config::ModelSpec& spec, int64_t num_classes, int64_t seed) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  model::Net net = model::make_net({spec.arch, num_classes, spec.head_hidden});
  if (!spec.pretrained.empty()) {
    // A path as it is; a URL or torchvision:NAME fetched into torch.hub's cache (model/hub.h).
    const std::string file = model::resolve_pretrained(spec.pretrained, spec.arch);
    const auto report = model::load_state_dict(*net, model::load_weights(file),
                                               "model.pretrained '" + spec.pretrained + "'",
                                               /*allow_classifier_mismatch=*/true);
    spdlog::info("loaded pretrained weights from {}", spec.pretrained);
    if (!report.reinitialised.empty()) {
      spdlog::info("classifier differs from the pretrained file ({} tensors): freshly initialised",
                   report.reinitialised.size());
    }
  }
  if (spec.freeze_backbone) model::freeze_backbone(*net);
  return net;
}

torch::Tensor prepare_input(const torch::Tensor& images, const ModelSettings& settings) {
  return data::normalize_images(images.to(settings.device, /*non_blocking=*/true),
                                settings.normalize, settings.channels_last, settings.norm);
}

torch::Tensor prepare_labels(const torch::Tensor& labels, const ModelSettings& settings) {
  return labels.to(settings.device, /*non_blocking=*/true);
}

struct StepTimer::Impl {
  bool cuda = false;
  std::vector<std::chrono::steady_clock::time_point> host;  // marks not yet paired
#ifdef TRAINER_WITH_CUDA
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events;
#endif
};

StepTimer::StepTimer(const torch::Device& device) : impl_(std::make_unique<Impl>()) {
#ifdef TRAINER_WITH_CUDA
  impl_->cuda = device.is_cuda();
#else
  (void)device;
#endif
}

StepTimer::~StepTimer() = default;

void StepTimer::mark() {
#ifdef TRAINER_WITH_CUDA
  if (impl_->cuda) {
    impl_->events.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    impl_->events.back()->record();
    return;
  }
#endif
  impl_->host.push_back(std::chrono::steady_clock::now());
}

std::vector<double> StepTimer::intervals() {
  std::vector<double> out;
#ifdef TRAINER_WITH_CUDA
  if (impl_->cuda) {
    auto& e = impl_->events;
    for (size_t i = 1; i < e.size(); ++i) out.push_back(e[i - 1]->elapsed_time(*e[i]) / 1000.0);
    if (!e.empty()) e.erase(e.begin(), e.end() - 1);  // the last mark starts the next interval
    return out;
  }
#endif
  auto& h = impl_->host;
  for (size_t i = 1; i < h.size(); ++i) {
    out.push_back(std::chrono::duration<double>(h[i] - h[i - 1]).count());
  }
  if (!h.empty()) h.erase(h.begin(), h.end() - 1);
  return out;
}

void StepTimer::reset() {
  impl_->host.clear();
#ifdef TRAINER_WITH_CUDA
  impl_->events.clear();
#endif
}

StepSyncCheck::StepSyncCheck(const torch::Device& device, bool announce) {
  const char* env = std::getenv("TRAINER_CUDA_SYNC_DEBUG");
  const std::string mode = env == nullptr ? "" : env;
  if (mode.empty()) return;
  if (mode != "warn" && mode != "error") {
    throw ConfigError("TRAINER_CUDA_SYNC_DEBUG: expected warn or error, got '" + mode + "'");
  }
  if (!device.is_cuda()) return;
#ifdef TRAINER_WITH_CUDA
  mode_ = static_cast<int>(mode == "error" ? c10::cuda::SyncDebugMode::L_ERROR
                                           : c10::cuda::SyncDebugMode::L_WARN);
  if (announce) {
    spdlog::info(
        "TRAINER_CUDA_SYNC_DEBUG={}: from the second step on, a host synchronisation "
        "inside a step or an evaluation batch {}",
        mode, mode == "error" ? "fails the run" : "warns");
  }
#endif
}

void StepSyncCheck::begin_step() {
  if (mode_ == 0 || steps_++ == 0) return;
#ifdef TRAINER_WITH_CUDA
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(mode_));
#endif
}

void StepSyncCheck::end_step() {
  if (mode_ == 0) return;
#ifdef TRAINER_WITH_CUDA
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
#endif
}

HostSyncAllowed::HostSyncAllowed() {
#ifdef TRAINER_WITH_CUDA
  saved_ = static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode());
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
#endif
}

HostSyncAllowed::~HostSyncAllowed() {
#ifdef TRAINER_WITH_CUDA
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(saved_));
#endif
}

torch::Tensor forward_logits(model::Net& net, const torch::Tensor& input,
                             const ModelSettings& settings) {
  torch::Tensor logits;
  {
    compat::AutocastGuard autocast(settings.autocast(), settings.device, settings.autocast_dtype());
    logits = net->forward(input);
  }
  return logits.to(torch::kFloat);
}

}  // namespace trainer::train
