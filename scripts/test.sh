#!/usr/bin/env bash
# Builds the tests (scripts/build.sh builds only the trainer) and runs the whole suite (unit and
# integration, Catch2 through CTest) against build/, or $TRAINER_BUILD_DIR. Extra arguments go to
# ctest (e.g. -R integration).
#   bash scripts/test.sh --torch pip   the same against build-pip/ (the CUDA build on PyTorch's
#                                      wheel), on the CPU here
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=torch-flavour.sh
. scripts/torch-flavour.sh
torch_parse_args "$@"
set -- ${torch_args_rest[@]+"${torch_args_rest[@]}"}
build_dir=${TRAINER_BUILD_DIR:-$(torch_build_dir)}
if [[ ! -f $build_dir/CMakeCache.txt ]]; then
  flag=""
  [[ $torch_flavour == pip ]] && flag=" --torch pip"
  echo "test.sh: $build_dir is not configured: run scripts/build.sh$flag first" >&2
  exit 2
fi
cmake --build "$build_dir" -j "$(nproc)"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
