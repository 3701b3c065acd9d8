#!/usr/bin/env bash
# Benchmark (not a test): weak-scaling efficiency of synchronous training. 1 worker with 1
# thread against 2 workers (trainer launch, real Gloo over loopback) with 1 thread each, at the
# same per-replica batch: efficiency = step time (1 worker) / step time (2 workers), and the
# share of each 2-worker step spent waiting on the gradient all-reduce. Needs 2 free cores.
#   scripts/bench/scaling.sh [arch=resnet50] [image_size=64] [batch=16] [steps=12]
set -euo pipefail
cd "$(dirname "$0")/../.."
trainer=$(realpath "${TRAINER_BIN:-build/app/trainer}")
arch=${1:-resnet50}; size=${2:-64}; batch=${3:-16}; steps=${4:-12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$trainer" make-dataset --out data --per-class 40 --image-size "$size" --splits train >/dev/null
cat >job.yaml <<YAML
model: {arch: $arch}
data: {train: {path: data/train}, image_size: $size, num_workers: 1, shard_policy: data}
train: {epochs: 100, per_replica_batch_size: $batch, threads: 1, max_steps: $steps}
logging: {every_steps: 1000}
YAML
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
field() { grep "\"$1\"" "$2" | tail -n +3 | sed -E "s/.*\"$1\":([0-9.eE+-]+).*/\\1/" | median; }
"$trainer" --config job.yaml --job-dir one >/dev/null 2>&1
ips1=$(field images_per_sec one/metrics.jsonl)
"$trainer" launch --workers 2 -- --config job.yaml --job-dir two >/dev/null 2>&1
step2=$(field step_time_s two/metrics.jsonl)
wait2=$(field comm_wait_s two/metrics.jsonl)
step1=$(awk -v b="$batch" -v i="$ips1" 'BEGIN {print b / i}')
awk -v s1="$step1" -v s2="$step2" -v w="$wait2" 'BEGIN {
  printf "1 worker:  step %.3f s\n2 workers: step %.3f s (waiting on gradients %.3f s, %.1f%%)\n", s1, s2, w, 100 * w / s2;
  printf "weak-scaling efficiency %.3f\n", s1 / s2 }'
