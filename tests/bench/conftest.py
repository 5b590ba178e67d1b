"""bench/ holds scripts, not a package: put it on sys.path so tests import `floor` as bench/h200.py does."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
