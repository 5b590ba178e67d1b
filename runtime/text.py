"""Text in, text out: the checkpoint's own tokenizer (transformers' AutoTokenizer), prompts → token ids → text.

    tokenizer = load_tokenizer("ckpts/opt-1.3b")               # from tokenizer.json / tokenizer_config.json there
    rows = encode_prompts(tokenizer, ["Hello", "Hi there"])    # token id lists, special tokens as the model expects
    rows = encode_prompts(tokenizer, ["Hello"], chat=True)     # through the checkpoint's chat template
    stop = eos_token_ids(tokenizer, "ckpts/opt-1.3b")          # the tokenizer's EOS and generation_config.json's
    text = decode(tokenizer, token_ids)                        # special tokens (EOS, padding) left out

Nothing is downloaded: the tokenizer is read from the checkpoint directory only (`local_files_only`). Where a
tokenizer has no padding token, padding uses its EOS token, as HF generate does; padded slots are masked anyway.
`TokenizerSource` is an engine's tokenizer: given, or loaded from the checkpoint on first use (token ids alone
never need transformers).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Sequence

from liac.errors import LiacError
from liac.fileio import load_json

# The files transformers may open in a checkpoint directory for its tokenizer (and the generation config liac reads):
# each must be a regular file, so a FIFO or a device planted under one of these names cannot block the run.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                   "chat_template.jinja", "chat_template.json", "tokenizer.tiktoken", "config.json",
                   "generation_config.json")

__all__ = ["TOKENIZER_FILES", "load_tokenizer", "encode_prompts", "eos_token_ids", "pad_token_id", "decode", "is_batch_encoding",
           "TokenizerSource"]


def _transformers(what: str):
    try:
        import transformers  # late import: seconds to import, and only text prompts need it
    except ImportError as e:
        raise LiacError(what, "needs the 'transformers' package, a dependency of liac that is missing here: "
                              "pip install transformers") from e
    return transformers


def load_tokenizer(directory: str | os.PathLike):
    """The tokenizer saved in a checkpoint directory, padding on the left.

    Raises:
        LiacError: transformers is missing, or the directory holds no tokenizer it can load.
    """
    directory = Path(directory)
    transformers = _transformers(str(directory))
    if not directory.is_dir():
        raise LiacError(str(directory), "must be a checkpoint directory holding the model's tokenizer files")
    for name in TOKENIZER_FILES:
        path = directory / name
        if (path.exists() or path.is_symlink()) and not path.is_file():
            raise LiacError(str(path), "must be a regular file (the tokenizer is read from it)")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
        reason = " ".join(str(e).split())[:300]
        raise LiacError(str(directory), f"holds no tokenizer transformers can load (tokenizer.json or "
                                        f"tokenizer_config.json and its vocabulary files): {reason}") from e
    tokenizer.padding_side = "left"
    return tokenizer


def pad_token_id(tokenizer) -> int:
    """The id padded slots get: the tokenizer's padding token, else its EOS, else 0 (they are masked anyway)."""
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(value, int):
            return value
    return 0


def encode_prompts(tokenizer, prompts: Sequence[str], chat: bool = False, source: str = "prompt") -> list[list[int]]:
    """Prompts → token id lists (special tokens as the tokenizer adds them; with `chat`, each prompt becomes one
    user message through the checkpoint's chat template, with the assistant's turn opened)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise LiacError(source, "must be a string or a non-empty list of strings")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise LiacError(source, "--chat needs a chat template, and this checkpoint's tokenizer has none "
                                    "(tokenizer_config.json 'chat_template', or chat_template.jinja)")
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True) for p in prompts]
        rows = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    else:
        rows = [tokenizer(p)["input_ids"] for p in prompts]
    for index, row in enumerate(rows):
        if not row:
            raise LiacError(source, f"prompt {index} is empty: it must give at least one token")
    return rows


def eos_token_ids(tokenizer, directory: str | os.PathLike | None = None) -> tuple[int, ...]:
    """Token ids that end a sequence: the tokenizer's EOS and those of the checkpoint's generation_config.json
    (Llama 3 lists several), in that order, without repeats."""
    ids = []
    if isinstance(getattr(tokenizer, "eos_token_id", None), int):
        ids.append(tokenizer.eos_token_id)
    if directory is not None:
        path = Path(directory) / "generation_config.json"
        try:  # through liac.fileio: a regular file, bounded, no NaN
            value = load_json(path, str(path)).get("eos_token_id") if path.is_file() else None
        except (LiacError, AttributeError):
            value = None
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and not isinstance(item, bool):
                ids.append(item)
    return tuple(dict.fromkeys(ids))


def decode(tokenizer, token_ids: Sequence[int]) -> str:
    """Token ids → text, special tokens (EOS, padding) left out."""
    return tokenizer.decode(list(token_ids), skip_special_tokens=True)


def is_batch_encoding(value) -> bool:
    """A tokenizer's output (transformers.BatchEncoding or a plain dict with 'input_ids')."""
    return isinstance(value, Mapping) and "input_ids" in value


class TokenizerSource:
    """The tokenizer of an engine: given (an object or the directory it is saved in), or loaded on first use from
    the checkpoint directory, whose generation_config.json also names EOS tokens."""

    def __init__(self, tokenizer=None, checkpoint: Path | None = None):
        given = isinstance(tokenizer, (str, os.PathLike))
        self.directory = Path(tokenizer) if given else checkpoint
        self.checkpoint = checkpoint
        self._tokenizer = None if given else tokenizer
        self._missing = False

    def tokenizer(self):
        if self._tokenizer is None:
            if self.directory is None:
                raise LiacError("prompt", "text needs a tokenizer: load the engine from a checkpoint directory that "
                                          "holds one, or pass Engine.from_plan(..., tokenizer=...)")
            self._tokenizer = load_tokenizer(self.directory)
        return self._tokenizer

    def available(self) -> bool:
        """Whether there is a tokenizer (loading it once if need be)."""
        if self._tokenizer is None and self.directory is not None and not self._missing:
            try:
                self.tokenizer()
            except LiacError:
                self._missing = True
        return self._tokenizer is not None

    def eos_ids(self) -> tuple[int, ...]:
        return eos_token_ids(self.tokenizer(), self.checkpoint or self.directory)

    def pad_id(self) -> int:
        """The tokenizer's padding id when there is a tokenizer; 0 otherwise (padded slots are masked)."""
        return pad_token_id(self._tokenizer) if self.available() else 0
