"""The serving ILP (passes/ilp_serve.py): equals brute force on small instances; degenerate cases in closed form.

Two referees, both written apart from passes/ilp_serve.py, passes/ilp.py and the master problem, on top of
test_ilp.py's plain-loop pricing of one layer's placement (`phase_options`, Eqs. 1-9, 15-17):

* `full_brute_force` (one decoder layer): every joint assignment — a tier vector per layer (embedding, decoder,
  head), and for every batch size its own prefill and decode placement — with the weighted objective, the bytes at
  the largest batch, the largest staging of any batch and the workspace of any GPU use, checked against the
  capacities. No pruning, no decomposition.
* `tier_brute_force` (two decoder layers, or a real model's six units): every joint memory placement (a tier vector
  per layer), every staging buffer size S some placement streams, and every choice of which classes may compute on
  the GPU; given those, each layer at each batch size takes its fastest placement that streams at most S (and
  stays off the GPU where not allowed): layers are independent once memory, staging and workspace are fixed.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from hand_graphs import hand_graph
from test_ilp import TINY, phase_options, synthetic

from liac.errors import InfeasibleError, LiacError
from liac.passes.costs import TierBudgets, Workload, annotate_costs
from liac.passes.ilp import SolverOptions, solve_placement
from liac.passes.ilp_serve import batch_shares, solve_serving
from liac.plan import TIERS
from liac.profile import resolve_profile

ROOT = Path(__file__).resolve().parents[2]


def serve_graphs(seed: int, batches: tuple[int, ...], layers: int, ops: tuple[str, ...], split=()):
    """One synthetic CostGraph per batch size: the first one's structure, weights and budgets, each with its own
    random prices, and a KV cache and workspace growing with the batch."""
    base = synthetic(seed, layers, ops, cxl=False, split=split)
    out = []
    for k, batch in enumerate(batches):
        prices = base if k == 0 else synthetic(seed + 1000 * k, layers, ops, cxl=False, split=split)
        classes = tuple(dataclasses.replace(ref, kv_cache_bytes=ref.kv_cache_bytes * batch,
                                            workspace_bytes=ref.workspace_bytes * batch, prefill=cls.prefill,
                                            decode=cls.decode)
                        for ref, cls in zip(base.classes, prices.classes))
        out.append(dataclasses.replace(base, workload=Workload(batch, 1, 3), classes=classes))
    # budgets in proportion to what the largest batch needs, so that HBM (and at times DDR) binds
    rng = np.random.default_rng(seed)
    total = sum(sum(c.weight_bytes) * c.count + c.kv_cache_bytes * c.count for c in out[-1].classes)
    budgets = TierBudgets(hbm_bytes=int(rng.uniform(0.15, 0.8) * total), ddr_bytes=int(rng.uniform(0.5, 1.2) * total),
                          cxl_bytes=0, prefetch_depth=base.budgets.prefetch_depth)
    out = [dataclasses.replace(graph, budgets=budgets) for graph in out]
    return tuple(out)


def _tier_vectors(cls, tiers):
    weight_units = [i for i, op in enumerate(cls.operands) if op == "weights"]
    has_kv = "kv" in cls.operands
    for weight_tiers in itertools.product(tiers, repeat=len(weight_units)):
        for kv in (tiers if has_kv else ("none",)):
            unit_tier = ["ddr"] * len(cls.units)
            for unit, tier in zip(weight_units, weight_tiers):
                unit_tier[unit] = tier
            for i, op in enumerate(cls.operands):
                if op == "kv":
                    unit_tier[i] = kv
            memory = dict.fromkeys(TIERS, 0)
            for unit, tier in zip(weight_units, weight_tiers):
                memory[tier] += cls.weight_bytes[unit]
            if has_kv:
                memory[kv] += cls.kv_cache_bytes
            yield tuple(unit_tier), memory, (weight_tiers[0] if weight_tiers else "none")


def _pairs(graph, name, unit_tier, max_split, cache):
    """Every (prefill, decode) placement of one layer at one batch size: (seconds, staging, uses the GPU)."""
    cls = graph.layer_class(name)
    pre = phase_options(graph, cls, "prefill", unit_tier, max_split, None, cache)
    dec = phase_options(graph, cls, "decode", unit_tier, max_split, None, cache)
    return [(p[1] + d[1], max(p[2], d[2]), min(p[0]) < 1000 or min(d[0]) < 1000) for p in pre for d in dec]


def _capacity_ok(graphs, used: dict, staging: float, workspace: float, host: float) -> bool:
    budgets = graphs[-1].budgets
    hbm = used["hbm"] + (budgets.prefetch_depth + 1) * staging + workspace
    return hbm <= budgets.hbm_bytes and used["ddr"] + host <= budgets.ddr_bytes and used["cxl"] <= budgets.cxl_bytes


def _workspaces(graphs):
    ws = {c.layer_class: max(g.layer_class(c.layer_class).workspace_bytes for g in graphs) for c in graphs[-1].classes}
    return ws, max(ws.values())


def full_brute_force(graphs, weights, max_split=1) -> float | None:
    """Every joint assignment of a model with one decoder layer (see the module docstring)."""
    shares = batch_shares(weights)
    top = graphs[-1]
    ws, host = _workspaces(graphs)
    rows = {}
    for name in ("embed", "decoder", "head"):
        cls = top.layer_class(name)
        assert cls.count == 1
        out = []
        for unit_tier, memory, first_tier in _tier_vectors(cls, top.tiers):
            caches = [{} for _ in graphs]
            per_batch = [_pairs(g, name, unit_tier, max_split, c) for g, c in zip(graphs, caches)]
            for combo in itertools.product(*per_batch):
                out.append((sum(s * c[0] for s, c in zip(shares, combo)), memory, max(c[1] for c in combo),
                            any(c[2] for c in combo), first_tier))
        rows[name] = out
    dec = rows["decoder"]  # every decoder row at once (numpy), every embedding and head row in a loop
    d_seconds = np.array([r[0] for r in dec])
    d_used = {t: np.array([r[1][t] for r in dec], dtype=float) for t in TIERS}
    d_staging = np.array([r[2] for r in dec], dtype=float)
    d_gpu = np.array([r[3] for r in dec], dtype=bool)
    budgets = top.budgets
    best = None
    for e, h in itertools.product(rows["embed"], rows["head"]):
        used = {t: d_used[t] + e[1][t] + h[1][t] for t in TIERS}
        if top.tied_weight_bytes and e[4] == h[4]:
            used[e[4]] = used[e[4]] - top.tied_weight_bytes
        ends = max([ws[n] for n, r in (("embed", e), ("head", h)) if r[3]], default=0)
        workspace = np.maximum(np.where(d_gpu, ws["decoder"], 0), ends)
        staging = np.maximum(d_staging, max(e[2], h[2]))
        fits = ((used["hbm"] + (budgets.prefetch_depth + 1) * staging + workspace <= budgets.hbm_bytes)
                & (used["ddr"] + host <= budgets.ddr_bytes) & (used["cxl"] <= budgets.cxl_bytes))
        if fits.any():
            value = float(d_seconds[fits].min()) + e[0] + h[0]
            best = value if best is None else min(best, value)
    return best


def tier_brute_force(graphs, weights, max_split=1) -> float | None:
    """Every joint memory placement, staging size and GPU permission (see the module docstring)."""
    shares = batch_shares(weights)
    top = graphs[-1]
    ws, host = _workspaces(graphs)
    options = {}  # class → [(unit tiers, memory, first tier, per batch: arrays of (seconds, staging, gpu))]
    levels = {0.0}
    for name in ("embed", "decoder", "head"):
        options[name] = []
        for unit_tier, memory, first_tier in _tier_vectors(top.layer_class(name), top.tiers):
            caches = [{} for _ in graphs]
            per_batch = [np.array(_pairs(g, name, unit_tier, max_split, c), dtype=float).reshape(-1, 3)
                         for g, c in zip(graphs, caches)]
            for table in per_batch:
                levels.update(table[:, 1].tolist())
            options[name].append((memory, first_tier, per_batch))

    def best(per_batch, cap, gpu_ok):
        total = 0.0
        for share, table in zip(shares, per_batch):
            ok = (table[:, 1] <= cap) & ((table[:, 2] == 0) | gpu_ok)
            if not ok.any():
                return None
            total += share * table[ok, 0].min()
        return total

    count = top.layer_class("decoder").count
    result = None
    for cap in sorted(levels):
        for flags in itertools.product((False, True), repeat=3):
            gpu_ok = dict(zip(("embed", "decoder", "head"), flags))
            workspace = max([ws[n] for n in gpu_ok if gpu_ok[n]], default=0)
            cost = {n: [best(pb, cap, gpu_ok[n]) for _, _, pb in options[n]] for n in options}
            for layers in itertools.combinations_with_replacement(range(len(options["decoder"])), count):
                if any(cost["decoder"][i] is None for i in layers):
                    continue
                dec_used = {t: sum(options["decoder"][i][0][t] for i in layers) for t in TIERS}
                dec_cost = sum(cost["decoder"][i] for i in layers)
                for e, (e_mem, e_tier, _) in enumerate(options["embed"]):
                    for h, (h_mem, h_tier, _) in enumerate(options["head"]):
                        if cost["embed"][e] is None or cost["head"][h] is None:
                            continue
                        used = {t: dec_used[t] + e_mem[t] + h_mem[t] for t in TIERS}
                        if top.tied_weight_bytes and e_tier == h_tier:
                            used[e_tier] -= top.tied_weight_bytes
                        if _capacity_ok(graphs, used, cap, workspace, host):
                            value = dec_cost + cost["embed"][e] + cost["head"][h]
                            result = value if result is None else min(result, value)
    return result


def assert_serving_optimal(graphs, weights, expected, options=SolverOptions()):
    if expected is None:
        with pytest.raises(InfeasibleError):
            solve_serving(graphs, weights, options)
        return None
    serve, report = solve_serving(graphs, weights, options)
    assert report.status == "optimal" and report.gap == 0.0
    assert report.objective_seconds == pytest.approx(expected, rel=1e-9)
    shares = batch_shares(weights)
    # the objective is the weighted sum of each batch size's own seconds over the shared tiers
    assert sum(s * a.objective_seconds for s, a in zip(shares, serve.per_batch)) == pytest.approx(expected, rel=1e-9)
    top = graphs[-1].budgets
    for tier, cap in (("hbm", top.hbm_bytes), ("ddr", top.ddr_bytes), ("cxl", top.cxl_bytes)):
        assert serve.memory.tier_used_bytes(tier, top.prefetch_depth) <= cap
    for assignment in serve.per_batch:  # one memory placement: the same tiers, layer for layer, at every batch
        assert [(c.layer_class, c.config.weights, c.config.kv_cache, c.count) for c in assignment.choices] == \
            [(c.layer_class, c.config.weights, c.config.kv_cache, c.count) for c in serve.memory.choices]
        assert max(c.config.staging_bytes for c in assignment.choices) <= serve.memory.staging_bytes
    return serve, report


@pytest.mark.parametrize("seed", range(6))
def test_one_layer_equals_the_full_brute_force(seed):
    graphs = serve_graphs(seed, (1, 4), layers=1, ops=("weights", "kv", "weights"))
    weights = (1 + seed % 3, 2)
    assert_serving_optimal(graphs, weights, full_brute_force(graphs, weights))


@pytest.mark.parametrize("seed", (1, 4, 7))
def test_one_layer_with_splits_equals_the_full_brute_force(seed):
    graphs = serve_graphs(seed, (2, 8), layers=1, ops=("weights", "kv", "weights"), split=(300, 700))
    assert_serving_optimal(graphs, (3, 1), full_brute_force(graphs, (3, 1)))


@pytest.mark.parametrize("seed", range(6))
def test_two_layers_three_batch_sizes_equal_the_tier_brute_force(seed):
    graphs = serve_graphs(seed, (1, 2, 8), layers=2, ops=("weights", "kv", "weights"))
    weights = (seed % 4, 1, 2)
    expected = tier_brute_force(graphs, weights)
    assert_serving_optimal(graphs, weights, expected)


def test_the_two_referees_agree_and_most_instances_are_feasible():
    feasible = 0
    for seed in range(6):
        graphs = serve_graphs(seed, (1, 4), layers=1, ops=("weights", "kv", "weights"))
        full, by_tiers = full_brute_force(graphs, (1, 1)), tier_brute_force(graphs, (1, 1))
        assert (full is None) == (by_tiers is None)
        if full is not None:
            feasible += 1
            assert by_tiers == pytest.approx(full, rel=1e-12)
    assert feasible >= 3


def tiny_serving_graphs(batches, hbm_fraction, profile="h200-amx16", split=(500,)):
    hw = resolve_profile(profile)
    graph = hand_graph(TINY, layers=1)
    weights = sum(s.weight_bytes for s in graph.sublayers()) * 1.0
    budgets = TierBudgets(hbm_bytes=int(hbm_fraction * weights), ddr_bytes=10 * int(weights) + 2**30, cxl_bytes=0)
    return tuple(annotate_costs(graph, hw, Workload(b, 16, 3), budgets, split_permille=split) for b in batches)


@pytest.mark.parametrize("batches, hbm_fraction, weights", [((1, 16), 0.35, (1, 1)), ((1, 8, 64), 0.5, (4, 2, 1))])
def test_real_one_layer_model_equals_the_tier_brute_force(batches, hbm_fraction, weights):
    graphs = tiny_serving_graphs(batches, hbm_fraction)
    assert_serving_optimal(graphs, weights, tier_brute_force(graphs, weights))


def test_one_batch_size_is_the_plan_of_one_point():
    graphs = tiny_serving_graphs((8,), 0.4)
    _, report = solve_serving(graphs, (1,))
    assert report.objective_seconds == pytest.approx(solve_placement(graphs[0])[1].objective_seconds, rel=1e-12)


def test_all_weight_on_the_largest_batch_is_its_own_optimum():
    """The smaller batches weigh nothing, and the largest batch's placement serves them within the same memory
    (it streams at most as much at a smaller batch), so the optimum is the largest batch's own."""
    graphs = tiny_serving_graphs((1, 4, 32), 0.45)
    serve, report = solve_serving(graphs, (0, 0, 1))
    assert report.objective_seconds == pytest.approx(solve_placement(graphs[-1])[1].objective_seconds, rel=1e-12)


