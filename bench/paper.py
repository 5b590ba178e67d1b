"""The LIA paper's findings, compiled: what liac plans and predicts at each of the paper's settings (docs/paper.md).

    .venv/bin/python bench/paper.py                       # writes bench/results/paper.json (10-20 min on 2 cores)
    .venv/bin/python bench/paper.py --only absolute,cxl   # some sections

Sections (each a list of compiled points: settings, policy strings, predicted seconds, tokens/s, memory):

  thresholds  OPT-175B under `--policy lia` (LIA's three policies, the solver picking per phase) and the optimum,
              batch 1..2048 at prompts 32 and 256, DDR lifted to 4 TiB like the paper's analytical points: which
              policy LIA's offloaded layers take in prefill and in decode, on spr-a100, spr-h100 and gnr-h100
              (Fig. 9: prefill CPU→GPU near B·L ≈ 850, decode CPU→partial near B ≈ 858; H100 GPU-centric sooner)
  resident    Optimization-1: the share of OPT-30B / OPT-66B / OPT-175B decoder layers LIA's policy keeps resident
              at batch 1 (the paper's 62 % for OPT-30B, prompt 2016, on SPR-A100)
  ablation    Table 4: LIA's policy with and without resident layers (`--no-resident-layers`), OPT-30B, spr-a100,
              batch 1, 64 and 900
  ipex        Fig. 10: LIA's policy against IPEX (all on the CPU, no GPU: `--policy lia-cpu --gpu-mem 0`),
              OPT-30B, spr-a100, batch 1, prompts 32, 256, 2016
  cxl         Table 3: OPT-30B on spr-a100-cxl with DDR at LIA's batch-900 footprint (140 GB), CXL 0 or 238 GiB:
              LIA's configuration (`lia-gpu/lia-partial --no-resident-layers`, its artifact's) and the optimum
  cxl_capacity  the largest batch that fits, and its tokens/s, as the CXL capacity grows 0..238 GiB (the same
              machine, DDR and configuration as `cxl`)
  absolute    OPT-30B, batch 900, prompt 32, 32 tokens, spr-a100 (the paper's 280 tokens/s): the optimum, LIA's
              policy, LIA's configuration, and LIA's configuration priced with each layer's chain *added* to its
              weight stream instead of overlapping it (what Table 3's two points imply of LIA's runtime)
  microbatch  issue 17's long-prompt settings: OPT-30B spr-a100 batch 64 prompt 2016, OPT-175B spr-h100 prompt 2016
              batch 16..64 (DDR 2 TiB), OPT-66B batch 64 prompt 2016, Llama-3.1-405B gnr-h100 batch 1 prompt 8192
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

__all__ = ["main", "lia_policy_of", "SECTIONS"]

TIB = 2**40
LETTERS = {"CCCCCC": "cpu", "GCCGGG": "partial", "GGGGGG": "gpu"}


def lia_policy_of(plan, phase: str) -> str:
    """LIA's policy the plan's offloaded decoder layers take in `phase` ('cpu', 'partial', 'gpu', or the letters),
    by layer count; 'resident' when every decoder layer is resident (all its weights in HBM)."""
    counts: dict[str, int] = {}
    for group in plan.spec.layer_groups:
        if group.layer_class != "decoder" or all(s.weights in ("hbm", "none") for s in group.sublayers):
            continue
        letters = "".join({"cpu": "C", "gpu": "G", "split": "S"}[getattr(s, phase)] for s in group.sublayers)
        name = LETTERS.get(letters, letters)
        counts[name] = counts.get(name, 0) + group.layer_count
    return max(sorted(counts), key=counts.get) if counts else "resident"


def _resident_share(plan) -> float:
    groups = [g for g in plan.spec.layer_groups if g.layer_class == "decoder"]
    resident = sum(g.layer_count for g in groups if all(s.weights in ("hbm", "none") for s in g.sublayers))
    return resident / sum(g.layer_count for g in groups)


def _point(plan, **extra) -> dict:
    from liac.sweep import microbatch_string, policy_string

    predicted = plan.status.predicted
    memory = {u.tier: round(u.used_bytes / 2**30, 1) for u in plan.status.memory}
    return {"plan": plan.metadata.name, "batch": plan.spec.workload.batch_size,
            "prompt": plan.spec.workload.prompt_len, "gen": plan.spec.workload.gen_len,
            "prefill": policy_string(plan, "prefill"), "decode": policy_string(plan, "decode"),
            "lia_prefill": lia_policy_of(plan, "prefill"), "lia_decode": lia_policy_of(plan, "decode"),
            "resident_share": round(_resident_share(plan), 3), "microbatch": microbatch_string(plan),
            "prefill_seconds": round(predicted.prefill_seconds, 4), "decode_seconds_per_token":
                round(predicted.decode_seconds_per_token, 5), "total_seconds": round(predicted.total_seconds, 3),
            "tokens_per_second": round(predicted.tokens_per_second, 3), "gib": memory, **extra}


class _Compiler:
    """compile_plans with one trace per model; an infeasible point is recorded with its reason."""

    def __init__(self):
        self.graphs = {}

    def __call__(self, model: str, profile: str, batch: int, prompt: int, gen: int = 32, **kwargs) -> dict:
        from liac.api import compile_plans
        from liac.errors import InfeasibleError
        from liac.passes.trace import trace_model
        from liac.models import resolve_model
        from liac.profile import resolve_profile

        if model not in self.graphs:
            self.graphs[model] = trace_model(resolve_model(model))
        hw = resolve_profile(profile)
        if kwargs.get("cpu_mem", 0) > hw.cpu_ddr_gib * 2**30:
            # the paper's analytical points assume more DDR than the machine has: a profile with that much
            hw = dataclasses.replace(hw, cpu_ddr_gib=kwargs["cpu_mem"] / 2**30)
        began = time.perf_counter()
        try:
            result = compile_plans(model, hw, batches=(batch,), prompt_len=prompt, gen_len=gen,
                                   graph=self.graphs[model], **kwargs)
        except InfeasibleError as e:
            return {"model": model, "profile": profile, "batch": batch, "prompt": prompt, "gen": gen,
                    "infeasible": e.line(), **{k: str(v) for k, v in kwargs.items()}}
        if result.infeasible:
            return {"model": model, "profile": profile, "batch": batch, "prompt": prompt, "gen": gen,
                    "infeasible": result.infeasible[0][1], **{k: str(v) for k, v in kwargs.items()}}
        plan = result.points[0].plan
        return _point(plan, model=model, profile=profile, seconds=round(time.perf_counter() - began, 2),
                      **{k: str(v) for k, v in kwargs.items()}), plan


def _plain(out):
    return out[0] if isinstance(out, tuple) else out


def thresholds(compile_point) -> list[dict]:
    rows = []
    for profile in ("spr-a100", "spr-h100", "gnr-h100"):
        for prompt in (32, 256):
            for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048):
                for policy in ("lia", None):
                    rows.append(_plain(compile_point("opt-175b", profile, batch, prompt, cpu_mem=4 * TIB,
                                                     policy=policy)))
    return rows


def resident(compile_point) -> list[dict]:
    return [_plain(compile_point(model, profile, 1, prompt, policy="lia"))
            for model, profile, prompt in (("opt-30b", "spr-a100", 2016), ("opt-30b", "spr-a100", 32),
                                           ("opt-175b", "spr-a100", 32), ("opt-66b", "spr-h100", 32),
                                           ("opt-175b", "spr-h100", 32))]


def ablation(compile_point) -> list[dict]:
    rows = []
    for batch, prompt in ((1, 32), (64, 32), (64, 2016), (900, 32)):
        for resident_layers in (True, False):
            rows.append(_plain(compile_point("opt-30b", "spr-a100", batch, prompt, policy="lia",
                                             resident_layers=resident_layers)))
    return rows


def ipex(compile_point) -> list[dict]:
    rows = []
    for prompt in (32, 256, 2016):
        rows.append(_plain(compile_point("opt-30b", "spr-a100", 1, prompt, policy="lia-cpu", gpu_mem=0)))
        rows.append(_plain(compile_point("opt-30b", "spr-a100", 1, prompt, policy="lia")))
        rows.append(_plain(compile_point("opt-30b", "spr-a100", 1, prompt)))
    return rows


def cxl(compile_point) -> list[dict]:
    rows = []
    lia = {"policy": "lia-gpu/lia-partial", "resident_layers": False}
    for cxl_mem in (0, 238 * 2**30):
        for batch in (900, 1000, 1580, 1700):
            rows.append(_plain(compile_point("opt-30b", "spr-a100-cxl", batch, 32, cpu_mem=140 * 10**9,
                                             cxl_mem=cxl_mem, **lia)))
        for batch in (900, 1200, 1580, 1800):
            rows.append(_plain(compile_point("opt-30b", "spr-a100-cxl", batch, 32, cpu_mem=140 * 10**9,
                                             cxl_mem=cxl_mem)))
    return rows


def cxl_capacity(compile_point) -> list[dict]:
    """The largest batch (to 10 sequences) that fits as the CXL capacity grows, and its tokens/s: OPT-30B on
    spr-a100-cxl, DDR at 140 GB, LIA's configuration (the issue's CXL-capacity sweep)."""
    rows = []
    lia = {"policy": "lia-gpu/lia-partial", "resident_layers": False}
    for gib in (0, 32, 64, 128, 192, 238):
        def fits(batch):
            out = compile_point("opt-30b", "spr-a100-cxl", batch, 32, cpu_mem=140 * 10**9, cxl_mem=gib * 2**30, **lia)
            return out if isinstance(out, tuple) else None
        low, high = 10, 4000  # low fits (checked below), high does not
        assert fits(low) and not fits(high)
        while high - low > 10:
            middle = (low + high) // 20 * 10
            low, high = (middle, high) if fits(middle) else (low, middle)
        rows.append({**_plain(fits(low)), "cxl_gib": gib, "largest_batch": low})
    return rows


def _serial_tokens_per_second(plan) -> float:
    """tokens/s when each layer's chain (compute and transfers) is added to its weight stream, not overlapped."""
    from liac.passes.price import price_plan

    price = price_plan(plan)
    work = plan.spec.workload
    total = 0.0
    for priced in price.groups:
        steps = {"prefill": 1, "decode": work.gen_len - 1}
        for phase in ("prefill", "decode"):
            per = sum(u.compute_seconds + u.transfer_seconds + u.stream_seconds for u in priced.units[phase])
            total += priced.group.layer_count * steps[phase] * per
    return work.batch_size * work.gen_len / total


