"""Choosing the next token: greedy, or sampled with temperature, top-k and top-p, reproducibly per sequence.

    params = SamplingParams(temperature=0.8, top_p=0.95, seed=0)
    sampler = Sampler([params] * batch)          # one SamplingParams per sequence (they may differ)
    next_ids = sampler(logits)                   # logits [B, vocab] → [B, 1], on the logits' device

The logits go through the same steps, in the same order, as HF transformers' warpers (temperature, then top-k,
then top-p over what top-k kept; tests/runtime/test_sampling.py compares the two). A sampled row draws one uniform
number per step from its *own* generator, seeded from (seed, its index), and takes the token where the cumulative
distribution passes it: a sequence's tokens depend on its seed, index and logits only — not on which other
sequences share the batch, nor on the device its logits are on. Temperature 0 is greedy (argmax); as the
temperature goes to 0, sampling becomes greedy too (the distribution collapses onto the argmax).

Nothing here knows about plans or devices: a continuous batcher can keep one SamplingParams and one generator per
slot and call `warp` / `draw` itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from liac.errors import LiacError

__all__ = ["SamplingParams", "Sampler", "warp", "draw", "sequence_seed", "generator_for"]


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence chooses its tokens (the defaults are greedy)."""

    temperature: float = 0.0  # 0: greedy (argmax); > 0: sample from softmax(logits / temperature)
    top_p: float = 1.0        # keep the most probable tokens whose probabilities add up to top_p (1: all)
    top_k: int = 0            # keep the k most probable tokens (0: all)
    seed: int | None = None   # None: a fresh random seed per call

    def __post_init__(self):
        for name, ok, rule in (
                ("temperature", _number(self.temperature) and self.temperature >= 0, "a number at least 0"),
                ("top_p", _number(self.top_p) and 0 < self.top_p <= 1, "a number greater than 0 and at most 1"),
                ("top_k", _integer(self.top_k) and self.top_k >= 0, "an integer at least 0 (0: no limit)"),
                ("seed", self.seed is None or (_integer(self.seed) and self.seed >= 0),
                 "an integer at least 0")):
            if not ok:
                raise LiacError(name, f"must be {rule}, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def sequence_seed(seed: int, index: int) -> int:
    """The generator seed of sequence `index` under `seed` (independent streams, not seed + index)."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0] & (2**63 - 1))


def warp(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row temperature, top-k, top-p (HF's order) → (probabilities sorted descending [B, V], their token ids).

    Args:
        logits: [B, V] (any float dtype; computed in float32).
        temperature: [B], greater than 0. top_k: [B] int, 0 for no limit. top_p: [B] in (0, 1].
    """
    scaled = logits.float() / temperature[:, None]
    ordered, order = scaled.sort(dim=-1, descending=True)                      # [B, V]
    rank = torch.arange(ordered.shape[-1], device=logits.device)
    limit = torch.where(top_k > 0, top_k, ordered.shape[-1])
    ordered = ordered.masked_fill(rank[None, :] >= limit[:, None], float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    before = probs.cumsum(-1) - probs                                          # mass of the more probable tokens
    probs = probs.masked_fill(before >= top_p[:, None], 0.0)                   # the most probable always stays
    return probs / probs.sum(-1, keepdim=True), order


def draw(probs: torch.Tensor, order: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: rows of `probs` [B, V] (as `warp` returns them) at `uniform` [B] in [0, 1) → ids [B]."""
    cdf = probs.cumsum(-1)
    at = torch.searchsorted(cdf, (uniform.to(cdf) * cdf[:, -1])[:, None], right=True)
    return order.gather(-1, at.clamp_(max=probs.shape[-1] - 1))[:, 0]


def generator_for(params: SamplingParams, index: int = 0) -> torch.Generator:
    """The generator of sequence `index` of a batch sampled with `params` (its seed, or a fresh random one)."""
    seed = int(torch.randint(0, 2**62, ()).item()) if params.seed is None else params.seed
    return torch.Generator().manual_seed(sequence_seed(seed, index))


class Sampler:
    """The token choice of one batch: one SamplingParams and (for sampled rows) one generator per sequence."""

    def __init__(self, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None] | None = None):
        """`generators`: one per sequence (None for greedy ones), kept by a caller whose sequences outlive the
        batch (the continuous batcher: a sequence's draws go on from its own generator whatever shares its step);
        default: fresh ones seeded from (seed, index) (`generator_for`)."""
        self.params = tuple(params)
        self.sampled = [index for index, p in enumerate(self.params) if not p.greedy]
        self.generators = {}
        for index in self.sampled:
            self.generators[index] = generators[index] if generators is not None else \
                generator_for(self.params[index], index)
        self._tensors: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    @property
    def greedy(self) -> bool:
        return not self.sampled

    def _rows(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self._tensors:
            chosen = [self.params[i] for i in self.sampled]
            self._tensors[device] = (
                torch.tensor(self.sampled, device=device),
                torch.tensor([p.temperature for p in chosen], dtype=torch.float32, device=device),
                torch.tensor([p.top_k for p in chosen], device=device),
                torch.tensor([p.top_p for p in chosen], dtype=torch.float32, device=device))
        return self._tensors[device]

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, V] → next token ids [B, 1] (int64, on the logits' device)."""
        chosen = logits.argmax(-1)
        if self.sampled:
            rows, temperature, top_k, top_p = self._rows(logits.device)
            probs, order = warp(logits[rows], temperature, top_k, top_p)
            uniform = torch.stack([torch.rand((), generator=self.generators[i]) for i in self.sampled])
            chosen[rows] = draw(probs, order, uniform.to(logits.device))
        return chosen[:, None]
