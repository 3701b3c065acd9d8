#!/usr/bin/env bash
# Configures a build dir and builds trainer in it. Extra arguments go to cmake's configure step,
# e.g. -DTRAINER_BUILD_TESTS=OFF or -DCMAKE_PREFIX_PATH=/path/to/libtorch (CUDA build).
#   scripts/build.sh          Release build of the trainer binary alone in build/ (what the README's
#                             commands use; scripts/test.sh builds the tests when it runs them)
#   scripts/build.sh --all    ... and every other target (tests, benchmarks' helpers)
#   scripts/build.sh --asan   AddressSanitizer + UndefinedBehaviorSanitizer build of everything in
#                             build-asan/ (clang; also the fuzz build: scripts/fuzz.sh builds its
#                             targets there)
#   scripts/build.sh --tsan   ThreadSanitizer build of everything in build-tsan/
#   scripts/build.sh --torch pip [--all]
#                             the CUDA build against PyTorch's wheel (scripts/install-deps.sh
#                             --torch pip makes its venv) in build-pip/; it runs on the CPU where
#                             no GPU or driver is (scripts/torch-flavour.sh)
# Run the suite against a sanitizer build with TRAINER_BUILD_DIR=build-asan scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=torch-flavour.sh
. scripts/torch-flavour.sh
torch_parse_args "$@"
set -- ${torch_args_rest[@]+"${torch_args_rest[@]}"}
sanitize=""
build_type=Release
default_dir=$(torch_build_dir)
targets=(--target trainer)
case "${1:-}" in
  --all) targets=(); shift ;;
  --asan) sanitize=address; build_type=RelWithDebInfo; default_dir=build-asan; targets=(); shift
          set -- -DCMAKE_CXX_COMPILER=clang++ -DTRAINER_BUILD_FUZZ=ON "$@" ;;
  --tsan) sanitize=thread; build_type=RelWithDebInfo; default_dir=build-tsan; targets=(); shift ;;
esac
build_dir=${TRAINER_BUILD_DIR:-$default_dir}
flavour_args=()
if [[ $torch_flavour == pip ]]; then
  mapfile -t flavour_args < <(torch_cmake_args) && ((${#flavour_args[@]})) || exit 2
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" -DTRAINER_SANITIZE="$sanitize" \
  ${flavour_args[@]+"${flavour_args[@]}"} "$@"
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
echo "built $build_dir/app/trainer"
