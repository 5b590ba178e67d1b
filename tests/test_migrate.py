"""Schema versioning: kept fixtures of older versions load; migrations are pure; random plans round-trip.

Round trips (the Kubernetes rule: convert to another version and back without loss):
  dataclass → YAML → dataclass is the identity for any valid plan (floats already at 6 significant digits, as
  every writer produces them through liac.schema_tools.stable_float), serving plans included;
  v4 → v3 (`_downgrade_to_v3`) → v4, v4 → v3 → v2 (`_downgrade_to_v2`) → v4, v4 → v2 → v1 (`_downgrade_to_v1`) → v4
  and on to v1alpha1 (`_downgrade_to_v1alpha1`) are the identity for every plan the older versions can express (v3:
  no serving batches; v2: also a prefill of the whole batch at once; v1: also no split sublayers); the downgrades
  are written independently of the migrations.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml
from artifact_plans import TINY_LLAMA, TINY_OPT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from liac.migrate import (MIGRATIONS, MigrationError, migrate_v1_to_v2, migrate_v1alpha1_to_v1, migrate_v2_to_v3,
                          migrate_v3_to_v4)
from liac.cli import main
from liac.errors import LiacError
from liac.models import SUBLAYERS
from liac.models.config import ModelConfig
from liac.plan import (API_VERSION, DEVICES, HOST_TIERS, SPLIT_UNITS, TIERS, Budgets, ComputePlacement, Execution,
                       GroupPlacement, HardwareSpec, LayerGroup, Metadata, ModelSpec, OffloadPlan, PlanSpec,
                       PlanStatus, Predicted, Serving, ServingBatch, ServingBatchStatus, ServingStatus, SolverReport,
                       SublayerPlacement, SublayerTime, TierBytes, TierUsage, Workload, batch_plan, check_semantics,
                       load_plan, parse_plan, plan_to_yaml)
from liac.schema_tools import stable_float, to_data

FIXTURES = Path(__file__).parent / "fixtures"


def _downgrade_to_v3(doc: dict) -> dict:
    """v4 → v3 for a plan without serving batches: the two `serving` sections go."""
    old = copy.deepcopy(doc)
    old["apiVersion"] = "liac/v3"
    for part in ("spec", "status"):
        assert old[part].pop("serving") == {"batches": []}
    return old


def _up_from_v2(doc: dict) -> dict:
    return migrate_v3_to_v4(migrate_v2_to_v3(doc))


def _downgrade_to_v2(doc: dict) -> dict:
    """v4 or v3 → v2 for a plan without serving batches whose prefill is one batch: the micro-batch fields go (v2
    prefilled the whole batch)."""
    old = _downgrade_to_v3(doc) if doc["apiVersion"] == "liac/v4" else copy.deepcopy(doc)
    old["apiVersion"] = "liac/v2"
    execution, work = old["spec"]["execution"], old["spec"]["workload"]
    assert (execution.pop("prefill_microbatch_sequences"), execution.pop("prefill_microbatch_tokens")) == (
        work["batch_size"], work["prompt_len"])
    return old


def _downgrade_to_v1(doc: dict) -> dict:
    """v4 → v1 (through v2) for a plan without splits: the permille fields go (v1 meant 1000 on the CPU, 0 on the
    GPU)."""
    old = _downgrade_to_v2(doc) if doc["apiVersion"] in ("liac/v3", "liac/v4") else copy.deepcopy(doc)
    old["apiVersion"] = "liac/v1"
    for group in old["spec"]["layer_groups"]:
        for sub in group["sublayers"]:
            assert "split" not in (sub["prefill"], sub["decode"])
            del sub["prefill_cpu_permille"], sub["decode_cpu_permille"]
    return old


def _downgrade_to_v1alpha1(doc: dict) -> dict:
    """v1 → v1alpha1, the inverse of the migration, written from the v1alpha1 description alone."""
    old = copy.deepcopy(doc)
    old["apiVersion"] = "liac/v1alpha1"
    for group in old["spec"]["layer_groups"]:
        subs = group.pop("sublayers")
        group["placement"] = {phase: {s["name"]: s[phase] for s in subs} for phase in ("prefill", "decode")}
        group["weights"] = {s["name"]: s["weights"] for s in subs if s["weights"] != "none"}
    return old


def test_kept_v1alpha1_fixture_loads_as_the_kept_v1_plan():
    old = load_plan(FIXTURES / "v1alpha1-tiny-opt.yaml")
    new = load_plan(FIXTURES / "v1-tiny-opt.yaml")
    assert old == new and old.apiVersion == API_VERSION
    assert [s.name for s in old.spec.layer_groups[2].sublayers] == list(SUBLAYERS["opt"])  # execution order back


def test_kept_v2_fixture_loads_as_the_kept_v3_plan():
    old, new = load_plan(FIXTURES / "v2-tiny-opt.yaml"), load_plan(FIXTURES / "v3-tiny-opt.yaml")
    assert old == new and old.apiVersion == API_VERSION == "liac/v4"
    execution, work = new.spec.execution, new.spec.workload
    assert (execution.prefill_microbatch_sequences, execution.prefill_microbatch_tokens) == (work.batch_size,
                                                                                           work.prompt_len)
    # a v3 plan whose prefill runs in micro-batches (compiled: OPT-30B on spr-a100, batch 64, prompt 2016)
    cut = load_plan(FIXTURES / "v3-opt-30b-spr-a100-microbatch.yaml")
    assert cut.spec.execution.prefill_microbatch_sequences < cut.spec.workload.batch_size


def test_v2_migration_is_pure_and_refuses_a_workload_without_sizes():
    doc = yaml.safe_load((FIXTURES / "v2-tiny-opt.yaml").read_text())
    before = copy.deepcopy(doc)
    out = migrate_v2_to_v3(doc)
    assert doc == before and out["apiVersion"] == "liac/v3"
    assert _downgrade_to_v2(out) == doc
    doc["spec"]["workload"]["prompt_len"] = "long"
    with pytest.raises(MigrationError) as raised:
        migrate_v2_to_v3(doc)
    assert (raised.value.path, raised.value.message) == ("spec.workload.prompt_len",
                                                         "must be a positive integer, got 'long'")


def test_kept_v1_fixtures_load_as_the_kept_v2_plans():
    for name in ("tiny-opt", "opt-30b-spr-a100"):
        old, new = load_plan(FIXTURES / f"v1-{name}.yaml"), load_plan(FIXTURES / f"v2-{name}.yaml")
        assert old == new and old.apiVersion == API_VERSION == "liac/v4"
        for sub in (s for g in new.spec.layer_groups for s in g.sublayers):
            assert sub.prefill_cpu_permille == (1000 if sub.prefill == "cpu" else 0)
            assert sub.decode_cpu_permille == (1000 if sub.decode == "cpu" else 0)
    # a v2 plan with split sublayers (compiled: OPT-30B on h200-amx16 at 24 GiB) stays loadable
    split = load_plan(FIXTURES / "v2-opt-30b-h200-amx16-split.yaml")
    assert any(0 < s.cpu_permille(phase) < 1000 for g in split.spec.layer_groups for s in g.sublayers
               for phase in ("prefill", "decode"))


def test_v1_migration_is_pure_and_refuses_what_v1_could_not_say():
    doc = yaml.safe_load((FIXTURES / "v1-tiny-opt.yaml").read_text())
    before = copy.deepcopy(doc)
    out = migrate_v1_to_v2(doc)
    assert doc == before and out["apiVersion"] == "liac/v2"
    assert _downgrade_to_v1(migrate_v2_to_v3(out)) == doc
    doc["spec"]["layer_groups"][1]["sublayers"][4]["decode"] = "split"
    with pytest.raises(MigrationError) as raised:
        migrate_v1_to_v2(doc)
    assert (raised.value.path, raised.value.message) == ("spec.layer_groups[1].sublayers[4].decode",
                                                         "unsupported value 'split': must be one of 'cpu', 'gpu'")


def test_every_kept_fixture_validates(capsys):
    files = sorted(FIXTURES.glob("*.yaml"))
    assert {f.name.split("-")[0] for f in files} >= {"v1alpha1", "v1", "v2", "v3", "v4"}
    assert main(["validate", *map(str, files)]) == 0
    assert capsys.readouterr().out.count(": OK (valid plan)") == len(files)


def test_every_registered_version_has_a_kept_fixture():
    versions = {yaml.safe_load(f.read_text())["apiVersion"] for f in FIXTURES.glob("*.yaml")}
    assert versions == set(MIGRATIONS) | {API_VERSION}


def test_migration_is_pure_and_chains_to_the_current_version():
    doc = yaml.safe_load((FIXTURES / "v1alpha1-tiny-opt.yaml").read_text())
    before = copy.deepcopy(doc)
    out = migrate_v1alpha1_to_v1(doc)
    assert doc == before  # input untouched
    assert out["apiVersion"] == MIGRATIONS["liac/v1alpha1"][0] == "liac/v1"
    version, steps = "liac/v1alpha1", 0
    while version != API_VERSION:  # every registered chain ends at the current version
        version = MIGRATIONS[version][0]
        steps += 1
        assert steps <= len(MIGRATIONS)


def test_broken_old_document_names_the_old_path():
    doc = yaml.safe_load((FIXTURES / "v1alpha1-tiny-opt.yaml").read_text())
    del doc["spec"]["layer_groups"][2]["placement"]["decode"]["fc1"]
    with pytest.raises(MigrationError) as raised:
        migrate_v1alpha1_to_v1(doc)
    assert (raised.value.path, raised.value.message) == ("spec.layer_groups[2].placement.decode.fc1",
                                                         "required sublayer is missing")
    with pytest.raises(LiacError) as raised:
        parse_plan(doc, "old.yaml")
    assert raised.value.line() == ("old.yaml: spec.layer_groups[2].placement.decode.fc1: required sublayer is missing "
                                   "(while migrating from 'liac/v1alpha1')")
    doc["spec"]["layer_groups"][2]["placement"]["decode"]["fc1"] = "cpu"
    doc["spec"]["layer_groups"][2]["weights"]["fc7"] = "ddr"
    with pytest.raises(MigrationError, match="unknown sublayer: must be one of 'qkv', 'attn_score'"):
        migrate_v1alpha1_to_v1(doc)


# ---------------------------------------------------------------------------------------------------------------
# Random valid plans

_NAMES = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12)
_SECONDS = st.floats(min_value=0, max_value=1e5, allow_nan=False, allow_infinity=False).map(stable_float)
_BYTES = st.integers(min_value=0, max_value=2**50)

TINY_QWEN = ModelConfig(**{**TINY_LLAMA.to_dict(), "name": "tiny-qwen", "family": "qwen2", "qkv_bias": True})
TINY_MIXTRAL = ModelConfig(**{**TINY_LLAMA.to_dict(), "name": "tiny-mixtral", "family": "mixtral", "num_experts": 4,
                              "experts_top_k": 2})


@st.composite
def _units(draw, names, kv_tier, splits):
    out = []
    for name in names:
        choices = DEVICES + ("split",) if splits and name in SPLIT_UNITS else DEVICES
        prefill, decode = draw(st.sampled_from(choices)), draw(st.sampled_from(choices))
        permille = {phase: draw(st.integers(1, 999)) if placement == "split" else 1000 * (placement == "cpu")
                    for phase, placement in (("prefill", prefill), ("decode", decode))}
        if name in ("attn_score", "attn_context"):
            if kv_tier == "hbm":
                decode = "gpu"
                permille["decode"] = 0
            out.append(SublayerPlacement(name, prefill, decode, "none", permille["prefill"], permille["decode"]))
            continue
        tiers = TIERS if "cpu" not in (prefill, decode) and "split" not in (prefill, decode) else ("ddr", "cxl")
        out.append(SublayerPlacement(name, prefill, decode, draw(st.sampled_from(tiers)), permille["prefill"],
                                     permille["decode"]))
    return tuple(out)


@st.composite
def valid_plans(draw, splits=True, serve=False):
    # serving plans are for dense models (an MoE model's serving batches are refused: test_moe_serving_refused)
    base = draw(st.sampled_from([TINY_OPT, TINY_LLAMA, TINY_QWEN] + ([] if serve else [TINY_MIXTRAL])))
    cfg = base.with_layers(draw(st.integers(1, 6)), name=draw(_NAMES))
    cuts = sorted(draw(st.sets(st.integers(1, cfg.num_layers - 1), max_size=3))) if cfg.num_layers > 1 else []
    bounds = [0, *cuts, cfg.num_layers]
    group_names = draw(st.lists(_NAMES, min_size=len(bounds) + 1, max_size=len(bounds) + 1, unique=True))
    groups = [LayerGroup(group_names[0], "embed", 0, 1, "none", draw(_units(("embed",), "none", splits)))]
    for index, (first, end) in enumerate(zip(bounds, bounds[1:])):
        kv = draw(st.sampled_from(TIERS))
        groups.append(LayerGroup(group_names[index + 1], "decoder", first, end - first, kv,
                                 draw(_units(SUBLAYERS[cfg.family], kv, splits))))
    groups.append(LayerGroup(group_names[-1], "head", 0, 1, "none", draw(_units(("lm_head",), "none", splits))))
    spec = PlanSpec(ModelSpec(cfg.name, cfg.family, cfg.sha256(), cfg.to_dict()),
                    HardwareSpec(draw(_NAMES), draw(st.from_regex("[0-9a-f]{64}", fullmatch=True))),
                    Workload(draw(st.integers(1, 4096)), draw(st.integers(1, 10**5)), draw(st.integers(1, 4096)),
                             draw(st.sampled_from(("latency", "throughput")))),
                    Budgets(draw(_BYTES), draw(_BYTES), draw(_BYTES)),
                    TierBytes(draw(_BYTES), draw(_BYTES), draw(_BYTES)),
                    Execution(draw(st.integers(0, 4)), draw(_BYTES), 1, 1), tuple(groups), Serving(()))
    whole = draw(st.booleans())
    spec = dataclasses.replace(spec, execution=dataclasses.replace(
        spec.execution, prefill_microbatch_sequences=spec.workload.batch_size if whole else draw(
            st.integers(1, spec.workload.batch_size)),
        prefill_microbatch_tokens=spec.workload.prompt_len if whole else draw(st.integers(1, spec.workload.prompt_len))))
    serving, serving_status = (draw(_serving(spec, splits)) if serve else ((), ()))
    spec = dataclasses.replace(spec, serving=Serving(serving))
    times = tuple(SublayerTime(g.name, s.name, phase, getattr(s, phase), draw(_SECONDS), draw(_SECONDS),
                               draw(_SECONDS))
                  for g in groups for s in g.sublayers for phase in ("prefill", "decode")
                  if draw(st.booleans()))
    status = PlanStatus(SolverReport(draw(_NAMES), draw(st.sampled_from(("optimal", "feasible", "fixed"))),
                                     draw(_SECONDS), draw(_SECONDS)),
                        Predicted(*(draw(_SECONDS) for _ in range(5)), times),
                        tuple(TierUsage(t, draw(_BYTES), draw(_BYTES)) for t in TIERS), ServingStatus(serving_status))
    return OffloadPlan(API_VERSION, "OffloadPlan", Metadata(draw(_NAMES), draw(_NAMES)), spec, status)


@st.composite
def _compute(draw, sub: SublayerPlacement, kv_tier: str, splits: bool):
    """A compute placement the sublayer's tiers allow (weights in 'hbm' compute on the GPU, an 'hbm' KV cache is
    attended on the GPU in decode, only weight GEMMs off HBM split)."""
    if sub.weights == "hbm":
        return ComputePlacement(sub.name, "gpu", "gpu", 0, 0)
    choices = DEVICES + ("split",) if splits and sub.name in SPLIT_UNITS and sub.weights in HOST_TIERS else DEVICES
    placed = {phase: draw(st.sampled_from(choices)) for phase in ("prefill", "decode")}
    if sub.name in ("attn_score", "attn_context") and kv_tier == "hbm":
        placed["decode"] = "gpu"
    permille = {phase: draw(st.integers(1, 999)) if where == "split" else 1000 * (where == "cpu")
                for phase, where in placed.items()}
    return ComputePlacement(sub.name, placed["prefill"], placed["decode"], permille["prefill"], permille["decode"])


@st.composite
def _serving(draw, spec: PlanSpec, splits: bool):
    """Serving batches ending at the workload's batch (placed as spec.layer_groups), and their status rows."""
    top = spec.workload.batch_size
    smaller = sorted(draw(st.sets(st.integers(1, top - 1), max_size=3))) if top > 1 else []
    batches = []
    for size in smaller + [top]:
        groups = []
        for group in spec.layer_groups:
            if size == top:
                subs = tuple(ComputePlacement(s.name, s.prefill, s.decode, s.prefill_cpu_permille,
                                              s.decode_cpu_permille) for s in group.sublayers)
            else:
                subs = tuple(draw(_compute(s, group.kv_cache, splits)) for s in group.sublayers)
            groups.append(GroupPlacement(group.name, subs))
        batches.append(ServingBatch(size, draw(st.integers(1, 100)), tuple(groups)))
    rows = tuple(ServingBatchStatus(b.batch_size, *(draw(_SECONDS) for _ in range(5))) for b in batches)
    return tuple(batches), rows


