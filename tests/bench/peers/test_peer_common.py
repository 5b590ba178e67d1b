"""bench/peers/peer_common.py: flags, OPT shapes, token ids, and the result record (numbers kept on failure)."""

import argparse
import json

import pytest

import peer_common as pc


def test_positive_numbers_reject_zero_negative_and_text():
    assert pc.positive_int("8") == 8
    assert pc.positive_float("1.5") == 1.5
    for bad in ("0", "-3", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a positive integer"):
            pc.positive_int(bad)
    for bad in ("0", "-1", "nan", "inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a positive number"):
            pc.positive_float(bad)


def test_base_parser_usage_errors_exit_2(capsys):
    parser = pc.base_parser("peer", "test", gen_len_default=4)
    args = parser.parse_args(["--batch", "8", "--gpu-budget-gib", "24"])
    assert (args.batch, args.prompt_len, args.gen_len, args.gpu_budget_gib) == (8, 128, 4, 24.0)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--batch", "0"])
    assert info.value.code == 2
    assert "--batch: must be a positive integer, got '0'" in capsys.readouterr().err


def test_opt_shapes_from_the_zoo_and_param_count():
    shapes = pc.opt_shapes("opt-30b")
    assert (shapes.hidden_size, shapes.num_layers, shapes.num_heads, shapes.ffn_dim) == (7168, 48, 56, 28672)
    # Hand count: layer = 4h² + 4h (attention) + 2hF + F + h (MLP) + 4h (two norms); embeddings V·h and
    # (2048 + 2)·h (OPT's position offset of 2); final norm 2h.
    h, f = 7168, 28672
    layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
    assert shapes.params == 50272 * h + 2050 * h + 48 * layer + 2 * h == 29_974_540_288


def test_opt_shapes_refuses_other_families_and_unknown_names():
    with pytest.raises(ValueError, match="must be an OPT model"):
        pc.opt_shapes("llama-3.1-8b")
    with pytest.raises(ValueError, match="--model:.*unknown model"):
        pc.opt_shapes("opt-31b")


def test_random_token_ids_are_seeded_and_avoid_special_ids():
    ids = pc.random_token_ids(3, 50, 100, seed=7)
    assert len(ids) == 3 and all(len(row) == 50 for row in ids)
    assert all(3 <= t < 100 for row in ids for t in row)
    assert ids == pc.random_token_ids(3, 50, 100, seed=7)
    assert ids != pc.random_token_ids(3, 50, 100, seed=8)


def _args(tmp_path, **kw):
    values = dict(model="opt-1.3b", batch=4, prompt_len=16, gen_len=3, gpu_budget_gib=1.0,
                  json_out=str(tmp_path / "out" / "r.json"))
    values.update(kw)
    return argparse.Namespace(**values)


def test_result_times_memory_and_json_out(tmp_path, capsys):
    result = pc.PeerResult.start("peer", _args(tmp_path))
    result.set_times(0.5, [0.1, 0.3])
    result.set_memory({"peak_gpu_allocated_bytes": 2**29, "peak_gpu_reserved_bytes": 2**30 + 1})
    assert result["prefill_ms"] == 500.0
    assert result["decode_ms_per_token"] == pytest.approx(200.0)
    assert result["decode_steps"] == 2
    # 4 sequences × (1 prefill token + 2 decode tokens) in 0.9 s
    assert result["tokens_per_second"] == pytest.approx(12 / 0.9)
    assert result["within_budget"] is False  # reserved is 1 byte over 1 GiB
    assert result.finish() == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    printed = json.loads(line)
    assert printed == json.loads((tmp_path / "out" / "r.json").read_text())
    assert printed["error"] is None and printed["peer"] == "peer"


def test_guard_keeps_the_numbers_measured_before_a_failure(tmp_path, capsys):
    result = pc.PeerResult.start("peer", _args(tmp_path, json_out=None))
    with result.guard():
        result["prefill_ms"] = 12.0
        raise MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert result.finish() == 1
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["prefill_ms"] == 12.0
    assert printed["error"].startswith("MemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (at ")
