#!/usr/bin/env bash
# Runs the whole test suite (unit and integration, Catch2 through CTest) against build/.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TRAINER_BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
