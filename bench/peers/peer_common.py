"""What the peer drivers (accelerate_opt.py, flexgen_opt.py) share: flags, OPT shapes, token ids, the result record.

The drivers are scripts run with the GPU machine's stock python3 (`python3 bench/peers/flexgen_opt.py ...`), so this
module imports nothing heavy at the top: torch loads inside the functions that need it, and liac only for its model
zoo (`liac.models.resolve_model`, which reads no torch). Each driver ends by printing ONE JSON line (the result) and
writing it atomically to `--json-out`; a failure after some numbers were measured still prints them, beside an
`error` string, instead of losing them in a traceback.

    result = PeerResult.start("flexgen", args)
    with result.guard():          # any exception → result["error"], numbers kept
        result["prefill_ms"] = ...
    sys.exit(result.finish())     # prints the JSON line, writes --json-out; exit 1 when an error was recorded
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import tempfile
import sys
import time
import traceback
from dataclasses import dataclass

if importlib.util.find_spec("liac") is None:  # a checkout where liac is not installed (the GPU machine): the repo
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # root holds it

__all__ = ["GIB", "OptShapes", "base_parser", "positive_int", "positive_float", "opt_shapes", "random_token_ids",
           "PeerResult", "gpu_peak_bytes", "reset_gpu_peak", "write_json_atomic"]

GIB = 2**30


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1 (the message names what was given)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got '{text}'")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got '{text}'") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got '{text}'")
    return value


def base_parser(prog: str, description: str, gen_len_default: int) -> argparse.ArgumentParser:
    """The flags every peer driver takes (the workload and where the result goes)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--model", default="opt-30b",
                        help="liac zoo name or an HF config.json (flexgen_opt.py: OPT only; default: opt-30b)")
    parser.add_argument("--batch", type=positive_int, default=1, help="sequences generated together (default 1)")
    parser.add_argument("--prompt-len", type=positive_int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--gen-len", type=positive_int, default=gen_len_default,
                        help=f"new tokens, the first from the prefill (default {gen_len_default})")
    parser.add_argument("--gpu-budget-gib", type=positive_float, default=24.0,
                        help="GPU memory budget in GiB (default 24)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random token ids and weights (default 0)")
    parser.add_argument("--json-out", metavar="FILE", help="also write the result JSON here (atomically)")
    return parser


@dataclass(frozen=True)
class OptShapes:
    """An OPT model's sizes, in elements (what both peers need to build it)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    ffn_dim: int
    vocab_size: int
    max_position: int

    @property
    def params(self) -> int:
        """Parameters, tied embedding counted once (token + position embeddings, layers, final norm)."""
        h, f = self.hidden_size, self.ffn_dim
        layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h  # q,k,v,out (+bias), fc1, fc2 (+bias), 2 norms
        return self.vocab_size * h + (self.max_position + 2) * h + self.num_layers * layer + 2 * h


def opt_shapes(model: str) -> OptShapes:
    """OPT sizes from liac's zoo (`opt-30b`) or an HF config.json (via `liac.models.resolve_model`).

    Raises:
        ValueError: not an OPT model, or an OPT variant the peers do not build (a projected embedding, opt-350m).
    """
    from liac.errors import LiacError
    from liac.models import resolve_model

    try:
        cfg = resolve_model(model)
    except LiacError as e:
        raise ValueError(f"--model: {e.line()}") from None
    if cfg.family != "opt":
        raise ValueError(f"--model: must be an OPT model (the peers drive OPT only), got family '{cfg.family}'")
    if cfg.num_kv_heads != cfg.num_heads or cfg.head_dim * cfg.num_heads != cfg.hidden_size:
        raise ValueError(f"--model: '{cfg.name}' must have head_dim × heads = hidden size and no grouped KV heads")
    return OptShapes(name=cfg.name, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                     num_heads=cfg.num_heads, ffn_dim=cfg.ffn_dim, vocab_size=cfg.vocab_size,
                     max_position=cfg.max_position)


def random_token_ids(batch: int, prompt_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """[batch][prompt_len] token ids, uniform in [3, vocab) so none is OPT's pad (1), bos/eos (2) or 0."""
    rng = random.Random(seed)
    high = max(vocab_size - 1, 3)
    return [[rng.randint(3, high) for _ in range(prompt_len)] for _ in range(batch)]


