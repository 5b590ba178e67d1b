"""bench/report.py: comparisons stay within one device call; the targets table computes its ratios from them."""

from pathlib import Path

from report import call_points, targets_markdown, targets_summary

ROOT = Path(__file__).resolve().parents[2]


def _row(call, contender, batch, decode, rate, prompt=128):
    return {"call": call, "contender": contender, "prompt_len": prompt, "batch": batch, "decode_ms": decode,
            "tokens_per_second": rate, "prefill_ms": 500.0, "predicted_decode_ms": 360.0 if call == "b" else 405.0}


def test_points_compare_within_one_call_only():
    rows = [_row("b", "optimal", 1, 400.0, 2.0), _row("b", "optimal", 1, 420.0, 1.9), _row("b", "whole", 1, 500.0, 1.8),
            _row("c", "optimal", 1, 450.0, 1.7), _row("c", "whole", 1, 300.0, 2.5)]  # c's whole must not reach b
    peers = [{"call": "c", "contender": "flexgen", "prompt_len": 128, "batch": 1, "decode_ms": 900.0,
              "tokens_per_second": 0.85, "prefill_ms": 1000.0, "peak_gib": 7.0}]
    floors = {"b": {(128, 1): {"decode_seconds_per_token": 0.32, "tokens_per_second": 3.0}}}
    b, c = call_points(rows, peers, floors)
    assert (b["call"], b["repeats"], b["decode_ms"], b["decode_ms_range"]) == ("b", 2, 410.0, [400.0, 420.0])
    assert b["others"] == {"whole": {"decode_ms": 500.0, "tokens_per_second": 1.8, "prefill_ms": 500.0}}
    assert b["peers"] == {} and b["floor_decode_ms"] == 320.0
    assert c["others"]["whole"]["decode_ms"] == 300.0 and c["peers"]["flexgen"]["decode_ms"] == 900.0
    table = targets_markdown([b, c]).splitlines()
    assert "| b | 128 | 1 | 410 (400–420) | 360 | 1.28x | yes / yes | – | – | 500 (–) | – |" in table
    assert "| c | 128 | 1 | 450 | 405 | – | no (1.50x the best) / no | 2.00x | – | 500 (–) | – |" in table


def test_targets_over_every_point():
    rows = [dict(_row("b", "optimal", 1, 400.0, 2.0), predicted_prefill_ms=450.0, peak_gib=23.9, budget_gib=24.0),
            dict(_row("b", "whole", 1, 420.0, 1.9), peak_gib=24.2, budget_gib=24.0),
            dict(_row("b", "optimal", 8, 600.0, 13.0), predicted_prefill_ms=500.0, peak_gib=23.5, budget_gib=24.0),
            dict(_row("b", "whole", 8, 570.0, 14.0), peak_gib=23.0, budget_gib=24.0)]
    floors = {"b": {(128, 1): {"decode_seconds_per_token": 0.36, "tokens_per_second": 2.8},
                    (128, 8): {"decode_seconds_per_token": 0.50, "tokens_per_second": 16.0}}}
    points = call_points(rows, [], floors)
    summary = targets_summary(points, rows)
    assert "| 1 of 2 points |" in summary and "worst 1.05x |" in summary  # 600 / 570
    assert "| 1.11x |" in summary and "worst 1.20x |" in summary            # 400 / 360, 600 / 500
    assert "| 2 of 2 points (measured / predicted 1.00-1.11) |" in summary  # 500 / 500, 500 / 450
    assert "| 3 of 4 runs (worst 1.008x) |" in summary


def test_timelines_are_tabulated_per_run():
    from report import timeline_markdown

    line = {"step_ms": 523.4, "main_idle_ms": 91.0, "compute_busy_ms": 300.0, "copy_busy_ms": 376.0,
            "overlap_ms": 250.0, "gpu_idle_ms": 97.4}
    rows = [dict(_row("b", "whole", 8, 450.0, 16.0), timeline=dict(line, step_ms=456.0)),
            dict(_row("b", "optimal", 8, 530.0, 15.0), timeline=line),
            dict(_row("b", "optimal", 32, 530.0, 15.0), timeline={"error": "RuntimeError: no trace"}),
            _row("b", "optimal", 1, 400.0, 2.0)]
    table = timeline_markdown(rows).strip().splitlines()
    assert table[-2:] == ["| b | 128 | 8 | liac (split) | 523 | 91 | 300 | 376 | 250 | 97.4 |",
                          "| b | 128 | 8 | liac (whole sublayers) | 456 | 91 | 300 | 376 | 250 | 97.4 |"]
    assert timeline_markdown([_row("b", "optimal", 1, 400.0, 2.0)]) == ""


