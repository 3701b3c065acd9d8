# Sourced by install-deps.sh, build.sh, test.sh and gpu-check.sh: which LibTorch they work with.
#   --torch debian (the default)  Debian's libtorch-dev: 1.13 on Debian 12, 2.6 on Debian 13; CPU
#                                 only; builds in build/
#   --torch pip                   PyTorch's wheel from the Python Package Index, torch==2.11.0 by
#                                 default (the CUDA 13.0 build: LibTorch with CUDA, cuDNN and NCCL),
#                                 in a venv outside the checkout, reused when present; the CUDA
#                                 build of the trainer against it in build-pip/
# Environment: TRAINER_TORCH_VERSION (2.11.0) picks the wheel, TRAINER_TORCHVISION_VERSION (0.26.0
# for 2.11; by default 0.<minor + 15>.x) the torchvision beside it (a second reference for the
# parity benchmarks), TRAINER_TORCH_VENV the venv (/opt/trainer/venv-torch-<version>),
# TRAINER_CUDA_HOME the CUDA toolkit the build compiles against: /usr/local/cuda where it has
# nvcc, else the toolkit that install-deps.sh --torch pip assembles in the venv from NVIDIA's
# wheels on the Python Package Index (<venv>/cuda: nvcc, headers, libraries; no system toolkit).
# Defines: torch_flavour, torch_args_rest (the arguments after --torch X), and the functions
# below. No side effects when sourced.

torch_flavour=debian
torch_args_rest=()
torch_version=${TRAINER_TORCH_VERSION:-2.11.0}
torch_venv=${TRAINER_TORCH_VENV:-/opt/trainer/venv-torch-$torch_version}
torch_wheel_cuda_home=$torch_venv/cuda
if [[ -n ${TRAINER_CUDA_HOME:-} ]]; then
  torch_cuda_home=$TRAINER_CUDA_HOME
elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
  torch_cuda_home=/usr/local/cuda
else
  torch_cuda_home=$torch_wheel_cuda_home
fi

# torch_parse_args ARGS...: takes --torch debian|pip (or --torch=...) from anywhere in ARGS; the
# rest go to torch_args_rest. Exits 2 on an unknown flavour.
torch_parse_args() {
  torch_args_rest=()
  while (($#)); do
    case $1 in
      --torch) [[ $# -ge 2 ]] || { echo "$(basename "$0"): --torch needs debian or pip" >&2; exit 2; }
               torch_flavour=$2; shift 2 ;;
      --torch=*) torch_flavour=${1#--torch=}; shift ;;
      *) torch_args_rest+=("$1"); shift ;;
    esac
  done
  case $torch_flavour in
    debian|pip) ;;
    *) echo "$(basename "$0"): --torch: expected debian or pip, got '$torch_flavour'" >&2; exit 2 ;;
  esac
}

# The torchvision release that goes with torch_version (2.x.y -> 0.(x+15).y).
torchvision_version() {
  if [[ -n ${TRAINER_TORCHVISION_VERSION:-} ]]; then
    echo "$TRAINER_TORCHVISION_VERSION"
  elif [[ $torch_version =~ ^2\.([0-9]+)\.([0-9]+)$ ]]; then
    echo "0.$((BASH_REMATCH[1] + 15)).${BASH_REMATCH[2]}"
  else
    echo "$(basename "$0"): cannot tell the torchvision release for torch $torch_version: set TRAINER_TORCHVISION_VERSION" >&2
    return 2
  fi
}

torch_python() { echo "$torch_venv/bin/python"; }

# The venv's torch package dir (torch/lib, torch/include, torch/share/cmake), or fails naming the
# command that makes it.
torch_pip_dir() {
  local py
  py=$(torch_python)
  if [[ ! -x $py ]] || ! "$py" -c 'import torch' >/dev/null 2>&1; then
    echo "$(basename "$0"): no PyTorch venv at $torch_venv: run bash scripts/install-deps.sh --torch pip" >&2
    return 2
  fi
  "$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))'
}

# The default build dir of the flavour.
torch_build_dir() {
  if [[ $torch_flavour == pip ]]; then echo build-pip; else echo build; fi
}

# torch_cmake_args: the configure arguments of the pip flavour, one a line (none for debian):
# LibTorch from the wheel (its lib dir first, so that Debian's libtorch.so is never found under the
# wheel's headers), the CUDA toolkit, NCCL's header from the wheel's nvidia-nccl package, and
# the CUDA runtime: the trainer calls libcudart itself, and the wheel's copy (the one libtorch_cuda
# loads) goes first on its run path, so one CUDA runtime is in the process, the wheel's.
torch_cmake_args() {
  [[ $torch_flavour == pip ]] || return 0
  local dir nccl cudart
  dir=$(torch_pip_dir) || return 2
  nccl=$(dirname "$dir")/nvidia/nccl/include
  [[ -f $nccl/nccl.h ]] || nccl=$torch_cuda_home/include
  cudart=$(ls -d "$(dirname "$dir")"/nvidia/*/lib/libcudart.so.* 2>/dev/null | head -n 1)
  if [[ ! -x $torch_cuda_home/bin/nvcc ]]; then
    echo "$(basename "$0"): no CUDA toolkit at $torch_cuda_home (set TRAINER_CUDA_HOME, or run bash scripts/install-deps.sh --torch pip, which installs NVIDIA's CUDA compiler wheels into the venv): the pip flavour is a CUDA build" >&2
    return 2
  fi
  printf '%s\n' \
    "-DCMAKE_PREFIX_PATH=$dir/share/cmake" \
    "-DCMAKE_LIBRARY_PATH=$dir/lib" \
    "-DCUDAToolkit_ROOT=$torch_cuda_home" \
    "-DCUDA_TOOLKIT_ROOT_DIR=$torch_cuda_home" \
    "-DCMAKE_CUDA_COMPILER=$torch_cuda_home/bin/nvcc" \
    "-DTRAINER_CUDA_HOME=$torch_cuda_home" \
    "-DTRAINER_NCCL_INCLUDE_DIR=$nccl" \
    "-DTORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}"
  [[ -z $cudart ]] || echo "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath,$(dirname "$cudart")"
}
