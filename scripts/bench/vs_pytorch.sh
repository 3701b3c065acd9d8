#!/usr/bin/env bash
# Benchmark (not a test): the trainer against a PyTorch-Python peer (scripts/bench/peer_pytorch.py,
# torchvision ResNet50 + ImageFolder + DataLoader + Adam) on the same generated 800x600 JPEGs
# (the Kaggle Cassava size), with both LibTorch flavours of scripts/torch-flavour.sh. Within each
# configuration (row) it runs, one after the other, five sides:
#   trainer 1.13     the trainer built against Debian's LibTorch (build/app/trainer; TRAINER_BIN)
#   trainer 2.11     the trainer built against pip's PyTorch wheel (build-pip/app/trainer;
#                    TRAINER_PIP_BIN); a CUDA build, run here on the CPU (train.device: cpu)
#   PyTorch 1.13     the peer on Debian's python3-torch and python3-torchvision (/usr/bin/python3)
#   PyTorch 2.11     the peer, eager, on the wheel's venv (/opt/trainer/venv-torch-2.11.0/bin/python
#                    from scripts/torch-flavour.sh, TRAINER_TORCH_VERSION / TRAINER_TORCH_VENV;
#                    PIP_PYTHON overrides)
#   PyTorch 2.11 compile  the same peer with --compile: torch.compile, default mode (TorchInductor
#                    on the CPU: it needs g++ and the Python.h of the venv's Python, Debian's
#                    python3.11-dev on Debian 12; checked before the run, the column is skipped with
#                    a message when either is missing). Its first step compiles; it is one of the
#                    warm-up steps left out of the medians, and the details table shows it.
# (The version numbers in the table are the ones found: Debian 13's LibTorch is 2.6.) A side whose
# binary or Python is missing, or fails its --version / import check, is skipped with a message on
# stderr and shows `-`; the run needs only one side (data are then made by peer Python where no
# trainer is there). The PyTorch 1.13 peer with jemalloc (LD_PRELOAD,
# MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1) is a sixth, optional side, off by default to
# keep the run time bounded: JEMALLOC=path (or JEMALLOC=auto, found with ldconfig) turns it on.
# Prints, as Markdown, a header (CPU model and bf16 flags, the trainers' --version lines, the
# peers' torch and torchvision versions, date, git commit, threads, command), one table with a row
# per configuration (images/s of every side and the ratios trainer 2.11 / PyTorch 2.11 eager,
# trainer 2.11 / PyTorch 2.11 compile, trainer 1.13 / PyTorch 1.13, trainer 2.11 / trainer 1.13),
# a details table (per configuration and side: step time, data wait, minor faults and kernel time
# per step, peak RSS, fraction of the convolution peak measured by scripts/bench/conv_peak.py with
# /usr/bin/python3, first-step time) and a weak-scaling table (trainer 1.13 launch --workers 2
# against PyTorch 1.13 DDP over Gloo, 1 thread per process). Medians over the steps after the
# first 2. Slow: use QUICK=1 for a smoke run.
#   [ARCH=resnet50] [SIDES_ONLY="trainer_pip peer_pip"] [QUICK=1] [ROWS="224/16/fp32/nchw 224/16/bf16/cl ..."] [STEPS=12] [THREADS=2]
#   [PER_CLASS=auto] [SCALING=1] [SCALE_SIZE=224] [SCALE_BATCH=16] [CONV_PEAK=1] [CONV_BATCH=16]
#   [CONV_ITERS=3] [COMPILE=1] [JEMALLOC=none|auto|path] [OUT=results.json]
#   [TRAINER_BIN=build/app/trainer] [TRAINER_PIP_BIN=build-pip/app/trainer]
#   [PIP_PYTHON=/opt/trainer/venv-torch-2.11.0/bin/python] scripts/bench/vs_pytorch.sh
# ARCH: the network of both sides (model.arch; torchvision.models.<ARCH> for the peer); the conv-
# peak share is computed for resnet50 only (its 24.5 GFLOP per image). ROWS: image size /
# per-replica batch / fp32|bf16 / nchw|cl. PER_CLASS: images per class (5
# classes); auto = enough for STEPS steps of the largest batch in one pass. COMPILE=0 leaves the
# compile side out. OUT: a file for the raw JSON results (relative to the directory it is started
# from). Paths in TRAINER_BIN, TRAINER_PIP_BIN and PIP_PYTHON are relative to the repository root.
# Exit 1 when a run failed (its cell shows `-`), 2 on a usage error or when no side can run.
set -euo pipefail
out=${OUT:-}
if [[ -n $out && $out != /* ]]; then out=$PWD/$out; fi  # relative to where it was started
cd "$(dirname "$0")/../.."
py=/usr/bin/python3  # the PyTorch 1.13 peer's Python
drv=$py              # runs this script's own helpers (standard library only)
[[ -x $drv ]] || drv=$(command -v python3 || true)

# The command as given, for the header.
cmd=""
for v in ARCH SIDES_ONLY QUICK ROWS STEPS THREADS PER_CLASS SCALING SCALE_SIZE SCALE_BATCH CONV_PEAK CONV_BATCH \
         CONV_ITERS COMPILE JEMALLOC OUT TRAINER_BIN TRAINER_PIP_BIN PIP_PYTHON TRAINER_TORCH_VERSION \
         TRAINER_TORCH_VENV; do
  if [[ -n ${!v+x} ]]; then printf -v q %q "${!v}"; cmd+="$v=$q "; fi
done
cmd+="scripts/bench/vs_pytorch.sh"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=0
if [[ $commit != unknown && -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then dirty=1; fi

if [[ ${QUICK:-0} == 1 ]]; then
  rows=${ROWS:-"64/8/fp32/nchw 64/8/bf16/cl"}
  steps=${STEPS:-5}
  scale_size=${SCALE_SIZE:-64}; scale_batch=${SCALE_BATCH:-8}
  conv_batch=${CONV_BATCH:-2}; conv_iters=${CONV_ITERS:-2}
else
  rows=${ROWS:-"224/16/fp32/nchw 224/16/bf16/cl"}
  steps=${STEPS:-12}
  scale_size=${SCALE_SIZE:-224}; scale_batch=${SCALE_BATCH:-16}
  conv_batch=${CONV_BATCH:-16}; conv_iters=${CONV_ITERS:-3}
fi
threads=${THREADS:-2}
arch=${ARCH:-resnet50}
scaling=${SCALING:-1}
conv_peak=${CONV_PEAK:-1}
compile=${COMPILE:-1}
warmup=2  # steps left out of every median (as train_throughput.sh and scaling.sh); the compile
          # side's first step, which compiles, is one of them

note() { echo "vs_pytorch.sh: $*" >&2; }
die() { note "$*"; exit 2; }
[[ -n $drv ]] || die "no python3 to run the benchmark's helpers"
(( steps > warmup )) || die "STEPS=$steps leaves no step after $warmup warm-up steps"
for spec in $rows; do
  [[ $spec =~ ^[0-9]+/[0-9]+/(fp32|bf16)/(nchw|cl)$ ]] ||
    die "ROWS entry '$spec' is not SIZE/BATCH/fp32|bf16/nchw|cl (e.g. 224/16/bf16/cl)"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/res" "$work/logs" "$work/jobs" "$work/sides"
failed=0

# The sides. $work/sides/KEY.{path,version,skip}: what runs it, what it says it is, why it is
# skipped; the report reads them.
sides=(trainer_debian trainer_pip peer_debian peer_pip peer_pip_compile)
declare -A bin=()
skip() {  # KEY REASON
  note "skipping $1: $2"
  printf '%s\n' "$2" >"$work/sides/$1.skip"
}

# probe_trainer KEY PATH ENV-NAME BUILD-COMMAND
probe_trainer() {
  local key=$1 rel=$2 v
  if [[ ! -x $rel ]]; then
    skip "$key" "no trainer binary at $rel (build it with $4, or set $3)"
    return
  fi
  if ! v=$("$rel" --version 2>&1); then
    skip "$key" "$rel --version failed: $(head -n 3 <<<"$v" | tr '\n' ' ')"
    return
  fi
  bin[$key]=$(realpath "$rel")
  printf '%s\n' "${bin[$key]}" >"$work/sides/$key.path"
  printf '%s\n' "$v" >"$work/sides/$key.version"
}

# probe_peer KEY PYTHON HOW-TO-INSTALL: can PYTHON import torch and torchvision?
probe_peer() {
  local key=$1 p=$2 v
  if [[ $p != */* ]]; then p=$(command -v "$p" || echo "$p"); fi
  if [[ ! -x $p ]]; then
    skip "$key" "no Python at $p ($3)"
    return
  fi
  if ! v=$("$p" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)' 2>"$work/logs/$key.probe"); then
    skip "$key" "$p cannot import torch and torchvision ($3): $(tail -n 1 "$work/logs/$key.probe")"
    return
  fi
  bin[$key]=$p
  printf '%s\n' "$p" >"$work/sides/$key.path"
  printf '%s\n' "$v" >"$work/sides/$key.version"
}

