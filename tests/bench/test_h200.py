"""bench/h200.py: with --compile-for-call the plans are compiled for the profile this call measured (the footprint
and rates stages' run-profile.yaml), as a user's `liac profile` → `liac compile` on the host that runs them."""

import argparse

from h200 import Bench, parse_points


def _bench(tmp_path, compile_for_call):
    args = argparse.Namespace(out=str(tmp_path / "out"), profile=str(tmp_path / "given.yaml"),
                              plans_dir=str(tmp_path / "plans"), deadline_s=60.0, compile_for_call=compile_for_call)
    return Bench(args)


def test_plans_are_compiled_for_the_calls_own_profile_once_it_exists(tmp_path):
    bench = _bench(tmp_path, True)
    assert bench.compile_profile() == tmp_path / "given.yaml"  # nothing measured yet: the given profile
    (tmp_path / "out" / "run-profile.yaml").write_text("name: h200-run\n")
    assert bench.compile_profile() == tmp_path / "out" / "run-profile.yaml"
    assert _bench(tmp_path, False).compile_profile() == tmp_path / "given.yaml"


def test_points_keep_their_order():
    assert parse_points("128:1,8,32;1024:1;128:64") == [(128, 1), (128, 8), (128, 32), (1024, 1), (128, 64)]


def test_contenders_with_a_prefetch_depth():
    from h200 import contender_parts, known_contender, main

    assert contender_parts("whole+d2") == ("whole", 2) and contender_parts("optimal") == ("optimal", 1)
    assert known_contender("lia-gpu+d3") and known_contender("whole")
    assert not known_contender("whole+d0") and not known_contender("fastest") and not known_contender("whole+dx")
    import pytest

    with pytest.raises(SystemExit, match="unknown contender 'whole\\+dx'"):
        main(["--out", "unused", "--contenders", "optimal,whole+dx"])


def test_abba_runs_each_contender_first_once_and_last_once():
    """--abba: a point's contenders in order, then reversed, so each runs once first and once last."""
    from h200 import abba, main

    assert abba(["optimal", "whole"]) == ["optimal", "whole", "whole", "optimal"]
    assert abba(["optimal"]) == ["optimal", "optimal"] and abba([]) == []
    import pytest

    with pytest.raises(SystemExit, match="unknown contender"):  # the flag parses (the contender check fails later)
        main(["--out", "unused", "--abba", "--contenders", "optimal,nope"])


def test_rates_stage_probes_the_decoders_own_gemv_shapes():
    """The rates stage measures the CPU GEMV on the decoder's weight matrices from the traced graph (OPT-30B: fc1,
    fc2, out_proj, qkv), not on one square-ish probe matrix: a Llama's fused gate/up and its down differ."""
    from h200 import decoder_gemv_shapes

    assert set(decoder_gemv_shapes("opt-30b")) == {(21504, 7168), (7168, 7168), (28672, 7168), (7168, 28672)}
    from liac.models import resolve_model

    cfg = resolve_model("llama-3.1-8b")
    shapes = set(decoder_gemv_shapes("llama-3.1-8b"))
    assert (cfg.hidden_size, cfg.ffn_dim) in shapes and len(shapes) >= 3