_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(valid_plans())
def test_random_plans_round_trip_through_yaml(plan):
    assert check_semantics(plan) == []
    text = plan_to_yaml(plan)
    again = parse_plan(yaml.safe_load(text), "fuzz")
    assert again == plan
    assert plan_to_yaml(again) == text  # and the file is byte-identical


@_SETTINGS
@given(valid_plans(serve=True))
def test_random_serving_plans_round_trip_through_yaml(plan):
    assert check_semantics(plan) == []
    text = plan_to_yaml(plan)
    again = parse_plan(yaml.safe_load(text), "fuzz")
    assert again == plan and plan_to_yaml(again) == text
    for batch in plan.spec.serving.batches:  # each live batch's plan is a sound plan of one point
        assert check_semantics(batch_plan(plan, batch.batch_size)) == []


@_SETTINGS
@given(valid_plans())
def test_random_plans_round_trip_through_v3_and_v2(plan):
    doc = to_data(plan)
    v3 = _downgrade_to_v3(doc)
    assert migrate_v3_to_v4(v3) == doc and parse_plan(v3, "fuzz") == plan
    execution, work = plan.spec.execution, plan.spec.workload
    if (execution.prefill_microbatch_sequences, execution.prefill_microbatch_tokens) != (work.batch_size,
                                                                                       work.prompt_len):
        return  # v2 cannot say it
    assert _up_from_v2(_downgrade_to_v2(doc)) == doc
    assert parse_plan(_downgrade_to_v2(doc), "fuzz") == plan


