#!/usr/bin/env bash
# The layering of docs/architecture.md, checked over the #include lines of lib/ and app/:
#   app -> job -> loop -> {model, data, dist, cluster, config} -> util;  app -> launch -> util;
#   job -> synth -> data
# and each third-party library confined to the files that docs/architecture.md names for it.
# Every module shares one include root (lib/), so an include that crosses a layer would compile
# and link; this script is what refuses it. Usage: scripts/check-layering.sh [ROOT] (ROOT: a
# checkout, default this one). Exit 0 when every include keeps the rules, 1 naming each file,
# line and the rule it breaks, 2 for a ROOT without lib/trainer.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
if [[ ! -d $root/lib/trainer ]]; then
  echo "check-layering: '$root' has no lib/trainer (expected a checkout of the trainer)" >&2
  exit 2
fi

# Which modules a module's files may include (besides its own).
allowed() {
  case $1 in
    util) echo "" ;;
    config | cluster | model | data | dist | launch) echo "util" ;;
    synth) echo "util data" ;;
    loop) echo "util config cluster model data dist" ;;
    job) echo "util config cluster model data dist loop synth" ;;
    app) echo "util config cluster model data dist loop synth job launch" ;;
    *) echo "?" ;;
  esac
}

# Third-party headers and the only files (relative to ROOT, regexes) that may include them:
# HEADER|FILES|WHY (the header's regex has no '|'; FILES may).
confined=(
  '<opencv2/|lib/trainer/(data/(image\.cpp|contact_sheet\.cpp|transforms\.(h|cpp)|augment\.(h|cpp))|synth/synthetic\.cpp)$|OpenCV only in data/image.cpp, data/contact_sheet.cpp, data/transforms.*, data/augment.* and synth/synthetic.cpp'
  '<yaml-cpp/|lib/trainer/config/[^/]+$|yaml-cpp only in config/'
  '<CLI/|app/|CLI11 only in app/'
  '<torch/csrc/distributed/|lib/trainer/dist/[^/]+$|c10d only in dist/'
  '<onnx/|lib/trainer/model/onnx/graph\.cpp$|ONNX only in model/onnx/graph.cpp'
  '<google/protobuf/|lib/trainer/(data/tf_example\.cpp|loop/events\.cpp|model/onnx/graph\.cpp)$|protobuf only in data/tf_example.cpp, loop/events.cpp and model/onnx/graph.cpp'
  '\.pb\.h"|lib/trainer/(data/tf_example\.cpp|loop/events\.cpp)$|generated protobuf code only in data/tf_example.cpp and loop/events.cpp'
)

failures=0
report() {
  echo "$1: $2" >&2
  failures=$((failures + 1))
}

cd "$root"
while IFS= read -r -d '' file; do
  case $file in
    lib/trainer/*) module=${file#lib/trainer/} module=${module%%/*} ;;
    app/*) module=app ;;
    *) continue ;;
  esac
  deps=$(allowed "$module")
  if [[ $deps == "?" ]]; then
    report "$file" "module '$module' is not in docs/architecture.md's layering"
    continue
  fi
  lineno=0
  while IFS= read -r line; do
    lineno=$((lineno + 1))
    [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*([<\"][^>\"]+[>\"]) ]] || continue
    target=${BASH_REMATCH[1]}
    if [[ $target =~ ^\"trainer/([a-z_]+)/ ]]; then
      dep=${BASH_REMATCH[1]}
      # The one arrow against the layers: config reads the job spec's data.train/validation
      # sections into data's own plain struct (data/source_options.h, standard library only),
      # so that their fields are defined once.
      if [[ $module == config && $target == '"trainer/data/source_options.h"' ]]; then
        :
      elif [[ $dep != "$module" && " $deps " != *" $dep "* ]]; then
        report "$file:$lineno" "includes $target: $module/ may include only ${deps:-nothing} besides itself (app -> job -> loop -> {model, data, dist, cluster, config} -> util; app -> launch -> util)"
      fi
    fi
    if [[ $file == lib/trainer/data/source_options.h && $target != \<* ]]; then
      report "$file:$lineno" "includes $target: data/source_options.h, which config/ includes, may include only standard headers"
    fi
    for rule in "${confined[@]}"; do
      header=${rule%%|*} rest=${rule#*|}
      why=${rest##*|} files=${rest%|*}
      if [[ $target =~ $header ]] && ! [[ $file =~ $files ]]; then
        report "$file:$lineno" "includes $target: $why"
      fi
    done
  done <"$file"
done < <(find lib/trainer app -type f \( -name '*.cpp' -o -name '*.h' \) -print0 | sort -z)

if ((failures > 0)); then
  echo "check-layering: $failures include(s) against the layering in docs/architecture.md" >&2
  exit 1
fi
echo "check-layering: every include of lib/ and app/ keeps the layering"
