"""Fit a hardware profile to measured runs: scale factors on its rates that make the cost model predict what ran.

    from liac.calibrate import load_measurements, calibrate
    runs = load_measurements(["m/b1.json", "m/b8.json"], plan_paths=["plans/"])   # lia-run --metrics-out files
    result = calibrate(resolve_profile("h200-run.yaml"), runs)
    result.profile            # the calibrated HardwareProfile (write with profile_yaml)
    result.before, result.after   # relative errors: median / mean, per phase and per sublayer

Inputs: the profile the plans were priced with (measured in the same run), and `lia-run --metrics-out` documents
(runtime/metrics.py), each matched to the plan it ran by the plan's `metadata.name`. A document gives two kinds of
measurement, both compared with the cost model re-pricing that plan (`liac.passes.price.price_plan`, the pricing
`emit_plan` writes into `status.predicted`) at the run's own batch, prompt and generation length:

  * phase rows: `prefill_ms` and `decode_ms_per_token` of the timed run, against the layer times of Eqs. 4-8 summed
    over the groups (the plan's `status.predicted` definition);
  * sublayer rows: each `sublayers[]` row with a prediction, `measured_ms` (mean per layer, from the separately
    synchronised profiling pass) against compute + transfer of the units it covers (a fused attention row sums
    both units), priced over the profiling pass's decode steps (the document's `run.profile_steps` when it has
    it, else min(--profile-steps, gen_len − 1), lia-run's default being 4).

Factors (FACTORS below) multiply groups of profile fields: CPU DDR read, the whole AMX curve, CPU KV read, GPU
FLOP/s, HBM, PCIe H2D and D2H, the shared DDR rate, the CPU prefill-attention curve, and the GPU / CPU launch, PCIe
latency, split synchronisation and per-unit runtime overheads. A factor that changes no prediction by more than
1e-9 (relative) when doubled or halved is left at 1 and reported as unconstrained. The fit minimises

    Σ_rows w·ρ(ln(predicted / measured)) + ½·PRIOR·Σ_factors log2(factor)²

with ρ the pseudo-Huber loss (quadratic within ~10%, linear beyond, so a stray measurement cannot dominate) and
w the row's weight. The phase totals, what a plan promises, carry PHASE_WEIGHT (0.9) of the weight; the sublayer
rows, from a pass that synchronises after every op and so carries none of the runtime's overlap, the rest: they
inform the rates of single ops but cannot outvote the totals. The prior says the profile was measured: a factor
of 2 must buy a drop of the loss of ½·PRIOR (PRIOR = 0.01), about what a 10 % error on every phase total costs,
so rates that only the synchronised rows or a few runs ask to move stay near the measurement instead of running
to their bounds (before the prior, fits on one prompt length put 5 of 14 factors at ×16 or ×1/16 and missed the
other length's prefill by 33-110 %).
The minimiser is a deterministic Levenberg-Marquardt over log2 scale factors in [1/16, 16] (forward-difference
Jacobian, the robust loss as reweighted least squares, the prior as a ridge term), stopping when a step no longer
helps or at `max_evals`. A factor the fit moved but the loss does not need goes back to 1; factors no prediction
depends on at the fit (±5%) are reported as not determined by the measurements. numpy only; the same inputs give
the same profile.

Runs of several device calls: the host's rates move between calls, so each call's runs are priced with the profile
measured in that call (`Run.hw`, from `load_measurements(run_profiles=...)`), all scaled by the same factors:
the fit learns how the cost model departs from what `liac profile` measures, not one call's rates.

Held out: `judge` prices runs the fit did not see (e.g. `split_by_prompt`: fit on one prompt length, judge on the
other) under the base and the calibrated profile, which says whether the fit generalises or only memorises.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from liac.errors import LiacError, brief
from liac.fileio import load_json, yaml_dump
from liac.passes.price import PlanPrice, price_plan, split_grid
from liac.plan import OffloadPlan, load_plan
from liac.profile import CurvePoint, HardwareProfile, parse_profile
from liac.schema_tools import stable_float, to_data
from liac.sweep import plan_files

__all__ = ["FACTORS", "METRICS_VERSIONS", "PHASE_WEIGHT", "PRIOR", "Run", "Row", "CalibrationResult",
           "load_measurements", "predict_rows", "predict_scaled", "calibrate", "scaled_profile", "error_summary",
           "profile_yaml", "report_data", "report_lines", "judge", "split_by_prompt"]

METRICS_VERSIONS = (1,)
LIA_RUN_PROFILE_STEPS = 4  # lia-run's default --profile-steps
_BOUND_LOG2 = 4.0  # factors stay within [1/16, 16]
_HUBER_DELTA = 0.1  # log-error where the loss turns from quadratic to linear (~10%)
PHASE_WEIGHT = 0.9  # the phase totals' share of the loss; the synchronised sublayer rows have the rest
PRIOR = 0.01  # ½·PRIOR·Σ log2(factor)² is added to the loss (module docstring)
_SENSITIVITY = 1e-9
_MIN_STEP_LOG2 = 1.0 / 1024
_JACOBIAN_STEP = 1e-4  # log2 units

# name → (profile fields it multiplies, what it stands for)
FACTORS: dict[str, tuple[tuple[str, ...], str]] = {
    "cpu_ddr_read": (("cpu_ddr_read_gb_per_s",), "CPU reading weights from DDR"),
    "cpu_amx": (("cpu_amx_bf16_tflops",), "CPU AMX throughput curve (every point)"),
    "cpu_kv_read": (("cpu_kv_read_gb_per_s",), "CPU decode attention over a DDR KV cache"),
    "gpu_flops": (("gpu_bf16_tflops", "gpu_gemm_bf16_tflops"), "GPU bf16 throughput (and its GEMM curve by rows)"),
    "gpu_hbm": (("gpu_hbm_gb_per_s",), "GPU HBM bandwidth"),
    "pcie_h2d": (("pcie_h2d_gb_per_s",), "PCIe host to device"),
    "pcie_d2h": (("pcie_d2h_gb_per_s",), "PCIe device to host"),
    "ddr_shared": (("ddr_shared_gb_per_s", "ddr_shared_kv_gb_per_s"),
                   "DDR shared by CPU reads and PCIe DMA (beside a GEMV; beside the fused attention where measured)"),
    "gpu_launch": (("gpu_launch_seconds",), "GPU kernel launch overhead"),
    "cpu_launch": (("cpu_launch_seconds",), "CPU kernel overhead"),
    "pcie_latency": (("pcie_latency_seconds",), "fixed cost of one PCIe copy"),
    "split_sync": (("split_sync_seconds",), "synchronising a split sublayer's parts (the join and merge)"),
    "cpu_attention": (("cpu_attention_bf16_tflops",), "CPU attention in prefill (every point of its curve)"),
    "runtime_op": (("runtime_op_seconds",), "the runtime's host time per unit it runs (Eq. 24)"),
}
_CURVES = ("cpu_amx_bf16_tflops", "cpu_attention_bf16_tflops", "gpu_gemm_bf16_tflops")  # scaled point by point
_TIME_FIELDS = ("gpu_launch_seconds", "cpu_launch_seconds", "pcie_latency_seconds",
                "split_sync_seconds", "runtime_op_seconds")  # a larger factor = slower


@dataclass(frozen=True)
class Row:
    """One measurement: a phase total or one sublayer row of one run."""

    source: str  # metrics file
    kind: str  # 'phase' or 'sublayer'
    phase: str
    group: str  # '' for phase rows
    sublayers: tuple[str, ...]  # () for phase rows
    device: str
    measured_seconds: float

    @property
    def label(self) -> str:
        return self.phase if self.kind == "phase" else "+".join(self.sublayers)


@dataclass(frozen=True)
class Run:
    """One metrics document with the plan it ran and the workload it ran at."""

    source: str
    plan: OffloadPlan
    batch_size: int
    prompt_len: int
    gen_len: int
    profile_steps: int
    rows: tuple[Row, ...]
    hw: HardwareProfile | None = None  # the profile measured with the run (its plan was priced with it); None: the base


@dataclass(frozen=True)
class CalibrationResult:
    profile: HardwareProfile
    factors: dict[str, float]  # name → scale (1.0 for unconstrained ones)
    constrained: tuple[str, ...]  # some prediction depends on it (at ×2 or ×½ of the base profile)
    determined: tuple[str, ...]  # some prediction depends on it at the fit (±5%): the measurements fix its value
    rows: tuple[Row, ...]
    predicted_before: tuple[float, ...]
    predicted_after: tuple[float, ...]
    before: dict
    after: dict
    evaluations: int


# ---------------------------------------------------------------------------------------------------------------
# Reading the runs


def _read_json(path: Path) -> dict:
    doc = load_json(path)
    if not isinstance(doc, dict) or doc.get("metrics_version") not in METRICS_VERSIONS:
        raise LiacError(str(path), "must be a metrics document from 'lia-run --metrics-out' (metrics_version "
                        + ", ".join(str(v) for v in METRICS_VERSIONS) + ")", path="metrics_version")
    return doc


def _plan_files(paths) -> list[Path]:
    out = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            out += plan_files(path)
        elif path.is_file():
            out.append(path)
        else:
            raise LiacError("--plans", f"'{item}' must be a plan file or a directory of plans")
    return out


def _positive_int(doc: dict, key: str, source: str) -> int:
    value = (doc.get("run") or {}).get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise LiacError(source, f"must be a positive integer, got {brief(value)}", path=f"run.{key}")
    return value


def load_measurements(metrics_paths, plan_paths=(), profile_steps: int = LIA_RUN_PROFILE_STEPS,
                      run_profiles=()) -> list[Run]:
    """Metrics documents + the plans they ran → Runs (each with its phase and sublayer rows).

    A document's plan is found by `metadata.name` among `plan_paths` (files or directories), else at the document's
    own `plan_file` (bench/run_plans.py writes it). `run_profiles`: profiles measured with the runs (one per device
    call: the host's rates move between calls); a run whose plan was compiled for one of them (the profile sha256
    the plan records; or for it without `ddr_shared_kv_gb_per_s`, a field a call's probe may predate) is priced with
    it, every other run with the base profile given to `calibrate`.

    Raises:
        LiacError: an unreadable or foreign document, a plan that cannot be found or is for another model.
    """
    own = {profile.sha256(): profile for profile in run_profiles}
    for profile in run_profiles:  # a call's profile with the attention's shared rate added after its plans were
        # compiled (bench/reprice.py --kv-shared-from-rates) still prices that call's runs
        own.setdefault(dataclasses.replace(profile, ddr_shared_kv_gb_per_s=0.0).sha256(), profile)
    plans: dict[str, OffloadPlan] = {}
    for path in _plan_files(plan_paths):
        try:
            plan = load_plan(path)
        except LiacError:
            continue  # a directory may hold other YAML (a sweep's pages, profiles): only plans are candidates
        plans.setdefault(plan.metadata.name, plan)
    runs = []
    for item in metrics_paths:
        path = Path(item)
        doc = _read_json(path)
        source = str(path)
        name = doc.get("plan")
        plan = plans.get(name)
        if plan is None and isinstance(doc.get("plan_file"), str):
            candidate = Path(doc["plan_file"])
            for where in (candidate, path.parent / candidate):
                if where.is_file():
                    plan = load_plan(where)
                    break
        if plan is None:
            raise LiacError(source, f"plan '{name}' must be among --plans (give the plan file it ran)", path="plan")
        if doc.get("model") not in (None, plan.spec.model.name):
            raise LiacError(source, f"model '{doc.get('model')}' must match the plan's '{plan.spec.model.name}'",
                            path="model")
        batch, prompt, gen = (_positive_int(doc, key, source) for key in ("batch_size", "prompt_len", "gen_len"))
        steps = (doc.get("run") or {}).get("profile_steps")
        steps = steps if isinstance(steps, int) and steps >= 0 else min(profile_steps, gen - 1)
        rows = []
        for phase, key in (("prefill", "prefill_ms"), ("decode", "decode_ms_per_token")):
            value = doc.get(key)
            if isinstance(value, (int, float)) and value > 0 and (phase == "prefill" or gen > 1):
                rows.append(Row(source, "phase", phase, "", (), "", value / 1e3))
        for index, row in enumerate(doc.get("sublayers") or []):
            if not isinstance(row, dict) or row.get("predicted_ms") is None:
                continue  # waits, releases: no prediction to compare with
            value = row.get("measured_ms")
            names = row.get("sublayers")
            if not isinstance(value, (int, float)) or value <= 0 or not isinstance(names, list):
                continue
            if row.get("phase") == "decode" and steps < 1:
                continue
            rows.append(Row(source, "sublayer", str(row.get("phase")), str(row.get("group")),
                            tuple(str(n) for n in names), str(row.get("device")), value / 1e3))
        runs.append(Run(source, plan, batch, prompt, gen, steps, tuple(rows), own.get(plan.spec.hardware.sha256)))
    if not any(run.rows for run in runs):
        raise LiacError("calibrate", "the metrics documents must hold at least one measured time with a prediction")
    return runs


# ---------------------------------------------------------------------------------------------------------------
# Re-pricing


def scaled_profile(base: HardwareProfile, factors: dict[str, float]) -> HardwareProfile:
    """`base` with each factor's fields multiplied by its scale."""
    changes = {}
    for name, scale in factors.items():
        for field in FACTORS[name][0]:
            if field in _CURVES:
                changes[field] = tuple(CurvePoint(m=p.m, tflops=p.tflops * scale) for p in getattr(base, field))
            else:
                changes[field] = getattr(base, field) * scale
    return dataclasses.replace(base, **changes)


def _with_workload(plan: OffloadPlan, batch: int, prompt: int, gen: int) -> OffloadPlan:
    work = dataclasses.replace(plan.spec.workload, batch_size=batch, prompt_len=prompt, gen_len=gen)
    return dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, workload=work))


