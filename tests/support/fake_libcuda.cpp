// A stand-in for the NVIDIA driver's libcuda.so.1, for the driver checks of a CUDA build on a
// machine without one (tests/integration/test_cli.cpp): cuDriverGetVersion answers
// $FAKE_CUDA_DRIVER_VERSION (e.g. 12040), and every other driver call is absent, so a CUDA
// runtime that opens it finds no usable driver.
#include <cstdlib>

extern "C" __attribute__((visibility("default"))) int cuDriverGetVersion(int* version) {
  const char* v = std::getenv("FAKE_CUDA_DRIVER_VERSION");
  if (version == nullptr || v == nullptr) return 1;  // CUDA_ERROR_INVALID_VALUE
  *version = std::atoi(v);
  return 0;
}
