// Knowing when a device has done its work without blocking the host: a probe records a point on
// the device's current stream (a c10::Event, so no CUDA header is needed) and answers, without
// waiting, whether the device has reached it. For the CPU, where work is done when the call
// returns, a probe is always ready. Thread-safety: a probe may be asked from any thread.
#pragma once

#include <torch/torch.h>

#include <functional>

namespace trainer::util {

// Records a point on `device`'s current stream now; the function returns whether the device
// has finished everything queued before it. Never blocks.
std::function<bool()> device_ready_probe(const torch::Device& device);

}  // namespace trainer::util
