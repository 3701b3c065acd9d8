// torch.save files (model.pretrained, `trainer convert`): the zip container (our reader of its
// central directory and stored, CRC-checked records), the legacy stream, and the restricted
// unpickler in both; the state dict is then loaded into a small module as model.pretrained does.
#include <torch/torch.h>

#include "fuzz_common.h"
#include "small_module.h"
#include "trainer/model/pth.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::SmallModule* module = new fuzz::SmallModule();
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean_errors("pth", [&] {
    const model::StateDict tensors = model::decode_pth(bytes, "input.pth");
    model::load_state_dict(*module, tensors, "input.pth", /*allow_classifier_mismatch=*/true);
  });
  return 0;
}
