#!/usr/bin/env bash
# Benchmark (not a test): `trainer predict` against `trainer evaluate` on the same JPEGs, with the
# same model and thread budget, alternating, each run twice; prints images/s for each and the
# ratio. Usage: scripts/bench/predict.sh [ARCH] [IMAGE_SIZE] [IMAGES_PER_CLASS]
# (default resnet50 224 40: 5 classes x 40 generated 256x256 JPEGs in the validation split).
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${TRAINER_BUILD_DIR:-build}/app/trainer
arch=${1:-resnet50}
size=${2:-224}
per_class=${3:-40}
work=$(mktemp -d /tmp/trainer-bench-predict.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$T" make-dataset --out "$work/data" --classes 5 --per-class "$per_class" --image-size 256 \
  --splits validation,train >/dev/null
cat >"$work/job.yaml" <<YAML
model: {arch: $arch}
data:
  train: {path: $work/data/validation}
  validation: {path: $work/data/validation}
  image_size: $size
train: {epochs: 1, max_steps: 1, per_replica_batch_size: 32}
YAML
"$T" --config "$work/job.yaml" --job-dir "$work/job" >/dev/null 2>&1
n=$(find "$work/data/validation" -name '*.jpg' | wc -l)
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores; $arch at $size px, $n images, batch 32"
rate() {  # seconds -> images/s
  python3 -c "print(f'{$n / $1:.1f}')"
}
for round in 1 2; do
  s=$(date +%s.%N)
  "$T" evaluate --model "$work/job/model" --config "$work/job.yaml" >/dev/null 2>&1
  e=$(python3 -c "print($(date +%s.%N) - $s)")
  s=$(date +%s.%N)
  "$T" predict --model "$work/job/model" --batch-size 32 --out "$work/p$round.csv" "$work/data/validation" 2>/dev/null
  p=$(python3 -c "print($(date +%s.%N) - $s)")
  echo "round $round: evaluate $(rate "$e") images/s, predict $(rate "$p") images/s (whole process, model load included), predict/evaluate $(python3 -c "print(f'{$e / $p:.2f}')")"
done
