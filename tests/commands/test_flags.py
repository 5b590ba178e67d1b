"""The command line's small parsers (liac/commands/flags.py): each value, and one LiacError naming the flag."""

from __future__ import annotations

import pytest

from liac.commands.flags import parse_batches, parse_bytes, positive_int
from liac.errors import LiacError


def test_parse_batches():
    assert parse_batches("1..256") == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert parse_batches("4..20") == (4, 8, 16)
    assert parse_batches("64,1,8,8") == (1, 8, 64)
    assert parse_batches(" 32 ") == (32,)
    for bad in ("0", "x", "8..4", "3..16", "1,,2", "-1", "1.5", "0..8"):
        with pytest.raises(LiacError) as info:
            parse_batches(bad)
        assert info.value.source == "--batch"


def test_parse_bytes():
    assert parse_bytes("24GiB", "--gpu-mem") == 24 * 2**30
    assert parse_bytes("24GB", "--gpu-mem") == 24 * 10**9
    assert parse_bytes("512MiB", "--gpu-mem") == 512 * 2**20
    assert parse_bytes("1.5TiB", "--cpu-mem") == int(1.5 * 2**40)
    assert parse_bytes("1000B", "--cpu-mem") == 1000
    assert parse_bytes("0", "--cxl-mem") == 0
    assert parse_bytes("0.0", "--cxl-mem") == 0
    for bad in ("24 parsecs", "GiB", "-1GiB", "1e9", "24", "1000", "1.5"):  # a number without a unit is refused
        with pytest.raises(LiacError) as info:
            parse_bytes(bad, "--gpu-mem")
        assert info.value.line() == (f"--gpu-mem: must be a size with a unit, like '24GiB', '24GB' or '512MiB' "
                                     f"(or 0), got '{bad}'")


def test_positive_int():
    assert positive_int(" 8 ", "--batch") == 8
    for text in ("0", "-3", "x", "1.5", ""):
        with pytest.raises(LiacError, match="must be a positive integer") as info:
            positive_int(text, "--batch")
        assert info.value.source == "--batch"
