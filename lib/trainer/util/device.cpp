#include "trainer/util/device.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <memory>

namespace trainer::util {

std::function<bool()> device_ready_probe(const torch::Device& device) {
  if (device.is_cpu()) return [] { return true; };
  const c10::impl::VirtualGuardImpl guard(device.type());
  auto event = std::make_shared<c10::Event>(device.type());
  event->record(guard.getStream(device));
  return [event] { return event->query(); };
}

}  // namespace trainer::util
