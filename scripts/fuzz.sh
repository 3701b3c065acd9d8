#!/usr/bin/env bash
# Builds the fuzz targets in the sanitizer build (clang, libFuzzer, ASan + UBSan: build-asan/,
# the build scripts/build.sh --asan makes, separate from build/) and runs one fuzz target
# for SECONDS (default 600), or every target one after the other with `all`.
#   scripts/fuzz.sh TARGET [SECONDS] [extra libFuzzer flags]
# Targets: tfrecord example job_spec tf_config safetensors pth model_json csv state_json image.
# Seeds are written by the project's own writers (fuzz/make_seeds.cpp) into build-asan/seeds/;
# the growing corpus is kept in build-asan/corpus/TARGET; a crash, leak, timeout (> 1 s for one
# input) or allocation over 256 MiB stops the run and leaves its input in
# build-asan/artifacts/TARGET/: turn it into a regression test in tests/unit (README, Fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
targets="tfrecord example job_spec tf_config safetensors pth model_json csv state_json image"
target=${1:-}
seconds=${2:-600}
shift $(( $# < 2 ? $# : 2 ))
if [[ -z "$target" || ( "$target" != all && " $targets " != *" $target "* ) ]]; then
  echo "usage: scripts/fuzz.sh TARGET|all [SECONDS] [libFuzzer flags]; targets: $targets" >&2
  exit 2
fi
build_dir=${TRAINER_BUILD_DIR:-build-asan}
run=$([[ "$target" == all ]] && echo "$targets" || echo "$target")

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DTRAINER_SANITIZE=address -DTRAINER_BUILD_FUZZ=ON >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target make_seeds $(for t in $run; do echo "fuzz_$t"; done)
"$build_dir/fuzz/make_seeds" "$build_dir/seeds" configs

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fuzz_one() {  # TARGET: runs it, its log in build dir/logs/TARGET.log as well as on stdout
  local t=$1
  mkdir -p "$build_dir/corpus/$t" "$build_dir/artifacts/$t" "$build_dir/logs"
  echo "== fuzz_$t for ${seconds}s"
  "$build_dir/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=1 -malloc_limit_mb=256 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build_dir/artifacts/$t/" \
    "${flags[@]}" "$build_dir/corpus/$t" "$build_dir/seeds/$t" 2>&1 | tee "$build_dir/logs/$t.log"
  local rc=${PIPESTATUS[0]}
  local summary
  summary="== fuzz_$t: exit $rc; $(grep -E '^(stat::number_of_executed_units|#[0-9]+.*DONE)' "$build_dir/logs/$t.log" | tr '\n' ' ')"
  echo "$summary" | tee -a "$build_dir/logs/$t.log"
  return "$rc"
}
flags=("$@")
# TRAINER_FUZZ_JOBS=N runs N targets at a time (each one process); default one after the other.
jobs=${TRAINER_FUZZ_JOBS:-1}
failed=0
pids=()
for t in $run; do
  if (( jobs > 1 )); then
    while (( $(jobs -rp | wc -l) >= jobs )); do sleep 1; done
    fuzz_one "$t" > /dev/null &
    pids+=($!)
  else
    fuzz_one "$t" || failed=1
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
if (( jobs > 1 )); then
  for t in $run; do grep -h '^== fuzz_.*: exit' "$build_dir/logs/$t.log" 2>/dev/null || true; done
fi
exit "$failed"