def _unit_seconds(price: PlanPrice) -> dict[tuple[str, str, str], float]:
    """{(group, unit, phase): compute s + transfer s}: what a profiling pass measures of a unit."""
    return {(group.name, unit.name, phase): unit.compute_seconds + unit.transfer_seconds
            for group in price.groups for phase, units in group.units.items() for unit in units}


def predict_rows(runs: list[Run], hw: HardwareProfile, graphs: dict | None = None) -> list[float]:
    """Predicted seconds of every row of `runs` (in order) under profile `hw`: each run's plan priced as
    `emit_plan` prices it (`price_plan`), at the run's own workload.

    CostGraphs are shared between runs of one model at one workload and prefill micro-batch (prices do not depend
    on the placement).
    """
    from liac.passes.trace import trace_model  # late import: tracing loads torch; a given graph needs none

    graphs = graphs if graphs is not None else {}
    costs: dict[tuple, object] = {}
    prices: dict[tuple, PlanPrice] = {}

    def priced(run: Run, gen: int) -> PlanPrice:
        plan = _with_workload(run.plan, run.batch_size, run.prompt_len, gen)
        sha = plan.spec.model.config_sha256
        if sha not in graphs:
            graphs[sha] = trace_model(plan.model_config)
        execution = plan.spec.execution  # the prefill is priced per micro-batch (Eq. 20): part of the prices
        key = (sha, run.batch_size, run.prompt_len, gen, split_grid(plan), execution.prefill_microbatch_sequences,
               execution.prefill_microbatch_tokens)
        plan_key = (run.plan.metadata.name, *key)
        if plan_key not in prices:
            price = price_plan(plan, hw=hw, graph=graphs[sha], costs=costs.get(key))
            costs[key] = price.costs
            prices[plan_key] = price
        return prices[plan_key]

    out = []
    for run in runs:
        full = priced(run, run.gen_len) if any(r.kind == "phase" for r in run.rows) else None
        profiled = priced(run, run.profile_steps + 1) if any(r.kind == "sublayer" for r in run.rows) else None
        table = _unit_seconds(profiled) if profiled is not None else {}
        for row in run.rows:
            if row.kind == "phase":
                out.append(full.prefill_seconds if row.phase == "prefill" else full.decode_seconds_per_token)
                continue
            parts = [table.get((row.group, name, row.phase)) for name in row.sublayers]
            if any(p is None for p in parts):
                raise LiacError(row.source, f"sublayers {list(row.sublayers)} of group '{row.group}' must be units "
                                f"of plan '{run.plan.metadata.name}'", path="sublayers")
            out.append(sum(parts))
    return out