def test_sharing_memory_never_beats_a_batch_size_alone():
    graphs = tiny_serving_graphs((1, 8, 64), 0.5)
    serve, _ = solve_serving(graphs, (1, 1, 1))
    for graph, assignment in zip(graphs, serve.per_batch):
        alone = solve_placement(graph)[1].objective_seconds
        assert assignment.objective_seconds >= alone * (1 - 1e-12)


def test_bad_weights_are_one_line():
    graphs = tiny_serving_graphs((1, 8), 0.5)
    with pytest.raises(LiacError, match="--batch-weights: must give one integer weight at least 0 per batch size"):
        solve_serving(graphs, (0, 0))
    with pytest.raises(LiacError, match="--batch-weights"):
        solve_serving(graphs, (1,))


def test_infeasible_when_the_largest_batch_cache_fits_nowhere():
    graphs = tiny_serving_graphs((1, 8), 0.3)
    budgets = TierBudgets(hbm_bytes=0, ddr_bytes=1 << 20, cxl_bytes=0)
    small = tuple(dataclasses.replace(g, budgets=budgets) for g in graphs)
    with pytest.raises(InfeasibleError, match="constraint mem_"):
        solve_serving(small, (1, 1))


def test_a_batch_size_of_weight_zero_gets_the_fastest_placement_within_the_shared_buffers():
    from liac.passes.ilp import layer_configs

    graphs = tiny_serving_graphs((1, 8, 64), 0.5)
    serve, _ = solve_serving(graphs, (0, 1, 1))
    staging = serve.memory.staging_bytes
    for choice in serve.per_batch[0].choices:
        config = choice.config
        cls = graphs[0].layer_class(choice.layer_class)
        same = [c for c in layer_configs(graphs[0], cls, per_tier_vector=True)
                if (c.weights, c.kv_cache) == (config.weights, config.kv_cache) and c.staging_bytes <= staging
                and (serve.memory.workspace_bytes >= cls.workspace_bytes or not c.uses_gpu)]
        assert config.seconds == pytest.approx(min(c.seconds for c in same), rel=1e-12)


