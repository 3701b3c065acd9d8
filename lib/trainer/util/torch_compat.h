// The one place for LibTorch-version differences (guards on TORCH_VERSION_MAJOR/MINOR), so the
// rest of the code calls a single spelling. Header-only. AutocastGuard changes thread-local
// autocast state: it affects only the constructing thread and must be destroyed on it.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#define TRAINER_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||          \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// at::_fused_adam_, _fused_adamw_ and _fused_sgd_ with CPU kernels (torch.optim's fused=True on
// the CPU): LibTorch 2.4 and later. Before, the optimizers are LibTorch's per-tensor ones.
#define TRAINER_FUSED_OPTIMIZERS TRAINER_TORCH_AT_LEAST(2, 4)

namespace trainer::compat {

// Autocast ("mixed precision") state per device type; CPU and CUDA are supported.
// LibTorch >= 2.4 takes the device type as an argument; earlier versions have one function per
// device (the old names are deprecated from 2.4 on).
inline bool autocast_enabled(c10::DeviceType device) {
#if TRAINER_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled()
                                        : at::autocast::is_enabled();
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if TRAINER_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast(c10::DeviceType device, bool enabled, c10::ScalarType dtype) {
  TORCH_CHECK(device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA,
              "autocast: only CPU and CUDA are supported, got ", device);
#if TRAINER_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(enabled);
  }
#endif
}

// RAII, as Python's `with torch.autocast(device.type(), dtype, enabled)`: when `enabled`, turns
// autocast on for the device's type with `dtype` (bf16 by default; fp16 is fine on CUDA),
// restores the previous state on destruction and clears the cast cache when the outermost guard
// exits. enabled=false leaves the autocast state untouched (a no-op scope).
class AutocastGuard {
 public:
  explicit AutocastGuard(bool enabled, c10::Device device = c10::Device(c10::DeviceType::CPU),
                         c10::ScalarType dtype = c10::ScalarType::BFloat16)
      : enabled_(enabled), device_(device.type()) {
    if (!enabled_) return;
    prev_enabled_ = autocast_enabled(device_);
    prev_dtype_ = autocast_dtype(device_);
    set_autocast(device_, true, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set_autocast(device_, prev_enabled_, prev_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
  c10::DeviceType device_;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::BFloat16;
};

// The key of a parameter in torch::optim::Optimizer::state(): its TensorImpl's address, as a
// string up to LibTorch 2.x (what c10::guts::to_string, gone in 2.11, printed) and as the address
// itself (void*) in 2.11. Chosen by the map's own key type, so no version number is guessed.
template <typename Key = typename std::decay_t<
              decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type>
Key optimizer_state_key(const torch::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << param.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

}  // namespace trainer::compat
