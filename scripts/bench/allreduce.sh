#!/usr/bin/env bash
# Benchmark (not a test): Gloo all-reduce of a 100 MiB float tensor (about ResNet50's gradient
# size) between 2 ranks over loopback; prints the median time and the bandwidth. It is the
# hidden Catch2 case "[.bench]" of unit_dist (real c10d/Gloo, ranks as threads).
set -euo pipefail
cd "$(dirname "$0")/../.."
"${TRAINER_BUILD_DIR:-build}/tests/unit_dist" "[.bench]" -s 2>&1 | grep -iE "all-reduce|MB|GB/s|median" || true
