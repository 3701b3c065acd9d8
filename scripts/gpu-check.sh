#!/usr/bin/env bash
# The prepared device check of the CUDA path (issue 22, item 7), for a lent GPU machine: one
# H100/H200, 16 cores, CUDA 13 with nvcc, cmake, ninja, a C++ compiler, Python 3.12 with pip's
# PyTorch 2.11 (cxx11 ABI) and torchvision, none of our Debian packages, nothing to download.
# Everything else the build needs comes in .gpu-carry/ (scripts/gpu-carry.sh, run here first;
# the caller carries that ignored folder with the tree). One command, under 8 minutes:
#
#   bash scripts/gpu-check.sh           on the GPU machine, with $OUT set; .gpu-carry carried
#   bash scripts/gpu-check.sh --dry-run here (Debian 12): everything but what needs a GPU
#
# Steps, each timed, each ending in one PASS/FAIL/SKIP line; a failure does not stop the rest
# (what needs a missing binary is skipped, saying why); a summary at the end; exit 1 if any
# step failed, else 0:
#   env             the machine: compiler (printed first), cmake, ninja, CUDA, GPU, PyTorch and
#                   what its include dir bundles (fmt, protobuf, gloo headers), nccl.h
#   carry-pack      (--dry-run only) runs scripts/gpu-carry.sh, which prints the carry's MiB
#   carry-unpack    .gpu-carry/carry.tar.xz -> WORK/carry/prefix (a /usr-like prefix, P)
#   carry-smoke     OpenCV from the carry loads (every stub in the path) and round-trips
#                   JPEG/PNG/BMP/TIFF/WebP/JPEG 2000; a graph written with libonnx runs through
#                   OpenCV's DNN, both on the carry's one protobuf runtime
#   configure       CMake, Release, Ninja, -DTRAINER_JEMALLOC=OFF, -DTRAINER_DOWNLOADS=OFF (the
#                   carry has no libcurl or OpenSSL headers), LibTorch = the machine's own
#                   (python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'; --dry-run:
#                   Debian's, from CMake's default path), every other package from P (each
#                   *_DIR / Protobuf_* / ZLIB_* given explicitly, P/include first on the include
#                   path; protobuf shared, as libonnx and OpenCV's DNN link it), then checks that
#                   CMake took each from P; on the GPU the build must have CUDA support
#   build           the trainer (ninja -j<cores> trainer)
#   carry-resolve   ldd -r of the trainer: every library of ours resolves into the carry,
#                   nothing is missing, no carried library has an undefined symbol, and the
#                   carry's libprotobuf.so.32 is the one protobuf runtime in the process (the
#                   trainer and LibTorch hold none of their own)
#   unit-tests      builds the unit-test executables (the unit_* targets, nothing else), then
#                   ctest -R '^unit_' on this build (the CUDA build on the GPU machine)
#   sync-debug      4 CUDA steps, then an evaluate, with TRAINER_CUDA_SYNC_DEBUG=error: after
#                   the first step (batch) a
#                   host synchronisation inside a step fails the run  (--dry-run: 4 CPU steps)
#   fp16, bf16      3 CUDA steps each with train.precision fp16 (loss scaling) / bf16
#                   (--dry-run: bf16 on CPU; fp16 skipped)
#   nccl-1rank      TF_CONFIG with one worker on 127.0.0.1, distributed.backend=nccl
#                   (--dry-run: the same TF_CONFIG with gloo)
#   gloo-2rank      trainer launch --workers 2, distributed.backend=gloo, both ranks on the GPU
#   resume          2 steps on the CPU (CUDA_VISIBLE_DEVICES="", train.device=auto), then the
#                   same job dir and spec to 4 steps on the GPU: resumed from step 2, steps 1-4
#                   each once in metrics.jsonl  (--dry-run: CPU then CPU)
#   tp-*            throughput: ResNet50, 224 px, batch 256 per GPU, bf16, channels_last, on
#                   7680 800x600 JPEGs (1280 distinct, hard-linked 6 times; 30 steps an
#                   epoch), 2 epochs each:
#                   tp-cache (data.cache: memory; the 2nd epoch is fed from the cache),
#                   tp-jpeg (decoding every epoch), tp-peer (PyTorch on the same GPU and files:
#                   scripts/bench/peer_pytorch.py --device cuda --workers <cores>: torchvision's
#                   resnet50, ImageFolder, DataLoader with pin_memory, bf16 autocast,
#                   channels_last), tp-deterministic (tp-cache with train.deterministic=true);
#                   tp-report prints, for the 2nd epoch of each, the median images/s of its
#                   steps (metrics.jsonl / the peer's records) and its whole wall time's
#                   images/s, and the ratios trainer/PyTorch. --dry-run: the same runs in
#                   miniature on the CPU (32 px, batch 8, 160x120 JPEGs) to check the plumbing.
# On the GPU the unit tests (their build and run) and the 800x600 data set are made in the
# background while the short GPU jobs run; the throughput runs then have the machine to
# themselves (the unit tests are stopped 100 s before the budget's end if still running: SKIP
# with how many had passed, FAIL if any had failed). Nothing starts that would not end before
# the budget (GPU_CHECK_BUDGET_S, 465 s): each step has its own time limit too, and a step that
# cannot fit is SKIP, saying so; tp-deterministic is the first to go. Give the command ~560 s.
# The carry's libraries are on LD_LIBRARY_PATH for everything but Python (the build runs
# protoc and the unit tests; the tests and the trainer load OpenCV and the rest from it).
#
# Results: $OUT (--dry-run: $OUT or /tmp/gpu-dry-out) gets at most 8 files: summary.txt,
# env.txt, carry.log, build.log, unit-tests.log, jobs.log, throughput.txt. Work dir:
# GPU_CHECK_WORK (/tmp/gpu-check; --dry-run /tmp/gpu-dry-build, whose build/ is kept, so a
# second dry run rebuilds only what changed). Here, wrap the dry run in the build lock:
#   flock /tmp/build.lock bash scripts/gpu-check.sh --dry-run
set -uo pipefail
self=$(readlink -f "${BASH_SOURCE[0]}")
repo=$(dirname "$(dirname "$self")")
arch=x86_64-linux-gnu

# ------------------------------------------------------------------------------------------
# Helpers shared by the steps (each step runs as `bash gpu-check.sh --step NAME`, under timeout,
# with its output in WORK/logs/NAME.log; lines starting "NOTE: " go to the summary, a step that
# exits 77 is SKIP with its last "SKIP: " line as the reason).