def absolute(compile_point) -> list[dict]:
    rows = []
    for kwargs in ({}, {"policy": "lia"}, {"policy": "lia-gpu/lia-partial", "resident_layers": False}):
        out = compile_point("opt-30b", "spr-a100", 900, 32, **kwargs)
        row = _plain(out)
        if isinstance(out, tuple):
            row["serial_tokens_per_second"] = round(_serial_tokens_per_second(out[1]), 1)
        rows.append(row)
    cut = compile_point("opt-30b", "spr-a100-cxl", 1580, 32, cpu_mem=140 * 10**9, policy="lia-gpu/lia-partial",
                        resident_layers=False)
    row = _plain(cut)
    if isinstance(cut, tuple):
        row["serial_tokens_per_second"] = round(_serial_tokens_per_second(cut[1]), 1)
    rows.append(row)
    return rows


def microbatch(compile_point) -> list[dict]:
    rows = [_plain(compile_point("opt-30b", "spr-a100", 64, 2016))]
    rows += [_plain(compile_point("opt-175b", "spr-h100", batch, 2016, cpu_mem=2 * TIB)) for batch in (16, 32, 48, 64)]
    rows += [_plain(compile_point("opt-66b", profile, 64, 2016)) for profile in ("spr-h100", "spr-a100")]
    rows.append(_plain(compile_point("llama-3.1-405b", "gnr-h100", 1, 8192)))
    return rows


SECTIONS = {"thresholds": thresholds, "resident": resident, "ablation": ablation, "ipex": ipex, "cxl": cxl,
            "cxl_capacity": cxl_capacity, "absolute": absolute, "microbatch": microbatch}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "paper.json"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parents[1]))
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}: must be among {', '.join(SECTIONS)}")
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {}
    compile_point = _Compiler()
    for name in names:
        began = time.perf_counter()
        doc[name] = SECTIONS[name](compile_point)
        print(f"{name}: {len(doc[name])} points in {time.perf_counter() - began:.0f} s", file=sys.stderr)
        out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
