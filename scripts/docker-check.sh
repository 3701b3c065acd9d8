#!/usr/bin/env bash
# Builds the Docker image and runs it the way the README says, with the data and the job dir on
# volumes mounted from the host, as a non-root user (uid 1000):
#   trainer --version; trainer make-dataset (into the data volume); a 2-epoch quickstart (job dir
#   on the jobs volume); trainer evaluate on the exported model.
# Then it checks, on the host, that the model files, a checkpoint and the TensorBoard events are
# in the job dir, that the runtime image has no compiler, no headers and no test dependencies,
# that every library of the binary resolves, and reports the image size.
#
# Engine: `docker` where a daemon answers (`docker info`); otherwise Debian's daemonless buildah
# (`buildah bud --isolation chroot --storage-driver vfs`, then `buildah run`). The base image
# debian:<release>-slim is pulled where a registry is reachable; otherwise it is built locally
# with `debootstrap --variant=minbase <release>` (then trimmed as the official slim image is) and
# cached in $TRAINER_DOCKER_CACHE (default /var/cache/trainer-docker).
#
# Run as root from anywhere:  bash scripts/docker-check.sh
#
# With --cuda it builds Dockerfile.cuda (PyTorch 2.11's CUDA wheel, trainer:cuda) the same way
# and runs it where no GPU is: `trainer --version` must name LibTorch 2.11.0, CUDA 13.0, cuDNN,
# NCCL, the GPU architectures (sm_75 ...) and the driver it needs (R580); every library
# resolves; make-dataset and the 2-epoch quickstart with train.device=cpu; `launch --workers 2`
# on the CPU; predict and `export --format onnx`; train.device=cuda exits 2 naming the missing
# driver; no Python, compiler or headers; at most 4.5 GB (TRAINER_CUDA_IMAGE_MAX_GB), with each
# large library's share. Time on 2 cores, cold: about an hour (the wheels and the CUDA build).
# Environment: TRAINER_DEBIAN_RELEASE=bookworm|trixie (default: the Dockerfile's
# DEBIAN_RELEASE) builds on that Debian (--build-arg DEBIAN_RELEASE); TRAINER_DOCKER_ENGINE=docker|buildah forces an engine; KEEP_WORK=1 keeps the
# host-side data/job dirs (printed); TRAINER_DOCKER_SKIP_BUILD=1 checks the image already tagged
# without building it. Exits non-zero, naming the failed step, on any failure.
# Time on 2 cores: 20-50 min cold (base image, apt in both stages, the build), ~15-20 min after a
# source change (cached apt layers), ~2 min with nothing changed. buildah's vfs storage takes
# ~16 GB under /var/lib/containers/storage (`buildah --storage-driver vfs rmi --all` frees it).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
start=$(date +%s)
cuda=0
case ${1:-} in
  --cuda) cuda=1 ;;
  "") ;;
  *) echo "docker-check.sh: unknown argument '$1' (usage: docker-check.sh [--cuda])" >&2; exit 2 ;;
esac
if ((cuda)); then
  image=trainer:cuda dockerfile=Dockerfile.cuda
else
  image=trainer dockerfile=Dockerfile
fi
default_release=$(sed -n 's/^ARG DEBIAN_RELEASE=//p' "$dockerfile" | head -n 1)
release=${TRAINER_DEBIAN_RELEASE:-${default_release:-bookworm}}
case $release in
  bookworm|trixie) ;;
  *) echo "docker-check.sh: TRAINER_DEBIAN_RELEASE: expected bookworm or trixie, got '$release'" >&2; exit 2 ;;
esac
base=debian:$release-slim
cache=${TRAINER_DOCKER_CACHE:-/var/cache/trainer-docker}
mirror=${TRAINER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
run_user=1000:1000

step() { echo "==> $*"; }
fail() { echo "docker-check.sh: FAILED: $*" >&2; exit 1; }

if [[ $(id -u) -ne 0 ]]; then
  echo "docker-check.sh: run as root (buildah with vfs storage and debootstrap need it)" >&2
  exit 2
fi

engine=${TRAINER_DOCKER_ENGINE:-}
if [[ -z $engine ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v buildah >/dev/null; then
    engine=buildah
  else
    echo "docker-check.sh: neither a docker daemon nor buildah (apt-get install buildah)" >&2
    exit 2
  fi
fi
case $engine in
  docker) ;;
  buildah) bh=(buildah --storage-driver vfs) ;;
  *) echo "docker-check.sh: TRAINER_DOCKER_ENGINE must be docker or buildah, not '$engine'" >&2
     exit 2 ;;
