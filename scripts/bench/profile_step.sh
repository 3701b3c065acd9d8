#!/usr/bin/env bash
# Profile (not a test): where the CPU time of a steady training step goes, in the trainer and in
# the PyTorch-Python peer with jemalloc (scripts/bench/peer_pytorch.py), on the same generated
# 800x600 JPEGs, sampled with Linux perf after both have warmed up. Prints, as Markdown, each
# side's step time and the share of its CPU samples per category:
#   compute kernels   oneDNN's JIT code (anonymous executable memory) and libdnnl
#   ATen/LibTorch     libtorch_cpu, libc10 (dispatch, autograd, the non-oneDNN kernels, Adam)
#   BLAS              libopenblas
#   OpenMP            libgomp (the intra-op pool: barriers and spinning)
#   allocator, libc   libjemalloc, libc (malloc, memcpy, memset)
#   input pipeline    libopencv*, libjpeg, libpng, libz, PIL's _imaging
#   Python            the interpreter and its extension modules (torch's Python bindings)
#   kernel            the Linux kernel (page faults, scheduling, futexes)
#   trainer, other    the trainer binary and everything else
# and each side's top symbols. Both sides run the same LibTorch kernels, so the compute share
# bounds what any change to the trainer's own code can win: at most the time spent outside it.
#   [SIZE=224] [BATCH=16] [PRECISION=fp32|bf16] [LAYOUT=cl|nchw] [THREADS=2] [STEPS=14]
#   [DELAY_S=auto] [SAMPLE_S=20] [FREQ=499] [JEMALLOC=path] [TRAINER_BIN=build/app/trainer]
#   scripts/bench/profile_step.sh
# DELAY_S: seconds before sampling starts (auto: start-up plus 3 steps, timed in a first short
# run of each side). SAMPLE_S: seconds sampled; the run must last longer (else raise STEPS). Needs perf (Debian: linux-perf) and permission to use it (root, or
# kernel.perf_event_paranoid <= 1). Exit 1 when a run failed, 2 on a usage error.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=/usr/bin/python3
size=${SIZE:-224}; batch=${BATCH:-16}; precision=${PRECISION:-fp32}; layout=${LAYOUT:-cl}
threads=${THREADS:-2}; steps=${STEPS:-14}; freq=${FREQ:-499}; sample=${SAMPLE_S:-20}

die() { echo "profile_step.sh: $*" >&2; exit 2; }
[[ $precision == fp32 || $precision == bf16 ]] || die "PRECISION must be fp32 or bf16, got '$precision'"
[[ $layout == cl || $layout == nchw ]] || die "LAYOUT must be cl or nchw, got '$layout'"
(( steps >= 8 )) || die "STEPS=$steps: at least 8 (3 to warm up, the rest sampled)"
command -v perf >/dev/null || die "no perf on PATH (Debian: apt-get install linux-perf)"
trainer=$(realpath "${TRAINER_BIN:-build/app/trainer}")
[[ -x $trainer ]] || die "no trainer binary at $trainer (build it with scripts/build.sh, or set TRAINER_BIN)"
"$py" -c 'import torch, torchvision' 2>/dev/null || die "$py cannot import torch and torchvision"
jemalloc=${JEMALLOC:-/usr/lib/x86_64-linux-gnu/libjemalloc.so.2}
[[ -e $jemalloc ]] || die "no $jemalloc (apt-get install libjemalloc2, or set JEMALLOC)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cl=false; peer_cl=()
if [[ $layout == cl ]]; then cl=true; peer_cl=(--channels-last); fi

echo "profile_step.sh: generating $(( steps * batch )) 800x600 JPEGs" >&2
"$trainer" make-dataset --out "$work/data" --per-class $(( (steps * batch + 4) / 5 )) \
  --image-size 800 --image-height 600 --splits train >"$work/make-dataset.log" 2>&1 ||
  { tail -n 15 "$work/make-dataset.log" >&2; exit 1; }

