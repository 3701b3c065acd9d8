// The NVIDIA driver a CUDA build of the trainer will meet, found without LibTorch or a CUDA
// header: libcuda.so.1 is opened (dlopen) and asked cuDriverGetVersion, and the driver's release
// ("580.65.06") is read from /proc/driver/nvidia/version. A CUDA runtime of major M runs on a
// driver whose CUDA version is at least M.0 (CUDA's minor-version compatibility), so the check
// is one comparison; the message names the driver found and the release needed. Stateless;
// thread-safe.
#pragma once

#include <string>

namespace trainer::util {

struct CudaDriver {
  int cuda_version = 0;  // cuDriverGetVersion: 12040 = CUDA 12.4; 0 when there is no driver
  std::string release;   // "580.65.06" from /proc/driver/nvidia/version; "" when unknown
  std::string missing;  // why there is no driver ("libcuda.so.1 not found"), when cuda_version == 0
};

// Opens libcuda.so.1 (the one the dynamic loader finds: LD_LIBRARY_PATH, the NVIDIA container
// toolkit's mounts, ld.so.cache) and reads its versions.
CudaDriver probe_cuda_driver();

// "13.0" for 13000, "12.4" for 12040.
std::string cuda_version_text(int version);

// The oldest driver release of a CUDA major ("R580" for 13, "R525" for 12, "R450" for 11,
// "" for others), as NVIDIA's compatibility table gives it.
std::string minimum_driver_release(int runtime_version);

// One line for `trainer --version`: the driver found and whether it runs a runtime of
// `runtime_version` (CUDART_VERSION of the build, 13000 for CUDA 13.0).
std::string describe_cuda_driver(const CudaDriver& driver, int runtime_version);

// Empty when `driver` runs CUDA `runtime_version` or there is no driver at all (then no GPU is
// visible, which the device choice reports); otherwise what is wrong and what to do, naming the
// driver found and the one needed.
std::string cuda_driver_problem(const CudaDriver& driver, int runtime_version);

}  // namespace trainer::util
