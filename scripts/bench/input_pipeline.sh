#!/usr/bin/env bash
# Benchmark (not a test): the input pipeline alone (read TFRecords, parse, decode, resize to 300,
# flip, batch 32) in examples/s per decode thread, on generated 800x600 JPEGs, with full and
# reduced-scale (libjpeg DCT) decoding and with the memory cache warm. It is the hidden Catch2
# case "[.bench]" of unit_data. Usage: input_pipeline.sh [IMAGES] [THREADS, e.g. 1,2]
set -euo pipefail
cd "$(dirname "$0")/../.."
TRAINER_BENCH_IMAGES="${1:-240}" TRAINER_BENCH_THREADS="${2:-1,2}" \
  "${TRAINER_BUILD_DIR:-build}/tests/unit_data" "[.bench]" -s 2>&1 |
  grep -E "input pipeline|threads|decode|cache|reduced/full" || true