job() {  # job STEPS: the trainer's job spec for STEPS steps
  cat <<YAML
model: {arch: resnet50}
data:
  train: {format: imagefolder, path: $work/data/train}
  image_size: $size
  num_workers: 1
train:
  epochs: 1000
  per_replica_batch_size: $batch
  optimizer: {name: adam, learning_rate: 0.001}
  precision: $precision
  channels_last: $cl
  threads: $threads
  max_steps: $1
checkpoint: {every_epochs: 1000}
logging: {every_steps: 1000}
YAML
}
job "$steps" >"$work/job.yaml"
job 3 >"$work/warm.yaml"
peer=(env LD_PRELOAD="$jemalloc" MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1
      "$py" scripts/bench/peer_pytorch.py --data "$work/data/train" --warmup 2
      --image-size "$size" --batch "$batch" --threads "$threads" --precision "$precision"
      ${peer_cl[@]+"${peer_cl[@]}"})

seconds() { local t0; t0=$(date +%s.%N); "$@" >/dev/null 2>>"$work/warm.log" || return 1; echo "$(date +%s.%N) - $t0" | bc; }
if [[ -n ${DELAY_S:-} && $DELAY_S != auto ]]; then
  delay_t=$DELAY_S; delay_p=$DELAY_S
else
  echo "profile_step.sh: timing start-up plus 3 steps of each side" >&2
  delay_t=$(seconds "$trainer" --config "$work/warm.yaml" --job-dir "$work/warm") ||
    { tail -n 15 "$work/warm.log" >&2; exit 1; }
  delay_p=$(seconds "${peer[@]}" --steps 3) || { tail -n 15 "$work/warm.log" >&2; exit 1; }
fi

# record NAME DELAY COMMAND...: starts the command, waits DELAY s, samples it (and its child
# processes: the peer's DataLoader worker) for $sample s with perf, then lets it finish. The run
# must outlive the window, so that its end (the trainer's final checkpoint and model) is not in it.
record() {
  local name=$1 delay=$2; shift 2
  "$@" >"$work/$name.out" 2>"$work/$name.log" &
  local pid=$!
  sleep "$delay"
  kill -0 "$pid" 2>/dev/null ||
    { echo "profile_step.sh: $name ended before sampling started:" >&2; tail -n 15 "$work/$name.log" >&2; exit 1; }
  local pids=$pid child
  for child in $(pgrep -P "$pid" || true); do pids+=",$child"; done
  echo "profile_step.sh: $name: sampling processes $pids at $freq Hz for $sample s, after ${delay%.*} s" >&2
  perf record -q -F "$freq" -p "$pids" -o "$work/$name.perf" -- sleep "$sample" 2>>"$work/$name.perf.log" ||
    { echo "profile_step.sh: perf record failed:" >&2; tail -n 5 "$work/$name.perf.log" >&2; exit 1; }
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" || true
    die "$name ended inside the sampling window: raise STEPS (or lower SAMPLE_S)"
  fi
  wait "$pid" || { echo "profile_step.sh: $name failed:" >&2; tail -n 15 "$work/$name.log" >&2; exit 1; }
  perf report -q -i "$work/$name.perf" --sort dso --stdio 2>/dev/null >"$work/$name.dso"
  perf report -q -i "$work/$name.perf" --sort dso,sym --stdio 2>/dev/null >"$work/$name.syms"
  sed -n '1,12p' "$work/$name.syms" >"$work/$name.sym"
}
record trainer "$delay_t" "$trainer" --config "$work/job.yaml" --job-dir "$work/jobT"
record peer "$delay_p" "${peer[@]}" --steps "$steps"

WORK_=$work SIZE_=$size BATCH_=$batch PREC_=$precision LAYOUT_=$layout THREADS_=$threads \
STEPS_=$steps FREQ_=$freq SAMPLE_=$sample "$py" - <<'PY'
import json, os, re, statistics

