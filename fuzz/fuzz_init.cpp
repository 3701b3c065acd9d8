// Linked into every fuzz target: libFuzzer calls this once before the first input.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  trainer::fuzz::quiet_logs();
  return 0;
}
