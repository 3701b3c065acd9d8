// A child of a Net for the families' builders (model/resnet.cpp, model/efficientnet.cpp): the
// module under its torchvision name and its forward, whatever the module's type (Sequential's
// forward is a template, so it cannot sit in an AnyModule). Header-only; stateless.
#pragma once

#include <string>

#include "trainer/model/net.h"

namespace trainer::model {

template <typename M>
NamedPart named_part(const std::string& name, M module) {
  return {name, module.ptr(), [module](torch::Tensor x) mutable { return module->forward(x); }};
}

}  // namespace trainer::model
