"""The checked-in artifacts, regenerated: plans/ (one sweep per model × profile), docs/plans/, docs/plan-format.md.

`scripts/refresh-artifacts` (`make artifacts`) calls `refresh_artifacts(repo_root)`, which solves every point.
Everything here is deterministic (one solver thread, no timestamps), so a fresh run over unchanged code gives
byte-identical plans and pages.

tests/test_checked_in.py checks the committed tree like a lock file without re-solving every point
(docs/architecture.md, "Checked-in plans"): `refresh_artifacts(tmp, reuse=REPO)` builds the same tree with every
committed plan *re-priced* from the choice it records (`liac.api.reprice_point`: current trace, profile, cost
model, emitter, format) and only the points without a committed plan solved; plans/sweeps.yaml records
`decision_fingerprint()`, a hash of the code that decides which placement wins (the passes, the models, the
profile and compile code, comments and docstrings ignored), so a change there makes the committed catalog stale
until `make artifacts` re-solves everything; and a few points, chosen by that hash, are re-solved in full.

The set is fixed below: LIA's OPT models, Llama 3.1 70B/405B and Mixtral 8x7B on every shipped profile, at
`BATCHES` (chosen so the whole regeneration stays within a few minutes on two cores: see docs/architecture.md),
prompt 128, 32 new tokens, objective latency, default budgets. A model × profile with no feasible batch is recorded
in plans/sweeps.yaml with the compiler's one-line reason; infeasible batches of a feasible sweep are listed in its
index.yaml. Both show on the docs pages.
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import shutil
import tokenize
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import liac
import liac.passes
from liac.api import CompileResult, compile_budgets, compile_point, reprice_point, write_plans
from liac.artifacts.render import render_docs
from liac.artifacts.schemadoc import render_plan_format
from liac.errors import InfeasibleError
from liac.fileio import safe_name, write_atomic, yaml_dump
from liac.models import resolve_model
from liac.passes.emit import plan_name
from liac.passes.ilp import SolverOptions
from liac.passes.trace import trace_model
from liac.plan import load_plan
from liac.profile import resolve_profile
from liac.sweep import CATALOG_NAME, INDEX_NAME

__all__ = ["MODELS", "PROFILES", "BATCHES", "PROMPT_LEN", "GEN_LEN", "SKIPPED", "DECISION_CODE", "SweepOutcome",
           "refresh_artifacts", "compile_sweep", "artifact_solver_options", "write_catalog", "decision_fingerprint"]

MODELS = ("opt-30b", "opt-66b", "opt-175b", "llama-3.1-70b", "llama-3.1-405b", "mixtral-8x7b")
PROFILES = ("spr-h100", "spr-a100", "gnr-h100", "spr-h100-cxl", "spr-a100-cxl", "h200-amx16")
BATCHES = (1, 16, 256)
PROMPT_LEN = 128
GEN_LEN = 32
# Pairs not compiled, with the reason shown on the index page. A checked-in plan must be proven optimal; points are
# solved with `artifact_solver_options` (work limits, never a time limit), so "proven" does not depend on the machine.
SKIPPED: dict[tuple[str, str], str] = {}


# The code that decides which placement a checked-in plan holds, beyond what re-pricing the recorded choice
# checks (package-relative globs; `decision_fingerprint`): the passes (trace, costs, ILP, emit), the model code that
# is traced, the profile's numbers (the AMX curve), and compile_plans.
DECISION_CODE = ("passes/*.py", "models/*.py", "profile.py", "api.py")


def _code_text(text: str) -> str:
    """Python source → its tokens without comments, docstrings and blank lines (one per line), so that editing
    prose does not change the fingerprint. f-strings are taken whole from the source, as tokenize reports them
    before Python 3.12 (which splits them into FSTRING_* tokens)."""
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def at(position):
        return offsets[position[0] - 1] + position[1]

    tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
              if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)]
    out, index, previous = [], 0, tokenize.NEWLINE
    while index < len(tokens):
        token = tokens[index]
        kind, string = token.type, token.string
        if tokenize.tok_name[kind] == "FSTRING_START":  # Python >= 3.12: one string, as before
            depth, end = 0, index
            while True:
                name = tokenize.tok_name[tokens[end].type]
                depth += (name == "FSTRING_START") - (name == "FSTRING_END")
                if depth == 0:
                    break
                end += 1
            kind, string = tokenize.STRING, text[at(token.start):at(tokens[end].end)]
            index = end
        following = tokens[index + 1].type if index + 1 < len(tokens) else tokenize.ENDMARKER
        docstring = kind == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT) \
            and following in (tokenize.NEWLINE, tokenize.ENDMARKER)
        if not docstring:
            out.append(f"{tokenize.tok_name[kind]} {string}")
            previous = kind
        index += 1
    return "\n".join(out)


def decision_fingerprint() -> str:
    """sha256 of `DECISION_CODE` (each file by its package-relative name and its code tokens)."""
    roots = {"passes": Path(liac.passes.__file__).parent, "": Path(liac.__file__).parent}
    digest = hashlib.sha256()
    for pattern in DECISION_CODE:
        root_key = "passes" if pattern.startswith("passes/") else ""
        root = roots[root_key]
        for path in sorted(root.glob(pattern.split("/", 1)[1] if root_key else pattern)):
            digest.update(f"{pattern.split('*')[0]}{path.name}\n".encode())
            digest.update(_code_text(path.read_text()).encode())
            digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class SweepOutcome:
    """What compiling one model × profile gave: a directory of plans, or the reason there is none."""

    model: str
    profile: str
    directory: str  # relative to plans/, '' when infeasible
    plans: int
    infeasible_batches: tuple[int, ...]
    reason: str  # '' when at least one batch has a plan


def _compile_model(model: str, profiles: tuple[str, ...], plans_dir: str,
                   reuse: str | None = None) -> list[SweepOutcome]:
    """All sweeps of one model (one trace, reused for every profile); runs in a worker process. With `reuse` (a
    directory of committed sweeps), a point whose plan is there is re-priced from it, not solved. Points are solved
    with `artifact_solver_options` (work limits, no wall-clock limit): the outcome never depends on the machine's
    load."""
    cfg = resolve_model(model)
    graph = trace_model(cfg)
    options = artifact_solver_options()
    out = []
    for profile_name in profiles:
        directory = Path(plans_dir) / f"{model}.{profile_name}"
        if (model, profile_name) in SKIPPED:
            out.append(SweepOutcome(model, profile_name, "", 0, BATCHES, SKIPPED[(model, profile_name)]))
            continue
        profile = resolve_profile(profile_name)
        budgets = compile_budgets(profile)
        points, infeasible = [], []
        for batch in BATCHES:
            name = safe_name(plan_name(cfg.name, profile.name, batch, PROMPT_LEN, GEN_LEN, "optimal")) + ".yaml"
            committed = Path(reuse) / directory.name / name if reuse else None
            point = None
            if committed is not None and committed.is_file():
                point = reprice_point(graph, cfg, profile, load_plan(committed), budgets)
            if point is None:
                try:
                    point = compile_point(graph, cfg, profile, batch, PROMPT_LEN, GEN_LEN, budgets, options,
                                          "latency")
                except InfeasibleError as e:
                    infeasible.append((batch, e))
                    continue
            points.append(point)
        if not points:
            batch, error = infeasible[0]
            out.append(SweepOutcome(model, profile_name, "", 0, BATCHES,
                                    f"{error.source}: batch {batch}: {error.message}"))
            continue
        result = CompileResult(points=tuple(points), infeasible=tuple((b, e.message) for b, e in infeasible),
                               model=cfg.name, profile=profile.name, objective="latency", policy="optimal")
        unproven = [p.plan.metadata.name for p in result.points if p.plan.status.solver.status != "optimal"]
        if unproven:
            raise RuntimeError(f"{', '.join(unproven)}: solve not proven optimal: add "
                               f"({model!r}, {profile_name!r}) to SKIPPED in liac/artifacts/refresh.py with the reason")
        write_plans(result, directory)  # a transaction: plans of batches that became infeasible go
        out.append(SweepOutcome(model, profile_name, directory.name, len(result.points),
                                tuple(batch for batch, _ in result.infeasible), ""))
    return out


def artifact_solver_options() -> SolverOptions:
    """How every checked-in point is solved, by `make artifacts` and by the freshness check
    (tests/test_checked_in.py): SolverOptions' defaults, one thread and count-based work limits (`max_states`,
    `node_limit`), never a wall-clock time limit. A work limit stops a search at the same place on every machine,
    so a solve ends with the same answer and the same proof on any machine, later on a loaded one rather than
    differently ('not proven optimal'). Pairs the limits leave unproven are in SKIPPED instead."""
    return SolverOptions()


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
           "decision_code_sha256": decision_fingerprint(),
           "sweeps": entries}
    write_atomic(plans_dir / CATALOG_NAME, yaml_dump(doc))


def refresh_artifacts(root: str | Path, jobs: int | None = None, models=MODELS, profiles=PROFILES,
                      reuse: str | Path | None = None) -> list[str]:
    """Regenerate `root/plans/`, `root/docs/plans/` and `root/docs/plan-format.md`; returns log lines.

    Args:
        root: the repository root (or a temporary directory shaped like it).
        jobs: worker processes (one model each at a time); default: the CPU count, at most len(models).
        reuse: a repository root whose committed plans are re-priced instead of solved, and whose figures are
            linked instead of drawn (the freshness check; see the module docstring). None: solve everything.
    """
    root = Path(root)
    plans_dir, docs_dir = root / "plans", root / "docs" / "plans"
    plans_dir.mkdir(parents=True, exist_ok=True)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(models)))
    committed = str(Path(reuse) / "plans") if reuse else None
    if jobs == 1:
        outcomes = [o for model in models for o in _compile_model(model, tuple(profiles), str(plans_dir), committed)]
    else:
        # spawn, not fork: the parent may hold torch's thread pools, which a forked child can deadlock on.
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_compile_model, model, tuple(profiles), str(plans_dir), committed)
                       for model in models]
            outcomes = [o for future in futures for o in future.result()]
    if reuse:  # a figure is named by the hash of its data and drawing code: a committed one needs no drawing
        docs_dir.mkdir(parents=True, exist_ok=True)
        for figure in (Path(reuse) / "docs" / "plans").glob("*.png"):
            if not (docs_dir / figure.name).exists():
                shutil.copyfile(figure, docs_dir / figure.name)
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