# What torch.compile's default backend (TorchInductor) needs on the CPU, checked before the run:
# torch >= 2.0, a C++ compiler ($CXX, else g++) and the Python.h of the Python that runs it.
compile_check_py='import os, shutil, sys, sysconfig
import torch
if not hasattr(torch, "compile"):
    sys.exit("torch %s has no torch.compile (torch >= 2.0 has)" % torch.__version__)
inc = sysconfig.get_path("include")
pyver = "%d.%d" % sys.version_info[:2]
if not os.path.exists(os.path.join(inc, "Python.h")):
    sys.exit("no Python.h in %s: TorchInductor compiles its CPU kernels against it (Debian: "
             "apt-get install python%s-dev)" % (inc, pyver))
cxx = os.environ.get("CXX", "g++")
if not shutil.which(cxx):
    sys.exit("no C++ compiler %s: TorchInductor compiles its CPU kernels with it (Debian: "
             "apt-get install g++)" % cxx)
print("torch.compile (TorchInductor, %s, Python.h from %s)" % (shutil.which(cxx), inc))'

probe_trainer trainer_debian "${TRAINER_BIN:-build/app/trainer}" TRAINER_BIN "scripts/build.sh"
probe_trainer trainer_pip "${TRAINER_PIP_BIN:-build-pip/app/trainer}" TRAINER_PIP_BIN \
  "scripts/build.sh --torch pip"
