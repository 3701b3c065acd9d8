#!/usr/bin/env bash
# Benchmark (not a test): the trainer against a PyTorch-Python peer (scripts/bench/peer_pytorch.py,
# torchvision ResNet50 + ImageFolder + DataLoader + Adam) on the same generated 800x600 JPEGs
# (the Kaggle Cassava size), run alternately for each configuration: trainer, peer, peer with
# jemalloc (LD_PRELOAD, MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1). Prints, as Markdown,
# a header (CPU model and flags, threads, command), one table with a row per configuration
# (images/s, ratios, minor faults, kernel time and data wait per step, peak RSS, fraction of the
# convolution peak measured by scripts/bench/conv_peak.py) and a weak-scaling table (trainer
# launch --workers 2 against PyTorch DDP over Gloo, 1 thread per process). Medians over the
# steps after the first 2. Slow: use QUICK=1 for a smoke run.
#   [QUICK=1] [ROWS="224/16/fp32/nchw 224/16/bf16/cl ..."] [STEPS=12] [THREADS=2]
#   [PER_CLASS=auto] [SCALING=1] [SCALE_SIZE=224] [SCALE_BATCH=16] [CONV_PEAK=1] [CONV_BATCH=16]
#   [CONV_ITERS=3] [JEMALLOC=path|none] [OUT=results.json] [TRAINER_BIN=build/app/trainer]
#   scripts/bench/vs_pytorch.sh
# ROWS: image size / per-replica batch / fp32|bf16 / nchw|cl. PER_CLASS: images per class (5
# classes); auto = enough for STEPS steps of the largest batch in one pass. OUT: a file for the raw
# JSON results (relative to the directory it is started from). Exit 1 when a run failed (its row
# shows `-`), 2 on a usage error.
set -euo pipefail
out=${OUT:-}
if [[ -n $out && $out != /* ]]; then out=$PWD/$out; fi  # relative to where it was started
cd "$(dirname "$0")/../.."
py=/usr/bin/python3

# The command as given, for the header.
cmd=""
for v in QUICK ROWS STEPS THREADS PER_CLASS SCALING SCALE_SIZE SCALE_BATCH CONV_PEAK CONV_BATCH \
         CONV_ITERS JEMALLOC OUT TRAINER_BIN; do
  if [[ -n ${!v+x} ]]; then printf -v q %q "${!v}"; cmd+="$v=$q "; fi
done
cmd+="scripts/bench/vs_pytorch.sh"

if [[ ${QUICK:-0} == 1 ]]; then
  rows=${ROWS:-"64/8/fp32/nchw 64/8/bf16/cl"}
  steps=${STEPS:-5}
  scale_size=${SCALE_SIZE:-64}; scale_batch=${SCALE_BATCH:-8}
  conv_batch=${CONV_BATCH:-2}; conv_iters=${CONV_ITERS:-2}
else
  rows=${ROWS:-"224/16/fp32/nchw 224/16/fp32/cl 224/16/bf16/cl 224/16/bf16/nchw 300/64/fp32/nchw 300/64/bf16/cl"}
  steps=${STEPS:-12}
  scale_size=${SCALE_SIZE:-224}; scale_batch=${SCALE_BATCH:-16}
  conv_batch=${CONV_BATCH:-16}; conv_iters=${CONV_ITERS:-3}
fi
threads=${THREADS:-2}
scaling=${SCALING:-1}
conv_peak=${CONV_PEAK:-1}
warmup=2  # steps left out of every median (as train_throughput.sh and scaling.sh)

die() { echo "vs_pytorch.sh: $*" >&2; exit 2; }
trainer_rel=${TRAINER_BIN:-build/app/trainer}
[[ -x $trainer_rel ]] || die "no trainer binary at $trainer_rel (build it with scripts/build.sh, or set TRAINER_BIN)"
trainer=$(realpath "$trainer_rel")
"$py" -c 'import torch, torchvision' 2>/dev/null ||
  die "$py cannot import torch and torchvision (Debian: apt-get install python3-torch python3-torchvision)"
(( steps > warmup )) || die "STEPS=$steps leaves no step after $warmup warm-up steps"
for spec in $rows; do
  [[ $spec =~ ^[0-9]+/[0-9]+/(fp32|bf16)/(nchw|cl)$ ]] ||
    die "ROWS entry '$spec' is not SIZE/BATCH/fp32|bf16/nchw|cl (e.g. 224/16/bf16/cl)"
done

jemalloc=${JEMALLOC:-}
if [[ -z $jemalloc ]]; then
  ldconfig_bin=$(command -v ldconfig || echo /sbin/ldconfig)
  jemalloc=$("$ldconfig_bin" -p 2>/dev/null | awk '/libjemalloc\.so\.2 / {print $NF; exit}' || true)
  [[ -n $jemalloc ]] || jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
fi
if [[ $jemalloc != none && ! -e $jemalloc ]]; then
  echo "vs_pytorch.sh: no libjemalloc.so.2 ($jemalloc): the PyTorch+jemalloc column is skipped (apt-get install libjemalloc2)" >&2
  jemalloc=none
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/res" "$work/logs" "$work/jobs"
failed=0

# Runs a command, then writes the peak RSS (KiB) of its process tree to $1.
rss_py='import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc if rc >= 0 else 128 - rc)'

# Medians of a job's per-step metrics after the warm-up, and its peak RSS, as one JSON line.
summarize_py='import json, statistics, sys
metrics, rss, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = [r for r in map(json.loads, open(metrics)) if "images_per_sec" in r]
steps.sort(key=lambda r: r["step"])
measured = steps[warmup:]
out = {}
for k in ("images_per_sec", "step_time_s", "minor_faults", "sys_time_s", "data_wait_s", "comm_wait_s"):
    v = [r[k] for r in measured if r.get(k) is not None]
    out[k] = statistics.median(v) if v else None
out["steps"], out["measured_steps"] = len(steps), len(measured)
out["peak_rss_mib"] = int(open(rss).read()) / 1024.0
print(json.dumps(out))'

fail_note() {  # WHAT LOG
  failed=1
  echo "vs_pytorch.sh: $1 failed; the last lines of its output:" >&2
  tail -n 15 "$2" | sed 's/^/    /' >&2
}

# trainer_job NAME SIZE BATCH PRECISION CHANNELS_LAST THREADS: writes $work/NAME.yaml
trainer_job() {
  cat >"$work/$1.yaml" <<YAML
model: {arch: resnet50}
data:
  train: {format: imagefolder, path: $work/data/train}
  image_size: $2
  num_workers: 1
  shard_policy: data
train:
  epochs: 1000
  per_replica_batch_size: $3
  optimizer: {name: adam, learning_rate: 0.001}
  precision: $4
  channels_last: $5
  threads: $6
  max_steps: $steps
checkpoint: {every_epochs: 1000}
logging: {every_steps: 1000}
YAML
}

# run_trainer NAME TRAINER-ARGS...: runs the trainer with job dir $work/jobs/NAME, summary into res/NAME.json
run_trainer() {
  local name=$1; shift
  local job=$work/jobs/$name
  if "$py" -c "$rss_py" "$job.rss" "$trainer" "$@" >"$work/logs/$name.log" 2>&1 &&
     "$py" -c "$summarize_py" "$job/metrics.jsonl" "$job.rss" "$warmup" >"$work/res/$name.json" 2>>"$work/logs/$name.log"; then
    :
  else
    rm -f "$work/res/$name.json"
    fail_note "trainer ($name: ${*})" "$work/logs/$name.log"
  fi
}

# run_peer NAME [ENV=VALUE...] -- PEER-ARGS...: summary into res/NAME.json
run_peer() {
  local name=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  if env ${envs[@]+"${envs[@]}"} "$py" scripts/bench/peer_pytorch.py --data "$work/data/train" \
       --warmup "$warmup" --steps "$steps" "$@" >"$work/res/$name.json" 2>"$work/logs/$name.log"; then
    :
  else
    rm -f "$work/res/$name.json"
    fail_note "PyTorch peer ($name: ${envs[*]} ${*})" "$work/logs/$name.log"
  fi
}

# Data: enough 800x600 JPEGs for every step of the largest batch in one pass over them.
max_batch=$scale_batch
for spec in $rows; do
  IFS=/ read -r _ b _ _ <<<"$spec"
  if (( b > max_batch )); then max_batch=$b; fi
done
per_class=${PER_CLASS:-$(( (steps * max_batch + 4) / 5 ))}
echo "vs_pytorch.sh: generating $(( per_class * 5 )) 800x600 JPEGs" >&2
"$trainer" make-dataset --out "$work/data" --per-class "$per_class" --image-size 800 \
  --image-height 600 --splits train >"$work/logs/make-dataset.log" 2>&1 ||
  { fail_note "trainer make-dataset" "$work/logs/make-dataset.log"; exit 1; }

if [[ $conv_peak == 1 ]]; then
  echo "vs_pytorch.sh: convolution peak ($threads threads)" >&2
  "$py" scripts/bench/conv_peak.py --threads "$threads" --batch "$conv_batch" --iters "$conv_iters" \
    >"$work/res/conv_peak.json" 2>"$work/logs/conv_peak.log" ||
    { rm -f "$work/res/conv_peak.json"; fail_note "conv_peak.py" "$work/logs/conv_peak.log"; }
fi

i=0
for spec in $rows; do
  IFS=/ read -r size batch precision layout <<<"$spec"
  cl=false; peer_cl=()
  if [[ $layout == cl ]]; then cl=true; peer_cl=(--channels-last); fi
  peer_args=(--image-size "$size" --batch "$batch" --threads "$threads" --precision "$precision" ${peer_cl[@]+"${peer_cl[@]}"})
  echo "vs_pytorch.sh: row $spec: trainer, PyTorch$([[ $jemalloc == none ]] || echo ', PyTorch+jemalloc')" >&2
  trainer_job "row$i" "$size" "$batch" "$precision" "$cl" "$threads"
  run_trainer "row$i.trainer" --config "$work/row$i.yaml" --job-dir "$work/jobs/row$i.trainer"
  run_peer "row$i.peer" -- "${peer_args[@]}"
  if [[ $jemalloc != none ]]; then
    run_peer "row$i.peer_jemalloc" LD_PRELOAD="$jemalloc" MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 \
      -- "${peer_args[@]}"
  fi
  i=$((i + 1))
done

if [[ $scaling == 1 ]]; then
  echo "vs_pytorch.sh: weak scaling $scale_size/$scale_batch: trainer 1 and 2 workers, PyTorch 1 and 2 (DDP) processes" >&2
  trainer_job scale "$scale_size" "$scale_batch" fp32 false 1
  run_trainer scale.trainer1 --config "$work/scale.yaml" --job-dir "$work/jobs/scale.trainer1"
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  run_trainer scale.trainer2 launch --workers 2 --base-port "$port" -- \
    --config "$work/scale.yaml" --job-dir "$work/jobs/scale.trainer2"
  scale_args=(--image-size "$scale_size" --batch "$scale_batch" --threads 1 --precision fp32)
  run_peer scale.peer1 -- "${scale_args[@]}"
  run_peer scale.peer2 -- "${scale_args[@]}" --ddp 2
fi

# The report.
ROWS_=$rows THREADS_=$threads STEPS_=$steps WARMUP_=$warmup CMD_=$cmd JEMALLOC_=$jemalloc \
SCALING_=$scaling SCALE_=$scale_size/$scale_batch TRAINER_VERSION_=$("$trainer" --version 2>/dev/null | head -n 1 || true) \
PER_CLASS_=$per_class RES_=$work/res OUT_=$out "$py" - <<'PY'
import json, os

env = os.environ
res = env["RES_"]


def load(name):
    try:
        with open(os.path.join(res, name + ".json")) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


model, flags = "unknown CPU", set()
with open("/proc/cpuinfo") as f:
    for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
cpu_flags = {k: k in flags for k in ("avx512_bf16", "amx_bf16", "avx512f", "avx2")}
threads = int(env["THREADS_"])
conv = load("conv_peak")


def get(r, k):
    return None if r is None else r.get(k)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or not b else a / b


def gflop_per_image(size):  # ResNet50 training (forward + backward), ~24.5 GFLOP at 224x224
    return 24.5 * (size / 224.0) ** 2


rows = []
for i, spec in enumerate(env["ROWS_"].split()):
    size, batch, precision, layout = spec.split("/")
    size, batch = int(size), int(batch)
    sides = {s: load(f"row{i}.{s}") for s in ("trainer", "peer", "peer_jemalloc")}
    peak = get(conv, precision)
    conv_fraction = {s: (None if get(r, "images_per_sec") is None or not peak
                         else get(r, "images_per_sec") * gflop_per_image(size) / peak)
                     for s, r in sides.items()}
    rows.append({"spec": spec, "image_size": size, "batch": batch, "precision": precision,
                 "channels_last": layout == "cl", **sides,
                 "ratio_trainer_peer": ratio(get(sides["trainer"], "images_per_sec"),
                                             get(sides["peer"], "images_per_sec")),
                 "ratio_trainer_peer_jemalloc": ratio(get(sides["trainer"], "images_per_sec"),
                                                      get(sides["peer_jemalloc"], "images_per_sec")),
                 "gflop_per_image": gflop_per_image(size), "conv_peak_gflops": peak,
                 "conv_peak_fraction": conv_fraction})

print(f"**CPU** {model}; flags: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu_flags.items())
      + f"; {os.cpu_count()} logical CPUs. **Threads** {threads} per process (train.threads / "
      f"torch.set_num_threads), 1 decode worker each. **Trainer** {env['TRAINER_VERSION_'] or '?'}; "
      f"**PyTorch** {(get(rows[0]['peer'], 'torch') if rows else None) or '?'} (/usr/bin/python3). "
      f"**Data** {int(env['PER_CLASS_']) * 5} generated 800x600 JPEGs. **Steps** {env['STEPS_']}, medians "
      f"after the first {env['WARMUP_']}. **Command** `{env['CMD_']}`")
print()
print("| config (size/batch/precision/layout) | trainer img/s | PyTorch img/s | PyTorch+jemalloc img/s "
      "| trainer / PyTorch | trainer / PyTorch+jemalloc | minor faults/step T / P / Pj "
      "| kernel s/step T / P / Pj | data wait s/step T / P / Pj | peak RSS MiB T / P / Pj "
      "| % of conv peak T / P / Pj |")
print("|---|" + "---:|" * 10)
S = ("trainer", "peer", "peer_jemalloc")
for r in rows:
    def three(key, spec):
        return " / ".join(fmt(get(r[s], key), spec) for s in S)
    print(f"| {r['spec']} | " + " | ".join([
        fmt(get(r["trainer"], "images_per_sec"), ".1f"), fmt(get(r["peer"], "images_per_sec"), ".1f"),
        fmt(get(r["peer_jemalloc"], "images_per_sec"), ".1f"),
        fmt(r["ratio_trainer_peer"], ".2f"), fmt(r["ratio_trainer_peer_jemalloc"], ".2f"),
        three("minor_faults", ".0f"), three("sys_time_s", ".3f"), three("data_wait_s", ".3f"),
        three("peak_rss_mib", ".0f"),
        " / ".join(fmt(None if r["conv_peak_fraction"][s] is None else 100 * r["conv_peak_fraction"][s], ".1f")
                   for s in S)]) + " |")
print()
peak_txt = ("not measured" if conv is None else
            f"fp32 {fmt(conv.get('fp32'), '.1f')}, bf16 {fmt(conv.get('bf16'), '.1f')} GFLOP/s "
            f"({conv['mode']} of 3x3 convolutions, {conv['batch']}x256x56x56 and {conv['batch']}x512x28x28, "
            f"{conv['threads']} threads, scripts/bench/conv_peak.py)")
print(f"T = trainer, P = PyTorch peer (scripts/bench/peer_pytorch.py), Pj = the peer with "
      + (f"LD_PRELOAD={env['JEMALLOC_']} MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1"
         if env["JEMALLOC_"] != "none" else "jemalloc (no libjemalloc.so.2 here: skipped)")
      + f". img/s and ratios: whole steps (data wait, "
      f"forward, backward, Adam). Faults and kernel time: per step, the trainer's whole process "
      f"(`-` where its metrics.jsonl lacks minor_faults / sys_time_s / data_wait_s), the peer's main "
      f"process only (its DataLoader worker is a child process); peer RSS = main + worker peaks. "
      f"Conv peak: {peak_txt}; a row's share = img/s x 24.5 x (size/224)^2 GFLOP / the peak at its precision.")

scaling = None
if env["SCALING_"] == "1":
    size, batch = map(int, env["SCALE_"].split("/"))
    t1, t2, p1, p2 = (load(n) for n in ("scale.trainer1", "scale.trainer2", "scale.peer1", "scale.peer2"))
    t1_step = None if get(t1, "images_per_sec") is None else batch / t1["images_per_sec"]
    scaling = {
        "image_size": size, "batch": batch,
        "trainer": {"one": t1, "two": t2, "step_1_s": t1_step, "step_2_s": get(t2, "step_time_s"),
                    "comm_wait_2_s": get(t2, "comm_wait_s"),
                    "efficiency": ratio(t1_step, get(t2, "step_time_s"))},
        "peer": {"one": p1, "two": p2, "step_1_s": get(p1, "step_time_s"), "step_2_s": get(p2, "step_time_s"),
                 "efficiency": ratio(get(p1, "step_time_s"), get(p2, "step_time_s"))},
    }
    print()
    print(f"| weak scaling, {size}/{batch} fp32 NCHW per process, 1 thread each | step s, 1 process "
          "| step s, 2 processes | efficiency | gradient wait s/step, 2 processes |")
    print("|---|---:|---:|---:|---:|")
    tr, pe = scaling["trainer"], scaling["peer"]
    print(f"| trainer, launch --workers 2 (each pinned to its own CPUs), data.shard_policy: data | {fmt(tr['step_1_s'], '.3f')} "
          f"| {fmt(tr['step_2_s'], '.3f')} | {fmt(tr['efficiency'], '.3f')} | {fmt(tr['comm_wait_2_s'], '.3f')} |")
    print(f"| PyTorch DDP over Gloo, DistributedSampler (not pinned) | {fmt(pe['step_1_s'], '.3f')} "
          f"| {fmt(pe['step_2_s'], '.3f')} | {fmt(pe['efficiency'], '.3f')} | - |")
    print()
    print("Efficiency = step time with 1 process / step time with 2 (the same per-process batch); "
          "trainer 1-worker step = batch / img/s, 2-worker step = the chief's step_time_s.")

if env["OUT_"]:
    with open(env["OUT_"], "w") as f:
        json.dump({"cpu": {"model": model, "flags": cpu_flags, "logical_cpus": os.cpu_count()},
                   "threads": threads, "steps": int(env["STEPS_"]), "warmup_steps": int(env["WARMUP_"]),
                   "command": env["CMD_"], "trainer_version": env["TRAINER_VERSION_"],
                   "jemalloc": None if env["JEMALLOC_"] == "none" else env["JEMALLOC_"],
                   "conv_peak": conv, "rows": rows, "scaling": scaling}, f, indent=1)
        f.write("\n")
PY
exit "$failed"
