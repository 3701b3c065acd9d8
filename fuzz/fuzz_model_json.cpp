// The model directory's model.json (what predict, evaluate and the sidecar evaluator read first),
// through the same reader load_model_dir uses before it builds the network.
#include "fuzz_common.h"
#include "trainer/loop/model_dir.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fuzz::fs::path path = fuzz::scratch_dir() / "model.json";
  fuzz::write_bytes(path, data, size);
  fuzz::expect_clean_errors("model_json", [&] { train::read_model_info(path); });
  return 0;
}
