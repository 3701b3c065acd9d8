#!/usr/bin/env bash
# Fails on a Catch test name that CTest cannot carry through catch_discover_tests: a ';' splits
# the name into CTest list items (each then matches no test, and Catch passes with nothing run),
# and a leading '-' reaches Catch as a command-line option. Arguments: the test executables.
set -euo pipefail
bad=0
for exe in "$@"; do
  while IFS= read -r name; do
    if [[ $name == *";"* || $name == -* ]]; then
      echo "$(basename "$exe"): test name '$name' has a ';' or starts with '-': CTest would not run it" >&2
      bad=1
    fi
  done < <("$exe" --list-test-names-only)
done
if ((bad)); then exit 1; fi
echo "test_names: every test name of $# executables reaches CTest whole"
