"""Weights into their tiers: a HF safetensors checkpoint, tensor by tensor, or seeded random values.

    ckpt = Checkpoint.open("ckpts/opt-1.3b")        # config.json + *.safetensors (sharded index too)
    ckpt.config()                                   # ModelConfig, for the plan's config hash
    ckpt.check(expected)                            # every tensor present, shapes right, files complete
    load_checkpoint(ckpt, store, cfg)               # safe_open, one tensor (or row chunk) at a time

Nothing is read into RAM as a whole model: each destination tensor already sits in its tier's arena (HBM, pinned
DDR, CXL) and is filled from the memory-mapped file chunk by chunk. Before any allocation, `check` reads only the
safetensors headers (8-byte length + JSON), so a missing tensor, a wrong shape or a truncated file is one clear
error, not a crash half way through loading.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from liac.errors import LiacError, brief
from liac.fileio import inside, load_json, parse_json
from liac.models import family_module
from liac.models.config import ModelConfig, from_hf_config
from liac.sizes import numel

__all__ = ["Checkpoint", "RandomWeights", "WeightStore", "load_checkpoint", "fill_random", "Progress",
           "CHUNK_BYTES"]

CHUNK_BYTES = 64 * 2**20  # rows per copy: bounds the RAM a single huge tensor (embedding) needs while loading
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


@dataclass(frozen=True)
class RandomWeights:
    """Seeded random weights: N(0, 0.02²) everywhere, 1 + N(0, 0.02²) for norm scales."""

    seed: int


@dataclass(frozen=True)
class _Entry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    nbytes: int  # end - begin of its data_offsets


class Progress:
    """A progress bar (tqdm) on stderr over bytes, when enabled: `lia-run` enables it when stderr is a terminal."""

    def __init__(self, label: str, total_bytes: int, enabled: bool = True):
        self.done = 0
        self.bar = tqdm(total=max(total_bytes, 1), desc=f"lia-run: {label}", unit="B", unit_scale=True,
                        unit_divisor=1024, file=sys.stderr, disable=not enabled, dynamic_ncols=True,
                        mininterval=0.1 if sys.stderr.isatty() else 10.0)  # a log file gets a line per 10 s

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        self.bar.update(nbytes)
        if self.done >= self.bar.total:
            self.bar.close()


class WeightStore:
    """Every parameter's tensor in every tier the plan puts a copy in: (canonical name, tier) → tensor. A copy may
    hold only some rows of its parameter (an MoE layer's experts split between HBM and DDR): `first_row` says which
    row of the parameter its row 0 is."""

    def __init__(self):
        self.tensors: dict[tuple[str, str], torch.Tensor] = {}
        self.first_rows: dict[tuple[str, str], int] = {}
        self.numels: dict[str, int] = {}  # the whole parameter's elements
        self._by_name: dict[str, list[tuple[torch.Tensor, int]]] = {}

    def add(self, canonical: str, tier: str, tensor: torch.Tensor, first_row: int = 0,
            rows: int | None = None) -> None:
        """`tensor` holds rows [first_row, first_row + len) of a parameter of `rows` rows (default: all of it)."""
        self.tensors[(canonical, tier)] = tensor
        self.first_rows[(canonical, tier)] = first_row
        self._by_name.setdefault(canonical, []).append((tensor, first_row))
        per_row = tensor[0].numel() if tensor.dim() and tensor.shape[0] else 1
        self.numels[canonical] = tensor.numel() if rows is None else rows * per_row

    def __call__(self, canonical: str, tier: str) -> torch.Tensor:
        return self.tensors[(canonical, tier)]

    def first_row(self, canonical: str, tier: str) -> int:
        return self.first_rows[(canonical, tier)]

    def copies(self, canonical: str) -> list[torch.Tensor]:
        return [tensor for tensor, _ in self._by_name[canonical]]

    def placed_copies(self, canonical: str) -> list[tuple[torch.Tensor, int]]:
        """Every copy with the parameter row its row 0 is."""
        return self._by_name[canonical]

    def names(self) -> list[str]:
        return sorted(self._by_name)


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints


MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the JSON header


def _read_header(path: Path) -> dict[str, _Entry]:
    """A safetensors file's header → its tensors, each checked: a dict of {dtype, shape, data_offsets} whose data
    lies inside the file."""
    source = str(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise LiacError(source, f"truncated: a safetensors file must start with an 8-byte header length, "
                                        f"the file has {size} bytes")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES:
                raise LiacError(source, f"not a safetensors file: its header length {length} is over "
                                        f"{MAX_HEADER_BYTES} bytes")
            if 8 + length > size:
                raise LiacError(source, f"truncated: the header needs {8 + length} bytes, the file has {size}")
            raw = handle.read(length)
    except OSError as e:
        raise LiacError(source, f"cannot read: {e.strerror or e}") from e
    try:
        header = parse_json(raw, source)
    except LiacError as e:
        raise LiacError(source, f"not a safetensors file: its header is {e.message}") from e
    if not isinstance(header, dict):
        raise LiacError(source, f"not a safetensors file: its header must be a JSON object, got "
                                f"{type(header).__name__}")
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            dtype, shape = info["dtype"], tuple(info["shape"])
            ok = (isinstance(dtype, str) and all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**48
                                                 for s in shape)
                  and all(isinstance(o, int) and not isinstance(o, bool) for o in (begin, end))
                  and 0 <= begin <= end)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise LiacError(source, f"tensor {brief(name)} has a malformed header entry: must be "
                                    "{dtype, shape: [non-negative integers], data_offsets: [begin, end]}")
        if 8 + length + end > size:
            raise LiacError(source, f"truncated: tensor {brief(name)} ends at byte {8 + length + end}, the file has "
                                    f"{size} bytes")
        entries[name] = _Entry(path, dtype, shape, end - begin)
    return entries


class Checkpoint:
    """A HF checkpoint directory: config.json and one or more .safetensors files (with or without an index)."""

    def __init__(self, directory: Path, entries: dict[str, _Entry]):
        self.directory = directory
        self.entries = entries
        self._handles: dict[Path, object] = {}

    @classmethod
    def open(cls, directory: str | Path) -> "Checkpoint":
        directory = Path(directory)
        if not directory.is_dir():
            raise LiacError(str(directory), "must be a checkpoint directory (config.json and *.safetensors)")
        index = directory / "model.safetensors.index.json"
        if index.is_file():
            doc = load_json(index)
            weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
            if not isinstance(weight_map, dict):
                raise LiacError(str(index), "must be a JSON object whose 'weight_map' maps tensor names to file names",
                                path="weight_map")
            # Names from the index stay inside the checkpoint directory (liac.fileio.inside).
            files = sorted({inside(directory, name, str(index), f"weight_map.{brief(tensor, 60, quote=False)}")
                            for tensor, name in weight_map.items()})
        else:
            files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise LiacError(str(directory), "holds no .safetensors files (pickle checkpoints are not loaded)")
        entries: dict[str, _Entry] = {}
        for path in files:
            if not path.is_file():
                raise LiacError(str(index), f"names {brief(path.name)}, which does not exist")
            entries.update(_read_header(path))
        return cls(directory, entries)

    def config(self) -> ModelConfig:
        path = self.directory / "config.json"
        return from_hf_config(load_json(path), name=self.directory.name, source=str(path))

    def _find(self, name: str) -> str | None:
        if name in self.entries:
            return name
        # Some OPT checkpoints drop the 'model.' prefix (HF's base_model_prefix).
        bare = name[len("model."):] if name.startswith("model.") else None
        return bare if bare in self.entries else None

    def check(self, expected: dict[str, tuple[int, ...]], cfg: ModelConfig) -> dict[str, list[str]]:
        """Verify every parameter's source tensors exist with the right shapes; return canonical → source names.

        Raises:
            LiacError: naming the checkpoint, the tensor and what was expected.
        """
        hf_names = family_module(cfg.family).hf_weight_names(cfg)
        sources = {}
        for canonical, shape in expected.items():
            parts = []
            for hf_name in hf_names[canonical]:
                found = self._find(hf_name)
                if found is None:
                    raise LiacError(str(self.directory), f"tensor '{hf_name}' is missing (needed for '{canonical}')")
                entry = self.entries[found]
                if entry.dtype not in _DTYPES:
                    raise LiacError(str(entry.file), f"tensor '{found}' has dtype {brief(entry.dtype)}: must be one "
                                    "of " + ", ".join(f"'{d}'" for d in _DTYPES))
                itemsize = _DTYPES[entry.dtype].itemsize
                if entry.nbytes != numel(entry.shape) * itemsize:
                    raise LiacError(str(entry.file), f"tensor '{found}' has {entry.nbytes} bytes of data: its shape "
                                    f"{list(entry.shape)} in {entry.dtype} needs {numel(entry.shape) * itemsize}")
                parts.append(found)
            if any(not self.entries[p].shape for p in parts):
                raise LiacError(str(self.entries[parts[0]].file), f"tensor '{parts[0]}' is a scalar: must have shape "
                                f"{list(shape)} for '{canonical}'")
            rows = sum(self.entries[p].shape[0] for p in parts)
            tails = {self.entries[p].shape[1:] for p in parts}
            if len(tails) != 1 or (rows,) + tails.pop() not in (tuple(shape), _as_rows_shape(shape)):
                got = " + ".join(str(list(self.entries[p].shape)) for p in parts)
                raise LiacError(str(self.entries[parts[0]].file), f"tensor '{parts[0]}' has shape {got}: must be "
                                f"{list(shape)} for '{canonical}'" if len(parts) == 1 else
                                f"tensors {', '.join(repr(p) for p in parts)} have shapes {got}: stacked they must "
                                f"be {list(shape)} for '{canonical}'")
            sources[canonical] = parts
        return sources

    def read_rows(self, name: str, first: int, count: int) -> torch.Tensor:
        from safetensors import safe_open  # late import: the optional 'hf' extra, needed for checkpoints only

        entry = self.entries[name]
        handle = self._handles.get(entry.file)
        if handle is None:
            try:
                handle = safe_open(str(entry.file), framework="pt")
            except Exception as e:  # SafetensorError and OSError: a broken file is the user's problem
                raise LiacError(str(entry.file), f"cannot open: {' '.join(str(e).split())}") from e
            self._handles[entry.file] = handle
        return handle.get_slice(name)[first:first + count]

    def close(self) -> None:
        self._handles.clear()


def _as_rows_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A stacked parameter [E, R, C] as the rows its checkpoint tensors concatenate into: [E·R, C]."""
    return (numel(shape[:-1]), shape[-1]) if len(shape) > 2 else tuple(shape)


def _as_rows(tensor: torch.Tensor, first_row: int) -> tuple[torch.Tensor, int]:
    """A copy as 2-D rows (a stacked [n, R, C] copy as [n·R, C]) and the first of the parameter's rows it holds."""
    if tensor.dim() <= 2:
        return tensor, first_row
    per = numel(tensor.shape[1:-1])
    return tensor.reshape(-1, tensor.shape[-1]), first_row * per


def load_checkpoint(ckpt: Checkpoint, sources: dict[str, list[str]], store: WeightStore,
                    progress: Progress) -> None:
    """Fill every tier copy of every parameter from its source tensors (stacked along dim 0), chunk by chunk."""
    for canonical, parts in sources.items():
        targets = [_as_rows(tensor, first) for tensor, first in store.placed_copies(canonical)]
        row = 0
        for part in parts:
            shape = ckpt.entries[part].shape
            row_bytes = max(1, numel(shape[1:]) * targets[0][0].element_size())
            step = max(1, CHUNK_BYTES // row_bytes)
            for first in range(0, shape[0], step):
                count = min(step, shape[0] - first)
                chunk = None
                for target, target_first in targets:  # the rows of [row + first, + count) this copy holds
                    low = max(row + first, target_first)
                    high = min(row + first + count, target_first + target.shape[0])
                    if low >= high:
                        continue
                    chunk = ckpt.read_rows(part, first, count) if chunk is None else chunk
                    target[low - target_first:high - target_first].copy_(chunk[low - row - first:high - row - first])
                    progress.advance((high - low) * row_bytes)
            row += shape[0]
    ckpt.close()



def _seed(seed: int, canonical: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{canonical}".encode()).digest()[:8], "little") & (2**63 - 1)


def fill_random(store: WeightStore, seed: int, device: torch.device, progress: Progress) -> None:
    """Seeded values generated on `device` (the GPU when there is one) in chunks, copied into every tier copy.

    The values depend on (seed, parameter name, device type) only, never on the plan: two plans over the same
    seed run the same model.
    """
    names = store.names()
    for canonical in names:
        targets = store.placed_copies(canonical)
        # each copy's place in the parameter's flat values: a copy of some rows holds [start, start + numel)
        flat = [(t.view(-1), first_row * (t[0].numel() if t.dim() else 1)) for t, first_row in targets]
        generator = torch.Generator(device=device).manual_seed(_seed(seed, canonical))
        norm_scale = ".norm.weight" in canonical  # LayerNorm / RMSNorm scales sit around 1
        total = store.numels[canonical]  # chunks as for the whole parameter: the same values in every copy
        step = max(1, CHUNK_BYTES // 4)
        for first in range(0, total, step):
            count = min(step, total - first)
            chunk = torch.randn(count, generator=generator, device=device, dtype=torch.float32).mul_(0.02)
            if norm_scale:
                chunk.add_(1.0)
            # Cast where generated (torch would cast a GPU → host copy on the host, through a pageable fp32
            # buffer); into page-locked memory the copy is then a queued DMA (the caching allocator keeps `chunk`
            # alive for it on the stream). Same rounding either way: same values.
            chunk = chunk.to(flat[0][0].dtype)
            for values, start in flat:
                low, high = max(first, start), min(first + count, start + values.numel())
                if low < high:
                    values[low - start:high - start].copy_(chunk[low - first:high - first],
                                                           non_blocking=values.is_pinned() or values.is_cuda)
                    progress.advance((high - low) * values.element_size())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
