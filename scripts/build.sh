#!/usr/bin/env bash
# Configures and builds trainer (Release) into build/. Extra arguments go to cmake's configure
# step, e.g. -DTRAINER_BUILD_TESTS=OFF or -DCMAKE_PREFIX_PATH=/path/to/libtorch (CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TRAINER_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" -j "$(nproc)"
echo "built $build_dir/app/trainer"
