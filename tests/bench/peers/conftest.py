"""The peer drivers are scripts beside their helper (bench/peers/), not a package: put that folder on sys.path."""

import sys
from pathlib import Path

PEERS = Path(__file__).resolve().parents[3] / "bench" / "peers"
if str(PEERS) not in sys.path:
    sys.path.insert(0, str(PEERS))
