#!/usr/bin/env bash
# The README's two set-up commands on a fresh Debian, as a new user meets them: a minimal root
# file system made with debootstrap (cached), a clean clone of this checkout's HEAD in it, then,
# inside a chroot as root, the README's main command (install, build, quickstart) and its test
# command (install, build, the whole suite). Nothing of this machine's packages or builds is used.
#
#   bash scripts/debian-check.sh [trixie|bookworm]     (default trixie, Debian 13)
#
# Environment: TRAINER_DEBIAN_CACHE (default /var/cache/trainer-debian) keeps the debootstrapped
# base per release (minbase, ~250 MB; delete it to start from a new one); KEEP_ROOT=1 keeps the
# work root (printed) for a look afterwards; TRAINER_DEBIAN_MIRROR picks the mirror.
# Run as root. Time on 2 cores: ~3 min for the base (first time), then the README's commands:
# ~5 min of packages, ~10 min per build, ~10 min of tests. Exits non-zero naming the failed step.
# Logs: WORK/main.log and WORK/test.log (WORK is printed first).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
release=${1:-trixie}
case $release in
  trixie|13) release=trixie ;;
  bookworm|12) release=bookworm ;;
  *) echo "debian-check.sh: expected trixie (13) or bookworm (12), got '$release'" >&2; exit 2 ;;
esac
if [[ $(id -u) -ne 0 ]]; then
  echo "debian-check.sh: run as root (debootstrap and chroot need it)" >&2
  exit 2
fi
command -v debootstrap >/dev/null || { echo "debian-check.sh: apt-get install debootstrap" >&2; exit 2; }
cache=${TRAINER_DEBIAN_CACHE:-/var/cache/trainer-debian}
mirror=${TRAINER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=$cache/$release-minbase.tar
step() { echo "==> $(date -u +%H:%M:%S) $*"; }
fail() { echo "debian-check.sh: FAILED: $*" >&2; exit 1; }

# 1. The base: debootstrap once, kept as a tar.
if [[ ! -s $base ]]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/rootfs.XXXXXX")
  step "debootstrap --variant=minbase $release ($mirror)"
  debootstrap --variant=minbase "$release" "$tmp" "$mirror" >"$cache/debootstrap-$release.log" 2>&1 ||
    { tail -n 20 "$cache/debootstrap-$release.log" >&2; rm -rf "$tmp"; fail "debootstrap (log: $cache/debootstrap-$release.log)"; }
  tar -C "$tmp" -cf "$base.tmp" . && mv "$base.tmp" "$base"
  rm -rf "$tmp"
fi

# 2. A fresh root from it, with a clean clone of HEAD at /src.
work=$(mktemp -d /var/tmp/debian-check.XXXXXX)
root=$work/root
echo "debian-check.sh: Debian $release in $work (HEAD $(git rev-parse --short HEAD))"
mkdir -p "$root"
tar -C "$root" -xf "$base"
cp /etc/resolv.conf "$root/etc/resolv.conf"
git clone -q --no-hardlinks "$repo" "$root/src"
mounts=()
cleanup() {
  local m
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
  if [[ ${KEEP_ROOT:-0} == 1 ]]; then
    echo "debian-check.sh: kept $root"
  else
    rm -rf "$root"
  fi
}
trap cleanup EXIT
for m in proc sys dev dev/pts; do
  mkdir -p "$root/$m"
  case $m in
    proc) mount -t proc proc "$root/proc" ;;
    sys) mount -t sysfs sys "$root/sys" ;;
    dev) mount --bind /dev "$root/dev" ;;
    dev/pts) mount --bind /dev/pts "$root/dev/pts" ;;
  esac
  mounts+=("$root/$m")
done
mkdir -p "$root/dev/shm" 2>/dev/null || true

# 3. The README's two commands, exactly as written there.
main_cmd=$(grep -m1 -E '^bash scripts/install-deps.sh .*scripts/run-quickstart.sh' README.md) ||
  fail "README.md has no main command (bash scripts/install-deps.sh ... run-quickstart.sh)"
test_cmd=$(grep -m1 -E '^bash scripts/install-deps.sh .*scripts/test.sh' README.md) ||
  fail "README.md has no test command (bash scripts/install-deps.sh ... test.sh)"
in_root() {  # LOG COMMAND
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 TERM=dumb /bin/bash -c "cd /src && $2" >"$work/$1" 2>&1
}
t0=$SECONDS
step "main command: $main_cmd"
in_root main.log "$main_cmd" || { tail -n 30 "$work/main.log" >&2; fail "the README's main command (log: $work/main.log)"; }
tail -n 5 "$work/main.log"
t1=$SECONDS
step "test command: $test_cmd"
in_root test.log "$test_cmd" || { grep -E "tests passed|Failed|\*\*\*" "$work/test.log" | tail -n 40 >&2; tail -n 5 "$work/test.log" >&2; fail "the README's test command (log: $work/test.log)"; }
grep -E "tests passed|Total Test time" "$work/test.log" | tail -n 2
os=$(chroot "$root" /bin/sh -c '. /etc/os-release; echo "$PRETTY_NAME"')
echo "debian-check.sh: PASS on $os: main command $((t1 - t0)) s, test command $((SECONDS - t1)) s (logs in $work)"
