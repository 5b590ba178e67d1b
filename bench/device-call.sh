#!/usr/bin/env bash
# One call on the H200 machine (the `run` tool of the device library; see docs/benchmarks.md for the calls made):
# installs the carried wheels (.whl/: pulp, highspy, platformdirs, flexgen for the peers) and liac, records the
# machine, optionally runs the GPU tests, then runs bench/h200.py into $OUT/NAME within what is left of the budget,
# with the plans compiled here (.device-plans/, untracked, travels with the tree) or in the call ('compile' stage).
# At most 8 files come back from a call: setup (pip, machine, GPU tests) goes into one setup.txt.
#     bench/device-call.sh NAME [--gpu-tests] [bench/h200.py arguments...]
# LIAC_CALL_SECONDS (default 530): the call's whole budget; h200.py gets what setup and the tests left of it.
set -u
began=$(date +%s)
budget=${LIAC_CALL_SECONDS:-530}
name=$1; shift
out=${OUT:?}/$name
mkdir -p "$out"
python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl > "$out/setup.txt" 2>&1
python3 -m pip install --no-index --no-build-isolation --no-deps -e . >> "$out/setup.txt" 2>&1
export PYTHONPATH=/tmp/site
if ! python3 -c "import liac.passes, liac.runtime" >> "$out/setup.txt" 2>&1; then  # no PEP 660 editable: a copy
    python3 -m pip install --no-index --no-build-isolation --no-deps --target /tmp/site . >> "$out/setup.txt" 2>&1
fi
# pulp (the GPU budget tests and the compile stage; highspy beside it to solve as CI does) and platformdirs
# (liac.profile) are not on the machine's image: carried as wheels in .whl/ (docs/benchmarks.md says how to fetch them)
python3 -c "import liac.passes, liac.runtime, pulp, platformdirs; print('liac from', liac.__file__)" 2>&1 | tail -n 1
{ nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv; free -g; nproc; lscpu | grep -i "model name\|amx" | cut -c1-200; } >> "$out/setup.txt" 2>&1
if [ "${1:-}" = "--gpu-tests" ]; then
    shift
    # the runtime's GPU tests: parity, splits, the budget sweep under tight budgets, the warm-up (at most 200 s)
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/runtime > /tmp/pytest-gpu.txt 2>&1
    grep -E "passed|failed|error" /tmp/pytest-gpu.txt | tail -n 3 | tee -a "$out/setup.txt"
    grep -E "^(FAILED|ERROR)" /tmp/pytest-gpu.txt | head -n 20 >> "$out/setup.txt"
    if grep -qE "^(FAILED|ERROR)" /tmp/pytest-gpu.txt; then  # the failures' detail, for the next session
        grep -E "^E  |Error|error:" /tmp/pytest-gpu.txt | head -n 80 >> "$out/setup.txt"
    fi
fi
# plans compiled here, before the call (untracked .device-plans/ travels with the tree), unless 'compile' runs there
[ -f .device-plans/summary.json ] && cp .device-plans/summary.json "$out/"
left=$(( budget - ($(date +%s) - began) ))
python3 bench/h200.py --out "$out" --plans-dir .device-plans --deadline-s "$left" "$@" > "$out/log.txt" 2>&1
grep -v "random weights\|^lia-run: " "$out/log.txt" | tail -n 60
# at most 8 files come back: where the call wrote more (compile + rates-after), setup.txt goes to the head of log.txt
if [ "$(find "$out" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
    { echo "== setup.txt (folded in: more than 8 files) =="; cat "$out/setup.txt"; echo "== log =="; cat "$out/log.txt"; } > "$out/log.tmp"
    mv "$out/log.tmp" "$out/log.txt" && rm -f "$out/setup.txt"
fi
