// safetensors, header and data, then loaded into a small module (a conv, a batch norm and a
// linear head: float, int64 and classifier keys) strictly and with the classifier mismatch
// allowed, as --init-from and checkpoint restore do.
#include <torch/torch.h>

#include "fuzz_common.h"
#include "small_module.h"
#include "trainer/model/safetensors.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::SmallModule* module =
      new fuzz::SmallModule();  // one module for the run (loads are all-or-nothing)
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean_errors("safetensors", [&] {
    model::Metadata metadata;
    const model::StateDict tensors =
        model::decode_safetensors(bytes, "input.safetensors", &metadata);
    fuzz::expect_clean_errors(
        "safetensors", [&] { model::load_state_dict(*module, tensors, "input.safetensors"); });
    model::load_state_dict(*module, tensors, "input.safetensors",
                           /*allow_classifier_mismatch=*/true);
  });
  return 0;
}
