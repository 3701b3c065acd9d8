#!/usr/bin/env bash
# cmake/torch_checks.cmake, through the project's real configure step, against stand-in
# LibTorches (a TorchConfig.cmake with an empty imported `torch` target: nothing is compiled or
# downloaded, no GPU needed; a few seconds):
#   1. a pre-cxx11-ABI LibTorch zip (TORCH_CXX_FLAGS -D_GLIBCXX_USE_CXX11_ABI=0, build-version
#      2.1.2+cu121) is refused, naming libtorch-cxx11-abi-shared-with-deps-2.1.2%2Bcu121.zip;
#   2. one without build-version (a pip wheel's) of 2.7 is refused, naming the plain cpu zip;
#   3. a cxx11-ABI zip that bundles protobuf 3.13.0 headers configures, says so, and the include
#      flags of the two sources that include generated protobuf code (data/tf_example.cpp,
#      loop/events.cpp) reach the system's protobuf headers first: preprocessed with those
#      flags, GOOGLE_PROTOBUF_VERSION is the system's (and, as a control, 3013000 without the
#      flag the check adds).
# Run by CTest as `torch_checks`:
#   torch_checks.sh CMAKE GENERATOR SOURCE_DIR CXX
set -euo pipefail
cmake=$1 generator=$2 src=$3 cxx=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "torch_checks: FAILED: $*"; failed=1; }

# A stand-in LibTorch install at $1: flags $2, version $3, build-version $4 ("" = none).
fake_torch() {
  local prefix=$1 flags=$2 version=$3 build_version=$4
  mkdir -p "$prefix/share/cmake/Torch" "$prefix/include"
  cat > "$prefix/share/cmake/Torch/TorchConfig.cmake" <<EOF
get_filename_component(TORCH_INSTALL_PREFIX "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(TORCH_INCLUDE_DIRS "\${TORCH_INSTALL_PREFIX}/include")
if(NOT TARGET torch)
  add_library(torch INTERFACE IMPORTED)
  set_target_properties(torch PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "\${TORCH_INCLUDE_DIRS}")
endif()
set(TORCH_LIBRARIES torch)
set(TORCH_CXX_FLAGS "$flags")
set(Torch_FOUND TRUE)
EOF
  cat > "$prefix/share/cmake/Torch/TorchConfigVersion.cmake" <<EOF
set(PACKAGE_VERSION "$version")
set(PACKAGE_VERSION_COMPATIBLE TRUE)
EOF
  if [[ -n $build_version ]]; then echo "$build_version" > "$prefix/build-version"; fi
}

configure() {  # configure NAME PREFIX: the project against the stand-in, output in $tmp/NAME.log
  "$cmake" -S "$src" -B "$tmp/$1-build" -G "$generator" -DTorch_DIR="$2/share/cmake/Torch" \
    -DCMAKE_CXX_COMPILER="$cxx" -DTRAINER_BUILD_TESTS=OFF > "$tmp/$1.log" 2>&1
}

expect_refused() {  # expect_refused NAME PREFIX URL
  if configure "$1" "$2"; then
    fail "$1: a pre-cxx11-ABI LibTorch was accepted"
  elif ! grep -q "pre-cxx11 ABI" "$tmp/$1.log"; then
    fail "$1: configure failed, but not on the ABI check"
  elif ! tr -d '\n' < "$tmp/$1.log" | grep -qF "$3"; then
    fail "$1: the message does not name $3"
  else
    echo "torch_checks: ok $1: refused, naming $3"
    return
  fi
  cat "$tmp/$1.log"
}

version() {  # GOOGLE_PROTOBUF_VERSION as the compiler sees it with the include flags given
  printf '#include <google/protobuf/stubs/common.h>\nGOOGLE_PROTOBUF_VERSION\n' |
    "$cxx" -E -P -x c++ "$@" - 2>&1 | tail -n 1
}

fake_torch "$tmp/old-zip/libtorch" "-D_GLIBCXX_USE_CXX11_ABI=0" 2.1.2 "2.1.2+cu121"
expect_refused old-zip "$tmp/old-zip/libtorch" \
  "https://download.pytorch.org/libtorch/cu121/libtorch-cxx11-abi-shared-with-deps-2.1.2%2Bcu121.zip"

fake_torch "$tmp/old-wheel/torch" "-D_GLIBCXX_USE_CXX11_ABI=0" 2.7.0 ""
expect_refused old-wheel "$tmp/old-wheel/torch" \
  "https://download.pytorch.org/libtorch/cpu/libtorch-shared-with-deps-2.7.0%2Bcpu.zip"

# 3. cxx11 ABI, with protobuf 3.13.0's headers bundled as a LibTorch zip has them.
zip=$tmp/bundled/libtorch
fake_torch "$zip" "-D_GLIBCXX_USE_CXX11_ABI=1" 2.1.2 "2.1.2+cu121"
mkdir -p "$zip/include/google/protobuf/stubs"
echo '#define GOOGLE_PROTOBUF_VERSION 3013000' > "$zip/include/google/protobuf/stubs/common.h"
if ! configure bundled "$zip"; then
  cat "$tmp/bundled.log"
  fail "bundled: a cxx11-ABI LibTorch was refused"
  exit 1
fi
if ! grep -q "LibTorch bundles protobuf headers in $zip/include/google/protobuf (3.13.0 against" \
    "$tmp/bundled.log"; then
  cat "$tmp/bundled.log"
  fail "bundled: configure did not say that LibTorch bundles protobuf headers"
fi
shadow=$tmp/bundled-build/system-headers/include
for source in lib/trainer/data/tf_example.cpp lib/trainer/loop/events.cpp; do
  command=$(grep -F "\"command\"" "$tmp/bundled-build/compile_commands.json" |
            grep -F -- "-c $src/$source\"" || true)
  if [[ -z $command ]]; then fail "bundled: no compile command for $source"; continue; fi
  # The include flags of that command, in order (paths here have no spaces).
  read -r -a flags <<< "$(grep -o -- '-isystem [^ "]*\|-I[^ "]*' <<< "$command" | tr '\n' ' ')"
  with=$(version "${flags[@]}")
  without=()
  skip=0
  for f in "${flags[@]}"; do
    if ((skip)); then skip=0; [[ $f == "$shadow" ]] || without+=(-isystem "$f"); continue; fi
    if [[ $f == -isystem ]]; then skip=1; continue; fi
    [[ $f == "-I$shadow" ]] || without+=("$f")
  done
  control=$(version "${without[@]}")
  if [[ $control != 3013000 ]]; then
    fail "$source: without the check's flag the stand-in's headers should win (got '$control'): the test proves nothing"
  elif [[ ! $with =~ ^[0-9]+$ || $with == 3013000 ]]; then
    fail "$source: LibTorch's bundled protobuf headers shadow the system's (GOOGLE_PROTOBUF_VERSION '$with'; flags: ${flags[*]})"
  else
    echo "torch_checks: ok $source sees the system's protobuf ($with), not LibTorch's (3013000)"
  fi
done
exit "$failed"
