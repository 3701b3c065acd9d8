#!/usr/bin/env bash
# Benchmark (not a test): training augmentation's cost in the decode threads, images/s per
# decode thread at 224 px from generated 800x600 JPEGs (read from files): ours plain
# (RandomResizedCrop + flip), ours with TrivialAugmentWide + RandomErasing, and torchvision's
# reference on the PIL path in a DataLoader (scripts/bench/torchvision_augment.py, run with
# TRAINER_PYTHON, default /usr/bin/python3), the sides alternating. It is the hidden Catch2 case
# "[.augbench]" of unit_data. Usage: augment_pipeline.sh [IMAGES] [ROUNDS] [ERASING]
set -euo pipefail
cd "$(dirname "$0")/../.."
TRAINER_BENCH_IMAGES="${1:-320}" TRAINER_BENCH_ROUNDS="${2:-2}" TRAINER_BENCH_ERASING="${3:-0.25}" \
  "${TRAINER_BUILD_DIR:-build}/tests/unit_data" "[.augbench]" -s 2>&1 |
  grep -E "^(augment bench|cpu|side|ours|torchvision|ratios|round)" || true