note() { echo "NOTE: $*"; }
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
pyrun() { env -u LD_LIBRARY_PATH "$py" "$@"; }  # Python never sees the carry's libraries
free_port() {
  pyrun -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
need_trainer() { [[ -x $T ]] || skip "no trainer binary (the build failed or did not run)"; }

# check_steps JOB_DIR N: metrics.jsonl has step records 1..N, each once, with finite losses.
check_steps() {
  pyrun - "$1/metrics.jsonl" "$2" <<'PY'
import json, math, statistics, sys
path, n = sys.argv[1], int(sys.argv[2])
try:
    recs = [json.loads(l) for l in open(path) if l.strip()]
except OSError as e:
    sys.exit(f"FAILED: no metrics: {e}")
steps = [r for r in recs if "images_per_sec" in r]
got = [r["step"] for r in steps]
if got != list(range(1, n + 1)):
    sys.exit(f"FAILED: {path}: step records {got}, expected 1..{n} each once")
bad = [r["step"] for r in steps if not math.isfinite(r.get("loss", float("nan")))]
if bad:
    sys.exit(f"FAILED: non-finite loss at steps {bad}")
ips = statistics.median(r["images_per_sec"] for r in steps[1:] or steps)
extra = ""
if any("loss_scale" in r for r in steps):
    extra = (f", loss scale {steps[-1]['loss_scale']:g}, "
             f"{sum(int(r.get('skipped_step', 0)) for r in steps)} skipped step(s)")
print(f"NOTE: steps 1..{n}, loss {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}, "
      f"median {ips:.1f} images/s after step 1{extra}")
PY
}

# show_log JOB_DIR: the end of the trainer's log (for a failed run).
show_log() {
  local f
  for f in "$1/trainer.log" "$1"/workertemp_*/trainer.log; do
    [[ -f $f ]] || continue
    echo "--- last lines of $f"
    tail -n 25 "$f"
  done
}

# log_note JOB_DIR ERE [first|last]: a line of the job's trainer.log as a NOTE, less its time
# stamp and level.
log_note() {
  local line
  line=$(grep -hE "$2" "$1/trainer.log" 2>/dev/null | if [[ ${3:-first} == last ]]; then tail -n 1; else head -n 1; fi)
  [[ -z $line ]] || note "$(sed -E 's/^[0-9-]+ [0-9:.]+ [a-z]+ //' <<<"$line")"
}

# trainer_run JOB_DIR ARGS...: the trainer on the small spec, into JOB_DIR, output to this log.
trainer_run() {
  local job=$1; shift
  echo "+ trainer --config $small_spec --job-dir $job $*"
  "$T" --config "$small_spec" --job-dir "$job" "$@"
}

# ------------------------------------------------------------------------------------------
# The steps.

s_env() {
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm), $(nproc) CPUs, $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")"
  echo "== c++";  c++ --version 2>&1 | head -n 1
  echo "== cmake"; cmake --version 2>&1 | head -n 1
  echo "== ninja"; ninja --version 2>&1
  echo "== python"; command -v "$py"; pyrun --version 2>&1
  echo "== memory, disk, /dev/shm (the PyTorch DataLoader passes its batches through it)"
  free -g 2>&1 | head -n 2; df -h "$work" /dev/shm 2>&1 | tail -n 2
  if [[ $mode == gpu ]]; then
    echo "== nvidia-smi"; nvidia-smi 2>&1 | head -n 20
    echo "== nvcc"; "${cuda_home:-/usr/local/cuda}/bin/nvcc" --version 2>&1 | tail -n 2
  fi
  echo "== torch"
  pyrun - <<'PY' 2>&1
import glob, os, re
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn",
      torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
      "cxx11abi", torch.compiled_with_cxx11_abi(), "cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
print("cmake_prefix_path", torch.utils.cmake_prefix_path)
inc = os.path.join(os.path.dirname(torch.__file__), "include")
print("include", inc, ":", " ".join(sorted(os.listdir(inc))) if os.path.isdir(inc) else "none")
def version(path, pattern):
    try:
        m = re.search(pattern, open(path).read())
        return m.group(1) if m else "?"
    except OSError:
        return None
for name, path, pattern in [
        ("fmt", "fmt/base.h", r"#\s*define FMT_VERSION (\d+)"),
        ("fmt", "fmt/core.h", r"#\s*define FMT_VERSION (\d+)"),
        ("protobuf", "google/protobuf/stubs/common.h", r"#define GOOGLE_PROTOBUF_VERSION (\d+)"),
        ("spdlog", "spdlog/version.h", r"#define SPDLOG_VER_MINOR (\d+)"),
        ("gloo", "gloo/config.h", r"#define GLOO_VERSION_MAJOR (\d+)"),
        ("nlohmann", "nlohmann/json.hpp", r"NLOHMANN_JSON_VERSION_MINOR (\d+)")]:
    v = version(os.path.join(inc, path), pattern)
    if v is not None:
        print(f"bundled in torch/include: {name} ({path}: {v})")
try:
    import torchvision
    print("torchvision", torchvision.__version__)
except ImportError as e:
    print("torchvision: not importable:", e)
PY
  echo "== /usr/bin/python3 (the unit tests' TRAINER_PYTHON unless CMake takes another)"
  if env -u LD_LIBRARY_PATH /usr/bin/python3 -c 'import torch, torchvision, numpy' 2>/dev/null; then
    echo "imports torch, torchvision, numpy"
  else
    echo "cannot import torch, torchvision and numpy"
  fi
}

s_carry_pack() {
  local o rc
  o=$(bash "$repo/scripts/gpu-carry.sh" 2>&1)
  rc=$?
  echo "$o"
  ((rc == 0)) || fail "scripts/gpu-carry.sh exit $rc"
  note "$(tail -n 1 <<<"$o" | sed 's/^gpu-carry.sh: //')"
}

