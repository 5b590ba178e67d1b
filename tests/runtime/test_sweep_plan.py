"""Picking a sweep's plan for a request (runtime/sweep.py), against the rule spelled out by brute force.
(tests/test_sweep.py covers liac/sweep.py, the sweep's file names.)"""

from __future__ import annotations

import itertools

import pytest
import yaml

from liac.errors import LiacError
from liac.runtime.sweep import is_sweep, plan_for_request, sweep_points

POINTS = [(1, 128, 32), (8, 128, 32), (2, 128, 32), (8, 512, 64), (64, 128, 32), (4, 128, 32)]


@pytest.fixture
def sweep(tmp_path):
    rows = []
    for batch, prompt, gen in POINTS:
        name = f"m.b{batch}-p{prompt}-g{gen}.yaml"
        (tmp_path / name).write_text("kind: OffloadPlan\n")  # the choice reads only the index
        rows.append({"file": name, "batch_size": batch, "prompt_len": prompt, "gen_len": gen})
    (tmp_path / "index.yaml").write_text(yaml.safe_dump({"kind": "OffloadPlanIndex", "points": rows}))
    return tmp_path


def _expected(batch, prompt, new):
    """Brute force: of the points holding the request, the smallest batch, then the smallest context."""
    holding = [p for p in POINTS if batch <= p[0] and prompt <= p[1] and prompt + new <= p[1] + p[2]]
    return min(holding, key=lambda p: (p[0], p[1] + p[2])) if holding else None


def test_choice_matches_brute_force(sweep):
    assert is_sweep(sweep) and is_sweep(sweep / "index.yaml") and not is_sweep(sweep / "m.b1-p128-g32.yaml")
    for batch, prompt, new in itertools.product((1, 2, 3, 5, 8, 9, 64, 65), (1, 128, 129, 400, 513), (1, 32, 40, 200)):
        want = _expected(batch, prompt, new)
        if want is None:
            with pytest.raises(LiacError, match=f"no plan of this sweep holds batch {batch}"):
                plan_for_request(sweep, batch, prompt, new)
        else:
            got = plan_for_request(sweep / "index.yaml", batch, prompt, new)
            assert got == sweep / f"m.b{want[0]}-p{want[1]}-g{want[2]}.yaml", (batch, prompt, new)


def test_only_the_batch_when_lengths_are_unknown(sweep):
    assert plan_for_request(sweep, 3).name == "m.b4-p128-g32.yaml"
    assert plan_for_request(sweep, 1).name == "m.b1-p128-g32.yaml"


def test_bad_indexes_are_one_line(tmp_path, sweep):
    (sweep / "m.b4-p128-g32.yaml").unlink()
    with pytest.raises(LiacError, match="lists 'm.b4-p128-g32.yaml', which does not exist"):
        plan_for_request(sweep, 3)
    for text, fragment in (("kind: Other\n", "must be a sweep index"), ("kind: OffloadPlanIndex\npoints: []\n",
                                                                       "must list at least one plan"),
                           ("kind: OffloadPlanIndex\npoints: [{file: ../x.yaml, batch_size: 1, prompt_len: 1, "
                            "gen_len: 1}]\n", "points[0].file: must name a file inside"),
                           ("kind: OffloadPlanIndex\npoints: [{file: /etc/x.yaml, batch_size: 1, prompt_len: 1, "
                            "gen_len: 1}]\n", "points[0].file: must name a file inside"),
                           ("kind: OffloadPlanIndex\npoints: [{file: sub/x.yaml, batch_size: 1, prompt_len: 1, "
                            "gen_len: 1}]\n", "points[0].file: must name a plan file beside the index"),
                           ("kind: OffloadPlanIndex\npoints: [{file: [a], batch_size: 1, prompt_len: 1, "
                            "gen_len: 1}]\n", "points[0].file: must be a file name"),
                           ("kind: OffloadPlanIndex\npoints: [{file: a.yaml, batch_size: 1e400, prompt_len: 1, "
                            "gen_len: 1}]\n", "points[0].batch_size: must be a positive integer"),
                           ("kind: OffloadPlanIndex\npoints: [{file: a.yaml, batch_size: 99999999999, "
                            "prompt_len: 1, gen_len: 1}]\n", "points[0].batch_size: must be a positive integer"),
                           ("a: &x [1]\nkind: OffloadPlanIndex\npoints: *x\n", "aliases"),
                           ("kind: OffloadPlanIndex\npoints: [{file: a.yaml, batch_size: 0, prompt_len: 1, "
                            "gen_len: 1}]\n", "points[0].batch_size: must be a positive integer"),
                           ("{", "not valid YAML")):
        (tmp_path / "index.yaml").write_text(text)
        with pytest.raises(LiacError, match=fragment.replace("[", r"\[").replace("]", r"\]")) as error:
            sweep_points(tmp_path)
        assert "\n" not in error.value.line()