env = os.environ
work = env["WORK_"]
CATEGORIES = [
    ("compute kernels (oneDNN)", lambda d: d.startswith("[JIT]") or d == "[unknown]" or "dnnl" in d or d.startswith("//anon") or d.startswith("[anon")),
    ("ATen/LibTorch", lambda d: "libtorch" in d or "libc10" in d),
    ("BLAS", lambda d: "openblas" in d or "blas" in d),
    ("OpenMP", lambda d: "gomp" in d or "libomp" in d),
    ("allocator, libc", lambda d: "jemalloc" in d or d.startswith("libc.so") or d.startswith("libc-") or "libstdc++" in d or "libm.so" in d),
    ("input pipeline", lambda d: "opencv" in d or "jpeg" in d or "png" in d or "libz." in d or "_imaging" in d or "PIL" in d),
    ("Python", lambda d: "python" in d or d.endswith(".cpython-311-x86_64-linux-gnu.so") or "_C." in d),
    ("kernel", lambda d: "kernel" in d or d.startswith("[vdso]")),
]


def shares(name):
    out = {c: 0.0 for c, _ in CATEGORIES}
    out["trainer, other"] = 0.0
    for line in open(os.path.join(work, name + ".dso")):
        m = re.match(r"\s*([\d.]+)%\s+(.*\S)", line)
        if not m:
            continue
        pct, dso = float(m.group(1)), m.group(2)
        for c, match in CATEGORIES:
            if match(dso):
                out[c] += pct
                break
        else:
            out["trainer, other"] += pct
    return out


def step_time(name):
    if name == "trainer":
        rows = [json.loads(l) for l in open(os.path.join(work, "jobT", "metrics.jsonl"))]
        v = sorted((r["step"], r["step_time_s"]) for r in rows if "step_time_s" in r)[2:]
        return statistics.median(t for _, t in v)
    return json.loads(open(os.path.join(work, "peer.out")).read().strip().splitlines()[-1])["step_time_s"]


model = "unknown CPU"
flags = set()
for line in open("/proc/cpuinfo"):
    k, _, v = line.partition(":")
    if k.strip() == "model name" and model == "unknown CPU":
        model = v.strip()
    elif k.strip() == "flags" and not flags:
        flags = set(v.split())
t, p = shares("trainer"), shares("peer")
st, sp = step_time("trainer"), step_time("peer")
print(f"## Where a step's CPU time goes: {env['SIZE_']}/{env['BATCH_']} {env['PREC_']} "
      f"{'channels_last' if env['LAYOUT_'] == 'cl' else 'NCHW'}, {env['THREADS_']} threads\n")
print(f"CPU: {model}; " + ", ".join(f"{f}: {'yes' if f in flags else 'no'}"
                                   for f in ("avx512_bf16", "amx_bf16", "avx512f", "avx2")))
print(f"perf at {env['FREQ_']} Hz for {env['SAMPLE_']} s of steps, after start-up and 3 warm-up steps, "
      "before the run ends; "
      f"the peer is PyTorch-Python with jemalloc (dirty_decay_ms:-1).\n")
print(f"Median step: trainer {st:.3f} s, peer {sp:.3f} s (peer/trainer {sp / st:.3f}).\n")
print("| category | trainer % of CPU samples | peer % | trainer CPU s/step | peer CPU s/step |")
print("|---|---:|---:|---:|---:|")
threads = int(env["THREADS_"])
for c in list(t):
    # CPU seconds per step, assuming the step keeps every intra-op thread busy (an upper bound).
    print(f"| {c} | {t[c]:.1f} | {p[c]:.1f} | {t[c] / 100 * st * threads:.3f} | "
          f"{p[c] / 100 * sp * threads:.3f} |")
for side in ("trainer", "peer"):
    print(f"\nTop symbols, {side} (perf report --sort dso,sym):\n")
    print("```")
    print(open(os.path.join(work, side + ".sym")).read().rstrip())
    print("```")
PY