s_carry_unpack() {
  local tarball=$repo/.gpu-carry/carry.tar.xz
  [[ -f $tarball ]] || fail "no $tarball: run scripts/gpu-carry.sh here and carry .gpu-carry"
  rm -rf "$work/carry" "$work/stubs-active"
  mkdir -p "$work/carry" "$work/stubs-active"
  xz -dc "$tarball" | tar -x -C "$work/carry" || fail "unpacking $tarball"
  # zlib: the carry has the headers; the library is this system's libz.so.1.
  local z
  z=$( (/sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null) | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
  [[ -n $z ]] || z=$(ls /usr/lib/$arch/libz.so.1 /lib/$arch/libz.so.1 2>/dev/null | head -n 1)
  [[ -n $z ]] || fail "no libz.so.1 on this system"
  ln -sf "$z" "$P/lib/$arch/libz.so"
  # No stub is on the library path until configure knows which libraries LibTorch loads.
  note "carry $(du -cb "$repo/.gpu-carry"/* | tail -n 1 | awk '{printf "%.1f MiB", $1 / 1048576}'), $(du -sm "$P" | cut -f1) MiB unpacked; zlib: $z"
}

s_carry_smoke() {
  c++ -std=c++17 -O1 -o "$work/carry-smoke" "$P/share/trainer-carry/smoke.cpp" \
    -I"$P/include" -I"$P/include/opencv4" -DONNX_NAMESPACE=onnx -DONNX_ML=1 -L"$P/lib/$arch" \
    -lopencv_dnn -lopencv_imgcodecs -lopencv_imgproc -lopencv_core -lonnx -lonnx_proto -lprotobuf \
    -Wl,-rpath-link,"$P/lib/$arch:$P/lib/stubs" || fail "compiling the smoke test"
  LD_LIBRARY_PATH=$P/lib/$arch:$P/lib/stubs "$work/carry-smoke" || fail "the smoke test"
}

s_configure() {
  # Both modes build against pip's LibTorch 2.11 (CUDA): on the GPU machine its own python3's, in
  # the dry run the venv of scripts/install-deps.sh --torch pip (the same wheel).
  local prefix_path=$P extra_flags="-isystem $P/include" torch_inc=""
  local torch_cmake
  torch_cmake=$(pyrun -c 'import torch; print(torch.utils.cmake_prefix_path)') ||
    fail "python3 cannot import torch"
  prefix_path="$torch_cmake;$P"
  torch_inc=$(pyrun -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
  # nccl.h, which the c10d NCCL headers include, is not in torch/include: pip's nvidia-nccl
  # package has it, or the CUDA toolkit / the system.
  local nccl_inc=""
  nccl_inc=$(pyrun -c 'import glob, os, site
for sp in site.getsitepackages():
    for h in sorted(glob.glob(os.path.join(sp, "nvidia", "**", "nccl.h"), recursive=True)):
        print(os.path.dirname(h))
        raise SystemExit' 2>/dev/null) || nccl_inc=""
  if [[ -n $nccl_inc && -f $nccl_inc/nccl.h ]]; then
    extra_flags+=" -isystem $nccl_inc"
    note "nccl.h from $nccl_inc"
  elif [[ -f $cuda_home/include/nccl.h || -f /usr/include/nccl.h || -f /usr/local/include/nccl.h ]]; then
    note "nccl.h from the CUDA toolkit or the system"
  else
    note "no nccl.h found (pip's nvidia-nccl, $cuda_home/include, /usr/include): the NCCL headers will not compile"
  fi
  if [[ ! -f $torch_inc/gloo/algorithm.h ]]; then
    extra_flags+=" -isystem $P/fallback-include"
    note "LibTorch ships no gloo headers: using Debian's from the carry (fallback-include)"
  fi
  local py_for_tests
  py_for_tests=$(command -v "$py")
  # Protobuf_LIBRARY is the shared libprotobuf.so (.so.32), as in the ordinary Debian build: the
  # carry's libonnx, libonnx_proto and libopencv_dnn link that library, so a libprotobuf.a in the
  # trainer would put a second protobuf runtime in the process (the carry no longer has one).
  # LibTorch meets no other copy either: pip's hides its static protobuf, Debian's links this one.
  local args=(
    -S "$repo" -B "$build" -G Ninja
    -DCMAKE_BUILD_TYPE=Release -DTRAINER_JEMALLOC=OFF -DTRAINER_DOWNLOADS=OFF
    "-DCMAKE_PREFIX_PATH=$prefix_path"
    "-DCMAKE_CXX_FLAGS=$extra_flags"
    "-DOpenCV_DIR=$P/lib/$arch/cmake/opencv4"
    "-Dyaml-cpp_DIR=$P/lib/$arch/cmake/yaml-cpp"
    "-Dspdlog_DIR=$P/lib/$arch/cmake/spdlog"
    "-Dfmt_DIR=$P/lib/$arch/cmake/fmt"
    "-Dnlohmann_json_DIR=$P/share/cmake/nlohmann_json"
    "-DCLI11_DIR=$P/share/cmake/CLI11"
    "-DCatch2_DIR=$P/lib/cmake/Catch2"
    "-DProtobuf_INCLUDE_DIR=$P/include"
    "-DProtobuf_LIBRARY=$P/lib/$arch/libprotobuf.so"
    "-DProtobuf_PROTOC_EXECUTABLE=$P/bin/protoc"
    "-DONNX_DIR=$P/lib/$arch/cmake/ONNX"
    "-DZLIB_INCLUDE_DIR=$P/include"
    "-DZLIB_LIBRARY=$P/lib/$arch/libz.so"
    "-DTRAINER_PYTHON=$py_for_tests"
  )
  # USE_SYSTEM_NVTX: LibTorch's CMake files up to 2.7 otherwise look for NVTX 3 in PyTorch's own
  # source tree and fall back to libnvToolsExt, which CUDA 12.9+ no longer ships.
  # CMAKE_LIBRARY_PATH: LibTorch's own lib dir before the system's, so that a Debian libtorch.so
  # on the same machine is never linked under the wheel's headers.
  args+=("-DCUDAToolkit_ROOT=$cuda_home" "-DTRAINER_CUDA_HOME=$cuda_home" -DUSE_SYSTEM_NVTX=ON
         "-DCMAKE_LIBRARY_PATH=$(dirname "$torch_cmake")/../lib")
  [[ -n $nccl_inc ]] && args+=("-DTRAINER_NCCL_INCLUDE_DIR=$nccl_inc")
  echo "+ cmake ${args[*]}"
  # A failed configure leaves no build.ninja behind, so that build and the steps after it skip
  # instead of running what an earlier configure generated (another source dir, older code).
  cmake "${args[@]}" || { rm -f "$build/build.ninja"; fail "cmake configure"; }
  local cache=$build/CMakeCache.txt bad=0 v
  # The stubs stand in for libraries only OpenCV links. Where LibTorch links OpenCV itself
  # (Debian's: Caffe2's image and video ops, with highgui, videoio, dnn...), it needs OpenCV's
  # real dependencies and no stub goes on the library path (carry-smoke exercised them all);
  # otherwise (pip's) each goes on it unless LibTorch links that library directly (the real
  # BLAS and LAPACK must never be shadowed).
  local torch_lib torch_needs="" f
  torch_lib=$(sed -n 's/^TORCH_LIBRARY:[A-Z]*=//p' "$cache" | head -n 1)
  if [[ -n $torch_lib && -e $torch_lib ]]; then
    for f in "$(dirname "$(readlink -f "$torch_lib")")"/lib{torch,c10}*.so*; do
      [[ -f $f ]] && torch_needs+=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')$'\n'
    done
  else
    note "TORCH_LIBRARY not in the CMake cache: every stub goes on the library path"
  fi
  rm -rf "$work/stubs-active"
  mkdir -p "$work/stubs-active"
  local s kept=() dropped=()
  for s in "$P"/lib/stubs/*; do
    if grep -qxF libopencv_core.so.406 <<<"$torch_needs" || grep -qxF "$(basename "$s")" <<<"$torch_needs"; then
      dropped+=("$(basename "$s")")
    else
      cp -a "$s" "$work/stubs-active/"
      kept+=("$(basename "$s")")
    fi
  done
  grep -qxF libopencv_core.so.406 <<<"$torch_needs" &&
    note "this LibTorch links OpenCV itself, so OpenCV's real dependencies load and no stub is used"
  note "stubs on the library path: ${kept[*]:-none}${dropped:+; left to the libraries LibTorch loads: ${dropped[*]}}"
  for v in OpenCV_DIR yaml-cpp_DIR spdlog_DIR fmt_DIR nlohmann_json_DIR Catch2_DIR ONNX_DIR \
           Protobuf_INCLUDE_DIR Protobuf_LIBRARY Protobuf_PROTOC_EXECUTABLE ZLIB_INCLUDE_DIR ZLIB_LIBRARY; do
    local val
    val=$(sed -n "s/^$v:[A-Z]*=//p" "$cache" | head -n 1)
    if [[ $val != "$P"/* ]]; then
      echo "not from the carry: $v=$val"
      bad=1
    fi
  done
  ((bad == 0)) || fail "CMake took some packages from elsewhere than the carry"
  grep -h "trainer: Torch" "$logs/configure.log" | tail -n 1 | sed 's/^-- /NOTE: /'
  if ! grep -q "CUDA support: ON" "$logs/configure.log"; then
    fail "CMake found no CUDA support in this LibTorch (TRAINER_WITH_CUDA OFF)"
  fi
}

s_build() {
  [[ -f $build/build.ninja ]] || skip "not configured"
  echo "+ ninja -C $build -j $ncpu trainer"
  ninja -C "$build" -j "$ncpu" trainer || fail "build"
}

s_carry_resolve() {
  need_trainer
  local out missing bad=0 s
  out=$(ldd -r "$T" 2>&1)
  echo "$out"
  missing=$(grep "not found" <<<"$out")
  [[ -z $missing ]] || { echo "missing: $missing"; bad=1; }
  for s in libopencv_core.so.406 libopencv_imgproc.so.406 libopencv_imgcodecs.so.406 \
           libyaml-cpp.so.0.7 libspdlog.so.1.10 libfmt.so.9 libjpeg.so.62 libpng16.so.16 libtiff.so.6 \
           libonnx.so.1 libonnx_proto.so.1 libprotobuf.so.32; do
    if ! grep -q "^[[:space:]]*$s => $work/" <<<"$out"; then
      echo "not from the carry: $(grep "$s" <<<"$out" || echo "$s (absent)")"
      bad=1
    fi
  done
  # One protobuf runtime in the process: the carry's libprotobuf.so.32, which libonnx_proto and
  # libopencv_dnn link too. Nothing else may define the runtime (its DescriptorPool::
  # generated_pool()): not the trainer (a libprotobuf.a linked in defines it and exports only
  # what the shared libraries use, leaving two half-shared copies), not LibTorch (pip's builds
  # its own protobuf with -fvisibility=hidden; Debian's links libprotobuf.so.32), and no other
  # libprotobuf. (Those are the candidates: nm over every library loaded takes ~40 s here.)
  local gp=_ZN6google8protobuf14DescriptorPool14generated_poolEv lib owners=""
  nm --defined-only "$T" 2>/dev/null | grep -qE " T $gp(@.*)?\$" && owners+=" $T"
  while IFS= read -r lib; do
    [[ $lib == "$P/lib/$arch/libprotobuf.so.32" ]] && continue
    nm -D --defined-only "$lib" 2>/dev/null | grep -qE " T $gp(@.*)?\$" && owners+=" $lib"
  done < <(sed -n 's/^[[:space:]]*\(libprotobuf\|libtorch\|libc10\)[^ ]* => \(\/[^ ]*\) (0x.*/\2/p' <<<"$out")
  if [[ -n $owners ]]; then
    echo "a protobuf runtime beside the carry's libprotobuf.so.32 in:$owners"
    bad=1
  fi
  # Undefined symbols: none may be in a carried library or a system one (a stub that shadows a
  # library something else needs shows up there); LibTorch's own are only counted.
  local torch_dir undef others
  torch_dir=$(sed -n 's/^[[:space:]]*libtorch\.so[.0-9]* => \([^ ]*\).*/\1/p' <<<"$out" | head -n 1)
  torch_dir=$(dirname "${torch_dir:-/nonexistent/x}")
  undef=$(grep "undefined symbol" <<<"$out" || true)
  others=$(grep -vF "($torch_dir/" <<<"$undef" | grep . || true)
  [[ -z $others ]] || { echo "undefined symbols outside LibTorch:"; echo "$others" | head -n 20; bad=1; }
  [[ -z $undef || -n $others ]] || note "$(grep -c . <<<"$undef") undefined symbols in LibTorch's own libraries (not ours)"
  ((bad == 0)) || fail "the trainer does not load its libraries from the carry"
  note "$(grep -c "=> $work/" <<<"$out") libraries from the carry; libtorch from $(sed -n 's/^[[:space:]]*libtorch\.so[.0-9]* => \([^ ]*\).*/\1/p' <<<"$out" | head -n 1)"
}

s_unit() {
  [[ -f $build/build.ninja ]] || skip "not configured"
  local targets t0=$SECONDS
  targets=$(ninja -C "$build" -t targets all 2>/dev/null | sed -n 's/^\(unit_[A-Za-z0-9_]*\): phony$/\1/p' | sort -u | tr '\n' ' ')
  [[ -n $targets ]] || skip "no unit-test targets (configured with TRAINER_BUILD_TESTS=OFF?)"
  echo "+ ninja -C $build -j $ncpu $targets"
  # shellcheck disable=SC2086
  ninja -C "$build" -j "$ncpu" $targets || fail "building the unit tests"
  note "built $targets in $((SECONDS - t0)) s"
  # The [parity] tests run TRAINER_PYTHON (compiled in) with torch and torchvision.
  local tp exclude="" names=() b n
  tp=$(grep -o 'TRAINER_PYTHON=\\"[^\\"]*' "$build/build.ninja" | head -n 1 | sed 's/^TRAINER_PYTHON=\\"//')
  if [[ -n $tp ]] && ! env -u LD_LIBRARY_PATH "$tp" -c 'import torch, torchvision, numpy' 2>/dev/null; then
    for b in "$build"/tests/unit_*; do
      [[ -x $b && -f $b ]] || continue
      while IFS= read -r n; do
        [[ -n $n ]] && names+=("$(basename "$b"): $n")
      done < <("$b" --list-test-names-only '[parity]' 2>/dev/null)
    done
    if ((${#names[@]})); then
      exclude=$(printf '%s\n' "${names[@]}" | pyrun -c '
import sys
esc = lambda s: "".join("\\" + c if c in "\\^$.|?*+()[]{}" else c for c in s)
print("^(" + "|".join(esc(l.rstrip("\n")).replace(": ", ": ?", 1) for l in sys.stdin if l.strip()) + ")$")')
      note "${#names[@]} [parity] tests not run: TRAINER_PYTHON=$tp cannot import torch, torchvision and numpy (it is /usr/bin/python3 unless tests/CMakeLists.txt takes -DTRAINER_PYTHON)"
    fi
  fi
  local args=(--test-dir "$build" -R '^unit_' -j "$unit_jobs" --output-on-failure --no-tests=error)
  [[ -n $exclude ]] && args+=(-E "$exclude")
  echo "+ ctest ${args[*]}"
  ctest "${args[@]}"
  local rc=$?
  grep -h "tests passed" "$logs/unit-tests.log" | tail -n 1 | sed 's/^/NOTE: /'
  grep -h "^[[:space:]]*[0-9]* - unit_" "$logs/unit-tests.log" | head -n 10 | sed 's/^[[:space:]]*/NOTE: failed: /'
  ((rc == 0)) || fail "ctest exit $rc"
}

s_dataset_small() {
  need_trainer
  rm -rf "$work/data/small"
  "$T" make-dataset --out "$work/data/small" --classes 5 --per-class 20 --image-size 64 \
    --splits train || fail "make-dataset"
  note "$(find "$work/data/small/train" -name '*.jpg' | wc -l) 64x64 JPEGs"
}

s_sync_debug() {
  need_trainer
  local job=$jobs/sync-debug
  TRAINER_CUDA_SYNC_DEBUG=error trainer_run "$job" --set train.max_steps=4 --set "train.device=$dev" ||
    { show_log "$job"; fail "the run"; }
  check_steps "$job" 4 || { show_log "$job"; exit 1; }
  log_note "$job" "TRAINER_CUDA_SYNC_DEBUG"
  # Evaluation reads nothing back between batches either: the same check over every batch after
  # the first (loop/evaluate.cpp).
  echo "+ trainer evaluate --model $job/model --split train (TRAINER_CUDA_SYNC_DEBUG=error)"
  TRAINER_CUDA_SYNC_DEBUG=error "$T" evaluate --model "$job/model" --config "$small_spec" \
    --split train --set "train.device=$dev" >"$job/evaluate.json" ||
    fail "evaluate under TRAINER_CUDA_SYNC_DEBUG=error"
  [[ $mode == gpu ]] || note "on the CPU: the sync-debug mode itself is a GPU check (not exercised)"
}

s_precision() {  # fp16 | bf16
  need_trainer
  local p=$1 job=$jobs/$1
  [[ $mode == gpu || $p != fp16 ]] || skip "fp16 (autocast + loss scaling) needs a GPU"
  trainer_run "$job" --set train.max_steps=3 --set "train.precision=$p" --set "train.device=$dev" ||
    { show_log "$job"; fail "the run"; }
  check_steps "$job" 3 || { show_log "$job"; exit 1; }
  log_note "$job" " info device "
}

s_nccl_1rank() {
  need_trainer
  local backend=nccl job=$jobs/nccl-1rank port
  [[ $mode == gpu ]] || backend=gloo
  port=$(free_port)
  echo "+ TF_CONFIG: one worker at 127.0.0.1:$port"
  TF_CONFIG="{\"cluster\": {\"worker\": [\"127.0.0.1:$port\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}" \
    trainer_run "$job" --set train.max_steps=3 --set "distributed.backend=$backend" \
      --set "train.device=$dev" || { show_log "$job"; fail "the run"; }
  check_steps "$job" 3 || { show_log "$job"; exit 1; }
  log_note "$job" " info device "
  if [[ $mode == gpu ]]; then
    note "distributed.backend=nccl: one rank in an NCCL group"
  else
    note "gloo on the CPU, where one rank opens no group (NCCL needs a GPU)"
  fi
}

s_gloo_2rank() {
  need_trainer
  local job=$jobs/gloo-2rank port
  port=$(free_port)
  echo "+ trainer launch --workers 2 --base-port $port -- ..."
  "$T" launch --workers 2 --base-port "$port" -- --config "$small_spec" --job-dir "$job" \
    --set train.max_steps=3 --set distributed.backend=gloo --set "train.device=$dev" ||
    { show_log "$job"; fail "the run"; }
  check_steps "$job" 3 || { show_log "$job"; exit 1; }
  grep -h "comm_wait_s" "$job/metrics.jsonl" >/dev/null && note "2 ranks: comm_wait_s recorded"
  log_note "$job" " info device "
}

s_resume() {
  need_trainer
  local job=$jobs/resume
  echo "== 2 steps on the CPU (CUDA_VISIBLE_DEVICES=\"\", train.device=auto)"
  CUDA_VISIBLE_DEVICES="" trainer_run "$job" --set train.max_steps=2 --set train.device=auto ||
    { show_log "$job"; fail "the CPU run"; }
  check_steps "$job" 2 || exit 1
  echo "== the same job to 4 steps ($([[ $mode == gpu ]] && echo "on the GPU" || echo "on the CPU again"))"
  trainer_run "$job" --set train.max_steps=4 --set train.device=auto ||
    { show_log "$job"; fail "the resumed run"; }
  check_steps "$job" 4 || { show_log "$job"; exit 1; }
  local line
  line=$(grep -h "resumed from" "$job/trainer.log" | tail -n 1)
  [[ -n $line ]] || { show_log "$job"; fail "the second run did not resume"; }
  grep -q "step 2)" <<<"$line" || fail "resumed from another step: $line"
  note "$(sed -E 's/^[0-9-]+ [0-9:.]+ [a-z]+ //' <<<"$line")"
  log_note "$job" " info device " first
  log_note "$job" " info device " last
}

# The throughput runs.
s_dataset_big() {
  need_trainer
  local d=$work/data/big i pids=() rc=0
  rm -rf "$d"
  mkdir -p "$d"
  # make-dataset draws one image at a time (~70 ms each at 800x600): tp_parallel of them, with
  # their own seeds, make the distinct images; hard links multiply the files (decoding a copy
  # costs the same; the page cache holds one).
  for ((i = 1; i <= tp_parallel; i++)); do
    "$T" make-dataset --out "$d/part$i" --classes 5 --per-class $((tp_unique / tp_parallel)) \
      --image-size "$tp_w" --image-height "$tp_h" --seed "$i" --splits train >"$d/part$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { rc=1; cat "$d/part$((i + 1)).log"; }
  done
  ((rc == 0)) || fail "make-dataset"
  pyrun - "$d" "$tp_parallel" "$tp_copies" <<'PY' || fail "merging and linking"
import os, sys
d, parts, copies = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
train = os.path.join(d, "train")
for p in range(1, parts + 1):
    src = os.path.join(d, f"part{p}", "train")
    for cls in sorted(os.listdir(src)):
        os.makedirs(os.path.join(train, cls), exist_ok=True)
        for f in sorted(os.listdir(os.path.join(src, cls))):
            os.rename(os.path.join(src, cls, f), os.path.join(train, cls, f"p{p}-{f}"))
for cls in sorted(os.listdir(train)):
    files = sorted(f for f in os.listdir(os.path.join(train, cls)) if f.endswith(".jpg"))
    for c in range(1, copies):
        for f in files:
            os.link(os.path.join(train, cls, f), os.path.join(train, cls, f"copy{c}-{f}"))
PY
  rm -rf "$d"/part*
  note "$(find "$d/train" -name '*.jpg' | wc -l) ${tp_w}x${tp_h} JPEGs ($((5 * tp_unique)) distinct, made by $tp_parallel make-dataset processes), $(du -sm "$d" | cut -f1) MiB"
}

tp_spec() {  # FILE CACHE DETERMINISTIC(true|"")
  local det_line=""
  [[ -n $3 ]] && det_line="  deterministic: $3"
  cat >"$1" <<YAML
model: {arch: resnet50}
data:
  train: {format: imagefolder, path: $work/data/big/train}
  image_size: $tp_size
  normalize: imagenet
  augment: {horizontal_flip: false, random_resized_crop: false}
  cache: $2
train:
  epochs: 2
  per_replica_batch_size: $tp_batch
  optimizer: {name: adam, learning_rate: 0.001}
  precision: bf16
  channels_last: true
  device: $dev
$det_line
checkpoint: {every_epochs: 1000}
logging: {every_steps: 10, tensorboard: false}
YAML
}

s_tp_trainer() {  # cache | jpeg | deterministic
  need_trainer
  [[ -d $work/data/big/train ]] || skip "no data set (dataset-big did not run)"
  local kind=$1 cache=none det=""
  case $kind in
    cache) cache=memory ;;
    deterministic) cache=memory det=true ;;
  esac
  local spec=$work/tp-$kind.yaml job=$jobs/tp-$kind
  tp_spec "$spec" "$cache" "$det"
  cat "$spec"
  echo "+ trainer --config $spec --job-dir $job"
  "$T" --config "$spec" --job-dir "$job" || { show_log "$job"; fail "the run"; }
  cp "$job/metrics.jsonl" "$work/tp-$kind.metrics.jsonl"
  tp_summary trainer "$work/tp-$kind.metrics.jsonl" >"$work/tp-$kind.json" || exit 1
  tp_note "$work/tp-$kind.json"
  log_note "$job" "data.cache: memory holds" last
}

tp_note() {
  pyrun -c 'import json, sys
r = json.load(open(sys.argv[1]))
print("NOTE: 2nd epoch: %.1f images/s median step, %.1f images/s over the epoch (%d steps, %.2f s), "
      "median data wait %.4f s" % (r["median_images_per_sec"], r["epoch_images_per_sec"], r["steps"],
                                   r["epoch_time_s"], r["median_data_wait_s"]))' "$1"
}

s_tp_peer() {
  [[ -d $work/data/big/train ]] || skip "no data set (dataset-big did not run)"
  local n steps_per_epoch args
  n=$(find "$work/data/big/train" -name '*.jpg' | wc -l)
  steps_per_epoch=$((n / tp_batch))
  args=(--data "$work/data/big/train" --image-size "$tp_size" --batch "$tp_batch"
        --steps $((2 * steps_per_epoch)) --warmup "$steps_per_epoch" --precision bf16
        --channels-last --device "$dev" --workers "$tp_workers" --threads "$tp_peer_threads")
  echo "+ $py scripts/bench/peer_pytorch.py ${args[*]}"
  pyrun "$repo/scripts/bench/peer_pytorch.py" "${args[@]}" >"$work/tp-peer.raw.json" ||
    fail "peer_pytorch.py"
  cat "$work/tp-peer.raw.json"
  tp_summary peer "$work/tp-peer.raw.json" >"$work/tp-peer.json" || exit 1
  tp_note "$work/tp-peer.json"
}

# tp_summary trainer METRICS | peer RAW_JSON: one JSON line for the 2nd epoch: the median
# images/s of its steps, its wall-time images/s, the median data wait.
tp_summary() {
  pyrun - "$1" "$2" "$tp_batch" <<'PY'
import json, statistics, sys
kind, path, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "trainer":
    recs = [json.loads(l) for l in open(path) if l.strip()]
    steps = [r for r in recs if "images_per_sec" in r and r.get("epoch") == 2]
    ep = [r for r in recs if "epoch_time_s" in r and r.get("epoch") == 2]
    if not steps or not ep:
        sys.exit("FAILED: no 2nd epoch in " + path)
    out = {"median_images_per_sec": statistics.median(r["images_per_sec"] for r in steps),
           "epoch_images_per_sec": len(steps) * batch / ep[-1]["epoch_time_s"],
           "median_data_wait_s": statistics.median(r.get("data_wait_s", 0) for r in steps),
           "median_step_time_s": statistics.median(r["step_time_s"] for r in steps),
           "steps": len(steps), "epoch_time_s": ep[-1]["epoch_time_s"]}
else:
    r = json.loads(open(path).read().strip().splitlines()[-1])
    eps = [e for e in r.get("epochs", []) if e["epoch"] == 2]
    if not eps:
        sys.exit("FAILED: the peer completed no 2nd epoch")
    out = {"median_images_per_sec": r["images_per_sec"],
           "epoch_images_per_sec": eps[0]["images_per_sec"],
           "median_data_wait_s": r["data_wait_s"], "median_step_time_s": r["step_time_s"],
           "steps": r["measured_steps"], "epoch_time_s": eps[0]["time_s"], "torch": r.get("torch"),
           "gpu": r.get("gpu")}
print(json.dumps(out))
PY
}

s_tp_report() {
  local f
  for f in cache jpeg peer; do
    [[ -f $work/tp-$f.json ]] || skip "tp-$f has no result"
  done
  local n
  n=$(find "$work/data/big/train" -name '*.jpg' 2>/dev/null | wc -l)
  pyrun - "$work" "$mode" "$tp_size" "$tp_batch" "$tp_w" "$tp_h" "$tp_workers" "$n" "$((5 * tp_unique))" <<'PY'
import json, os, sys
work, mode, size, batch, w, h, workers, n, distinct = sys.argv[1:10]
def load(k):
    p = os.path.join(work, f"tp-{k}.json")
    return json.loads(open(p).read().strip().splitlines()[-1]) if os.path.exists(p) else None
r = {k: load(k) for k in ("cache", "jpeg", "peer", "deterministic")}
gpu = (r["peer"] or {}).get("gpu") or "CPU"
title = (f"ResNet50, {size} px, batch {batch}, bf16, channels_last, 2 epochs of {n} {w}x{h} JPEGs "
         f"({distinct} distinct), on {gpu}"
         + (" (dry run: a miniature on the CPU; only the plumbing is checked)" if mode == "dry" else ""))
rows = [("trainer, data.cache: memory (2nd epoch from the cache)", r["cache"]),
        ("trainer, JPEG decoding", r["jpeg"]),
        (f"PyTorch {(r['peer'] or {}).get('torch', '?')}, DataLoader({workers} workers"
         + (", pin_memory)" if mode == "gpu" else ")"), r["peer"])]
if r["deterministic"]:
    rows.append(("trainer, memory cache, train.deterministic: true", r["deterministic"]))
lines = [title, "",
         f"{'run':<66} {'median step img/s':>18} {'epoch img/s':>12} {'data wait s':>12}"]
for name, v in rows:
    lines.append(f"{name:<66} {v['median_images_per_sec']:>18.1f} {v['epoch_images_per_sec']:>12.1f} "
                 f"{v['median_data_wait_s']:>12.4f}")
p = r["peer"]
def ratio(a, b, k):
    return a[k] / b[k] if a and b and b[k] else float("nan")
notes = []
for label, k in (("cache", "cache"), ("JPEG", "jpeg")):
    notes.append(f"trainer ({label}) / PyTorch: {ratio(r[k], p, 'median_images_per_sec'):.2f} "
                 f"(median step), {ratio(r[k], p, 'epoch_images_per_sec'):.2f} (whole 2nd epoch)")
if r["deterministic"]:
    notes.append(f"train.deterministic: true costs "
                 f"{100 * (1 - ratio(r['deterministic'], r['cache'], 'epoch_images_per_sec')):.1f}% "
                 f"of the 2nd epoch's images/s (memory cache)")
lines += [""] + notes + ["",
          "median step = median over the 2nd epoch's steps (metrics.jsonl images_per_sec; the "
          "peer's per-step wall time); epoch = the 2nd epoch's images / its wall time, which also "
          "counts each epoch's input refill and an input pipeline slower than the GPU where the "
          "prefetch queues hide it from the median."]
text = "\n".join(lines)
print(text)
open(os.path.join(work, "throughput.txt"), "w").write(text + "\n\nraw:\n" + json.dumps(r, indent=1) + "\n")
for name, v in rows:
    print(f"NOTE: {name.split(',')[0] if name.startswith('PyTorch') else name}: "
          f"{v['median_images_per_sec']:.1f} (median step), {v['epoch_images_per_sec']:.1f} (epoch) images/s")
for n in notes:
    print("NOTE: " + n)
PY
}

# ------------------------------------------------------------------------------------------
# Step dispatch (the runner calls the script itself as `--step NAME ARGS`).
if [[ ${1:-} == --step ]]; then
  shift
  name=$1; shift
  cd "$repo" || exit 1
  case $name in
    env) s_env ;;
    carry-pack) s_carry_pack ;;
    carry-unpack) s_carry_unpack ;;
    carry-smoke) s_carry_smoke ;;
    configure) s_configure ;;
    build) s_build ;;
    carry-resolve) s_carry_resolve ;;
    unit-tests) s_unit ;;
    dataset-small) s_dataset_small ;;
    sync-debug) s_sync_debug ;;
    fp16|bf16) s_precision "$name" ;;
    nccl-1rank) s_nccl_1rank ;;
    gloo-2rank) s_gloo_2rank ;;
    resume) s_resume ;;
    dataset-big) s_dataset_big ;;
    tp-cache|tp-jpeg|tp-deterministic) s_tp_trainer "${name#tp-}" ;;
    tp-peer) s_tp_peer ;;
    tp-report) s_tp_report ;;
    *) echo "gpu-check.sh: unknown step $name" >&2; exit 2 ;;
  esac
  exit 0