probe_peer peer_debian "$py" "Debian: apt-get install python3-torch python3-torchvision"
pip_py=${PIP_PYTHON:-}
if [[ -z $pip_py ]]; then
  if [[ -f scripts/torch-flavour.sh ]]; then
    # shellcheck source=scripts/torch-flavour.sh
    source scripts/torch-flavour.sh
    pip_py=$(torch_python)
  else
    pip_py=/opt/trainer/venv-torch-${TRAINER_TORCH_VERSION:-2.11.0}/bin/python
  fi
fi
pip_version=${TRAINER_TORCH_VERSION:-2.11.0}  # the nominal version, for labels of skipped sides
printf '%s\n' "$pip_version" >"$work/sides/pip_nominal"
probe_peer peer_pip "$pip_py" "make the venv with scripts/install-deps.sh --torch pip, or set PIP_PYTHON"
if [[ $compile != 1 ]]; then
  skip peer_pip_compile "COMPILE=$compile"
elif [[ -z ${bin[peer_pip]:-} ]]; then
  skip peer_pip_compile "no PyTorch 2.11 peer (above)"
elif v=$("${bin[peer_pip]}" -c "$compile_check_py" 2>&1); then
  bin[peer_pip_compile]=${bin[peer_pip]}
  printf '%s\n' "${bin[peer_pip]}" >"$work/sides/peer_pip_compile.path"
  { cat "$work/sides/peer_pip.version"; printf '%s\n' "$v"; } >"$work/sides/peer_pip_compile.version"
else
  skip peer_pip_compile "$(tail -n 1 <<<"$v")"
fi

# SIDES_ONLY="trainer_pip peer_pip": run only those sides (the others show `-`).
if [[ -n ${SIDES_ONLY:-} ]]; then
  for s in "${sides[@]}"; do
    if [[ -n ${bin[$s]:-} && " $SIDES_ONLY " != *" $s "* ]]; then
      unset "bin[$s]"
      skip "$s" "not in SIDES_ONLY"
    fi
  done
