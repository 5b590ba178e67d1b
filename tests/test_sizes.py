"""liac/sizes.py: the byte units and the element count every part of liac uses."""

from __future__ import annotations

from liac.sizes import GB, GIB, MIB, format_gib, numel


def test_units_and_numel():
    assert (GB, GIB, MIB) == (10**9, 2**30, 2**20)
    assert numel((3, 4, 5)) == 60 and numel(()) == 1 and numel([7]) == 7
    assert isinstance(numel((2, 3)), int)


def test_format_gib_switches_to_mib_below_one_gib():
    assert format_gib(24 * GIB) == "24.0 GiB" and format_gib(GIB) == "1.0 GiB"
    assert format_gib(512 * MIB) == "512.0 MiB" and format_gib(-3 * MIB) == "-3.0 MiB"