fi

# ------------------------------------------------------------------------------------------
# The runner.
r_status=() r_name=() r_secs=() r_note=()
declare -A bg_pid=() bg_limit=()
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }

record() {  # STATUS NAME SECS NOTE
  r_status+=("$1"); r_name+=("$2"); r_secs+=("$3"); r_note+=("$4")
  printf '%-4s %-16s %7s s  %s\n' "$1" "$2" "$3" "$4"
}

finish() {  # NAME RC SECS LIMIT
  local name=$1 rc=$2 secs=$3 limit=$4 log=$logs/$1.log status note
  note=$(grep -h '^NOTE: ' "$log" 2>/dev/null | sed 's/^NOTE: //' | awk 'NR > 1 {printf "; "} {printf "%s", $0}')
  case $rc in
    0) status=PASS ;;
    77) status=SKIP; note=$(grep -h '^SKIP: ' "$log" | tail -n 1 | sed 's/^SKIP: //') ;;
    124|137)
      status=FAIL
      note="timed out after ${limit} s${note:+; $note}"
      if [[ $name == unit-tests ]]; then  # cut short to leave the throughput runs their time
        local passed failed
        passed=$(grep -cE "Test +#[0-9]+: .* Passed" "$log")
        failed=$(grep -cE "Test +#[0-9]+: .*\*\*\*(Failed|Exception|Timeout)" "$log")
        if ((failed == 0)); then
          status=SKIP
          note="stopped at its time limit (${limit} s, the rest of the budget is the throughput runs'): $passed tests passed and none failed before"
        else
          note="$failed tests failed, $passed passed before it stopped at its time limit (${limit} s)"
        fi
      fi ;;
    *) status=FAIL
       local why
       why=$(grep -h '^FAILED: ' "$log" | tail -n 1 | sed 's/^FAILED: //')
       note="${why:-exit $rc}${note:+; $note}" ;;
  esac
  record "$status" "$name" "$secs" "$note"
  if [[ $status == FAIL ]]; then
    tail -n 15 "$log" | sed 's/^/      | /'
  fi
}