esac
echo "docker-check.sh: engine $engine"

have_image() {
  if [[ $engine == docker ]]; then docker image inspect "$1" >/dev/null 2>&1
  else "${bh[@]}" inspect --type image "$1" >/dev/null 2>&1; fi
}

# The debian:<release>-slim base: present, pulled, or built with debootstrap.
make_base_tar() {
  local tar=$cache/debian-$release-slim.tar
  if [[ -s $tar ]]; then
    echo "using the cached base root file system $tar"
    return
  fi
  command -v debootstrap >/dev/null || fail "no registry and no debootstrap (apt-get install debootstrap)"
  mkdir -p "$cache"
  local root
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  step "debootstrap --variant=minbase $release ($mirror)"
  debootstrap --variant=minbase "$release" "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
    { tail -20 "$cache/debootstrap.log" >&2; rm -rf "$root"; fail "debootstrap (log: $cache/debootstrap.log)"; }
  # What the official slim image does on top of minbase: deb822 sources with updates and
  # security, no apt caches or translations kept, no docs or man pages installed.
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $release $release-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: $release-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
  # This machine's own certificate authorities (a TLS proxy's, in /usr/local/share/ca-certificates):
  # the stand-in for the registry's image trusts what the host trusts, so the build stage's pip
  # reaches the Python Package Index where the host does (ca-certificates adds them when the
  # build stage installs it; the runtime stage holds the inert files).
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  find "$root/usr/share/doc" -mindepth 2 ! -name copyright -type f -delete 2>/dev/null || true
  rm -rf "$root/usr/share/man/"* "$root/usr/share/info/"* "$root/usr/share/locale/"* \
         "$root/var/lib/apt/lists/"* "$root/var/cache/apt/"*.bin "$root/var/cache/apt/archives/"*.deb
  tar -C "$root" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
  rm -rf "$root"
}

ensure_base() {
  if have_image "$base" || have_image "localhost/$base"; then
    echo "base image $base is present"
    return
  fi
  step "pulling $base"
  if [[ $engine == docker ]]; then
    timeout 120 docker pull "$base" && return
  else
    timeout 120 "${bh[@]}" pull "docker.io/library/$base" && return
  fi
  echo "no registry reachable: building $base with debootstrap"
  make_base_tar
  if [[ $engine == docker ]]; then
    docker import --change 'CMD ["bash"]' "$cache/debian-$release-slim.tar" "$base" >/dev/null
  else
    local ctr
    ctr=$("${bh[@]}" from scratch)
    "${bh[@]}" add "$ctr" "$cache/debian-$release-slim.tar" / >/dev/null
    "${bh[@]}" config --cmd bash \
      --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    "${bh[@]}" commit --rm "$ctr" "localhost/$base" >/dev/null
  fi
  have_image "$base" || have_image "localhost/$base" || fail "the base image $base was not made"
}

# `run ARGS...`: the image's entrypoint (trainer) with ARGS, as uid 1000, the data and jobs
# volumes mounted where the configs read them (/work/data, /work/jobs).
run() {
  if [[ $engine == docker ]]; then
    docker run --rm --user "$run_user" -v "$data_dir:/work/data" -v "$jobs_dir:/work/jobs" \
      "$image" "$@"
  else
    local ctr rc=0
    ctr=$("${bh[@]}" from --pull-never "localhost/$image")
    "${bh[@]}" run --isolation chroot --user "$run_user" --workingdir /work \
      -v "$data_dir:/work/data" -v "$jobs_dir:/work/jobs" "$ctr" -- trainer "$@" || rc=$?
    "${bh[@]}" rm "$ctr" >/dev/null
    return $rc
  fi
}

