#!/usr/bin/env bash
# Configures and builds trainer into a build dir. Extra arguments go to cmake's configure step,
# e.g. -DTRAINER_BUILD_TESTS=OFF or -DCMAKE_PREFIX_PATH=/path/to/libtorch (CUDA build).
#   scripts/build.sh          Release build in build/ (what the README's commands use)
#   scripts/build.sh --asan   AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/
#                             (clang; also the fuzz build: scripts/fuzz.sh builds its targets there)
#   scripts/build.sh --tsan   ThreadSanitizer build in build-tsan/
# Run the suite against a sanitizer build with scripts/sanitize-test.sh (README, Development).
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""
build_type=Release
default_dir=build
case "${1:-}" in
  --asan) sanitize=address; build_type=RelWithDebInfo; default_dir=build-asan; shift
          set -- -DCMAKE_CXX_COMPILER=clang++ -DTRAINER_BUILD_FUZZ=ON "$@" ;;
  --tsan) sanitize=thread; build_type=RelWithDebInfo; default_dir=build-tsan; shift ;;
esac
build_dir=${TRAINER_BUILD_DIR:-$default_dir}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" -DTRAINER_SANITIZE="$sanitize" "$@"
cmake --build "$build_dir" -j "$(nproc)"
echo "built $build_dir/app/trainer"
