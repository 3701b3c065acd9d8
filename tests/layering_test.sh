#!/usr/bin/env bash
# scripts/check-layering.sh on a copy of the sources: passes as they are; fails, naming the file,
# the line and the rule, on a planted include that crosses a layer or a third-party confinement;
# exit 2 for a ROOT that is not a checkout.
set -euo pipefail
src=$1
check=$src/scripts/check-layering.sh
tmp=$(mktemp -d /tmp/trainer-layering.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "layering_test: $*" >&2; exit 1; }

mkdir -p "$tmp/root"
cp -r "$src/lib" "$src/app" "$tmp/root/"
bash "$check" "$tmp/root" >/dev/null || fail "the sources as they are should pass"

plant() {  # FILE LINE_TEXT: insert after the file's first line
  sed -i "1a $2" "$tmp/root/$1"
}
plant lib/trainer/util/fs.cpp '#include "trainer/job/commands.h"'
plant lib/trainer/model/resnet.cpp '#include <opencv2/core.hpp>'
plant lib/trainer/data/loader.cpp '#include "trainer/dist/process_group.h"'
plant lib/trainer/loop/evaluate.cpp '#include "trainer/job/agreement.h"'
set +e
out=$(bash "$check" "$tmp/root" 2>&1)
rc=$?
set -e
[[ $rc == 1 ]] || fail "planted includes: expected exit 1, got $rc: $out"
for want in \
  'lib/trainer/util/fs.cpp:2: includes "trainer/job/commands.h": util/ may include only nothing' \
  'lib/trainer/model/resnet.cpp:2: includes <opencv2/core.hpp>: OpenCV only in data/image.cpp' \
  'lib/trainer/data/loader.cpp:2: includes "trainer/dist/process_group.h": data/ may include only util' \
  'lib/trainer/loop/evaluate.cpp:2: includes "trainer/job/agreement.h": loop/ may include only util config cluster model data dist' \
  'check-layering: 4 include(s) against the layering'; do
  [[ $out == *"$want"* ]] || fail "expected '$want' in: $out"
done

set +e
bash "$check" "$tmp/nowhere" >/dev/null 2>&1
rc=$?
set -e
[[ $rc == 2 ]] || fail "a ROOT without lib/trainer: expected exit 2, got $rc"
echo "layering_test: ok"