# `inside CMD`: a shell command in the runtime image (as root), for the checks.
inside() {
  if [[ $engine == docker ]]; then
    docker run --rm --entrypoint /bin/sh "$image" -c "$1"
  else
    local ctr rc=0
    ctr=$("${bh[@]}" from --pull-never "localhost/$image")
    "${bh[@]}" run --isolation chroot "$ctr" -- /bin/sh -c "$1" || rc=$?
    "${bh[@]}" rm "$ctr" >/dev/null
    return $rc
  fi
}

ensure_base

step "building the image from $dockerfile ($engine)"
build_start=$(date +%s)
if [[ ${TRAINER_DOCKER_SKIP_BUILD:-0} == 1 ]]; then
  # Check the image already built under the tag (e.g. one whose build finished but whose checks
  # were cut short), without building it again.
  have_image "$image" || have_image "localhost/$image" ||
    fail "TRAINER_DOCKER_SKIP_BUILD=1, but there is no image $image to check"
  echo "TRAINER_DOCKER_SKIP_BUILD=1: checking the existing image $image"
elif [[ $engine == docker ]]; then
  docker build -f "$dockerfile" --build-arg "DEBIAN_RELEASE=$release" -t "$image" . ||
    fail "docker build -f $dockerfile"
else
  "${bh[@]}" bud --isolation chroot --layers --pull-never --build-arg "DEBIAN_RELEASE=$release" \
    -f "$dockerfile" -t "localhost/$image" . ||
    fail "buildah bud -f $dockerfile"
fi
build_s=$(($(date +%s) - build_start))
echo "the image took $((build_s / 60))m$((build_s % 60))s to build"

work=$(mktemp -d /tmp/docker-check.XXXXXX)
data_dir=$work/data
jobs_dir=$work/jobs
mkdir -p "$data_dir" "$jobs_dir"
chown 1000:1000 "$data_dir" "$jobs_dir"
if [[ ${KEEP_WORK:-0} != 1 ]]; then trap 'rm -rf "$work"' EXIT; else echo "host dirs: $work"; fi

step "trainer --version"
version=$(run --version) || fail "trainer --version"
echo "$version"
if ((cuda)); then
  for want in "LibTorch 2.11.0" "CUDA 13.0 (built with)" "cuDNN 9." "NCCL 2." \
              "GPU architectures: sm_75 " "NVIDIA driver: " "needs R580 or newer"; do
    grep -qF "$want" <<<"$version" || fail "trainer --version does not say '$want'"
  done
fi

step "trainer make-dataset (into the data volume)"
run make-dataset --out data/sample --classes 5 --per-class 100 --image-size 64 --seed 0 ||
  fail "make-dataset"
[[ -d $data_dir/sample/train && -d $data_dir/sample/validation ]] ||
  fail "make-dataset wrote no data/sample/{train,validation} on the host"

step "2-epoch quickstart (job dir on the jobs volume)"
device_args=()
((cuda)) && device_args=(--set train.device=cpu)
run --config /opt/trainer/configs/quickstart.yaml --epochs 2 --job-dir jobs/quickstart \
  ${device_args[@]+"${device_args[@]}"} || fail "the quickstart job"

step "model files on the host"
job=$jobs_dir/quickstart
for f in model/model.safetensors model/model.json; do
  [[ -s $job/$f ]] || fail "$job/$f is missing or empty"
  echo "  $f: $(stat -c %s "$job/$f") bytes, owner $(stat -c %u:%g "$job/$f")"
done
ls "$job"/checkpoints/ckpt-* >/dev/null 2>&1 || fail "no checkpoint in $job/checkpoints"
ls "$job"/logs/train/events.out.tfevents.* >/dev/null 2>&1 ||
  fail "no TensorBoard events in $job/logs/train"
[[ $(stat -c %u "$job/model/model.safetensors") == 1000 ]] ||
  fail "the model is not owned by the container's user 1000"

step "trainer evaluate on the exported model"
run evaluate --model jobs/quickstart/model --config /opt/trainer/configs/quickstart.yaml ||
  fail "trainer evaluate"

