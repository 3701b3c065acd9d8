#!/usr/bin/env bash
# Writes docs/reference.md, the job spec's field reference, from `trainer train --help` (the one
# source of the fields, their defaults and their values). The README test fails when the two
# differ: run this after adding or changing a field.
#   bash scripts/gen-reference.sh [TRAINER_BINARY]     (default: build/app/trainer)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/app/trainer}
[[ -x $bin ]] || { echo "gen-reference.sh: no trainer at $bin (bash scripts/build.sh)" >&2; exit 2; }
help=$("$bin" train --help)
# From the first field group to the line before the exit codes.
fields=$(awk '/^model: the network/ { on = 1 } /^Exit codes:/ { on = 0 } on' <<<"$help")
[[ -n $fields ]] || { echo "gen-reference.sh: no field list in '$bin train --help'" >&2; exit 1; }
{
  cat <<'HEAD'
# Job spec reference

A job spec is YAML; every field has a default, an unknown key is an error (with a "did you
mean"), and `--set field=value` overrides any field (the value is YAML: `--set
data.class_names=[a,b]`). Relative paths are relative to the working directory. Limits on sizes:
[data.md](data.md#limits). This page is `trainer train --help`'s field list, written by
`bash scripts/gen-reference.sh`; every field, with its default and its values:

```
HEAD
  printf '%s\n' "$fields"
  echo '```'
} >docs/reference.md.tmp
mv docs/reference.md.tmp docs/reference.md
echo "gen-reference.sh: docs/reference.md: $(wc -l <<<"$fields") lines from $bin train --help"
