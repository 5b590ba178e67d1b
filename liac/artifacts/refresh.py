"""The checked-in artifacts, regenerated: plans/ (one sweep per model × profile), docs/plans/, docs/plan-format.md.

`scripts/refresh-artifacts` (`make artifacts`) calls `refresh_artifacts(repo_root)`; tests/test_checked_in.py calls
it into a temporary directory and compares, like a lock file. Everything here is deterministic (one solver
thread, no timestamps), so a fresh run over unchanged code gives byte-identical plans and pages.

The set is fixed below: LIA's OPT models, Llama 3.1 70B/405B and Mixtral 8x7B on every shipped profile, at
`BATCHES` (chosen so the whole regeneration stays within a few minutes on two cores: see docs/architecture.md),
prompt 128, 32 new tokens, objective latency, default budgets. A model × profile with no feasible batch is recorded
in plans/sweeps.yaml with the compiler's one-line reason; infeasible batches of a feasible sweep are listed in its
index.yaml. Both show on the docs pages.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from liac.api import compile_plans, write_plans
from liac.artifacts.render import render_docs
from liac.artifacts.schemadoc import render_plan_format
from liac.errors import InfeasibleError
from liac.fileio import write_atomic, yaml_dump
from liac.models import resolve_model
from liac.passes.trace import trace_model
from liac.sweep import CATALOG_NAME, INDEX_NAME

__all__ = ["MODELS", "PROFILES", "BATCHES", "PROMPT_LEN", "GEN_LEN", "SKIPPED", "SweepOutcome", "refresh_artifacts",
           "compile_sweep", "write_catalog"]

MODELS = ("opt-30b", "opt-66b", "opt-175b", "llama-3.1-70b", "llama-3.1-405b", "mixtral-8x7b")
PROFILES = ("spr-h100", "spr-a100", "gnr-h100", "spr-h100-cxl", "h200-amx16")
BATCHES = (1, 16, 256)
PROMPT_LEN = 128
GEN_LEN = 32
# Pairs not compiled, with the reason shown on the index page. A checked-in plan must be proven optimal.
SKIPPED = {
    ("llama-3.1-405b", "spr-h100-cxl"): "not checked in: HBM, DDR and CXL all bind, and the compiler's work limits "
                                        "leave its placement unproven (status 'feasible', gap about 6e-5 at batch 1) "
                                        "after minutes per point",
}


@dataclass(frozen=True)
class SweepOutcome:
    """What compiling one model × profile gave: a directory of plans, or the reason there is none."""

    model: str
    profile: str
    directory: str  # relative to plans/, '' when infeasible
    plans: int
    infeasible_batches: tuple[int, ...]
    reason: str  # '' when at least one batch has a plan


def _compile_model(model: str, profiles: tuple[str, ...], plans_dir: str) -> list[SweepOutcome]:
    """All sweeps of one model (one trace, reused for every profile); runs in a worker process."""
    graph = trace_model(resolve_model(model))
    out = []
    for profile in profiles:
        directory = Path(plans_dir) / f"{model}.{profile}"
        if (model, profile) in SKIPPED:
            out.append(SweepOutcome(model, profile, "", 0, BATCHES, SKIPPED[(model, profile)]))
            continue
        try:
            result = compile_plans(model, profile, batches=BATCHES, prompt_len=PROMPT_LEN, gen_len=GEN_LEN,
                                   graph=graph)
        except InfeasibleError as e:
            out.append(SweepOutcome(model, profile, "", 0, BATCHES, e.line()))
            continue
        unproven = [p.plan.metadata.name for p in result.points if p.plan.status.solver.status != "optimal"]
        if unproven:
            raise RuntimeError(f"{', '.join(unproven)}: solve not proven optimal: add "
                               f"({model!r}, {profile!r}) to SKIPPED in liac/artifacts/refresh.py with the reason")
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob("*.yaml"):  # a batch that became infeasible must not leave its old plan
            old.unlink()
        write_plans(result, directory)
        out.append(SweepOutcome(model, profile, directory.name, len(result.points),
                                tuple(batch for batch, _ in result.infeasible), ""))
    return out


def compile_sweep(model: str, profile: str, plans_dir: str | Path) -> SweepOutcome:
    """One model × profile into `plans_dir/<model>.<profile>/` (for a quick look at one pair)."""
    return _compile_model(model, (profile,), str(plans_dir))[0]


def write_catalog(outcomes: list[SweepOutcome], plans_dir: Path) -> None:
    """plans/sweeps.yaml: the settings and every model × profile, with its directory or why it has none."""
    entries = []
    for o in sorted(outcomes, key=lambda o: (MODELS.index(o.model), PROFILES.index(o.profile))):
        entry = {"model": o.model, "hardware": o.profile}
        if o.reason:
            entry["reason"] = o.reason
        else:
            entry.update(directory=o.directory, plans=o.plans, infeasible_batches=list(o.infeasible_batches))
        entries.append(entry)
    doc = {"kind": "SweepCatalog", "generated_by": "scripts/refresh-artifacts",
           "settings": {"batches": list(BATCHES), "prompt_len": PROMPT_LEN, "gen_len": GEN_LEN,
                        "objective": "latency", "budgets": "profile defaults"},
           "sweeps": entries}
    write_atomic(plans_dir / CATALOG_NAME, yaml_dump(doc))


def refresh_artifacts(root: str | Path, jobs: int | None = None, models=MODELS, profiles=PROFILES) -> list[str]:
    """Regenerate `root/plans/`, `root/docs/plans/` and `root/docs/plan-format.md`; returns log lines.

    Args:
        root: the repository root (or a temporary directory shaped like it).
        jobs: worker processes (one model each at a time); default: the CPU count, at most len(models).
    """
    root = Path(root)
    plans_dir, docs_dir = root / "plans", root / "docs" / "plans"
    plans_dir.mkdir(parents=True, exist_ok=True)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(models)))
    if jobs == 1:
        outcomes = [o for model in models for o in _compile_model(model, tuple(profiles), str(plans_dir))]
    else:
        # spawn, not fork: the parent may hold torch's thread pools, which a forked child can deadlock on.
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_compile_model, model, tuple(profiles), str(plans_dir)) for model in models]
            outcomes = [o for future in futures for o in future.result()]
    kept = {o.directory for o in outcomes if o.directory}
    for stale in plans_dir.iterdir():  # sweeps of pairs no longer compiled or no longer feasible
        if stale.is_dir() and stale.name not in kept and (stale / INDEX_NAME).is_file():
            shutil.rmtree(stale)
    write_catalog(outcomes, plans_dir)
    written = render_docs(plans_dir, docs_dir)
    write_atomic(root / "docs" / "plan-format.md", render_plan_format())
    log = [f"{o.model} on {o.profile}: " + (f"{o.plans} plans in plans/{o.directory}"
                                             + (f", infeasible at batch {', '.join(map(str, o.infeasible_batches))}"
                                                if o.infeasible_batches else "") if not o.reason
                                             else f"no plan: {o.reason}") for o in outcomes]
    return log + [f"wrote {len(written)} files to {docs_dir} and {root / 'docs' / 'plan-format.md'}"]
