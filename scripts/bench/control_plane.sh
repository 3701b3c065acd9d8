#!/usr/bin/env bash
# Benchmark (not a test): the trainer's control plane (rendezvous, job agreement, liveness,
# failure propagation) at N ranks on this host, without models or Gloo meshes; one JSON line per
# N with ranks, meet_s, store_ops_per_s, heartbeat_median_ms and death_to_exit_s (and more: see
# scripts/bench/control_plane.cpp). Example: scripts/bench/control_plane.sh 64 256 1024
# Needs about 4 open files per rank in the chief's process (ulimit -n) and a thread per rank.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$#" -eq 0 ]; then
  echo "usage: $0 N [N ...]   (ranks, at least 2 each)" >&2
  exit 2
fi
bench="${TRAINER_BUILD_DIR:-build}/tests/control_plane_bench"
if [ ! -x "$bench" ]; then
  echo "$0: $bench is not built: cmake --build ${TRAINER_BUILD_DIR:-build} --target control_plane_bench" >&2
  exit 2
fi
exec "$bench" "$@"
