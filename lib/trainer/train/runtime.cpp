#include "trainer/train/runtime.h"

#include <spdlog/spdlog.h>

#include <thread>

#include "trainer/model/safetensors.h"
#include "trainer/util/error.h"
#include "trainer/util/torch_compat.h"

namespace trainer::train {

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

int configure_threads(int threads) {
  const int n = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  torch::set_num_threads(n);
  return torch::get_num_threads();
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
    const auto report = model::load_state_dict(*net, model::load_safetensors(spec.pretrained),
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
  torch::Tensor x = images.to(settings.device, /*non_blocking=*/true);
  return settings.channels_last ? x.contiguous(at::MemoryFormat::ChannelsLast) : x;
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
