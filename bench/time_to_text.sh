#!/bin/bash
# Seconds from `pip install` of the liac wheel (into a fresh virtualenv) to the first printed text, on this machine.
#
#   bench/time_to_text.sh [TORCH_REQUIREMENT]        # default torch==2.13.0 (the CPU build of the Makefile)
#
# Builds the wheel, makes the quickstart checkpoint with the checkout's own .venv (a user brings their own
# checkpoint), then times: pip install torch + the wheel with its 'hf' extra; then the notebook call
# `liac.generate(checkpoint, "The GPU")` in a new Python process (compile a plan, load, generate, print); then the
# same call again, with the plan in the cache. Everything goes into a temporary directory, removed at the end.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TORCH=${1:-torch==2.13.0}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$ROOT/.venv/bin/pip" wheel -q --no-deps -w "$WORK/wheel" "$ROOT" >/dev/null 2>&1
"$ROOT/.venv/bin/python" -m liac.tiny "$WORK/tiny-llama" 2>/dev/null
python3 -m venv "$WORK/venv"
WHEEL=$(ls "$WORK"/wheel/liac-*.whl)
cd "$WORK"  # not the checkout: `python -c` would import its liac/ instead of the installed wheel
now() { date +%s.%N; }
start=$(now)
"$WORK/venv/bin/pip" install -q "$TORCH" "$WHEEL[hf]" >/dev/null 2>&1
installed=$(now)
CALL="import liac; print(liac.generate('$WORK/tiny-llama', 'The GPU', max_new_tokens=24).text[0], flush=True)"
LIAC_CACHE_DIR="$WORK/cache" "$WORK/venv/bin/python" -c "$CALL"
first=$(now)
LIAC_CACHE_DIR="$WORK/cache" "$WORK/venv/bin/python" -c "$CALL" >/dev/null
second=$(now)
python3 - "$start" "$installed" "$first" "$second" <<'PY'
import sys
start, installed, first, second = map(float, sys.argv[1:])
print(f"pip install {installed - start:.1f} s; first text {first - installed:.1f} s later "
      f"({first - start:.1f} s from pip install); again with the cached plan {second - first:.1f} s")
PY
