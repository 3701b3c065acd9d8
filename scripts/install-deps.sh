#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the fast BLAS need. Idempotent; run as
# root on Debian 12 (bookworm) or 13 (trixie).
#   bash scripts/install-deps.sh               Debian's packages (LibTorch 1.13 on 12, 2.6 on 13)
#   bash scripts/install-deps.sh --torch pip   ... and PyTorch's wheel (torch==2.11.0, the CUDA 13.0
#                                              build, with torchvision and numpy) in a venv at
#                                              /opt/trainer/venv-torch-2.11.0, reused when present
#                                              (scripts/torch-flavour.sh: TRAINER_TORCH_VERSION,
#                                              TRAINER_TORCH_VENV); where no CUDA toolkit is
#                                              (/usr/local/cuda, TRAINER_CUDA_HOME), NVIDIA's
#                                              compiler and headers from the same index too,
#                                              as a toolkit in <venv>/cuda
# Set TRAINER_RUNTIME_ONLY=1 for the runtime libraries alone (the Docker runtime stage).
set -euo pipefail
here=$(dirname "$0")
# shellcheck source=torch-flavour.sh
. "$here/torch-flavour.sh"
torch_parse_args "$@"
if ((${#torch_args_rest[@]})); then
  echo "install-deps.sh: unknown arguments: ${torch_args_rest[*]} (usage: install-deps.sh [--torch debian|pip])" >&2
  exit 2
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps.sh: must run as root (apt-get install)" >&2
  exit 2
fi

# The Debian release: the package names of the runtime libraries differ between 12 and 13.
release=""
if [[ -r /etc/os-release ]]; then
  # shellcheck disable=SC1091
  release=$(. /etc/os-release; [[ ${ID:-} == debian ]] && echo "${VERSION_ID:-${VERSION_CODENAME:-}}")
fi
case $release in
  12|bookworm) release=12 ;;
  13|trixie) release=13 ;;
  *)
    what=$( (. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}") || echo unknown)
    echo "install-deps.sh: this script knows Debian 12 (bookworm) and Debian 13 (trixie); this machine is '$what'." >&2
    echo "  Elsewhere, install the equivalents of the packages listed in scripts/install-deps.sh by hand." >&2
    exit 2 ;;
esac

build_pkgs=(
  build-essential cmake ninja-build pkg-config git
  libtorch-dev libopencv-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  catch2 libyaml-cpp-dev libprotobuf-dev protobuf-compiler zlib1g-dev libgloo-dev clang-format
  libonnx-dev  # ONNX export: the ONNX project's protobuf types and checker
  libcurl4-openssl-dev libssl-dev ca-certificates  # model.pretrained by URL: HTTP(S), SHA-256
  libopenblas0-pthread libjemalloc-dev
  # test-only: the reference implementation the parity tests compare against
  python3 python3-torch python3-torchvision python3-numpy
)
if [[ $release == 12 ]]; then
  runtime_pkgs=(
    libtorch1.13 libopencv-imgcodecs406 libopencv-imgproc406 libopencv-core406
    libspdlog1.10 libfmt9 libyaml-cpp0.7 libprotobuf32 zlib1g libgloo0 libopenblas0-pthread
    libjemalloc2 libonnx1 libcurl4 libssl3 ca-certificates
  )
else
  runtime_pkgs=(
    libtorch2.6 libopencv-imgcodecs410 libopencv-imgproc410 libopencv-core410
    libspdlog1.15 libfmt10 libyaml-cpp0.8 libprotobuf32t64 zlib1g libgloo0 libopenblas0-pthread
    libjemalloc2 libonnx1t64 libcurl4t64 libssl3t64 ca-certificates
  )
fi

if [[ ${TRAINER_RUNTIME_ONLY:-0} == 1 ]]; then
  pkgs=("${runtime_pkgs[@]}")
else
  pkgs=("${build_pkgs[@]}")
  # The pip flavour's venv is made with Debian's Python.
  [[ $torch_flavour == pip ]] && pkgs+=(python3-venv)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps.sh: all ${#pkgs[@]} packages for Debian $release already installed"
else
  echo "install-deps.sh: installing for Debian $release: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi

[[ $torch_flavour == pip ]] || exit 0

# PyTorch's wheel, in a venv outside the checkout (rebuilds and CI runs on this machine reuse it).
tv=$(torchvision_version)
py=$(torch_python)
want="$torch_version $tv"
have=""
if [[ -x $py ]]; then
  have=$("$py" -c 'import torch, torchvision, numpy; print(torch.__version__.split("+")[0], torchvision.__version__.split("+")[0])' 2>/dev/null || true)
fi
if [[ $have == "$want" ]]; then
  echo "install-deps.sh: torch $torch_version and torchvision $tv already in $torch_venv"
else
  echo "install-deps.sh: torch==$torch_version torchvision==$tv numpy into $torch_venv (about 2.7 GB with CUDA's wheels)"
  mkdir -p "$(dirname "$torch_venv")"
  [[ -x $py ]] || /usr/bin/python3 -m venv "$torch_venv"
  start=$SECONDS
  # --no-cache-dir: the venv is the cache; a second copy of 2.7 GB in ~/.cache helps nobody.
  (cd / && "$py" -m pip install --no-cache-dir --progress-bar off --disable-pip-version-check \
    "torch==$torch_version" "torchvision==$tv" numpy)
  "$py" -c 'import torch; print("install-deps.sh: torch", torch.__version__, "CUDA", torch.version.cuda, "cxx11 ABI", torch.compiled_with_cxx11_abi())'
  echo "install-deps.sh: the PyTorch venv took $((SECONDS - start)) s"
fi

# The CUDA compiler and headers the CUDA build needs. A system toolkit is used as it is;
# otherwise NVIDIA's wheels of the wheel's own CUDA release go into the venv, and
# $torch_wheel_cuda_home is laid out as a toolkit over them (bin/, include/, nvvm/, lib64/ with
# the unversioned names CMake looks for, lib64/stubs/libcuda.so), so that no nvidia/cuda image,
# apt repository or download site is needed.
if [[ -x $torch_cuda_home/bin/nvcc && $torch_cuda_home != "$torch_wheel_cuda_home" ]]; then
  echo "install-deps.sh: the CUDA toolkit at $torch_cuda_home: $("$torch_cuda_home/bin/nvcc" --version | tail -n 1)"
  exit 0
fi
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# torch's CUDA 13 wheels depend on the cuda-toolkit meta-package, which pins every component
# of one CUDA update (13.0.2: nvcc 13.0.88); its extras bring the compiler parts of the same.
kit=$("$py" -c 'import importlib.metadata as m; print(m.version("cuda-toolkit"))' 2>/dev/null || true)
if [[ -z $kit ]]; then
  cuda=$("$py" -c 'import torch; print(torch.version.cuda or "")')
  echo "install-deps.sh: torch $torch_version (CUDA ${cuda:-none}) does not depend on NVIDIA's cuda-toolkit wheels (CUDA 13 builds do):" >&2
  echo "  install the CUDA ${cuda:-} toolkit at /usr/local/cuda, or point TRAINER_CUDA_HOME at one" >&2
  exit 2
fi
want_nvcc="cuda-toolkit[nvcc,crt,nvvm,cccl,cudart]==$kit"
if ! "$py" -c 'import importlib.metadata as m; m.version("nvidia-cuda-nvcc"); m.version("nvidia-nvvm"); m.version("nvidia-cuda-crt"); m.version("nvidia-cuda-cccl")' 2>/dev/null; then
  echo "install-deps.sh: no CUDA toolkit at $torch_cuda_home: NVIDIA's compiler wheels ($want_nvcc) into $torch_venv"
  (cd / && "$py" -m pip install --no-cache-dir --progress-bar off --disable-pip-version-check "$want_nvcc")
fi
view=$torch_wheel_cuda_home
rm -rf "$view.tmp"
mkdir -p "$view.tmp/bin" "$view.tmp/include" "$view.tmp/lib64/stubs"
# Every nvidia/<package>/{bin,include,nvvm,lib} merged into one tree of links (the first of a
# name wins): CUDA 13's wheels share nvidia/cu13, others keep a directory each.
for pkg in "$site"/nvidia/*/; do
  for part in bin include; do
    [[ -d $pkg$part ]] || continue
    for f in "$pkg$part"/*; do [[ -e $view.tmp/$part/${f##*/} ]] || ln -s "$f" "$view.tmp/$part/"; done
  done
  if [[ -d ${pkg}nvvm && ! -e $view.tmp/nvvm ]]; then ln -s "${pkg}nvvm" "$view.tmp/nvvm"; fi
  [[ -d ${pkg}lib ]] || continue
  for f in "$pkg"lib/*; do
    name=${f##*/}
    [[ -e $view.tmp/lib64/$name ]] || ln -s "$f" "$view.tmp/lib64/$name"
    # libcublas.so.13 -> libcublas.so, the name the linker and CMake's FindCUDAToolkit look for
    if [[ $name =~ ^(lib[^.]+)\.so\.[0-9.]+$ && ! -e $view.tmp/lib64/${BASH_REMATCH[1]}.so ]]; then
      ln -s "$f" "$view.tmp/lib64/${BASH_REMATCH[1]}.so"
    fi
  done
done
ln -s lib64 "$view.tmp/lib"
[[ -x $view.tmp/bin/nvcc ]] || { echo "install-deps.sh: no nvcc among $site/nvidia/*/bin" >&2; exit 1; }
# The driver API's link-time stub, as a toolkit has in lib64/stubs (the real libcuda.so.1 comes
# with the driver at run time; nothing of ours calls it directly, and the binary does not need it).
echo 'void trainer_libcuda_stub(void) {}' >"$view.tmp/lib64/stubs/stub.c"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$view.tmp/lib64/stubs/libcuda.so" "$view.tmp/lib64/stubs/stub.c"
rm "$view.tmp/lib64/stubs/stub.c"
rm -rf "$view" && mv "$view.tmp" "$view"
echo "install-deps.sh: CUDA toolkit from NVIDIA's wheels at $view: $("$view/bin/nvcc" --version | tail -n 1)"
