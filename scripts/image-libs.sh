#!/usr/bin/env bash
# The runtime file tree of the CUDA image (Dockerfile.cuda's build stage runs it): the trainer
# binary and exactly the shared libraries it resolves, plus the few that LibTorch and cuDNN open
# later by name (dlopen), laid out under OUT as they go into the runtime stage:
#   OUT/usr/local/bin/trainer
#   OUT/opt/trainer/lib/<soname>               from PyTorch's wheel and NVIDIA's (the venv)
#   OUT/usr/lib/<multiarch>/<soname>           from Debian packages the base image lacks
#   OUT/etc/ld.so.conf.d/trainer.conf          /opt/trainer/lib for the dynamic loader
# A library from a package of the base image (BASE_PACKAGES, one name a line, written before
# anything was installed) is left to the base image; one that no package owns and is not in the
# venv stops the script, naming it. Prints each library of 10 MB or more with its share.
#
#   bash scripts/image-libs.sh BINARY OUT BASE_PACKAGES      (after scripts/build.sh --torch pip)
#
# Left out on purpose (the trainer never loads them): libtorch_python (Python), the lazily
# loaded linear-algebra library libtorch_cuda_linalg with cuSOLVER (no solver is called),
# cuFFTW, NVBLAS, the profilers' host libraries, nvcc's libnvvm, static libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=torch-flavour.sh
. scripts/torch-flavour.sh
torch_flavour=pip
if (($# != 3)); then
  echo "usage: image-libs.sh BINARY OUT BASE_PACKAGES" >&2
  exit 2
fi
binary=$1 out=$2 base_packages=$3
[[ -x $binary ]] || { echo "image-libs.sh: no binary at $binary (scripts/build.sh --torch pip)" >&2; exit 2; }
[[ -s $base_packages ]] || { echo "image-libs.sh: $base_packages: no list of the base image's packages" >&2; exit 2; }
torch_dir=$(torch_pip_dir)
site=$(dirname "$torch_dir")
multiarch=$(gcc -print-multiarch)

# What LibTorch and cuDNN open by name while training: cuDNN 9's sub-libraries (the engines,
# the heuristics, the graph API), NVRTC with its builtins (cuDNN's runtime-compiled engines and
# LibTorch's jiterator) and LibTorch's NVRTC shim.
extras=()
for f in "$site"/nvidia/cudnn/lib/libcudnn_*.so.* "$site"/nvidia/*/lib/libnvrtc.so.* \
         "$site"/nvidia/*/lib/libnvrtc-builtins.so.* "$torch_dir"/lib/libcaffe2_nvrtc.so; do
  [[ -e $f ]] && extras+=("$f")
done

rm -rf "$out"
mkdir -p "$out/usr/local/bin" "$out/opt/trainer/lib" "$out/usr/lib/$multiarch" "$out/etc/ld.so.conf.d"
install -m 0755 "$binary" "$out/usr/local/bin/trainer"
echo /opt/trainer/lib >"$out/etc/ld.so.conf.d/trainer.conf"

declare -A seen=()
place() {  # place SONAME PATH
  local name=$1 path=$2 real pkg
  [[ -n ${seen[$name]:-} ]] && return
  seen[$name]=1
  real=$(readlink -f "$path")
  if [[ $real == "$torch_venv"/* ]]; then
    cp -L "$path" "$out/opt/trainer/lib/$name"
    return
  fi
  pkg=""
  for p in "$path" "$real" "/usr$path" "${real#/usr}"; do
    pkg=$(dpkg-query -S "$p" 2>/dev/null | head -n 1 | cut -d: -f1) && [[ -n $pkg ]] && break
  done
  if [[ -z $pkg ]]; then
    echo "image-libs.sh: $path ($name) is neither in $torch_venv nor in a Debian package" >&2
    exit 1
  fi
  grep -qx "$pkg" "$base_packages" && return  # the base image has it
  cp -L "$path" "$out/usr/lib/$multiarch/$name"
}

for f in "$binary" "${extras[@]}"; do
  [[ $f == "$binary" ]] || place "$(basename "$f")" "$f"
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    if [[ $path == "not" ]]; then
      # The driver's own libraries come from the host at run time (the NVIDIA container
      # toolkit mounts them); LibTorch's NVRTC shim links libcuda.so.1.
      [[ $name == libcuda.so.* || $name == libnvidia-* ]] && continue
      echo "image-libs.sh: $f needs $name, which is not found" >&2
      exit 1
    fi
    place "$name" "$path"
  done < <(ldd "$f")
done

# The CA certificates libcurl checks HTTPS downloads (model.pretrained by URL or torchvision
# name) against, at the path Debian's OpenSSL looks in.
bundle=/etc/ssl/certs/ca-certificates.crt
if [[ ! -s $bundle ]]; then
  echo "image-libs.sh: $bundle is missing (install ca-certificates in the build stage)" >&2
  exit 1
fi
install -D -m 0644 "$bundle" "$out$bundle"

total=$(du -sb "$out" | cut -f1)
copied=$(find "$out/opt" "$out/usr/lib" -type f | wc -l)
awk -v n="$copied" -v s="${#seen[@]}" -v t="$total" -v b="$(stat -c %s "$out/usr/local/bin/trainer")" \
  'BEGIN { printf "image-libs.sh: the trainer (%.0f MB) and %d of the %d libraries it loads (the rest are the base image'"'"'s), %.2f GB in all\n", b / 1e6, n, s, t / 1e9 }'
find "$out" -type f -size +10M -printf '%s %P\n' | sort -rn |
  awk -v t="$total" '{ printf "  %7.0f MB  %4.1f %%  /%s\n", $1 / 1e6, 100 * $1 / t, $2 }'
