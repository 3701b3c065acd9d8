// KeepGlobalRng: the default CPU generator's state, saved on construction and restored on
// destruction, for work that draws from it without being part of the run's random stream
// (building a scratch model: the EMA's copy, the kernel choice's probe shapes and inputs).
// Header-only; each call locks the generator's mutex.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>

namespace trainer::train {

class KeepGlobalRng {
 public:
  KeepGlobalRng() : gen_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    state_ = gen_.get_state();
  }
  ~KeepGlobalRng() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(state_);
  }
  KeepGlobalRng(const KeepGlobalRng&) = delete;
  KeepGlobalRng& operator=(const KeepGlobalRng&) = delete;

 private:
  at::Generator gen_;
  at::Tensor state_;
};

}  // namespace trainer::train
