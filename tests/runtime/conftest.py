"""Fixtures for the runtime tests: tiny HF checkpoints, saved once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # runtime_plans.py sits beside the tests

from runtime_plans import FAMILIES, save_hf_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """family → (checkpoint directory, ModelConfig), each a random HF model saved as fp32 safetensors."""
    root = tmp_path_factory.mktemp("hf")
    made = {}

    def get(family: str):
        if family not in made:
            directory = root / family
            made[family] = (directory, save_hf_checkpoint(family, directory, seed=FAMILIES.index(family)))
        return made[family]

    return get

