"""bench/replay_step.py: a plan's decode step replayed through the runtime's protocol (its schedule, staging slots,
copy engine and DDR sharing) with the cost model's prices, on the committed 2026-12-02 Eq. 24 call."""

from __future__ import annotations

from pathlib import Path

import pytest
import replay_step
from reprice import load_call_plans

from liac.passes.price import price_plan
from liac.passes.trace import trace_model
from liac.plan import parse_plan
from liac.profile import resolve_profile
from liac.schema_tools import to_data

CALL = Path(__file__).resolve().parents[2] / "bench" / "results" / "h200-2026-12-02" / "i12-eq24"
DT = 1e-4  # coarse steps: the tests compare replays of one resolution


@pytest.fixture(scope="module")
def call():
    plans = load_call_plans(CALL)
    profile = resolve_profile(str(CALL / "run-profile.yaml"))
    graph = trace_model(next(iter(plans.values())).model_config)
    return plans, profile, graph, replay_step.Rates.of_call(CALL, profile)


def _head_whole(plan):
    """The plan with its LM head whole on the GPU from HBM (what the split plans' twins do)."""
    data = to_data(plan)
    for group in data["spec"]["layer_groups"]:
        if group["layer_class"] == "head":
            group["sublayers"][0].update(decode="gpu", decode_cpu_permille=0, prefill="gpu", prefill_cpu_permille=0,
                                         weights="hbm")
    return parse_plan(data, "test")


def test_rates_come_from_the_calls_rates_stage(call):
    _, profile, _, rates = call
    assert rates.h2d == pytest.approx(profile.pcie_h2d_gb_per_s * 1e9)
    assert rates.cpu_beside == pytest.approx(39.373e9) and rates.h2d_beside == pytest.approx(50.349e9)


def test_the_split_head_costs_its_price_in_the_replay(call):
    """The split LM head's join and the next step's first copies waiting for it: the replay of the batch-32 plan
    with its head split against the same plan with the head whole differs by what the cost model prices the split
    head above the whole one (within 1.5 ms at this resolution: no ordering loss at the step boundary); the copies of the next pass are
    issued after the join, and the replayed steps repeat exactly."""
    plans, profile, graph, rates = call
    split = plans["opt-30b.h200-run.b32-p128-g32"]
    whole = _head_whole(split)
    replayed = replay_step.replay(split, profile, graph, rates, steps=3, dt=DT)
    assert replayed[1] == pytest.approx(replayed[2], abs=2 * DT)
    gap = replayed[-1] - replay_step.replay(whole, profile, graph, rates, dt=DT)[-1]
    priced = (price_plan(split, hw=profile, graph=graph).decode_seconds_per_token
              - price_plan(whole, hw=profile, graph=graph).decode_seconds_per_token)
    assert priced > 0.005 and gap == pytest.approx(priced, abs=1.5e-3)


def test_activations_queued_behind_weight_copies_only_add(call):
    """An activation copy that waits for the copy engine can only lengthen a step."""
    plans, profile, graph, rates = call
    plan = plans["opt-30b.h200-run.b8-p128-g32.whole"]
    queued = replay_step.replay(plan, profile, graph, rates, dt=DT)[-1]
    free = replay_step.replay(plan, profile, graph, rates, dt=DT, queue=False)[-1]
    assert queued > free
    alone = replay_step.Rates(rates.h2d, rates.h2d, rates.cpu, rates.cpu)  # no DDR contention
    assert replay_step.replay(plan, profile, graph, alone, dt=DT)[-1] < queued


def test_main_prints_a_table(capsys):
    assert replay_step.main([str(CALL), "--plans", "opt-30b.h200-run.b1-p128-g32", "--dt", "1e-4"]) == 0
    out = capsys.readouterr().out
    assert "opt-30b.h200-run.b1-p128-g32" in out and "replayed" in out
    assert replay_step.main([str(CALL), "--plans", "no-such-plan"]) == 2


def test_the_account_adds_up_to_the_step(call):
    """--account: the replayed step's time by what ran at once sums to the step; the batch-1 plan (CPU projections
    beside the stream) overlaps the two paths for most of it, and without DDR contention its bubbles do not grow."""
    plans, profile, graph, rates = call
    plan = plans["opt-30b.h200-run.b1-p128-g32"]
    account: list[dict] = []
    steps = replay_step.replay(plan, profile, graph, rates, dt=DT, account=account)
    assert len(account) == 2
    assert sum(account[-1].values()) == pytest.approx(steps[-1], abs=3 * DT)
    assert account[-1]["both"] > 0.5 * steps[-1]
    assert all(key == "both" or key in ("stream only", "cpu only") or key.startswith("bubble: ")
               for key in account[-1])


def test_deferring_the_release_copy_only_moves_the_wait(call):
    """--defer-issue: a release's copy held until the next crossing is queued takes the crossings off the copy
    engine's queue, and the engine then waits for the CPU instead: the replayed step is not shorter than the
    protocol's (so the runtime keeps issuing at the release)."""
    plans, profile, graph, rates = call
    plan = plans["opt-30b.h200-run.b8-p128-g32"]
    queued = replay_step.replay(plan, profile, graph, rates, dt=DT)[-1]
    deferred = replay_step.replay(plan, profile, graph, rates, dt=DT, defer=True)[-1]
    assert deferred >= queued - 2 * DT