def predict_scaled(runs: list[Run], base: HardwareProfile, factors: dict[str, float], graphs: dict | None = None
                   ) -> list[float]:
    """`predict_rows` with each run priced on its own profile (`Run.hw`, else `base`) scaled by `factors`: the
    same correction applied to every call's measured rates."""
    graphs = graphs if graphs is not None else {}
    groups: dict[int, tuple[HardwareProfile, list[int]]] = {}
    for index, run in enumerate(runs):
        hw = run.hw if run.hw is not None else base
        groups.setdefault(id(hw), (hw, []))[1].append(index)
    per_run: list[list[float]] = [[] for _ in runs]
    for hw, indices in groups.values():
        predicted = predict_rows([runs[i] for i in indices], scaled_profile(hw, factors), graphs)
        at = 0
        for i in indices:
            per_run[i] = predicted[at:at + len(runs[i].rows)]
            at += len(runs[i].rows)
    return [value for values in per_run for value in values]


# ---------------------------------------------------------------------------------------------------------------
# Errors and the fit


def _summary(errors: list[float]) -> dict:
    if not errors:
        return {"count": 0, "median": None, "mean": None}
    return {"count": len(errors), "median": stable_float(float(np.median(errors))),
            "mean": stable_float(float(np.mean(errors)))}