limit_for() {  # EST CAP -> prints the time limit, or nothing when the budget cannot fit EST
  local left=$((budget - SECONDS))
  ((left >= $1)) || return 1
  local lim=$2
  ((lim > left - 3)) && lim=$((left - 3))
  echo "$lim"
}

run() {  # NAME EST_S CAP_S [ARGS...]
  local name=$1 est=$2 cap=$3 lim t0
  shift 3
  if ! lim=$(limit_for "$est" "$cap"); then
    record SKIP "$name" 0 "not started: $((budget - SECONDS)) s of the ${budget} s budget left, it takes ~${est} s"
    return
  fi
  t0=$(now)
  timeout -k 10 "$lim" bash "$self" --step "$name" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  finish "$name" "$rc" "$(since "$t0")" "$lim"
}

run_bg() {  # NAME EST_S CAP_S [RESERVE_S]: starts it, to end RESERVE_S before the budget's end;
            # wait_bg NAME collects it
  local name=$1 est=$2 cap=$3 reserve=${4:-0} lim
  if ! lim=$(limit_for $((est + reserve)) $((cap + reserve))); then
    record SKIP "$name" 0 "not started: $((budget - SECONDS)) s of the ${budget} s budget left, it takes ~${est} s"
    return
  fi
  lim=$((lim - reserve))
  bg_limit[$name]=$lim
  local t0
  t0=$(now)
  {
    timeout -k 10 "$lim" bash "$self" --step "$name" >"$logs/$name.log" 2>&1
    echo "$? $(since "$t0")" >"$logs/$name.end"
  } &
  bg_pid[$name]=$!
  echo "     $name: started in the background (limit $lim s)"
}

