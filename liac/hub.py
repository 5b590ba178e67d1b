"""Models named as users name them: a Hugging Face repo id (`facebook/opt-30b`) → files in the Hugging Face cache.

`liac compile` and `liac inspect` need only a repo's `config.json` (`hub_config`); `lia-run --weights` needs the
checkpoint: config, safetensors and tokenizer files, never pickles (`resolve_checkpoint`). Both go through
huggingface_hub's own cache (`HF_HOME`, `HF_HUB_CACHE`), so a model any HF tool downloaded before is found again
without a download, and both honour `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`), read when called: offline, only
the cache is read, and a repo that is not there is one line saying so. Every failure is a `LiacError`.

    from liac.hub import resolve_checkpoint
    directory = resolve_checkpoint("facebook/opt-125m")   # a local directory: config.json, *.safetensors, tokenizer

The runtime may import this module (it imports no pass); huggingface_hub is imported only when a repo id is used.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from liac.errors import LiacError

__all__ = ["CHECKPOINT_PATTERNS", "is_repo_id", "hub_offline", "hub_config", "hub_checkpoint",
           "resolve_checkpoint"]

# What a checkpoint directory needs: config and generation config, safetensors weights and their index, and the
# tokenizer in any of its formats (tokenizer.json, sentencepiece .model, vocab/merges .txt, chat template .jinja).
CHECKPOINT_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
_TRUE = ("1", "on", "yes", "true")


def is_repo_id(text: str) -> bool:
    """'facebook/opt-30b' → True; a path with more parts, a bare name or '..' → False."""
    return bool(_REPO_ID.fullmatch(str(text))) and ".." not in str(text) and not str(text).endswith(".json")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, now or when huggingface_hub was imported."""
    if any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return True
    from huggingface_hub import constants  # late import: only a repo id needs the hub

    return bool(constants.HF_HUB_OFFLINE)


def _cache_dir() -> str:
    # late import: only a repo id needs the hub
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _hub_error(error: Exception, repo_id: str, source: str, what: str) -> LiacError:
    """A huggingface_hub exception → one line naming the repo, what was wanted and what to do."""
    # late import: only a repo id needs the hub
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    if hub_offline():
        return LiacError(source, f"'{repo_id}' ({what}) is not in the Hugging Face cache ({_cache_dir()}) and "
                                 f"HF_HUB_OFFLINE is set: download it where there is a connection ('hf download "
                                 f"{repo_id}') or unset HF_HUB_OFFLINE")
    if isinstance(error, GatedRepoError):
        return LiacError(source, f"'{repo_id}' is gated: accept its terms on huggingface.co and log in "
                                 f"('hf auth login')")
    if isinstance(error, RepositoryNotFoundError):
        return LiacError(source, f"no Hugging Face repo '{repo_id}' (if it is private, log in with 'hf auth "
                                 f"login')")
    if isinstance(error, RevisionNotFoundError):
        return LiacError(source, f"'{repo_id}' has no such revision")
    if isinstance(error, LocalEntryNotFoundError):
        return LiacError(source, f"cannot reach the Hugging Face Hub and '{repo_id}' ({what}) is not in the cache "
                                 f"({_cache_dir()}): check the connection")
    if isinstance(error, EntryNotFoundError):
        return LiacError(source, f"Hugging Face repo '{repo_id}' has no {what}")
    first = " ".join(str(error).split())[:300]
    return LiacError(source, f"cannot fetch {what} of '{repo_id}' from the Hugging Face Hub: {first}")


def hub_config(repo_id: str, source: str = "--model") -> Path:
    """The repo's config.json in the Hugging Face cache (downloaded alone when missing and online).

    Raises:
        LiacError: offline and not cached, no such repo, gated, no config.json, or the Hub unreachable.
    """
    # late import: only a repo id needs the hub
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, "config.json", local_files_only=hub_offline()))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        raise _hub_error(e, repo_id, source, "config.json") from e


def hub_checkpoint(repo_id: str, source: str = "--weights") -> Path:
    """The repo's checkpoint as a local directory of the Hugging Face cache: every file matching
    `CHECKPOINT_PATTERNS` (downloaded when missing and online; huggingface_hub shows its own progress bars).

    Raises:
        LiacError: as `hub_config`, or the cached snapshot holds no safetensors weights.
    """
    # late import: only a repo id needs the hub
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        directory = Path(snapshot_download(repo_id, allow_patterns=list(CHECKPOINT_PATTERNS),
                                           local_files_only=hub_offline()))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        raise _hub_error(e, repo_id, source, "checkpoint") from e
    if not any(directory.glob("*.safetensors")):
        why = (" and HF_HUB_OFFLINE is set: download it where there is a connection ('hf download "
               f"{repo_id}') or unset HF_HUB_OFFLINE") if hub_offline() else " (pickle checkpoints are not loaded)"
        raise LiacError(source, f"'{repo_id}' in the Hugging Face cache ({directory}) holds no .safetensors "
                                f"weights{why}")
    return directory


def resolve_checkpoint(spec: str | os.PathLike, source: str = "--weights") -> Path:
    """A checkpoint directory, or a Hugging Face repo id resolved through the cache → a local directory.

    A local directory wins over a repo id of the same spelling, as in transformers' `from_pretrained`.

    Raises:
        LiacError: neither an existing directory nor a repo id, or the repo cannot be had (see `hub_checkpoint`).
    """
    path = Path(spec)
    if path.is_dir():
        return path
    if is_repo_id(str(spec)):
        return hub_checkpoint(str(spec), source)
    raise LiacError(source, f"must be a checkpoint directory or a Hugging Face repo id like 'facebook/opt-125m', "
                            f"got '{spec}'")
