"""bench/amx_beside_dma.py: the probe of DMA beside a CPU GEMM (its GEMM half runs without a GPU)."""

from __future__ import annotations

import json

import amx_beside_dma


def test_without_cuda_it_times_the_gemms_alone(tmp_path, capsys):
    assert amx_beside_dma.main(["--out", str(tmp_path), "--seconds", "0.02", "--rotate-gib", "0.001",
                                "--shapes", "16:64:32,1:96:32"]) == 0
    result = json.loads((tmp_path / "amx_beside_dma.json").read_text())
    rows = result["rows"]
    assert [(r["m"], r["n"], r["k"]) for r in rows] == [(16, 64, 32), (1, 96, 32)]
    for row in rows:
        assert row["gemm_alone_ms"] > 0 and row["gflop"] == round(2 * row["m"] * row["n"] * row["k"] / 1e9, 3)
        if not result["cuda"]:
            assert "dma_share" not in row
    assert "16x   64x32" in capsys.readouterr().out


def test_bad_arguments_exit_2(tmp_path):
    assert amx_beside_dma.main(["--out", str(tmp_path), "--seconds", "0"]) == 2