def error_summary(rows, predicted) -> dict:
    """Relative errors |predicted − measured| / measured: all rows, per phase, the phase totals, per sublayer."""
    errors = [abs(p - r.measured_seconds) / r.measured_seconds for r, p in zip(rows, predicted)]
    out = {"all": _summary(errors), "by_phase": {}, "totals": {}, "by_sublayer": {}}
    for phase in ("prefill", "decode"):
        picked = [e for r, e in zip(rows, errors) if r.phase == phase]
        if picked:
            out["by_phase"][phase] = _summary(picked)
        totals = [e for r, e in zip(rows, errors) if r.phase == phase and r.kind == "phase"]
        if totals:
            out["totals"][phase] = _summary(totals)
    for label in sorted({r.label for r in rows if r.kind == "sublayer"}):
        out["by_sublayer"][label] = _summary([e for r, e in zip(rows, errors) if r.kind == "sublayer"
                                              and r.label == label])
    return out


def _loss(weights: np.ndarray, measured: np.ndarray, predicted: list[float], x: dict[str, float],
          prior: float) -> float:
    return _robust_loss(weights, _residuals(measured, predicted)) + _prior_loss(x.values(), prior)


def _prior_loss(log2_factors, prior: float) -> float:
    """½·prior·Σ log2(factor)²: the profile was measured, so a factor far from 1 must buy its distance."""
    return 0.5 * prior * float(sum(v * v for v in log2_factors))


