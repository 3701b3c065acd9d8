#!/usr/bin/env bash
# Op profile (not a test): where the CPU time of the trainer's training step goes, operator by
# operator, before and after the trainer's own kernels (issue 39), for machines where perf
# cannot sample (scripts/bench/profile_step.sh needs it). Runs op_profile_bench (built from
# scripts/bench/op_profile.cpp with the suite) with TRAINER_ATEN_KERNELS=1 ("ATen": LibTorch's
# batch norm, ReLU, residual addition and per-tensor optimizer) and without ("own"),
# alternating, ROUNDS times each, and prints as Markdown the median step, the phases, and the
# ops with the most self time per step on either side (self: the time inside an op less the ops
# it called; backward nodes are autograd's). The input pipeline is not in it: a fixed random
# batch, the compute only.
#   [ARCH=resnet50] [SIZE=224] [BATCH=16] [THREADS=2] [STEPS=4] [WARMUP=2] [ROUNDS=2] [TOP=16]
#   [LAYOUT=nchw|cl] [PRECISION=fp32|bf16] [OPTIMIZER=adam] [TRAINER_BUILD_DIR=build]
#   scripts/bench/op_profile.sh
# PRECISION=bf16: forward and loss under bf16 autocast, as `train.precision: bf16` runs them.
# Exit 1 when a run failed, 2 on a usage error.
set -euo pipefail
cd "$(dirname "$0")/../.."
arch=${ARCH:-resnet50}; size=${SIZE:-224}; batch=${BATCH:-16}; threads=${THREADS:-2}
steps=${STEPS:-4}; warmup=${WARMUP:-2}; rounds=${ROUNDS:-2}; top=${TOP:-16}
layout=${LAYOUT:-nchw}; optimizer=${OPTIMIZER:-adam}; precision=${PRECISION:-fp32}
die() { echo "op_profile.sh: $*" >&2; exit 2; }
[[ $layout == nchw || $layout == cl ]] || die "LAYOUT must be nchw or cl, got '$layout'"
[[ $precision == fp32 || $precision == bf16 ]] || die "PRECISION must be fp32 or bf16, got '$precision'"
for v in size batch threads steps warmup rounds top; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "${v^^} must be a positive integer, got '${!v}'"
done
bench="${TRAINER_BUILD_DIR:-build}/tests/op_profile_bench"
[[ -x $bench ]] || die "$bench is not built: cmake --build ${TRAINER_BUILD_DIR:-build} --target op_profile_bench"
args=(--arch "$arch" --image "$size" --batch "$batch" --threads "$threads" --steps "$steps"
      --warmup "$warmup" --optimizer "$optimizer")
[[ $layout == cl ]] && args+=(--channels-last)
[[ $precision == bf16 ]] && args+=(--bf16)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for side in aten own; do
    echo "op_profile.sh: round $r/$rounds, $side kernels" >&2
    if [[ $side == aten ]]; then
      TRAINER_ATEN_KERNELS=1 "$bench" "${args[@]}" >"$work/$side.$r.json" || exit 1
    else
      env -u TRAINER_ATEN_KERNELS "$bench" "${args[@]}" >"$work/$side.$r.json" || exit 1
    fi
  done
done

python3 - "$work" "$rounds" "$top" <<'EOF'
import json, statistics, sys
work, rounds, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = {s: [json.load(open(f"{work}/{s}.{r}.json")) for r in range(1, rounds + 1)] for s in ("aten", "own")}
first = runs["aten"][0]
def per_step(side, name):  # self ms per step, over every measured step of the side's runs
    total = sum(run["ops"].get(name, {}).get("self_s", 0.0) for run in runs[side])
    return 1e3 * total / sum(run["steps"] for run in runs[side])
def calls(side, name):
    total = sum(run["ops"].get(name, {}).get("calls", 0) for run in runs[side])
    return total / sum(run["steps"] for run in runs[side])
def median_ms(side, key=None):
    values = [v for run in runs[side] for v in (run["step_s"] if key is None else run["phases"][key])]
    return 1e3 * statistics.median(values)
print(f"{first['arch']} at {first['image']} px, batch {first['batch']}, {first['threads']} thread(s), "
      f"{'channels_last' if first['channels_last'] else 'NCHW'} {first.get('precision', 'fp32')}, {first['optimizer']}, LibTorch "
      f"{first['torch']}, {first['allocator']}; {rounds} round(s) of {first['steps']} measured steps a side, alternating\n")
print("| | ATen kernels ms | own kernels ms | own / ATen |")
print("|---|---:|---:|---:|")
a, o = median_ms("aten"), median_ms("own")
print(f"| **median step** | {a:.0f} | {o:.0f} | {o / a:.2f} |")
order = ["reset gradients", "forward + loss", "backward", "optimizer step"]
for phase in sorted(first["phases"], key=lambda p: order.index(p) if p in order else len(order)):
    a, o = median_ms("aten", phase), median_ms("own", phase)
    print(f"| {phase} (median) | {a:.1f} | {o:.1f} | {o / a:.2f} |" if a > 0 else f"| {phase} (median) | {a:.1f} | {o:.1f} | |")
def is_conv(name):
    return "conv" in name.lower()
names = set().union(*(run["ops"].keys() for side in runs for run in runs[side]))
for label, pick in (("convolutions (forward and backward)", is_conv), ("everything else", lambda n: not is_conv(n))):
    a = sum(per_step("aten", n) for n in names if pick(n))
    o = sum(per_step("own", n) for n in names if pick(n))
    print(f"| {label}: self time | {a:.0f} | {o:.0f} | {o / a:.2f} |")
print(f"\nThe {top} ops with the most self time per step on either side (ms per step; calls per step):\n")
print("| op | ATen kernels ms | calls | own kernels ms | calls |")
print("|---|---:|---:|---:|---:|")
ranked = sorted(names, key=lambda n: -max(per_step("aten", n), per_step("own", n)))
for n in ranked[:top]:
    print(f"| `{n}` | {per_step('aten', n):.1f} | {calls('aten', n):.0f} | {per_step('own', n):.1f} | {calls('own', n):.0f} |")
EOF
