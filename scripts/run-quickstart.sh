#!/usr/bin/env bash
# The quickstart job: writes the embedded synthetic sample to data/sample if it is not there,
# trains a ResNet50 on it with configs/quickstart.yaml into jobs/quickstart, then evaluates the
# exported model. Extra arguments go to `trainer train` (e.g. --epochs 2, --set ...).
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=${TRAINER_BIN:-build/app/trainer}
job_dir=${JOB_DIR:-jobs/quickstart}
if [[ ! -d data/sample/train ]]; then
  "$trainer" make-dataset --out data/sample --classes 5 --per-class 100 --image-size 64 --seed 0
fi
"$trainer" --config configs/quickstart.yaml --job-dir "$job_dir" "$@"
"$trainer" evaluate --model "$job_dir/model" --config configs/quickstart.yaml
echo "the model is in $job_dir/model (predict: $trainer predict --model $job_dir/model IMAGE...)"
