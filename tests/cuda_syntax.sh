#!/usr/bin/env bash
# The CUDA code path, compiled for syntax only (no GPU, no CUDA LibTorch needed): every source
# with CUDA-only code, with TRAINER_WITH_CUDA and USE_C10D_NCCL defined, against this LibTorch's
# headers and the CUDA toolkit's. A CPU LibTorch lacks one generated header,
# c10/cuda/impl/cuda_cmake_macros.h; an empty stand-in is supplied. Skips (exit 77) where the
# CUDA toolkit is absent. Run by CTest as `cuda_syntax`:
#   cuda_syntax.sh CXX CUDA_HOME STUB_DIR -I... [more -I...] -- SOURCE...
set -euo pipefail
cxx=$1 cuda_home=$2 stub=$3
shift 3
includes=()
while (($#)) && [[ $1 != -- ]]; do includes+=("$1"); shift; done
shift
if [[ ! -f $cuda_home/include/cuda_runtime_api.h ]]; then
  echo "cuda_syntax: skipped: no CUDA toolkit at $cuda_home (set TRAINER_CUDA_HOME)"
  exit 77
fi
mkdir -p "$stub/c10/cuda/impl"
: > "$stub/c10/cuda/impl/cuda_cmake_macros.h"
failed=0
for src in "$@"; do
  if "$cxx" -std=c++17 -fsyntax-only -w -DTRAINER_WITH_CUDA=1 -DUSE_C10D_NCCL=1 \
      -DTRAINER_VERSION='"cuda-syntax"' -I"$stub" -I"$cuda_home/include" "${includes[@]}" "$src"; then
    echo "cuda_syntax: ok $src"
  else
    echo "cuda_syntax: FAILED $src"
    failed=1
  fi
done
exit "$failed"
