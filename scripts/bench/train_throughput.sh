#!/usr/bin/env bash
# Benchmark (not a test): training images/s of ResNet50 on the synthetic sample at fp32 and
# bf16, NCHW and channels_last, read from metrics.jsonl (median over steps after warm-up).
#   scripts/bench/train_throughput.sh [image_size=64] [steps=12] [batch=32]
set -euo pipefail
cd "$(dirname "$0")/../.."
trainer=${TRAINER_BIN:-build/app/trainer}
size=${1:-64}
steps=${2:-12}
batch=${3:-32}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$trainer" make-dataset --out "$work/data" --per-class 40 --image-size "$size" --splits train >/dev/null
cat >"$work/job.yaml" <<YAML
model: {arch: resnet50}
data:
  train: {path: $work/data/train}
  image_size: $size
  num_workers: 1
train:
  epochs: 100
  per_replica_batch_size: $batch
  optimizer: {name: adam, learning_rate: 0.001}
logging: {every_steps: 1000}
YAML
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
printf '%-6s %-14s %s\n' precision layout images_per_sec
for precision in fp32 bf16; do
  for cl in false true; do
    job="$work/job-$precision-$cl"
    "$trainer" --config "$work/job.yaml" --job-dir "$job" --set train.max_steps="$steps" \
      --set train.precision=$precision --set train.channels_last=$cl >/dev/null 2>&1
    ips=$(grep '"images_per_sec"' "$job/metrics.jsonl" | tail -n +3 |
          sed -E 's/.*"images_per_sec":([0-9.eE+-]+).*/\1/' | median)
    printf '%-6s %-14s %.1f\n' "$precision" "$([[ $cl == true ]] && echo channels_last || echo nchw)" "$ips"
  done
done