fi

jemalloc=${JEMALLOC:-none}
if [[ $jemalloc == auto ]]; then
  ldconfig_bin=$(command -v ldconfig || echo /sbin/ldconfig)
  jemalloc=$("$ldconfig_bin" -p 2>/dev/null | awk '/libjemalloc\.so\.2 / {print $NF; exit}' || true)
  [[ -n $jemalloc ]] || jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
fi
if [[ $jemalloc != none ]]; then
  sides+=(peer_debian_jemalloc)
  if [[ ! -e $jemalloc ]]; then
    skip peer_debian_jemalloc "no libjemalloc.so.2 at $jemalloc (apt-get install libjemalloc2)"
  elif [[ -z ${bin[peer_debian]:-} ]]; then
    skip peer_debian_jemalloc "no PyTorch 1.13 peer (above)"
  else
    bin[peer_debian_jemalloc]=$py
    printf '%s\n' "$py" >"$work/sides/peer_debian_jemalloc.path"
    cp "$work/sides/peer_debian.version" "$work/sides/peer_debian_jemalloc.version"
  fi
fi

runnable=()
for s in "${sides[@]}"; do
  if [[ -n ${bin[$s]:-} ]]; then runnable+=("$s"); fi
done
(( ${#runnable[@]} > 0 )) || die "no side can run (see above): nothing to measure"

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
out["first_step_s"] = steps[0].get("step_time_s") if steps else None
out["peak_rss_mib"] = int(open(rss).read()) / 1024.0
print(json.dumps(out))'

# The peer Python makes the data where no trainer can (make-dataset's layout, class names, size
# and JPEG quality; simpler pictures: leaf-coloured ground, blurred blobs, a little noise).
make_data_py='import os, random, sys
from PIL import Image, ImageDraw, ImageFilter
out, per_class, w, h = sys.argv[1], int(sys.argv[2]), 800, 600
rng = random.Random(0)
noise = Image.effect_noise((w, h), 24).convert("RGB")
for c, name in enumerate(["cbb", "cbsd", "cgm", "cmd", "healthy"]):
    d = os.path.join(out, "train", name)
    os.makedirs(d, exist_ok=True)
    for i in range(per_class):
        base = (40 + 25 * c + rng.randrange(20), 110 + rng.randrange(60), 30 + rng.randrange(30))
        img = Image.new("RGB", (w, h), base)
        draw = ImageDraw.Draw(img)
        for _ in range(12 + 6 * c):
            x, y, r = rng.randrange(w), rng.randrange(h), rng.randrange(8, 60)
            draw.ellipse((x - r, y - r, x + r, y + r),
                         fill=tuple(min(255, max(0, v + rng.randrange(-70, 70))) for v in base))
        img = Image.blend(img.filter(ImageFilter.GaussianBlur(2)), noise, 0.15)
        img.save(os.path.join(d, "%s_%04d.jpg" % (name, i)), quality=90)'

fail_note() {  # WHAT LOG
  failed=1
  note "$1 failed; the last lines of its output:"
  tail -n 15 "$2" | sed 's/^/    /' >&2
}

# trainer_job NAME SIZE BATCH PRECISION CHANNELS_LAST THREADS: writes $work/NAME.yaml
trainer_job() {
  cat >"$work/$1.yaml" <<YAML
model: {arch: $arch}
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
  device: cpu
  max_steps: $steps
checkpoint: {every_epochs: 1000}
logging: {every_steps: 1000}
YAML
}

# run_trainer NAME BINARY TRAINER-ARGS...: runs the trainer with job dir $work/jobs/NAME, summary
# into res/NAME.json
run_trainer() {
  local name=$1 binary=$2; shift 2
  local job=$work/jobs/$name
  if "$drv" -c "$rss_py" "$job.rss" "$binary" "$@" >"$work/logs/$name.log" 2>&1 &&
     "$drv" -c "$summarize_py" "$job/metrics.jsonl" "$job.rss" "$warmup" >"$work/res/$name.json" 2>>"$work/logs/$name.log"; then
    :
  else
    rm -f "$work/res/$name.json"
    fail_note "trainer ($name: $binary ${*})" "$work/logs/$name.log"
  fi
}

# run_peer NAME PYTHON [ENV=VALUE...] -- PEER-ARGS...: summary into res/NAME.json
run_peer() {
  local name=$1 python=$2; shift 2
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  if env ${envs[@]+"${envs[@]}"} "$python" scripts/bench/peer_pytorch.py --data "$work/data/train" \
       --arch "$arch" --warmup "$warmup" --steps "$steps" "$@" >"$work/res/$name.json" 2>"$work/logs/$name.log"; then
    :
  else
    rm -f "$work/res/$name.json"
    fail_note "PyTorch peer ($name: ${envs[*]} $python ${*})" "$work/logs/$name.log"
  fi
}

# run_side KEY ROW SIZE BATCH PRECISION LAYOUT THREADS: one side of a row ($work/ROW.yaml written)
run_side() {
  local key=$1 row=$2 size=$3 batch=$4 precision=$5 layout=$6 thr=$7
  local peer_args=(--image-size "$size" --batch "$batch" --threads "$thr" --precision "$precision")
  if [[ $layout == cl ]]; then peer_args+=(--channels-last); fi
  case $key in
    trainer_*) run_trainer "$row.$key" "${bin[$key]}" --config "$work/$row.yaml" --job-dir "$work/jobs/$row.$key" ;;
    peer_debian|peer_pip) run_peer "$row.$key" "${bin[$key]}" -- "${peer_args[@]}" ;;
    peer_pip_compile) run_peer "$row.$key" "${bin[$key]}" -- "${peer_args[@]}" --compile ;;
    peer_debian_jemalloc)
      run_peer "$row.$key" "${bin[$key]}" LD_PRELOAD="$jemalloc" \
        MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 -- "${peer_args[@]}" ;;
  esac
}

