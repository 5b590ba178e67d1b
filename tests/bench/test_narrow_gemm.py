"""bench/narrow_gemm.py: F.linear timed by rows M and output features N (no assertion on speed)."""

from __future__ import annotations

import json

import narrow_gemm
import pytest


def test_measure_rows_are_consistent_shapes_and_rates():
    rows = narrow_gemm.measure(rows_m=(1, 128), features_n=(16, 48), inner_k=(64,), rotate_bytes=1 << 14, repeats=1)
    assert [(r["k"], r["n"], r["m"]) for r in rows] == [(64, 16, 1), (64, 16, 128), (64, 48, 1), (64, 48, 128)]
    for r in rows:
        assert r["seconds"] > 0
        assert r["tflops"] == pytest.approx(2.0 * r["m"] * r["n"] * r["k"] / r["seconds"] / 1e12)
        assert r["weight_gb_per_s"] == pytest.approx(r["n"] * r["k"] * 2 / r["seconds"] / 1e9)


def test_main_writes_json_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "narrow.json"
    assert narrow_gemm.main(["--quick", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 4 and data["threads"] >= 1
    text = capsys.readouterr().out
    assert "K = 256" in text and "N=64" in text and "M =   128" in text
