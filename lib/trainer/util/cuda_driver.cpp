#include "trainer/util/cuda_driver.h"

#include <dlfcn.h>

#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>

namespace trainer::util {

namespace {

// /proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  ...".
std::string driver_release() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::stringstream text;
  text << in.rdbuf();
  std::smatch m;
  const std::string s = text.str();
  if (std::regex_search(s, m, std::regex("Kernel Module\\s+([0-9][0-9.]*)"))) return m[1].str();
  return "";
}

std::string driver_text(const CudaDriver& d) {
  if (d.release.empty()) return fmt::format("CUDA {}", cuda_version_text(d.cuda_version));
  return fmt::format("{} (CUDA {})", d.release, cuda_version_text(d.cuda_version));
}

}  // namespace

CudaDriver probe_cuda_driver() {
  CudaDriver out;
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    out.missing = "no NVIDIA driver (libcuda.so.1 not found)";
    return out;
  }
  using GetVersion = int (*)(int*);
  auto get = reinterpret_cast<GetVersion>(::dlsym(lib, "cuDriverGetVersion"));
  int version = 0;
  if (get == nullptr || get(&version) != 0 || version <= 0) {
    out.missing = "libcuda.so.1 does not answer cuDriverGetVersion";
  } else {
    out.cuda_version = version;
    out.release = driver_release();
  }
  // libcuda stays loaded: LibTorch's CUDA runtime opens the same library later.
  return out;
}

std::string cuda_version_text(int version) {
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

std::string minimum_driver_release(int runtime_version) {
  switch (runtime_version / 1000) {
    case 13:
      return "R580";
    case 12:
      return "R525";
    case 11:
      return "R450";
    default:
      return "";
  }
}

std::string describe_cuda_driver(const CudaDriver& driver, int runtime_version) {
  const std::string needed = minimum_driver_release(runtime_version);
  const std::string need = fmt::format(
      "CUDA {} needs {} or newer", cuda_version_text(runtime_version),
      needed.empty() ? std::string("a driver of CUDA ") + cuda_version_text(runtime_version)
                     : needed);
  if (driver.cuda_version == 0)
    return fmt::format("NVIDIA driver: none ({}); {}", driver.missing, need);
  return fmt::format("NVIDIA driver: {}; {}: {}", driver_text(driver), need,
                     cuda_driver_problem(driver, runtime_version).empty() ? "ok" : "TOO OLD");
}

std::string cuda_driver_problem(const CudaDriver& driver, int runtime_version) {
  if (driver.cuda_version == 0 || driver.cuda_version / 1000 >= runtime_version / 1000) return "";
  const std::string needed = minimum_driver_release(runtime_version);
  return fmt::format(
      "the NVIDIA driver on this machine is {}, and this trainer is built with CUDA {}, which "
      "needs driver {} or newer (CUDA {}.0); update the driver, build the image against an older "
      "PyTorch wheel for this driver (TRAINER_TORCH_VERSION, README: Docker), or set "
      "train.device: cpu",
      driver_text(driver), cuda_version_text(runtime_version),
      needed.empty() ? std::string("a newer one") : needed, runtime_version / 1000);
}

}  // namespace trainer::util