def write_json_atomic(path: str, data: dict) -> None:
    """Write to a temp file beside `path`, then rename: a reader never sees half a result."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def reset_gpu_peak() -> None:
    """Start the peak-memory counters afresh (no-op without CUDA)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def gpu_peak_bytes() -> dict:
    """Peak GPU memory since the last reset: what tensors held (allocated) and what the allocator took (reserved).

    Neither counts the CUDA context (~0.5 GiB), which no budget in this benchmark includes either.
    """
    import torch

    if not torch.cuda.is_available():
        return {"peak_gpu_allocated_bytes": None, "peak_gpu_reserved_bytes": None}
    torch.cuda.synchronize()
    return {"peak_gpu_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "peak_gpu_reserved_bytes": int(torch.cuda.max_memory_reserved())}


class PeerResult(dict):
    """The result record of one driver run (a dict, so it prints and dumps as is)."""

    @classmethod
    def start(cls, peer: str, args, model: str | None = None) -> "PeerResult":
        result = cls(peer=peer, model=model or args.model, batch_size=args.batch, prompt_len=args.prompt_len,
                     gen_len=args.gen_len, gpu_budget_gib=args.gpu_budget_gib, settings={}, notes=[],
                     prefill_ms=None, decode_ms_per_token=None, decode_steps=0, total_ms=None,
                     tokens_per_second=None, peak_gpu_allocated_bytes=None, peak_gpu_reserved_bytes=None,
                     within_budget=None, error=None)
        result._json_out = args.json_out
        result._started = time.perf_counter()
        return result

    def set_times(self, prefill_seconds: float, decode_seconds: list[float]) -> None:
        """Prefill (first token) and per-step decode times → the reported numbers (tokens/s over both phases)."""
        total = prefill_seconds + sum(decode_seconds)
        self["prefill_ms"] = prefill_seconds * 1e3
        self["decode_steps"] = len(decode_seconds)
        self["decode_ms_per_token"] = sum(decode_seconds) / len(decode_seconds) * 1e3 if decode_seconds else None
        self["total_ms"] = total * 1e3
        tokens = self["batch_size"] * (1 + len(decode_seconds))
        self["tokens_per_second"] = tokens / total if total > 0 else None

    def set_memory(self, peaks: dict) -> None:
        """Record peak GPU memory and whether it stayed within the budget (judged on reserved bytes)."""
        self.update(peaks)
        reserved = peaks.get("peak_gpu_reserved_bytes")
        self["within_budget"] = None if reserved is None else reserved <= self["gpu_budget_gib"] * GIB

    @contextlib.contextmanager
    def guard(self):
        """Run a block; an exception becomes `error` (type, message, last frame) and the block ends there."""
        try:
            yield self
        except KeyboardInterrupt:
            self["error"] = "interrupted"
        except BaseException as e:  # noqa: BLE001 - a driver must report, not crash: the numbers so far matter
            if isinstance(e, SystemExit) and not e.code:
                return
            frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
            where = f" (at {os.path.basename(frame.filename)}:{frame.lineno})" if frame else ""
            self["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}{where}"

    def finish(self) -> int:
        """Print the result as one JSON line, write --json-out; the exit status (1 when an error was recorded)."""
        self["wall_seconds"] = round(time.perf_counter() - self._started, 3)
        data = dict(self)
        if self._json_out:
            write_json_atomic(self._json_out, data)
        print(json.dumps(data, sort_keys=True), flush=True)
        return 1 if self["error"] else 0