def test_moe_serving_refused(tmp_path, capsys):
    """A mixture of experts has no serving plan (its experts are placed by count per point only): the library call,
    the solver, `liac compile --serve` (exit 2, one line, nothing created) and a plan carrying serving batches
    each refuse it."""
    from liac.api import compile_serving
    from liac.cli import main
    from liac.models import resolve_model
    from liac.plan import Serving, ServingBatch, check_semantics, load_plan

    cfg = resolve_model("mixtral-8x7b")
    with pytest.raises(LiacError, match=r"--serve: model 'mixtral-8x7b' is a mixture of experts \(8 experts\)"):
        compile_serving(cfg, "spr-h100", batches=(1, 8))
    out = tmp_path / "serve"
    assert main(["compile", "--model", "mixtral-8x7b", "--hw", "spr-h100", "--serve", "--batch", "1,8",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--serve: model 'mixtral-8x7b' is a mixture of experts" in err[0], err
    assert not out.exists()
    plan = load_plan(ROOT / "plans" / "mixtral-8x7b.spr-h100" / "mixtral-8x7b.spr-h100.b16-p128-g32.yaml")
    served = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, serving=Serving((
        ServingBatch(16, 1, ()),))))
    assert check_semantics(served) == [("spec.serving.batches", "must be empty: the model is a mixture of experts "
                                                                "(8 experts), which serving plans do not place")]
    tiny = cfg.with_layers(1, name="tiny-mixtral")
    graphs = tuple(annotate_costs(_traced_tiny_moe(tiny), resolve_profile("spr-h100"), Workload(b, 8, 4),
                                  TierBudgets(hbm_bytes=1 << 40, ddr_bytes=1 << 40, cxl_bytes=0)) for b in (1, 2))
    with pytest.raises(LiacError, match="--serve: a mixture-of-experts model has no serving plan"):
        solve_serving(graphs, (1, 1))


