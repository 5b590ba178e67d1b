"""Hand-made plans for the artifact tests: tiny models, built with the plan dataclasses, no compiler involved.

`make_plan` gives a semantically valid plan (check_semantics passes) whose memory claims cover what it places, so a
test breaks exactly one thing and expects exactly that error.
"""

from __future__ import annotations

import dataclasses

import yaml

from liac.cli import main
from liac.models import SUBLAYERS
from liac.models.config import ModelConfig
from liac.plan import (API_VERSION, Budgets, Execution, HardwareSpec, LayerGroup, Metadata, ModelSpec, OffloadPlan,
                       PlanSpec,
                       PlanStatus, Predicted, SolverReport, SublayerPlacement, SublayerTime, TierBytes, TierUsage,
                       Workload, plan_to_yaml, Serving, ServingStatus)
from liac.schema_tools import stable_float

__all__ = ["TINY_OPT", "TINY_LLAMA", "GIB", "make_plan", "with_group", "replace_sub", "plan_doc", "write_doc",
           "save_plan", "run_cli"]

GIB = 2**30

TINY_OPT = ModelConfig(name="tiny-opt", family="opt", hidden_size=64, num_layers=6, num_heads=4, num_kv_heads=4,
                       head_dim=16, ffn_dim=256, vocab_size=128, max_position=64, norm="layernorm", norm_eps=1e-5,
                       activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True)
TINY_LLAMA = ModelConfig(name="tiny-llama", family="llama", hidden_size=64, num_layers=4, num_heads=4,
                         num_kv_heads=2, head_dim=16, ffn_dim=160, vocab_size=96, max_position=128, norm="rmsnorm",
                         norm_eps=1e-5, activation="silu", qkv_bias=False, proj_bias=False, tie_embeddings=False,
                         rope_theta=10000.0)

_WEIGHTLESS = ("attn_score", "attn_context")


def _units(names, prefill, decode, tier):
    return tuple(SublayerPlacement.whole(name, prefill, decode, "none" if name in _WEIGHTLESS else tier) for name in names)


def make_plan(cfg: ModelConfig = TINY_OPT, *, batch: int = 1, prompt: int = 16, gen: int = 8, resident: int = 2,
              offload_prefill: str = "gpu", offload_decode: str = "cpu", offload_kv: str = "ddr",
              gpu_bytes: int = GIB, cpu_bytes: int = 4 * GIB, cxl_bytes: int = 0, seconds_scale: float = 1.0,
              prefetch_depth: int = 0) -> OffloadPlan:
    """A valid plan: layers [0, resident) all GPU from HBM, the rest offloaded (weights in DDR)."""
    units = SUBLAYERS[cfg.family]
    offload_tier = "ddr"
    groups = [LayerGroup("embed", "embed", 0, 1, "none", _units(("embed",), "gpu", "gpu", "hbm"))]
    if resident:
        groups.append(LayerGroup("resident", "decoder", 0, resident, "hbm", _units(units, "gpu", "gpu", "hbm")))
    if resident < cfg.num_layers:
        groups.append(LayerGroup("offload", "decoder", resident, cfg.num_layers - resident, offload_kv,
                                 _units(units, offload_prefill, offload_decode, offload_tier)))
    groups.append(LayerGroup("head", "head", 0, 1, "none", _units(("lm_head",), "gpu", "gpu", "hbm")))
    spec = PlanSpec(
        model=ModelSpec(cfg.name, cfg.family, cfg.sha256(), cfg.to_dict()),
        hardware=HardwareSpec("test-hw", "0" * 64),
        workload=Workload(batch, prompt, gen, "latency"),
        budgets=Budgets(gpu_bytes, cpu_bytes, cxl_bytes),
        # Reserve half of each budget: far more than a tiny model needs, never more than allowed.
        memory=TierBytes(gpu_bytes // 2, cpu_bytes // 2, cxl_bytes // 2),
        execution=Execution(prefetch_depth, 4096 if prefetch_depth else 0, batch, prompt),
        layer_groups=tuple(groups),
        serving=Serving(()),
    )
    times = []
    for rank, (group, sub) in enumerate((g, s) for g in groups for s in g.sublayers):
        for phase in ("prefill", "decode"):
            device = getattr(sub, phase)
            times.append(SublayerTime(group.name, sub.name, phase, device,
                                      stable_float(seconds_scale * 1e-4 * (rank + 1)), 1e-6, 0.0))
    prefill = stable_float(sum(t.compute_seconds for t in times if t.phase == "prefill") * cfg.num_layers)
    per_token = stable_float(sum(t.compute_seconds for t in times if t.phase == "decode") * cfg.num_layers)
    decode = stable_float(per_token * gen)
    total = stable_float(prefill + decode)
    predicted = Predicted(prefill, decode, per_token, total, stable_float(batch * gen / total), tuple(times))
    status = PlanStatus(
        solver=SolverReport("fixed", "fixed", total, 0.0),
        predicted=predicted,
        memory=(TierUsage("hbm", gpu_bytes // 4, gpu_bytes), TierUsage("ddr", cpu_bytes // 4, cpu_bytes),
                TierUsage("cxl", 0, cxl_bytes)),
        serving=ServingStatus(()),
    )
    name = f"{cfg.name}.test-hw.b{batch}-p{prompt}-g{gen}"
    return OffloadPlan(API_VERSION, "OffloadPlan", Metadata(name, "0.1.0"), spec, status)


def with_group(plan: OffloadPlan, index: int, **changes) -> OffloadPlan:
    """`plan` with `spec.layer_groups[index]` replaced field by field."""
    groups = list(plan.spec.layer_groups)
    groups[index] = dataclasses.replace(groups[index], **changes)
    return dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, layer_groups=tuple(groups)))


def replace_sub(plan: OffloadPlan, group: int, unit: str, **changes) -> OffloadPlan:
    """`plan` with one sublayer placement of one group changed (status left as it was); a phase moved wholly to
    'cpu' or 'gpu' gets that placement's permille (1000 or 0) unless `changes` gives one."""
    for phase in ("prefill", "decode"):
        if changes.get(phase) in ("cpu", "gpu"):
            changes.setdefault(f"{phase}_cpu_permille", 1000 if changes[phase] == "cpu" else 0)
    subs = tuple(dataclasses.replace(s, **changes) if s.name == unit else s
                 for s in plan.spec.layer_groups[group].sublayers)
    return with_group(plan, group, sublayers=subs)


def plan_doc(plan: OffloadPlan | None = None) -> dict:
    """A plan (default `make_plan()`) as the plain data of its YAML file, to break by hand."""
    return yaml.safe_load(plan_to_yaml(plan or make_plan()))


def write_doc(folder, doc: dict, name: str = "plan.yaml"):
    """Plain data written as a YAML file in `folder`; returns its path."""
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=True))
    return path


def save_plan(path, plan: OffloadPlan):
    """A plan written as its YAML file at `path` (folders made); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(plan_to_yaml(plan))
    return path


def run_cli(capsys, command: str, *args) -> tuple[int, list[str], str]:
    """`liac COMMAND ARGS...` in process: (exit status, stdout lines, stderr)."""
    code = main([command, *map(str, args)])
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err
