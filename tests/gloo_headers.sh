#!/usr/bin/env bash
# Our objects use Gloo only through LibTorch's exported ProcessGroupGloo functions and hold its
# types only by pointer, so the Gloo headers they compile against need to declare those names and
# nothing more: a LibTorch that ships no Gloo headers (PyTorch's wheels) builds against Debian's
# libgloo-dev, whose Gloo is older than the one inside the wheel. Were any Gloo code compiled into
# our objects (an inline function, a vtable such as ProcessGroupGloo::GlooStore's, a class laid
# out by value), those headers would have to match LibTorch's Gloo exactly. This test fails on
# any such symbol defined in the library given.
#   gloo_headers.sh NM LIBRARY...
set -euo pipefail
nm=$1
shift
bad=$("$nm" -C --defined-only "$@" 2>/dev/null |
  grep -E '^[0-9a-f]+ [A-Za-z] ((vtable|typeinfo|typeinfo name|VTT|construction vtable) for |[a-z_]+ )?(gloo::|c10d::ProcessGroupGloo::GlooStore)' || true)
if [[ -n $bad ]]; then
  echo "gloo_headers: Gloo code compiled into our objects (then the Gloo headers must be LibTorch's own):"
  echo "$bad" | head -n 20
  exit 1
fi
used=$("$nm" -C --undefined-only "$@" 2>/dev/null | grep -c 'ProcessGroupGloo' || true)
echo "gloo_headers: no Gloo code in $(basename "$1"); $used references to LibTorch's ProcessGroupGloo"
