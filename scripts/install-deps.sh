#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the fast BLAS need.
# Idempotent; run as root on Debian 12 (bookworm). Set TRAINER_RUNTIME_ONLY=1 for the
# runtime libraries alone (the Docker runtime stage).
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps.sh: must run as root (apt-get install)" >&2
  exit 2
fi

build_pkgs=(
  build-essential cmake ninja-build pkg-config git
  libtorch-dev libopencv-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  catch2 libyaml-cpp-dev libprotobuf-dev protobuf-compiler zlib1g-dev libgloo-dev clang-format
  libonnx-dev  # ONNX export: the ONNX project's protobuf types and checker
  libopenblas0-pthread libjemalloc-dev
  # test-only: the reference implementation the parity tests compare against
  python3 python3-torch python3-torchvision python3-numpy
)
runtime_pkgs=(
  libtorch1.13 libopencv-imgcodecs406 libopencv-imgproc406 libopencv-core406
  libspdlog1.10 libfmt9 libyaml-cpp0.7 libprotobuf32 zlib1g libgloo0 libopenblas0-pthread libjemalloc2
  libonnx1
)

if [[ ${TRAINER_RUNTIME_ONLY:-0} == 1 ]]; then
  pkgs=("${runtime_pkgs[@]}")
else
  pkgs=("${build_pkgs[@]}")
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps.sh: all ${#pkgs[@]} packages already installed"
  exit 0
fi
echo "install-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${missing[@]}"
