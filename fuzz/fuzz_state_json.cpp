// A checkpoint's state.json, verified as resume and the sidecar evaluator verify a checkpoint.
// The checkpoint directory also holds the three files a real one lists (small fixed contents), so
// that inputs naming their sizes and checksums reach the rest of the checks.
#include "fuzz_common.h"
#include "trainer/loop/checkpoint.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fuzz::fs::path dir = fuzz::scratch_dir() / "ckpt-000000007";
  static const bool ready = [&dir] {
    fuzz::fs::create_directories(dir);
    for (const char* name : {"model.safetensors", "optimizer.pt", "rng.safetensors"}) {
      const std::string bytes = std::string(name) + " bytes";
      fuzz::write_bytes(dir / name, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    }
    return true;
  }();
  (void)ready;
  fuzz::write_bytes(dir / "state.json", data, size);
  fuzz::expect_clean_errors("state_json", [&] { train::verify_checkpoint(dir); });
  return 0;
}