def test_tables_go_between_the_pages_markers(tmp_path, capsys):
    import pytest
    from report import BEGIN, END, fill_markdown, main

    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nbefore\n{BEGIN}\nold tables\n{END}\nafter\n")
    fill_markdown(page, "| new | tables |\n")
    fill_markdown(page, "| newer | tables |\n")  # again: replaced, not stacked
    assert page.read_text() == f"# Benchmarks\n\nbefore\n{BEGIN}\n| newer | tables |\n{END}\nafter\n"
    bare = tmp_path / "bare.md"
    bare.write_text("# no markers\n")
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path), "--json", str(tmp_path / "out.json"), "--md", str(bare)])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and "needs one" in err[0]
    assert not (tmp_path / "out.json").exists() and bare.read_text() == "# no markers\n"


def test_rivals_are_the_issues_contenders_at_the_median_of_their_runs():
    """An A B B A call: each rival counts at the median of its two runs (not its last), and the variants a call
    runs as experiments ('optimal@copies', 'optimal+nostart', 'whole+d2') are no rivals of the compiled plan."""
    rows = [_row("w", "optimal", 32, 460.0, 70.0), _row("w", "whole", 32, 440.0, 72.0),
            _row("w", "whole", 32, 500.0, 64.0), _row("w", "optimal", 32, 480.0, 67.0),
            _row("w", "optimal+nostart", 32, 430.0, 74.0), _row("w", "optimal@copies", 32, 400.0, 80.0),
            _row("w", "whole+d2", 32, 410.0, 78.0)]
    (point,) = call_points(rows, [], {})
    assert point["decode_ms"] == 470.0 and set(point["others"]) == {"whole"}
    assert point["others"]["whole"] == {"decode_ms": 470.0, "tokens_per_second": 68.0, "prefill_ms": 500.0}
    assert "| 1 of 1 points |" in targets_summary([point], rows)  # 470 against whole's median 470 (its last: 500)


def test_a_rival_that_is_the_same_plan_is_no_rival():
    """Where the whole-sublayer policy chose the compiled plan's placement (`liac diff`: no semantic difference,
    only the names differ), its runs are the compiled plan's runs, pooled: one plan cannot lose to itself. A rival
    with another placement stays a rival."""
    import dataclasses

    from liac.plan import load_plan
    from report import same_plan

    base = ROOT / "plans" / "opt-30b.spr-a100"
    one, other = (load_plan(p) for p in sorted(base.glob("opt-30b.spr-a100.b*-p128-g32.yaml"))[:2])
    renamed = dataclasses.replace(one, metadata=dataclasses.replace(one.metadata, name=one.metadata.name + ".whole"))
    assert same_plan(one, renamed) and not same_plan(one, other)
    assert not same_plan(one, None)
    plans = {"x": {p.metadata.name: p for p in (one, renamed, other)}}
    rows = [dict(_row("x", "optimal", 8, 430.0, 18.0), plan=one.metadata.name),
            dict(_row("x", "whole", 8, 410.0, 19.0), plan=renamed.metadata.name),
            dict(_row("x", "lia-gpu", 8, 700.0, 11.0), plan=other.metadata.name)]
    (point,) = call_points(rows, [], {}, plans)
    assert point["same_plan_as"] == ["whole"] and set(point["others"]) == {"lia-gpu"}
    assert point["repeats"] == 2 and point["decode_ms"] == 420.0
    assert "yes / yes (the same plan as whole: runs pooled)" in targets_markdown([point])
    assert "| 1 of 1 points |" in targets_summary([point], rows)
    rows[1]["plan"] = other.metadata.name  # now whole is another plan, and the faster one
    (point,) = call_points(rows, [], {}, plans)
    assert point["same_plan_as"] == [] and point["others"]["whole"]["decode_ms"] == 410.0


def test_refloor_recomputes_a_calls_floors_at_its_rates_and_footprint():
    """--refloor: a committed call's floors with today's definition (the DDR pairs, the measured footprint kept
    out of the budget) are never below what the call wrote with the paths alone, and equal a direct workload_floor
    at the call's run-profile; what the call wrote stays under 'as_written'."""
    import json
    from pathlib import Path

    import floor as fl
    import report

    from liac.models import resolve_model
    from liac.passes.trace import trace_model
    from liac.profile import resolve_profile

    folder = Path(__file__).resolve().parents[2] / "bench" / "results" / "h200-2026-12-03" / "i12wp"
    written = json.loads((folder / "floor.json").read_text())
    again = report.refloor(folder, written)
    assert len(again) == len(written) == 3
    footprint = json.loads((folder / "summary.json").read_text())["footprint"]
    reserved = footprint["context_bytes"] + footprint["library_bytes"]
    for old, new in zip(written, again):
        assert new["as_written"] == old and new["reserved_bytes"] == reserved
        assert new["decode_seconds_per_token"] > old["decode_seconds_per_token"]
    direct = fl.workload_floor(trace_model(resolve_model("opt-30b")), resolve_profile(str(folder / "run-profile.yaml")),
                               batch=1, prompt_len=128, gen_len=32, gpu_budget_bytes=24 * 2**30,
                               reserved_bytes=reserved)
    first = next(f for f in again if (f["batch"], f["prompt_len"]) == (1, 128))
    assert first["decode_seconds_per_token"] == direct.decode_seconds_per_token