def _row_weights(rows, phase_weight: float = PHASE_WEIGHT) -> np.ndarray:
    """The phase rows share `phase_weight` of the loss, the sublayer rows the rest (all of it when a family is
    empty), each row equally within its family."""
    counts = {kind: sum(1 for r in rows if r.kind == kind) for kind in ("phase", "sublayer")}
    share = {"phase": phase_weight if counts["sublayer"] else 1.0,
             "sublayer": 1.0 - phase_weight if counts["phase"] else 1.0}
    return np.array([share[r.kind] / counts[r.kind] for r in rows])


def _residuals(measured: np.ndarray, predicted: list[float]) -> np.ndarray:
    return np.log(np.maximum(np.asarray(predicted), 1e-30) / measured)


def _robust_loss(weights: np.ndarray, residuals: np.ndarray) -> float:
    return float(np.sum(weights * _HUBER_DELTA**2 * (np.sqrt(1.0 + (residuals / _HUBER_DELTA) ** 2) - 1.0)))


def _levenberg_marquardt(residuals_at, weights: np.ndarray, start: dict[str, float], max_evals: int,
                         evaluations, prior: float = 0.0) -> dict[str, float]:
    """Minimise the pseudo-Huber loss of the log residuals plus the prior on the log2 factors (iteratively
    reweighted Levenberg-Marquardt, forward-difference Jacobian, steps clipped to the bounds). Deterministic."""
    names = list(start)
    x = np.array([start[n] for n in names])

    def at(vector):
        return residuals_at(dict(zip(names, vector.tolist())))

    r = at(x)
    value = _robust_loss(weights, r) + _prior_loss(x, prior)
    damping = 1e-3
    while evaluations() + len(names) + 1 <= max_evals:
        jacobian = np.empty((len(r), len(names)))
        for column in range(len(names)):
            moved = x.copy()
            moved[column] += _JACOBIAN_STEP if moved[column] + _JACOBIAN_STEP <= _BOUND_LOG2 else -_JACOBIAN_STEP
            jacobian[:, column] = (at(moved) - r) / (moved[column] - x[column])
        robust = weights / np.sqrt(1.0 + (r / _HUBER_DELTA) ** 2)  # IRLS weights of the pseudo-Huber loss
        normal = jacobian.T @ (robust[:, None] * jacobian) + prior * np.eye(len(names))
        gradient = jacobian.T @ (robust * r) + prior * x
        improved = False
        while evaluations() < max_evals:
            step = np.linalg.solve(normal + damping * (np.diag(np.diag(normal)) + 1e-12 * np.eye(len(names))),
                                   -gradient)
            trial = np.clip(x + step, -_BOUND_LOG2, _BOUND_LOG2)
            trial_r = at(trial)
            trial_value = _robust_loss(weights, trial_r) + _prior_loss(trial, prior)
            if trial_value < value:
                shrink = value - trial_value
                x, r, value = trial, trial_r, trial_value
                damping = max(damping / 3, 1e-9)
                improved = shrink > 1e-14 * max(value, 1e-30) and np.max(np.abs(step)) > _MIN_STEP_LOG2 / 64
                break
            damping *= 4
            if damping > 1e8:
                break
        if not improved:
            break
    return dict(zip(names, x.tolist()))