# Data: enough 800x600 JPEGs for every step of the largest batch in one pass over them.
max_batch=$scale_batch
for spec in $rows; do
  IFS=/ read -r _ b _ _ <<<"$spec"
  if (( b > max_batch )); then max_batch=$b; fi
done
per_class=${PER_CLASS:-$(( (steps * max_batch + 4) / 5 ))}
maker=""
for s in trainer_debian trainer_pip; do
  if [[ -n ${bin[$s]:-} ]]; then maker=$s; break; fi
done
if [[ -n $maker ]]; then
  note "generating $(( per_class * 5 )) 800x600 JPEGs (${bin[$maker]} make-dataset)"
  printf 'made by %s make-dataset\n' "${bin[$maker]}" >"$work/sides/data_maker"
  "${bin[$maker]}" make-dataset --out "$work/data" --per-class "$per_class" --image-size 800 \
    --image-height 600 --splits train >"$work/logs/make-dataset.log" 2>&1 ||
    { fail_note "trainer make-dataset" "$work/logs/make-dataset.log"; exit 1; }
else
  maker_py=${bin[peer_debian]:-${bin[peer_pip]:-}}
  note "no trainer: generating $(( per_class * 5 )) 800x600 JPEGs with $maker_py and PIL"
  printf 'made by %s with PIL, no trainer being there: simpler pictures than make-dataset'"'"'s\n' \
    "$maker_py" >"$work/sides/data_maker"
  "$maker_py" -c "$make_data_py" "$work/data" "$per_class" >"$work/logs/make-dataset.log" 2>&1 ||
    { fail_note "making the data with PIL" "$work/logs/make-dataset.log"; exit 1; }
fi

if [[ $conv_peak == 1 && -n ${bin[peer_debian]:-} ]]; then
  # bf16 only where the CPU computes it: an x86 CPU without AVX512_BF16 or AMX-BF16 emulates it
  # at a twentieth of fp32, and timing it took over ten minutes on a 2-core AVX2 EPYC.
  conv_precisions=fp32,bf16
  if grep -qw avx2 /proc/cpuinfo 2>/dev/null && ! grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
    conv_precisions=fp32
    note "convolution peak: bf16 not timed (emulated on this CPU)"
  fi
  note "convolution peak ($threads threads)"
  "$py" scripts/bench/conv_peak.py --threads "$threads" --batch "$conv_batch" --iters "$conv_iters" \
    --precisions "$conv_precisions" >"$work/res/conv_peak.json" 2>"$work/logs/conv_peak.log" ||
    { rm -f "$work/res/conv_peak.json"; fail_note "conv_peak.py" "$work/logs/conv_peak.log"; }
