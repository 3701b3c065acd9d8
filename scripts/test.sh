#!/usr/bin/env bash
# Builds the tests (scripts/build.sh builds only the trainer) and runs the whole suite (unit and
# integration, Catch2 through CTest) against build/, or $TRAINER_BUILD_DIR. Extra arguments go to
# ctest (e.g. -R integration).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TRAINER_BUILD_DIR:-build}
if [[ ! -f $build_dir/CMakeCache.txt ]]; then
  echo "test.sh: $build_dir is not configured: run scripts/build.sh first" >&2
  exit 2
fi
cmake --build "$build_dir" -j "$(nproc)"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
