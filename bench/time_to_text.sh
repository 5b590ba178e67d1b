#!/bin/bash
# Seconds from `pip install` of the liac wheel (into a fresh virtualenv) to the first printed text, on this machine.
#
#   bench/time_to_text.sh [TORCH_REQUIREMENT]        # default torch==2.13.0 (the CPU build of the Makefile)
#
# Builds the wheel, makes the quickstart checkpoint with the checkout's own .venv (a user brings their own
# checkpoint), then times: pip install torch + the wheel; then the notebook call `liac.quick.generate(checkpoint,
# "The GPU")` in a new Python process (first use: probe this host, compile a plan, load, generate, print); then
# the same call again, with the host profile and the plan in the cache; then the command line (liac compile, then
# lia-run --prompt) in a fresh user cache. Everything goes into a temporary directory (the user caches too,
# XDG_CACHE_HOME), removed at the end.
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
"$WORK/venv/bin/pip" install -q "$TORCH" "$WHEEL" >/dev/null 2>&1
installed=$(now)
CALL="from liac.quick import generate; print(generate('$WORK/tiny-llama', 'The GPU', max_new_tokens=24).text[0], flush=True)"
XDG_CACHE_HOME="$WORK/cache" "$WORK/venv/bin/python" -c "$CALL"
first=$(now)
XDG_CACHE_HOME="$WORK/cache" "$WORK/venv/bin/python" -c "$CALL" >/dev/null
second=$(now)
# the command-line path in a fresh user cache: liac compile (probe this host, compile), then lia-run (text streamed)
XDG_CACHE_HOME="$WORK/cache-cli" "$WORK/venv/bin/liac" compile --model "$WORK/tiny-llama" --batch 1 \
    -o "$WORK/tiny.yaml" >/dev/null 2>&1
XDG_CACHE_HOME="$WORK/cache-cli" "$WORK/venv/bin/lia-run" "$WORK/tiny.yaml" --weights "$WORK/tiny-llama" \
    --prompt "The GPU" 2>/dev/null
cli=$(now)
python3 - "$start" "$installed" "$first" "$second" "$cli" <<'PY'
import sys
start, installed, first, second, cli = map(float, sys.argv[1:])
print(f"pip install {installed - start:.1f} s; first text {first - installed:.1f} s later "
      f"({first - start:.1f} s from pip install); again with the cached plan {second - first:.1f} s; "
      f"liac compile + lia-run in a fresh cache {cli - second:.1f} s")
PY