def _prefer_base(x: dict[str, float], loss_at) -> dict[str, float]:
    """Return factors the fit moved but the loss does not need to the profile's own value (scale 1)."""
    value = loss_at(x)
    for name in sorted(x, key=lambda n: abs(x[n])):
        if x[name] == 0.0:
            continue
        trial = dict(x, **{name: 0.0})
        trial_value = loss_at(trial)
        if trial_value <= value + 1e-12 * max(value, 1e-12):
            x, value = trial, trial_value
    return x


def _moves_predictions(predict, x: dict[str, float], name: str) -> bool:
    """Whether ±5% on this factor at the fit changes any prediction (else the measurements do not determine it)."""
    here = predict(x)
    for delta in (0.07, -0.07):  # log2(1.05) ≈ 0.07
        moved = predict(dict(x, **{name: x[name] + delta}))
        if any(abs(a - b) > _SENSITIVITY * max(abs(b), 1e-30) for a, b in zip(moved, here)):
            return True
    return False


def calibrate(base: HardwareProfile, runs: list[Run], max_evals: int = 600, phase_weight: float = PHASE_WEIGHT,
              prior: float = PRIOR) -> CalibrationResult:
    """Fit FACTORS to the runs' measurements (module docstring); returns the calibrated profile and the errors.

    `phase_weight`: the phase totals' share of the loss (the sublayer rows have the rest); `prior`: the weight of
    ½·Σ log2(factor)² in it (0: none)."""
    rows = [row for run in runs for row in run.rows]
    measured = np.array([r.measured_seconds for r in rows])
    weights = _row_weights(rows, phase_weight)
    graphs: dict = {}
    evaluations = 0

    def predict(log2: dict[str, float]) -> list[float]:
        nonlocal evaluations
        evaluations += 1
        return predict_scaled(runs, base, {k: 2.0**v for k, v in log2.items()}, graphs)

    before = predict({})
    constrained = []
    for name in FACTORS:
        for probe in (1.0, -1.0):
            moved = predict({name: probe})
            if any(abs(a - b) > _SENSITIVITY * max(abs(b), 1e-30) for a, b in zip(moved, before)):
                constrained.append(name)
                break
    x = {name: 0.0 for name in constrained}
    if constrained:
        x = _levenberg_marquardt(lambda point: _residuals(measured, predict(point)), weights, x, max_evals,
                                 lambda: evaluations, prior)
        x = _prefer_base(x, lambda point: _loss(weights, measured, predict(point), point, prior))
    determined = tuple(name for name in constrained if _moves_predictions(predict, x, name))
    factors = {name: (2.0 ** x[name] if name in x else 1.0) for name in FACTORS}
    after = predict(x)
    profile = scaled_profile(base, factors)
    return CalibrationResult(profile=profile, factors=factors, constrained=tuple(constrained),
                             determined=determined, rows=tuple(rows),
                             predicted_before=tuple(before), predicted_after=tuple(after),
                             before=error_summary(rows, before), after=error_summary(rows, after),
                             evaluations=evaluations)


