#include "trainer/train/runtime.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#ifdef TRAINER_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "trainer/model/pth.h"
#include "trainer/model/safetensors.h"
#include "trainer/util/cpu.h"
#include "trainer/util/error.h"
#include "trainer/util/storage.h"
#include "trainer/util/torch_compat.h"

namespace trainer::train {

namespace {

bool cuda_supports_bf16(const torch::Device& device) {
#ifdef TRAINER_WITH_CUDA
  return at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->major >= 8;
#else
  return false;
#endif
}

}  // namespace

torch::Device resolve_device(const std::string& device) {
  const bool have_cuda = torch::cuda::is_available();
  if (device == "cuda" && !have_cuda) {
    throw ConfigError(
        "train.device: 'cuda' requested, but this LibTorch build sees no CUDA GPU (Debian's "
        "libtorch is CPU-only; build against a CUDA LibTorch with -DCMAKE_PREFIX_PATH)");
  }
  if (device == "cuda" || (device == "auto" && have_cuda)) return torch::Device(torch::kCUDA, 0);
  return torch::Device(torch::kCPU);
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

std::string effective_precision(const std::string& precision, const torch::Device& device) {
  if (precision != "auto") return precision;
  if (device.is_cuda()) return cuda_supports_bf16(device) ? "bf16" : "fp32";
  return util::cpu_features().native_bf16() ? "bf16" : "fp32";
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

ModelSettings model_settings(const config::JobSpec& spec, bool warn_emulated_bf16) {
  const config::TrainSpec& train = spec.train;
  ModelSettings s;
  s.normalize = data::parse_normalize(spec.data.normalize);
  s.device = resolve_device(train.device);
  s.bf16 = effective_precision(train.precision, s.device) == "bf16";
  s.channels_last = train.channels_last;
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

void place_model(model::ResNet& net, const ModelSettings& settings) {
  net->to(settings.device);
  if (!settings.channels_last) return;
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }
}

model::ResNet build_model(const config::ModelSpec& spec, int64_t num_classes, int64_t seed) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  model::ResNet net = model::make_resnet({spec.arch, num_classes, spec.head_hidden});
  if (!spec.pretrained.empty()) {
    const auto report = model::load_state_dict(
        *net, model::load_weights(util::local_path(spec.pretrained, "model.pretrained")),
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
                                settings.normalize, settings.channels_last);
}

torch::Tensor forward_logits(model::ResNet& net, const torch::Tensor& input,
                             const ModelSettings& settings) {
  torch::Tensor logits;
  {
    compat::AutocastGuard autocast(settings.bf16, settings.device);
    logits = net->forward(input);
  }
  return logits.to(torch::kFloat);
}

}  // namespace trainer::train
