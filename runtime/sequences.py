"""Per-sequence state of a batch: prompts of different lengths, left-padded, and when each sequence stops.

    batch = PromptBatch.from_lists([[5, 6, 7], [8]], pad_id=0)    # ids [[5, 6, 7], [0, 0, 8]], pad [0, 2]
    stops = StopState(batch.size, eos_ids=(2,), pad_id=0)          # EOS per sequence; finished rows get pad_id

A batch is left-padded, so every sequence's last prompt token sits in the same slot and the next token is read
from the same position. `pad[b]` says how many leading slots of sequence b are padding: its positions start after
them and attention never looks at them (`liac.models.layers.padded_causal_mask`). That one integer per sequence is
the whole padding state, in the KV cache too: slot s of sequence b holds its token s - pad[b].

`StopState` follows HF generate: once a sequence has produced an EOS token it is finished, and every later step
gives it `pad_id` instead of a sampled token (the step still runs for the others); the batch stops when all are
finished or at the token limit. `HostTokens` brings each step's tokens to the host for the stop check and for
streaming, a step late on a GPU so that the GPU never waits for the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from liac.errors import LiacError

__all__ = ["PromptBatch", "StopState", "HostTokens"]


@dataclass(frozen=True)
class PromptBatch:
    """Left-padded prompts: ids [B, P] int64 (host) and each sequence's leading pad slots [B]."""

    ids: torch.Tensor
    pad: torch.Tensor

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    @property
    def lengths(self) -> list[int]:
        """Real prompt tokens per sequence."""
        return [self.width - int(p) for p in self.pad]

    @property
    def padded(self) -> bool:
        return bool(self.pad.any())

    def rows(self) -> list[list[int]]:
        """Each prompt's real tokens."""
        return [row[int(p):] for row, p in zip(self.ids.tolist(), self.pad)]

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], pad_id: int = 0, source: str = "prompt") -> "PromptBatch":
        """Token id lists of any lengths (each at least one token) → left-padded with `pad_id`."""
        rows = [list(row) for row in rows]
        if not rows:
            raise LiacError(source, "must hold at least one prompt")
        for index, row in enumerate(rows):
            if not row:
                raise LiacError(source, f"prompt {index} is empty: each prompt must have at least one token")
        width = max(len(row) for row in rows)
        ids = torch.tensor([[pad_id] * (width - len(row)) + row for row in rows], dtype=torch.long)
        return cls(ids, torch.tensor([width - len(row) for row in rows], dtype=torch.long))

    @classmethod
    def from_tensor(cls, ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    pad_id: int = 0, source: str = "attention_mask") -> "PromptBatch":
        """ids [B, P] and an optional attention mask [B, P] (1: token, 0: padding; either side, e.g. a tokenizer's
        right padding) → left-padded."""
        if attention_mask is None:
            return cls(ids, torch.zeros(ids.shape[0], dtype=torch.long))
        mask = torch.as_tensor(attention_mask)
        if mask.shape != ids.shape:
            raise LiacError(source, f"must have the shape of input_ids {list(ids.shape)}, got {list(mask.shape)}")
        keep = mask.to(torch.bool)
        return cls.from_lists([row[m].tolist() for row, m in zip(ids, keep)], pad_id, source)


class StopState:
    """Which sequences have finished (EOS), and the tokens each produced; see the module docstring."""

    def __init__(self, batch: int, eos_ids: Sequence[int] = (), pad_id: int = 0):
        self.eos_ids = tuple(int(e) for e in eos_ids)
        self.pad_id = int(pad_id)
        self.batch = batch
        self._eos: dict[torch.device, torch.Tensor] = {}
        self.finished_on: torch.Tensor | None = None  # [B] bool, on the device the tokens are chosen on

    def apply(self, tokens: torch.Tensor) -> torch.Tensor:
        """On the device of `tokens` [B, 1] (no host sync): finished rows → pad_id; then mark rows that chose EOS."""
        if not self.eos_ids:
            return tokens
        device = tokens.device
        if device not in self._eos:
            self._eos[device] = torch.tensor(self.eos_ids, device=device)
        if self.finished_on is None or self.finished_on.device != device:
            self.finished_on = torch.zeros(self.batch, dtype=torch.bool, device=device)
        tokens = tokens.masked_fill(self.finished_on[:, None], self.pad_id)
        self.finished_on |= torch.isin(tokens[:, 0], self._eos[device])
        return tokens

    def lengths(self, token_ids: torch.Tensor) -> list[int]:
        """Tokens each sequence produced, its EOS included, from the host tokens [B, M]."""
        out = []
        for row in token_ids.tolist():
            at = next((i for i, t in enumerate(row) if t in self.eos_ids), None)
            out.append(len(row) if at is None else at + 1)
        return out

    def all_finished(self, token_ids: list[list[int]]) -> bool:
        """Whether every row of the host tokens so far holds an EOS."""
        return bool(self.eos_ids) and all(any(t in self.eos_ids for t in row) for row in token_ids)


@dataclass
class HostTokens:
    """Each step's tokens brought to the host without stalling the GPU (a copy into page-locked memory and an
    event), handed to the streamer / `on_step`, and the EOS bookkeeping the loop stops on."""

    backend: object               # liac.runtime.backend.Backend (its events)
    streamer: object
    on_step: Callable | None
    stops: StopState
    pending: list = field(default_factory=list)  # per step: (host tensor [B, 1], event)
    seen: int = 0
    finished: list = field(default_factory=list)
    done: bool = False

    def push(self, tokens: torch.Tensor) -> None:
        if tokens.device.type == "cpu":
            self.pending.append((tokens, None))
            return
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        event = self.backend.event()
        event.record()
        self.pending.append((host, event))

    def observe(self, upto: int) -> None:
        """Hand on the tokens of steps seen .. upto (waiting for each one's copy)."""
        eos = self.stops.eos_ids
        while self.seen <= upto and self.seen < len(self.pending):
            host, event = self.pending[self.seen]
            if event is not None:
                event.synchronize()
            row = host[:, 0].tolist()
            if not self.finished:
                self.finished = [False] * len(row)
            if self.streamer is not None and not self.finished[0]:
                self.streamer.put(torch.tensor(row[:1]))
            if self.on_step is not None:
                self.on_step(self.seen, row)
            self.finished = [f or (t in eos) for f, t in zip(self.finished, row)]
            self.done = bool(eos) and all(self.finished)
            self.seen += 1