elif [[ $conv_peak == 1 ]]; then
  note "no convolution peak: it is measured with the PyTorch 1.13 peer's Python (skipped above)"
fi

i=0
for spec in $rows; do
  IFS=/ read -r size batch precision layout <<<"$spec"
  cl=false
  if [[ $layout == cl ]]; then cl=true; fi
  note "row $spec: ${runnable[*]}"
  trainer_job "row$i" "$size" "$batch" "$precision" "$cl" "$threads"
  for s in "${runnable[@]}"; do
    run_side "$s" "row$i" "$size" "$batch" "$precision" "$layout" "$threads"
  done
  i=$((i + 1))
done

if [[ $scaling == 1 ]]; then
  note "weak scaling $scale_size/$scale_batch: trainer 1.13 1 and 2 workers, PyTorch 1.13 1 and 2 (DDP) processes"
  if [[ -n ${bin[trainer_debian]:-} ]]; then
    trainer_job scale "$scale_size" "$scale_batch" fp32 false 1
    run_trainer scale.trainer1 "${bin[trainer_debian]}" --config "$work/scale.yaml" --job-dir "$work/jobs/scale.trainer1"
    port=$("$drv" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    run_trainer scale.trainer2 "${bin[trainer_debian]}" launch --workers 2 --base-port "$port" -- \
      --config "$work/scale.yaml" --job-dir "$work/jobs/scale.trainer2"
  else
    note "weak scaling: no trainer 1.13 (skipped above): its line shows -"
  fi
  if [[ -n ${bin[peer_debian]:-} ]]; then
    scale_args=(--image-size "$scale_size" --batch "$scale_batch" --threads 1 --precision fp32)
    run_peer scale.peer1 "$py" -- "${scale_args[@]}"
    run_peer scale.peer2 "$py" -- "${scale_args[@]}" --ddp 2
  else
    note "weak scaling: no PyTorch 1.13 peer (skipped above): its line shows -"
  fi
fi

# The report.
ARCH_=$arch ROWS_=$rows THREADS_=$threads STEPS_=$steps WARMUP_=$warmup CMD_=$cmd JEMALLOC_=$jemalloc \
SCALING_=$scaling SCALE_=$scale_size/$scale_batch SIDES_="${sides[*]}" SIDES_DIR_=$work/sides \
DATE_=$started COMMIT_=$commit DIRTY_=$dirty PER_CLASS_=$per_class RES_=$work/res OUT_=$out \
"$drv" - <<'PY'
import json, os, re

env = os.environ
res, sides_dir = env["RES_"], env["SIDES_DIR_"]
SIDES = env["SIDES_"].split()


def load(name):
    try:
        with open(os.path.join(res, name + ".json")) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def side_file(key, what):
    try:
        with open(os.path.join(sides_dir, f"{key}.{what}" if what else key)) as f:
            return f.read().strip()
    except OSError:
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
pip_nominal = ".".join((side_file("pip_nominal", None) or "2.11").split(".")[:2])


def major_minor(text, prefix):
    m = re.search(prefix + r"\s*(\d+)\.(\d+)", text or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


# Each side: what runs it, what it says it is, why it was skipped, and its column label. A trainer
# that is not there is labelled with its peer's torch version (Debian builds python3-torch and
# libtorch-dev from one source package; the venv's wheel is the pip flavour's LibTorch).
info = {}
for key in sorted(SIDES, key=lambda k: k.startswith("trainer")):  # the peers first
    version = side_file(key, "version")
    path = side_file(key, "path")
    skipped = side_file(key, "skip")
    lines = (version or "").splitlines()
    if key.startswith("trainer"):
        first = lines[0] if lines else None
        libtorch = next((l for l in lines if l.startswith("LibTorch")), None)
        ver = major_minor(libtorch, "LibTorch")
        d = {"first_line": first, "libtorch": libtorch}
    else:
        ver = major_minor(lines[0] if lines else None, "torch")
        d = {"torch_torchvision": lines[0] if lines else None,
             "compiler": lines[1] if key == "peer_pip_compile" and len(lines) > 1 else None}
    if ver is None and key.startswith("trainer"):
        ver = info.get(key.replace("trainer", "peer"), {}).get("version_mm")
    if ver is None:
        ver = pip_nominal if "pip" in key else "(Debian)"
    label = {"trainer_debian": f"trainer {ver}", "trainer_pip": f"trainer {ver}",
             "peer_debian": f"PyTorch {ver}", "peer_pip": f"PyTorch {ver} eager",
             "peer_pip_compile": f"PyTorch {ver} compile",
             "peer_debian_jemalloc": f"PyTorch {ver}+jemalloc"}[key]
    info[key] = {"label": label, "version_mm": ver, "path": path, "version": version, "skipped": skipped, **d}


def get(r, k):
    return None if r is None else r.get(k)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or not b else a / b


def gflop_per_image(size):  # ResNet50 training (forward + backward), ~24.5 GFLOP at 224x224
    return 24.5 * (size / 224.0) ** 2 if env["ARCH_"] == "resnet50" else None


RATIOS = [("trainer_pip", "peer_pip"), ("trainer_pip", "peer_pip_compile"),
          ("trainer_debian", "peer_debian"), ("trainer_pip", "trainer_debian")]
if "peer_debian_jemalloc" in SIDES:
    RATIOS.append(("trainer_debian", "peer_debian_jemalloc"))

rows = []
for i, spec in enumerate(env["ROWS_"].split()):
    size, batch, precision, layout = spec.split("/")
    size, batch = int(size), int(batch)
    results = {s: load(f"row{i}.{s}") for s in SIDES}
    peak = get(conv, precision)
    conv_fraction = {s: (None if get(r, "images_per_sec") is None or not peak
                         or gflop_per_image(size) is None else get(r, "images_per_sec") * gflop_per_image(size) / peak)
                     for s, r in results.items()}
    ratios = {f"{a}/{b}": ratio(get(results[a], "images_per_sec"), get(results[b], "images_per_sec"))
              for a, b in RATIOS}
    rows.append({"spec": spec, "image_size": size, "batch": batch, "precision": precision,
                 "channels_last": layout == "cl", "sides": results, "ratios": ratios,
                 "gflop_per_image": gflop_per_image(size), "conv_peak_gflops": peak,
                 "conv_peak_fraction": conv_fraction})


def describe(key):
    i = info[key]
    if i["skipped"] and not i["path"]:
        return f"{i['label']}: skipped: {i['skipped']}"
    if key.startswith("trainer"):
        return (f"{i['label']}: `{i['path']}`, \"{i['first_line'] or '?'}\", "
                f"\"{i['libtorch'] or 'LibTorch ?'}\"")
    text = f"{i['label']}: `{i['path']}`, {i['torch_torchvision'] or '?'}"
    if key == "peer_pip_compile":
        text += f", {i['compiler'] or 'torch.compile'}"
    if key == "peer_debian_jemalloc":
        text += f", LD_PRELOAD={env['JEMALLOC_']} MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1"
    return text


L = {k: info[k]["label"] for k in SIDES}
dirty = " (with uncommitted changes)" if env["DIRTY_"] == "1" else ""
print(f"- **CPU** {model}; flags: "
      + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu_flags.items())
      + f"; {os.cpu_count()} logical CPUs. **Threads** {threads} per process (train.threads / "
      f"torch.set_num_threads), 1 decode worker each.")
for key in SIDES:
    print(f"- {describe(key)}")
print(f"- **Date** {env['DATE_']}; **commit** {env['COMMIT_']}{dirty}. **Data** "
      f"{int(env['PER_CLASS_']) * 5} generated 800x600 JPEGs ({side_file('data_maker', None) or '?'}). "
      f"**Steps** {env['STEPS_']}, medians after the first {env['WARMUP_']}. "
      f"**Network** {env['ARCH_']}. **Command** `{env['CMD_']}`")
print()
print("| config (size/batch/precision/layout) | " + " | ".join(f"{L[s]} img/s" for s in SIDES)
      + " | " + " | ".join(f"{L[a]} / {L[b]}" for a, b in RATIOS) + " |")
print("|---|" + "---:|" * (len(SIDES) + len(RATIOS)))
for r in rows:
    print(f"| {r['spec']} | "
          + " | ".join(fmt(get(r["sides"][s], "images_per_sec"), ".1f") for s in SIDES) + " | "
          + " | ".join(fmt(r["ratios"][f"{a}/{b}"], ".2f") for a, b in RATIOS) + " |")
print()
print("| config | side | step s | data wait s/step | minor faults/step | kernel s/step "
      "| peak RSS MiB | % of conv peak | first step s |")
print("|---|---|" + "---:|" * 7)
for r in rows:
    for s in SIDES:
        x = r["sides"][s]
        if x is None:
            continue
        frac = r["conv_peak_fraction"][s]
        print(f"| {r['spec']} | {L[s]} | " + " | ".join([
            fmt(get(x, "step_time_s"), ".3f"), fmt(get(x, "data_wait_s"), ".3f"),
            fmt(get(x, "minor_faults"), ".0f"), fmt(get(x, "sys_time_s"), ".3f"),
            fmt(get(x, "peak_rss_mib"), ".0f"), fmt(None if frac is None else 100 * frac, ".1f"),
            fmt(get(x, "first_step_s"), ".1f")]) + " |")
print()
peak_txt = ("not measured" if conv is None else
            f"fp32 {fmt(conv.get('fp32'), '.1f')}, bf16 {fmt(conv.get('bf16'), '.1f')} GFLOP/s "
            f"({conv['mode']} of 3x3 convolutions, {conv['batch']}x256x56x56 and {conv['batch']}x512x28x28, "
            f"{conv['threads']} threads, scripts/bench/conv_peak.py on {info['peer_debian']['label']})")
print("img/s and ratios: whole steps (data wait, forward, backward, Adam), medians over the "
      "steps after the warm-up; `-`: the side was skipped (above) or its run failed (stderr). "
      "Faults and kernel time: per step, the trainer's whole process (`-` where its metrics.jsonl "
      "lacks minor_faults / sys_time_s / data_wait_s), the peer's main process only (its "
      "DataLoader worker is a child process); peer RSS = main + worker peaks. First step: its wall "
      "time, a warm-up step (the compile side's includes compiling the forward and backward graphs, "
      "shorter when TorchInductor's cache already has them). "
      f"Conv peak: {peak_txt}; a row's share = img/s x 24.5 x (size/224)^2 GFLOP / the peak at its "
      "precision.")

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
    print(f"| {L['trainer_debian']}, launch --workers 2 (each pinned to its own CPUs), data.shard_policy: data "
          f"| {fmt(tr['step_1_s'], '.3f')} | {fmt(tr['step_2_s'], '.3f')} | {fmt(tr['efficiency'], '.3f')} "
          f"| {fmt(tr['comm_wait_2_s'], '.3f')} |")
    print(f"| {L['peer_debian']} DDP over Gloo, DistributedSampler (not pinned) | {fmt(pe['step_1_s'], '.3f')} "
          f"| {fmt(pe['step_2_s'], '.3f')} | {fmt(pe['efficiency'], '.3f')} | - |")
    print()
    print("Efficiency = step time with 1 process / step time with 2 (the same per-process batch); "
          "trainer 1-worker step = batch / img/s, 2-worker step = the chief's step_time_s.")

if env["OUT_"]:
    with open(env["OUT_"], "w") as f:
        json.dump({"cpu": {"model": model, "flags": cpu_flags, "logical_cpus": os.cpu_count()},
                   "date": env["DATE_"], "commit": env["COMMIT_"], "uncommitted_changes": env["DIRTY_"] == "1",
                   "threads": threads, "steps": int(env["STEPS_"]), "warmup_steps": int(env["WARMUP_"]),
                   "command": env["CMD_"], "sides": info,
                   "ratios": [f"{a}/{b}" for a, b in RATIOS],
                   "jemalloc": None if env["JEMALLOC_"] == "none" else env["JEMALLOC_"],
                   "data": side_file("data_maker", None),
                   "conv_peak": conv, "rows": rows, "scaling": scaling}, f, indent=1)
        f.write("\n")
PY
exit "$failed"
