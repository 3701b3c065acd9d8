#!/usr/bin/env bash
# Fails on a Catch test name that CTest cannot carry through catch_discover_tests: a ';' splits
# the name into CTest list items (each then matches no test, and Catch passes with nothing run),
# and a leading '-' reaches Catch as a command-line option. Arguments: Catch2's major version
# (2 or 3: they list test names with different options), then the test executables.
set -euo pipefail
major=$1
shift
case $major in
  2) list=(--list-test-names-only) ;;
  3) list=(--list-tests --verbosity quiet) ;;
  *) echo "test_names.sh: Catch2 major version 2 or 3 expected, got '$major'" >&2; exit 2 ;;
esac
bad=0
for exe in "$@"; do
  while IFS= read -r name; do
    if [[ $name == *";"* || $name == -* ]]; then
      echo "$(basename "$exe"): test name '$name' has a ';' or starts with '-': CTest would not run it" >&2
      bad=1
    fi
  done < <("$exe" "${list[@]}")
done
if ((bad)); then exit 1; fi
echo "test_names: every test name of $# executables reaches CTest whole"