@_SETTINGS
@given(valid_plans(splits=False))
def test_random_plans_round_trip_through_v1_and_v1alpha1(plan):
    doc = to_data(plan)
    execution, work = plan.spec.execution, plan.spec.workload
    if (execution.prefill_microbatch_sequences, execution.prefill_microbatch_tokens) != (work.batch_size,
                                                                                       work.prompt_len):
        return  # v1 cannot say it
    v1 = _downgrade_to_v1(doc)
    assert _up_from_v2(migrate_v1_to_v2(v1)) == doc
    assert parse_plan(v1, "fuzz") == plan
    assert migrate_v1alpha1_to_v1(_downgrade_to_v1alpha1(v1)) == v1
    assert parse_plan(_downgrade_to_v1alpha1(v1), "fuzz") == plan


def test_kept_v3_fixture_loads_as_the_kept_v4_plan():
    old, new = load_plan(FIXTURES / "v3-tiny-opt.yaml"), load_plan(FIXTURES / "v4-tiny-opt.yaml")
    assert old == new and new.spec.serving.batches == () and new.status.serving.batches == ()
    # a v4 serving plan (compiled: the tiny OPT on spr-h100, batches 1, 2, 4) keeps a placement per batch size
    serve = load_plan(FIXTURES / "v4-tiny-opt-serve.yaml")
    assert [b.batch_size for b in serve.spec.serving.batches] == [1, 2, 4]


def test_v4_migration_is_pure_and_refuses_a_v3_document_with_serving():
    doc = yaml.safe_load((FIXTURES / "v3-tiny-opt.yaml").read_text())
    before = copy.deepcopy(doc)
    out = migrate_v3_to_v4(doc)
    assert doc == before and out["apiVersion"] == "liac/v4"
    assert out["spec"]["serving"] == out["status"]["serving"] == {"batches": []}
    assert _downgrade_to_v3(out) == doc
    doc["spec"]["serving"] = {"batches": []}
    with pytest.raises(MigrationError) as raised:
        migrate_v3_to_v4(doc)
    assert (raised.value.path, raised.value.message) == ("spec.serving",
                                                         "unknown field: liac/v3 has no serving batches")