def _traced_tiny_moe(cfg):
    from liac.passes.trace import trace_model

    return trace_model(cfg)


def test_the_committed_benchmark_serving_plan_is_valid(capsys):
    """bench/serve/opt-30b.h200-measured.serve.yaml (what bench/serve_h200.py serves on the H200) loads as the current
    plan version and passes `liac validate`; its batch sizes are the ones docs/serving.md gives."""
    from liac.cli import main
    from liac.plan import API_VERSION, load_plan

    path = ROOT / "bench" / "serve" / "opt-30b.h200-measured.serve.yaml"
    assert path.read_text().startswith(f"apiVersion: {API_VERSION}\n")
    plan = load_plan(path)
    assert [b.batch_size for b in plan.spec.serving.batches] == [1, 2, 4, 8, 16, 32]
    assert (plan.spec.workload.prompt_len, plan.spec.workload.gen_len) == (256, 64)
    assert main(["validate", str(path)]) == 0, capsys.readouterr()


@pytest.mark.parametrize("batch", (8, 32))
def test_the_committed_benchmark_plain_plans_match_the_serving_plan(batch, capsys):
    """bench/serve/opt-30b.h200-measured.plain-bB.yaml (bench/serve_h200.py's 'plain:B'): batch B's own plan for the
    serving plan's model, hardware profile, budgets and lengths, current and valid, with no serving batches."""
    from liac.cli import main
    from liac.plan import API_VERSION, load_plan

    serving = load_plan(ROOT / "bench" / "serve" / "opt-30b.h200-measured.serve.yaml")
    path = ROOT / "bench" / "serve" / f"opt-30b.h200-measured.plain-b{batch}.yaml"
    assert path.read_text().startswith(f"apiVersion: {API_VERSION}\n")
    plan = load_plan(path)
    assert plan.spec.serving.batches == () and plan.spec.workload.batch_size == batch
    assert (plan.spec.workload.prompt_len, plan.spec.workload.gen_len) == (256, 64)
    assert (plan.spec.budgets, plan.spec.hardware, plan.model_config) == \
        (serving.spec.budgets, serving.spec.hardware, serving.model_config)
    assert main(["validate", str(path)]) == 0, capsys.readouterr()


def test_compile_serve_into_a_directory(tmp_path, capsys):
    """`liac compile --serve -o DIR` writes the serving plan and index.yaml into DIR (the sweep writer owns a serving
    plan's file name), `liac validate DIR` accepts it, and a second compile replaces it, keeping the user's files."""
    from liac.cli import main
    from liac.sweep import is_sweep_file

    assert is_sweep_file("opt-30b.h200-amx16.serve-b1-32-p256-g64.yaml")
    assert is_sweep_file("opt-30b.h200-amx16.serve-b1-32-p256-g64.lia-gpu.yaml")
    assert not is_sweep_file("opt-30b.h200-amx16.serve-p256-g64.yaml")
    out = tmp_path / "serve"
    argv = ["compile", "--model", "opt-125m", "--hw", "h200-measured", "--gpu-mem", "200MiB", "--serve",
            "--batch", "1,4", "-o", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["index.yaml", "opt-125m.h200-measured.serve-b1-4-p128-g32.yaml"]
    (out / "notes.txt").write_text("mine")
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["index.yaml", "notes.txt",
                                                     "opt-125m.h200-measured.serve-b1-4-p128-g32.yaml"]
    assert main(["validate", str(out)]) == 0, capsys.readouterr()
