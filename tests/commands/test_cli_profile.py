"""`liac profile` (liac/commands/profile.py): the output must be a profile file (YAML), said before measuring."""

from __future__ import annotations

from liac.cli import main


def test_output_must_be_yaml(tmp_path, capsys):
    assert main(["profile", "--quick", "--no-gpu", "-o", str(tmp_path / "host.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"liac profile: --output: must end in '.yaml' or '.yml', got '{tmp_path / 'host.txt'}'"]


def test_the_gpu_footprint_is_measured_in_a_fresh_process_and_its_failure_is_one_line(tmp_path):
    """`liac profile` measures the footprint in a child process (liac/commands/profile.py); where that child fails
    (here: no CUDA, or a python that does not exist), the user gets one LiacError line naming what failed."""
    import pytest
    import torch

    from liac.commands.profile import measure_footprint_in_child
    from liac.errors import LiacError
    from liac.profile import resolve_profile

    profile = resolve_profile("h200-measured")
    if not torch.cuda.is_available():
        with pytest.raises(LiacError, match="measuring the GPU footprint in a fresh process failed: .*needs CUDA"):
            measure_footprint_in_child(profile)
    with pytest.raises((LiacError, OSError)):
        measure_footprint_in_child(profile, python=str(tmp_path / "no-such-python"))