if ((cuda)); then
  step "trainer launch --workers 2 on the CPU"
  run launch --workers 2 -- --config /opt/trainer/configs/quickstart.yaml --epochs 1 \
    --set train.device=cpu --job-dir jobs/launch || fail "trainer launch --workers 2"
  ls "$jobs_dir"/launch/model/model.safetensors >/dev/null || fail "launch wrote no model"

  step "trainer predict and export --format onnx"
  run predict --model jobs/quickstart/model --out jobs/predictions.jsonl data/sample/validation ||
    fail "trainer predict"
  [[ $(wc -l <"$jobs_dir/predictions.jsonl") -ge 10 ]] || fail "predict wrote too few lines"
  run export --model jobs/quickstart/model --format onnx --out jobs/model.onnx ||
    fail "trainer export --format onnx"
  [[ -s $jobs_dir/model.onnx ]] || fail "export wrote no jobs/model.onnx"

  step "train.device=cuda without a GPU or driver exits 2, naming it"
  rc=0
  err=$(run --config /opt/trainer/configs/quickstart.yaml --epochs 1 --set train.device=cuda \
          --job-dir jobs/cuda 2>&1 >/dev/null) || rc=$?
  grep "train.device" <<<"$err" | tail -n 1
  [[ $rc == 2 ]] || fail "train.device=cuda exited $rc, not 2"
  grep -q "NVIDIA driver\|no CUDA GPU\|shows no GPU" <<<"$err" ||
    fail "train.device=cuda: the message names no driver or GPU"
fi

step "the runtime image is small: no compiler, no headers, no test dependencies"
inside 'for c in cc gcc g++ c++ clang cmake ninja protoc python3 python nvcc pip; do
          if command -v $c >/dev/null; then echo "found $c"; exit 1; fi; done
        for d in /usr/include/torch /usr/include/opencv4 /usr/include/c++ /usr/lib/python3/dist-packages/torch \
                 /usr/include/cuda_runtime.h /usr/local/cuda /opt/trainer/venv-torch-2.11.0; do
          if [ -e $d ]; then echo "found $d"; exit 1; fi; done
        if find / -xdev \( -name "*.a" -o -name "*.h" -o -name "*.hpp" \) -print -quit | grep -q .; then
          echo "found static libraries or headers:"; find / -xdev \( -name "*.a" -o -name "*.h" \) | head; exit 1; fi
        echo "no compiler, headers, static libraries or python"' ||
  fail "the runtime image has build or test tools"

step "every library of the binary resolves"
inside 'out=$(ldd /usr/local/bin/trainer); if echo "$out" | grep -q "not found"; then
          echo "$out" | grep "not found"; exit 1; fi; echo "$(echo "$out" | wc -l) libraries resolve"' ||
  fail "unresolved libraries"

step "image size"
if [[ $engine == docker ]]; then
  docker image ls "$image"
else
  "${bh[@]}" images "localhost/$image"
fi
# The uncompressed root file system, as the running container sees it, and its largest files.
size=$(inside 'du -sxb / | cut -f1') || fail "du in the image"
awk -v b="$size" 'BEGIN { printf "uncompressed: %.2f GB\n", b / 1e9 }'
large=$(inside "find / -xdev -type f -size +10M -printf '%s %p\n'") || fail "listing the large files of the image"
sort -rn <<<"$large" | awk -v t="$size" '{ printf "  %7.0f MB  %4.1f %%  %s\n", $1 / 1e6, 100 * $1 / t, $2 }'
if ((cuda)); then
  max_gb=${TRAINER_CUDA_IMAGE_MAX_GB:-4.5}
  awk -v b="$size" -v m="$max_gb" 'BEGIN { exit !(b <= m * 1e9) }' ||
    fail "the image is $(awk -v b="$size" 'BEGIN { printf "%.2f", b / 1e9 }') GB, over the $max_gb GB budget"
fi

elapsed=$(($(date +%s) - start))
printf 'docker-check.sh: PASSED %s in %dm%02ds (%s; the build %dm%02ds)\n' "$dockerfile" \
  $((elapsed / 60)) $((elapsed % 60)) "$engine" $((build_s / 60)) $((build_s % 60))