wait_bg() {
  local name=$1 rc secs
  [[ -n ${bg_pid[$name]:-} ]] || return 0
  wait "${bg_pid[$name]}"
  read -r rc secs <"$logs/$name.end" || { rc=1 secs=0; }
  finish "$name" "$rc" "$secs" "${bg_limit[$name]}"
  unset "bg_pid[$name]"
}

# ------------------------------------------------------------------------------------------
# The check, in one function: bash parses it whole before it runs, so the file can change
# under a running check without harm.
main() {
  # Set-up.
  mode=gpu
  case ${1:-} in
    --dry-run) mode=dry ;;
    "") ;;
    -h|--help) sed -n '2,/^set -uo pipefail/p' "$self" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: bash scripts/gpu-check.sh [--dry-run]" >&2; exit 2 ;;
  esac
  ncpu=$(nproc)
  if [[ $mode == gpu ]]; then
    work=${GPU_CHECK_WORK:-/tmp/gpu-check}
    out=${OUT:-}
    [[ -n $out ]] || { echo "gpu-check.sh: set OUT to the folder for the results (--dry-run to run here)" >&2; exit 2; }
    py=python3
    budget=${GPU_CHECK_BUDGET_S:-465}
    dev=cuda
    unit_jobs=$((ncpu > 4 ? ncpu * 3 / 4 : ncpu))
    small_size=64 small_batch=16
    tp_size=224 tp_batch=256 tp_w=800 tp_h=600 tp_unique=256 tp_copies=6 tp_parallel=8
    tp_workers=$ncpu tp_peer_threads=2
    cuda_home=${CUDA_HOME:-}
    if [[ -z $cuda_home ]]; then
      nvcc_path=$(command -v nvcc || true)
      if [[ -n $nvcc_path ]]; then cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")
      else cuda_home=/usr/local/cuda; fi
    fi
    export PATH=$cuda_home/bin:$PATH
    if [[ -z ${TORCH_CUDA_ARCH_LIST:-} ]]; then  # spares LibTorch's CMake files a probe with nvcc
      cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
      [[ -n $cap ]] && export TORCH_CUDA_ARCH_LIST=$cap
    fi
  else
    work=${GPU_CHECK_WORK:-/tmp/gpu-dry-build}
    out=${OUT:-/tmp/gpu-dry-out}
    py=$(. "$repo/scripts/torch-flavour.sh"; torch_python)  # the pip venv: torch 2.11, as on the GPU
    if ! env -u LD_LIBRARY_PATH "$py" -c 'import torch' 2>/dev/null; then
      echo "gpu-check.sh: --dry-run builds against pip's LibTorch as the GPU machine does: run bash scripts/install-deps.sh --torch pip first (no venv at $py)" >&2
      exit 2
    fi
    budget=${GPU_CHECK_BUDGET_S:-14400}
    dev=cpu
    unit_jobs=$ncpu
    small_size=32 small_batch=8
    tp_size=32 tp_batch=8 tp_w=160 tp_h=120 tp_unique=8 tp_copies=2 tp_parallel=2
    tp_workers=2 tp_peer_threads=2
    cuda_home=${TRAINER_CUDA_HOME:-/usr/local/cuda}
  fi
  if [[ $(uname -m) != x86_64 ]]; then
    echo "gpu-check.sh: the carry is for x86_64 (Debian 12's), this machine is $(uname -m)" >&2
    exit 2
  fi
  P=$work/carry/prefix
  build=$work/build
  logs=$work/logs
  jobs=$work/jobs
  T=$build/app/trainer
  small_spec=$work/small.yaml
  mkdir -p "$work" "$out" || exit 2
  rm -rf "$logs" "$jobs" "$work/data" "$work"/tp-* "$work/throughput.txt"
  mkdir -p "$logs" "$jobs" "$work/data"
  export mode work out py budget dev unit_jobs ncpu cuda_home P build logs jobs T small_spec arch \
    repo tp_size tp_batch tp_w tp_h tp_unique tp_copies tp_parallel tp_workers tp_peer_threads
  # The carry's libraries for everything but Python: the build (protoc, the test discovery that
  # runs the unit-test executables), the tests and the trainer.
  export LD_LIBRARY_PATH=$P/lib/$arch:$work/stubs-active

  cat >"$small_spec" <<YAML