def judge(base: HardwareProfile, result: CalibrationResult, runs: list[Run]) -> dict:
    """A fit judged on runs it did not see (held out, e.g. another prompt length): their relative errors under the
    base profile and under the calibrated one (`error_summary` of each)."""
    rows = [row for run in runs for row in run.rows]
    graphs: dict = {}
    return {"measurements": len(rows), "error_before": error_summary(rows, predict_scaled(runs, base, {}, graphs)),
            "error_after": error_summary(rows, predict_scaled(runs, base, result.factors, graphs))}


def split_by_prompt(runs: list[Run], prompt_len: int) -> tuple[list[Run], list[Run]]:
    """(runs of other prompt lengths, runs at `prompt_len`): what to fit on, what to hold out."""
    return [r for r in runs if r.prompt_len != prompt_len], [r for r in runs if r.prompt_len == prompt_len]


# ---------------------------------------------------------------------------------------------------------------
# Output


def profile_yaml(result: CalibrationResult, base: HardwareProfile, name: str) -> str:
    """The calibrated profile as YAML: scaled fields say where they came from; they are no longer estimates."""
    count = len(result.rows)
    sources = dict(base.sources)
    estimates = set(base.estimates)
    for factor, (fields, _meaning) in FACTORS.items():
        scale = result.factors[factor]
        if scale == 1.0 and factor not in result.determined:
            continue
        note = "" if factor in result.determined else " (not determined by them: kept where the fit left it)"
        for field in fields:
            sources[field] = (f"calibrated by liac calibrate from {count} measurements{note}: ×{scale:.4g} of "
                              f"'{base.name}' ({base.sources.get(field, '')})")
            if factor in result.determined:
                estimates.discard(field)
    profile = dataclasses.replace(result.profile, name=name, description=f"{base.description} (calibrated)",
                                  sources=sources, estimates=tuple(sorted(estimates)))
    data = to_data(profile)
    parse_profile(data, name)  # what we write must load
    return yaml_dump(data)


