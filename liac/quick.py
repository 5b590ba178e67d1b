"""One call from a checkpoint directory to text: compile a plan for the request (or reuse a cached one), run it.

    from liac.quick import generate, load
    out = generate("ckpts/tiny-llama", "The GPU", max_new_tokens=24)             # this host; gpu_mem: all of it
    print(out.text[0], out.tokens_per_second)

    engine = load("facebook/opt-1.3b", gpu_mem="8GiB", batch=4)                # keep the model loaded
    engine.generate(["Hello", "Hi"], 64, temperature=0.7, seed=0).text

The plan is compiled with `liac.api.compile_plans` (the compiler) and run with `liac.runtime.Engine` (the
runtime): this module sits with the command line on top of both (docs/architecture.md, "What may import what");
the runtime itself never imports the compiler, and `import liac` imports neither. Plans are maxima, so the workload a plan is compiled for
is rounded up (batch and lengths to powers of two, at least 16 tokens) and one plan serves every request within
it. Compiled plans are kept in the user's cache directory (beside this host's profile: `~/.cache/liac/plans`, or
under `$XDG_CACHE_HOME`), named by a hash of everything else they depend on (the model's architecture hash,
the hardware profile's hash, the memory budgets, the solver and liac's version) and their workload; a request reuses
the cached plan of the same hash with the smallest batch that holds it.

The model is a checkpoint directory or a Hugging Face repo id (liac.hub: through the HF cache, `HF_HUB_OFFLINE`
honoured). Plans are for this host unless `hw` names another profile (liac.host: measured with a quick probe on
first use, said on stderr). Where no GPU budget is given, a host without CUDA gets a CPU-only plan (`gpu_mem=0`),
and a host with CUDA the profile's own GPU budget.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import platformdirs
import torch

import liac
from liac.api import compile_plans, write_plans
from liac.commands.flags import parse_bytes
from liac.errors import LiacError
from liac.host import host_profile
from liac.hub import resolve_checkpoint
from liac.models.config import from_hf_config
from liac.profile import HOST_PROFILE, HardwareProfile, resolve_profile
from liac.runtime import Engine
from liac.runtime.backend import EMULATE_ENV
from liac.runtime.engine import DTYPES
from liac.runtime.sequences import PromptBatch
from liac.runtime.text import encode_prompts, is_batch_encoding, load_tokenizer

__all__ = ["generate", "load", "plan_for", "cache_dir", "workload_bucket"]

_MIN_TOKENS = 16


def cache_dir() -> Path:
    """Where compiled plans are kept: `plans/` in the user's cache directory, beside this host's profile."""
    return platformdirs.user_cache_path("liac") / "plans"


def _model_dir(model: str | os.PathLike) -> Path:
    """A checkpoint directory, or a Hugging Face repo id resolved through the HF cache (liac.hub)."""
    path = resolve_checkpoint(model, source="model")
    if not (path / "config.json").is_file():
        raise LiacError(str(model), "must be a checkpoint directory holding config.json (and *.safetensors and the "
                                    "tokenizer files)")
    return path


def _pow2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def workload_bucket(batch: int, prompt_len: int, gen_len: int, max_position: int) -> tuple[int, int, int]:
    """The workload a plan is compiled for so that it also holds nearby requests: each size rounded up to a power of
    two (lengths to at least 16 tokens), as long as the context fits the model; else the request itself."""
    bucket = (_pow2(batch), _pow2(max(prompt_len, _MIN_TOKENS)), _pow2(max(gen_len, _MIN_TOKENS)))
    if bucket[1] + bucket[2] <= max_position:
        return bucket
    if prompt_len + _pow2(max(gen_len, _MIN_TOKENS)) <= max_position:
        return bucket[0], prompt_len, _pow2(max(gen_len, _MIN_TOKENS))
    return bucket[0], prompt_len, gen_len


def _budget(value, name: str) -> int | None:
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    return parse_bytes(str(value), name)


def plan_for(model: str | os.PathLike, *, batch: int = 1, prompt_len: int = 128, gen_len: int = 32, hw=None,
             gpu_mem: int | str | None = None, cpu_mem: int | str | None = None, solver: str = "auto",
             cache: str | os.PathLike | None = None) -> Path:
    """The plan file for this model, host and workload: from the cache, or compiled into it.

    Args:
        model: a checkpoint directory or a Hugging Face repo id (config.json; the weights only matter to `load` /
            `generate`).
        batch, prompt_len, gen_len: the request; the plan's workload is `workload_bucket` of it.
        hw: hardware profile name or file (default: this host's, liac.host).
        gpu_mem, cpu_mem: budgets, bytes or sizes like '24GiB' (gpu_mem default: 0 without CUDA, else the
            profile's).
        cache: the directory of cached plans (default `cache_dir()`).
    """

    directory = _model_dir(model)
    config_path = directory / "config.json"
    try:
        cfg = from_hf_config(json.loads(config_path.read_text()), name=directory.name, source=str(config_path))
    except (OSError, ValueError) as e:
        raise LiacError(str(config_path), f"cannot read the model's configuration: {e}") from e
    profile = _profile(hw)
    gpu = _budget(gpu_mem, "gpu_mem")
    if gpu is None and not _cuda():
        gpu = 0
    cpu = _budget(cpu_mem, "cpu_mem")
    key = {"liac": liac.__version__, "model": cfg.sha256(), "profile": profile.sha256(), "gpu_mem": gpu,
           "cpu_mem": cpu, "solver": solver}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(cache) if cache is not None else cache_dir()
    cached = _cached_plan(folder, digest, batch, prompt_len, gen_len)
    if cached is not None:
        return cached
    workload = workload_bucket(batch, prompt_len, gen_len, cfg.max_position)
    path = folder / f"{digest}.b{workload[0]}-p{workload[1]}-g{workload[2]}.{cfg.name}.{profile.name}.yaml"
    result = compile_plans(cfg, profile, batches=(workload[0],), prompt_len=workload[1], gen_len=workload[2],
                           gpu_mem=gpu, cpu_mem=cpu, solver=solver)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_plans(result, path)[0]


_CACHED = re.compile(r"(?P<digest>[0-9a-f]{16})\.b(?P<batch>\d+)-p(?P<prompt>\d+)-g(?P<gen>\d+)\..*\.yaml")


def _cached_plan(folder: Path, digest: str, batch: int, prompt_len: int, gen_len: int) -> Path | None:
    """A cached plan with the same inputs (`digest`) whose workload holds the request (plans are maxima): the one
    with the smallest batch, then the smallest context."""
    holding = []
    for path in folder.glob(f"{digest}.*.yaml") if folder.is_dir() else ():
        match = _CACHED.fullmatch(path.name)
        if match is None:
            continue
        b, p, g = (int(match.group(k)) for k in ("batch", "prompt", "gen"))
        if batch <= b and prompt_len <= p and prompt_len + gen_len <= p + g:
            holding.append(((b, p + g, path.name), path))
    return min(holding)[1] if holding else None


def _request_size(directory: Path, prompt, chat: bool) -> tuple[int, int]:
    """(prompts, tokens of the longest) of any prompt form Engine.generate takes."""
    if isinstance(prompt, str) or (isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], str)):
        rows = encode_prompts(load_tokenizer(directory), [prompt] if isinstance(prompt, str) else list(prompt), chat)
        batch = PromptBatch.from_lists(rows)
    elif is_batch_encoding(prompt):
        batch = PromptBatch.from_tensor(torch.as_tensor(prompt["input_ids"]), prompt.get("attention_mask"))
    elif isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], (list, tuple)):
        batch = PromptBatch.from_lists(prompt)
    else:
        ids = torch.as_tensor(prompt)
        batch = PromptBatch.from_tensor(ids[None] if ids.dim() == 1 else ids)
    return batch.size, batch.width


def _profile(hw):
    """The hardware profile: this host's (measured on first use, said on stderr) unless `hw` names another."""
    if isinstance(hw, HardwareProfile):
        return hw
    if hw in (None, HOST_PROFILE):
        return host_profile(say=lambda text: sys.stderr.write(f"liac: {text}\n"))
    return resolve_profile(hw, "hw")


def _cuda() -> bool:
    return torch.cuda.is_available()


def load(model: str | os.PathLike, *, batch: int = 1, prompt_len: int = 128, gen_len: int = 32, hw=None,
         gpu_mem: int | str | None = None, cpu_mem: int | str | None = None, dtype: str | None = None,
         emulate_gpu: bool | None = None, progress: bool = False, cache: str | os.PathLike | None = None):
    """An Engine for `model` whose plan holds `batch` prompts of `prompt_len` tokens and `gen_len` new tokens
    (compiled or from the cache); call `engine.generate(...)` as often as you like, `engine.close()` at the end.
    dtype: 'bfloat16' (the plan's, default), 'float16' or 'float32'."""
    if dtype is not None and dtype not in DTYPES:
        raise LiacError("dtype", f"unsupported value '{dtype}': must be one of " + ", ".join(f"'{d}'" for d in DTYPES))
    emulated = emulate_gpu if emulate_gpu is not None else os.environ.get(EMULATE_ENV, "") not in ("", "0")
    if _budget(gpu_mem, "gpu_mem") and not _cuda() and not emulated:
        raise LiacError("gpu_mem", f"must be 0 on this host: no CUDA device is available, got {gpu_mem!r} (leave "
                                   f"it out and the plan runs on the CPU)")
    plan = plan_for(model, batch=batch, prompt_len=prompt_len, gen_len=gen_len, hw=hw, gpu_mem=gpu_mem,
                    cpu_mem=cpu_mem, cache=cache)
    return Engine.from_plan(plan, _model_dir(model), emulate_gpu=emulate_gpu, progress=progress,
                            dtype=DTYPES[dtype] if dtype else None)


def generate(model: str | os.PathLike, prompt, max_new_tokens: int = 32, *, chat: bool = False,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None, hw=None,
             gpu_mem: int | str | None = None, cpu_mem: int | str | None = None, dtype: str | None = None,
             emulate_gpu: bool | None = None, progress: bool = False, cache: str | os.PathLike | None = None):
    """Compile (or reuse) a plan for this request, load the checkpoint, generate, free the engine.

    Args:
        model: a checkpoint directory with its tokenizer, or a Hugging Face repo id.
        prompt: a string or a list of strings (or token ids; see `Engine.generate`).
        max_new_tokens: at most this many new tokens per prompt (each stops at its EOS token).
        chat, temperature, top_p, top_k, seed: as `Engine.generate`.
        hw, gpu_mem, cpu_mem, cache: as `plan_for`. dtype: as `load`. emulate_gpu, progress: as
            `Engine.from_plan`.

    Returns:
        liac.runtime.Generation: `.text` (one string per prompt), `.token_ids`, `.prefill_seconds`,
        `.decode_seconds`, `.tokens_per_second`.
    """
    directory = _model_dir(model)
    batch, prompt_len = _request_size(directory, prompt, chat)
    with load(directory, batch=batch, prompt_len=prompt_len, gen_len=max_new_tokens, hw=hw, gpu_mem=gpu_mem,
              cpu_mem=cpu_mem, dtype=dtype, emulate_gpu=emulate_gpu, progress=progress, cache=cache) as engine:
        return engine.generate(prompt, max_new_tokens, chat=chat, temperature=temperature, top_p=top_p,
                               top_k=top_k, seed=seed)
