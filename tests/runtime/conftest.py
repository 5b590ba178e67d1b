"""Fixtures for the runtime tests: tiny HF checkpoints, saved once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # runtime_plans.py sits beside the tests

import torch  # noqa: E402
from runtime_plans import (FAMILIES, MOE_SHAPES, NEW_TOKENS, PROMPT, hf_greedy, hf_model_class,  # noqa: E402
                           save_hf_checkpoint, save_text_checkpoint)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """family → (checkpoint directory, ModelConfig), each a random HF model saved as fp32 safetensors."""
    root = tmp_path_factory.mktemp("hf")
    made = {}

    def get(family: str):
        if family not in made:
            directory = root / family
            made[family] = (directory, save_hf_checkpoint(family, directory,
                                                          seed=(FAMILIES + tuple(MOE_SHAPES)).index(family)))
        return made[family]

    return get


@pytest.fixture(scope="session")
def text_checkpoint(tmp_path_factory):
    """(directory, ModelConfig, HF fp32 model, tokenizer): a random 2-layer Llama over a BPE tokenizer trained with
    the `tokenizers` library, saved with its tokenizer files."""
    from liac.runtime.text import load_tokenizer

    directory = tmp_path_factory.mktemp("text") / "tiny-text"
    cfg, model = save_text_checkpoint(directory)
    return directory, cfg, model, load_tokenizer(directory)


@pytest.fixture(scope="session")
def reference(checkpoints):
    """family → (HF fp32 model, HF bf16 models, greedy tokens, their logits) for PROMPT, computed once per family.
    The bf16 models are HF's two attention implementations, SDPA (fused) and eager (softmax probabilities rounded
    to bf16 before p·V, as a plan that runs score and context apart does).

    HF's own forward pass over the whole sequence at every step (no KV cache): it shares nothing with the
    runtime's incremental decode."""
    cache = {}

    def get(family: str):
        if family not in cache:
            directory, _ = checkpoints(family)
            fp32 = hf_model_class(family).from_pretrained(directory, dtype=torch.float32).eval()
            bf16 = tuple(hf_model_class(family).from_pretrained(directory, dtype=torch.bfloat16,
                                                                attn_implementation=impl).eval()
                         for impl in ("sdpa", "eager"))
            cache[family] = (fp32, bf16, *hf_greedy(fp32, PROMPT, NEW_TOKENS))
        return cache[family]

    return get