def _rate_word(factor: str, scale: float) -> str:
    fields = FACTORS[factor][0]
    if fields[0] in _TIME_FIELDS:
        return "slower" if scale > 1 else "faster"
    return "faster" if scale > 1 else "slower"


def report_data(result: CalibrationResult, base: HardwareProfile) -> dict:
    """The report as plain data (what `liac calibrate --format json` prints)."""
    factors = {}
    for name, (fields, meaning) in FACTORS.items():
        scale = result.factors[name]
        old = [getattr(base, f) if f not in _CURVES else None for f in fields]
        factors[name] = {"scale": stable_float(scale), "fields": list(fields), "meaning": meaning,
                         "constrained": name in result.constrained, "determined": name in result.determined,
                         "before": [stable_float(v) for v in old if v is not None] or None,
                         "after": [stable_float(getattr(result.profile, f)) for f in fields
                                   if f not in _CURVES] or None}
    rows = [{"source": r.source, "kind": r.kind, "phase": r.phase, "group": r.group, "sublayers": list(r.sublayers),
             "device": r.device, "measured_ms": stable_float(r.measured_seconds * 1e3),
             "predicted_before_ms": stable_float(b * 1e3), "predicted_after_ms": stable_float(a * 1e3)}
            for r, b, a in zip(result.rows, result.predicted_before, result.predicted_after)]
    return {"profile": base.name, "measurements": len(result.rows), "evaluations": result.evaluations,
            "factors": factors, "error_before": result.before, "error_after": result.after, "rows": rows}


def report_lines(result: CalibrationResult, base: HardwareProfile, held_out: dict | None = None) -> list[str]:
    """A short text report: factors, then median / mean relative error before → after (of the held-out runs too,
    when `held_out` is `judge`'s)."""
    def pct(summary: dict, key: str) -> str:
        value = summary.get(key)
        return "-" if value is None else f"{100 * value:.1f}%"

    lines = [f"calibrated '{base.name}' from {len(result.rows)} measurements ({result.evaluations} evaluations)"]
    for name in FACTORS:
        scale = result.factors[name]
        if name in result.determined:
            word = "unchanged" if f"{scale:.4g}" == "1" else _rate_word(name, scale)  # as printed
            lines.append(f"  {name:<13} ×{scale:<8.4g} ({word}; {FACTORS[name][1]})")
        elif name in result.constrained:
            lines.append(f"  {name:<13} ×{scale:<8.4g} (not determined: no prediction depends on it at the fit)")
        else:
            lines.append(f"  {name:<13} unconstrained (no prediction depends on it): unchanged")
    def table(title: str, before: dict, after: dict, sublayers: bool = True) -> None:
        lines.append(f"  {title:<24} {'n':>4}  {'median before → after':>22}  {'mean before → after':>20}")
        groups = [("all", before["all"], after["all"])]
        groups += [(f"phase {k}", v, after["by_phase"][k]) for k, v in before["by_phase"].items()]
        groups += [(f"total {k}", v, after["totals"][k]) for k, v in before["totals"].items()]
        if sublayers:
            groups += [(k, v, after["by_sublayer"][k]) for k, v in before["by_sublayer"].items()]
        for label, b, a in groups:
            lines.append(f"  {label:<24} {b['count']:>4}  {pct(b, 'median'):>10} → {pct(a, 'median'):<9}"
                         f"  {pct(b, 'mean'):>8} → {pct(a, 'mean'):<9}")

    table("relative error", result.before, result.after)
    if held_out is not None:
        lines.append(f"held out: {held_out['measurements']} measurements the fit did not see")
        table("held-out relative error", held_out["error_before"], held_out["error_after"], sublayers=False)
    return lines