model: {arch: resnet50}
data:
  train: {format: imagefolder, path: $work/data/small/train}
  image_size: $small_size
  normalize: imagenet
train:
  epochs: 1000
  per_replica_batch_size: $small_batch
  optimizer: {name: adam, learning_rate: 0.001}
checkpoint: {every_epochs: 1000}
logging: {every_steps: 1}
YAML

  # The check.
  echo "gpu-check.sh: $([[ $mode == gpu ]] && echo "GPU run" || echo "dry run (no GPU: the CUDA-only steps are skipped)") in $work, results to $out, budget $budget s"
  echo "c++: $(c++ --version 2>&1 | head -n 1)"
  run env 5 60
  if [[ $mode == dry ]]; then
    run carry-pack 30 600
  fi
  run carry-unpack 5 120
  run carry-smoke 10 120
  run configure 20 240
  run build 60 3600
  run carry-resolve 3 60

  if [[ $mode == gpu ]]; then
    # The unit tests and the big data set use the CPUs while the short GPU jobs run.
    # The unit tests end at the latest 100 s before the budget's end: the throughput runs need
    # the machine to themselves for about that long.
    run_bg unit-tests 60 300 100
    run dataset-small 3 60
    run_bg dataset-big 30 150
    run sync-debug 20 120
    run fp16 20 120
    run bf16 20 120
    run nccl-1rank 20 120
    run gloo-2rank 25 150
    run resume 40 180
    wait_bg unit-tests
    wait_bg dataset-big
    run tp-cache 25 120
    run tp-jpeg 25 120
    run tp-peer 30 120
    run tp-deterministic 25 120
    run tp-report 3 30
  else
    run unit-tests 60 5400
    run dataset-small 3 120
    run sync-debug 20 600
    run fp16 20 600
    run bf16 20 600
    run nccl-1rank 20 600
    run gloo-2rank 25 600
    run resume 40 900
    run dataset-big 10 600
    run tp-cache 20 900
    run tp-jpeg 20 900
    run tp-peer 20 900
    record SKIP tp-deterministic 0 "measures the cost of deterministic kernels on a GPU (on the CPU they are always on)"
    run tp-report 3 60
  fi

  # Summary and results.
  n_pass=0 n_fail=0 n_skip=0
  summary=$work/summary.txt
  {
    echo "gpu-check.sh $([[ $mode == gpu ]] && echo "on the GPU machine" || echo "--dry-run") $(date -u +%Y-%m-%dT%H:%M:%SZ), $SECONDS s, $(hostname)"
    echo "c++: $(c++ --version 2>&1 | head -n 1)"
    echo
    for i in "${!r_name[@]}"; do
      printf '%-4s %-16s %7s s  %s\n' "${r_status[$i]}" "${r_name[$i]}" "${r_secs[$i]}" "${r_note[$i]}"
      case ${r_status[$i]} in PASS) ((n_pass++)) ;; FAIL) ((n_fail++)) ;; SKIP) ((n_skip++)) ;; esac
    done
    echo
    echo "$n_pass passed, $n_fail failed, $n_skip skipped in $SECONDS s"
    if [[ -f $work/throughput.txt ]]; then
      echo
      sed '/^raw:$/,$d' "$work/throughput.txt"
    fi
  } >"$summary"
  echo
  echo "==================== summary"
  cat "$summary"

  # At most 8 files back: each log cut to 1.5 MiB (its head and its end).
  copy_out() {  # DEST FILES...
    local dest=$1 f
    shift
    : >"$dest.tmp"
    for f in "$@"; do
      [[ -f $f ]] || continue
      echo "==================== $(basename "$f")" >>"$dest.tmp"
      cat "$f" >>"$dest.tmp"
    done
    local size
    size=$(stat -c %s "$dest.tmp")
    if ((size > 1572864)); then
      { head -c 262144 "$dest.tmp"; echo; echo "... [$size bytes: cut to the first 256 KiB and the last 1.25 MiB] ..."
        tail -c 1310720 "$dest.tmp"; } >"$dest"
      rm -f "$dest.tmp"
    else
      mv "$dest.tmp" "$dest"
    fi
  }
  cp "$summary" "$out/summary.txt"
  copy_out "$out/env.txt" "$logs/env.log"
  copy_out "$out/carry.log" "$logs"/carry-*.log "$logs/configure.log"
  copy_out "$out/build.log" "$logs/build.log"
  copy_out "$out/unit-tests.log" "$logs/unit-tests.log"
  copy_out "$out/jobs.log" "$logs"/dataset-*.log "$logs/sync-debug.log" "$logs/fp16.log" \
    "$logs/bf16.log" "$logs/nccl-1rank.log" "$logs/gloo-2rank.log" "$logs/resume.log"
  copy_out "$out/throughput.txt" "$work/throughput.txt" "$logs"/tp-*.log
  echo "gpu-check.sh: results in $out: $(cd "$out" && ls | tr '\n' ' ')"
  if ((n_fail > 0)); then
    exit 1
  fi
  exit 0
}

main "$@"; exit $?
