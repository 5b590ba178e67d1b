"""A run's measurements beside the plan's predictions, as one JSON document (docs/runtime.md, "Metrics").

This is the only module of the runtime that reads `plan.status`, and only to print the compiler's predictions next
to what was measured: nothing the runtime does depends on it.

A plan's workload is a maximum, so a run may be smaller than what the plan was priced for; `request_prediction`
scales the plan's prediction to the run (reporting only) with a first-order rule over the plan's per-sublayer
times, exact at the plan's own workload:
  prefill  each sublayer's compute and transfer time × the token ratio (b·p) / (B·P), attention's compute
           × (b·p²) / (B·P²); streamed weights unchanged; the phase time scaled as the sum of its sublayers is
  decode   attention's compute × (b·c) / (B·C) (c, C: mean context of a step), transfers × b / B; the other compute
           and streaming unchanged (reading the weights dominates a decode step whatever the batch)
  total    prefill + decode per token × (new tokens − 1); tokens/s = b × new tokens / total
(b, p: the run's batch and prompt; B, P, G: the plan's.) Small prefills that turn compute-bound GEMMs memory-bound
take longer than this estimate.
"""

from __future__ import annotations

import json

import torch

from liac.fileio import write_atomic
from liac.plan import OffloadPlan
from liac.runtime.executor import microbatch_parts
from liac.runtime.kernels import cpu_backend
from liac.schema_tools import stable_float
from liac.sizes import GIB

__all__ = ["build_metrics", "write_metrics", "summary_lines", "request_prediction", "expert_rates", "METRICS_VERSION"]

METRICS_VERSION = 1


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else stable_float(seconds * 1e3)


def _predicted_sublayers(plan: OffloadPlan) -> dict[tuple[str, str, str], tuple[float, float, float]]:
    # Reporting only: status is the compiler's observation, never an input to execution.
    return {(t.group, t.name, t.phase): (t.compute_seconds, t.transfer_seconds, t.stream_seconds)
            for t in plan.status.predicted.sublayers}


_ATTENTION = ("attn_score", "attn_context")


def request_prediction(plan: OffloadPlan, batch: int, prompt_len: int, new_tokens: int) -> dict:
    """The plan's prediction scaled to a request within its workload (see the module docstring)."""
    work, predicted = plan.spec.workload, plan.status.predicted  # reporting only
    counts = {g.name: g.layer_count for g in plan.spec.layer_groups}
    tokens = batch * prompt_len / (work.batch_size * work.prompt_len)
    context = (prompt_len + (new_tokens - 1) / 2) / (work.prompt_len + (work.gen_len - 1) / 2)
    ratios = {("prefill", True): tokens * prompt_len / work.prompt_len, ("prefill", False): tokens,
              ("decode", True): batch / work.batch_size * context, ("decode", False): None}

    def phase_factor(phase: str) -> float:
        before = after = 0.0
        for t in predicted.sublayers:
            if t.phase != phase:
                continue
            count = counts.get(t.group, 1)
            attention = t.name in _ATTENTION
            compute_ratio = ratios[(phase, attention)]
            transfer_ratio = tokens if phase == "prefill" else batch / work.batch_size
            before += count * (t.compute_seconds + t.transfer_seconds + t.stream_seconds)
            after += count * (t.compute_seconds * (1.0 if compute_ratio is None else compute_ratio)
                              + t.transfer_seconds * transfer_ratio + t.stream_seconds)
        return after / before if before > 0 else 1.0

    prefill = predicted.prefill_seconds * phase_factor("prefill")
    per_token = predicted.decode_seconds_per_token * phase_factor("decode")
    total = prefill + per_token * (new_tokens - 1)
    return {"batch_size": batch, "prompt_len": prompt_len, "gen_len": new_tokens,
            "prefill_ms": _ms(prefill), "decode_ms_per_token": _ms(per_token), "total_ms": _ms(total),
            "tokens_per_second": stable_float(batch * new_tokens / total) if total > 0 else None}


def build_metrics(engine, generation, sublayer_seconds: dict[tuple, float], profile_steps: int | None = None) -> dict:
    """The metrics document of one run (see the module docstring); `sublayer_seconds` from `Engine.profile`, run
    over `profile_steps` decode steps (recorded as `run.profile_steps`, which `liac calibrate` prices the sublayer
    rows at; None: not recorded)."""
    plan = engine.plan
    batch, new_tokens = generation.token_ids.shape
    steps = generation.decode_steps
    total = generation.prefill_seconds + generation.decode_seconds
    predicted = plan.status.predicted  # reporting only
    table = _predicted_sublayers(plan)
    sublayers = []
    part_seconds = {key[:3]: {} for key in sublayer_seconds if key[3].startswith("split:")}
    for key, seconds in sublayer_seconds.items():
        if key[3].startswith("split:"):  # a split op's CPU / GPU part, measured inside its row's time
            part_seconds[key[:3]][key[3][len("split:"):]] = seconds
    for (group, names, phase, device), seconds in sublayer_seconds.items():  # execution order, prefill first
        if device.startswith("split:"):
            continue
        parts = [table.get((group, name, phase)) for name in names]
        known = [p for p in parts if p is not None]
        row = {"group": group, "sublayers": list(names), "phase": phase, "device": device,
               "measured_ms": _ms(seconds), "predicted_ms": None, "predicted_compute_ms": None,
               "predicted_transfer_ms": None, "predicted_stream_ms": None}
        if known:
            compute, transfer, stream = (sum(p[i] for p in known) for i in range(3))
            row.update(predicted_ms=_ms(compute + transfer), predicted_compute_ms=_ms(compute),
                       predicted_transfer_ms=_ms(transfer), predicted_stream_ms=_ms(stream))
        if device == "split":
            split = part_seconds.get((group, names, phase), {})
            row.update(measured_cpu_part_ms=_ms(split.get("cpu")), measured_gpu_part_ms=_ms(split.get("gpu")))
            if "route" in split:  # experts on both devices: the routing read on the host before the parts
                row["measured_route_ms"] = _ms(split["route"])
        sublayers.append(row)
    share = engine.executor.expert_share
    transfers = generation.transfers or engine.backend.transfers.totals()  # the timed run's, not the profile's
    memory = [{"tier": tier, **{k: v for k, v in values.items()}}
              for tier, values in engine.memory_report().items()]
    return {
        "metrics_version": METRICS_VERSION,
        "plan": plan.metadata.name,
        "model": plan.spec.model.name,
        "backend": {"gpu": engine.backend.describe(), "emulated_gpu": engine.backend.emulated,
                    "cpu_kernels": cpu_backend(), "dtype": str(engine.dtype).replace("torch.", ""),
                    "torch": torch.__version__, "cpu_threads": torch.get_num_threads(),
                    "cpu_small_m_kernel": engine.cpu_linear[0],
                    "expert_share_ratio": (stable_float(share.at_load) if share is not None else None),
                    "expert_share": ({"at_load": stable_float(share.at_load), "now": stable_float(share.current),
                                      "adapt": share.adapt, "cpu_parts_observed": share.observed,
                                      "probes": share.probes} if share is not None else None),
                    "cpu_small_m_gb_per_s": ({k: stable_float(v) for k, v in engine.cpu_linear[1].items()}
                                             if engine.cpu_linear[1] else None)},
        "run": {"batch_size": batch, "prompt_len": generation.prompt_len, "gen_len": new_tokens,
                "decode_steps": steps, "generated_tokens": sum(generation.lengths),
                "prefill_microbatches": len(microbatch_parts(batch, generation.prompt_len,
                                                             engine.schedule.prefill_microbatch)),
                **({"profile_steps": profile_steps} if profile_steps is not None else {})},
        "load_seconds": stable_float(engine.build_seconds),
        "warmup_seconds": stable_float(engine.warmup_seconds),
        "warmup": ({"batch_size": engine.warmup_request[0], "prompt_len": engine.warmup_request[1]}
                   if engine.warmup_request else None),
        "prefill_ms": _ms(generation.prefill_seconds),
        "decode_ms": _ms(generation.decode_seconds),
        "decode_ms_per_token": _ms(generation.decode_seconds / steps) if steps else None,
        "total_ms": _ms(total),
        "tokens_per_second": stable_float(batch * new_tokens / total) if total > 0 else None,
        "predicted": {"prefill_ms": _ms(predicted.prefill_seconds),
                      "decode_ms_per_token": _ms(predicted.decode_seconds_per_token),
                      "tokens_per_second": stable_float(predicted.tokens_per_second),
                      "total_ms": _ms(predicted.total_seconds)},
        "predicted_for_request": request_prediction(plan, batch, generation.prompt_len, new_tokens),
        "sublayers": sublayers,
        "memory": memory,
        "transfers": dict(transfers),
        "experts": expert_rates(generation.experts),
        "notes": list(engine.notes),
    }


def expert_rates(totals: dict | None) -> dict | None:
    """Per phase, what the run's experts ops did on the CPU (`Generation.experts`, ExpertTally keys) and the rate
    the CPU's expert kernel reached over the CPU parts that computed experts: their weight bytes over their host
    seconds, every timed step counted (a profiled step times one). None for a run without MoE experts on the
    CPU."""
    if not totals:
        return None
    out = {}
    for phase in sorted({key.split("_", 1)[0] for key in totals}):
        counts = {key.split("_", 1)[1]: value for key, value in totals.items() if key.startswith(phase + "_")}
        seconds = counts.get("cpu_seconds", 0.0)
        out[phase] = {"cpu_experts": int(counts.get("cpu_experts", 0)), "cpu_parts": int(counts.get("cpu_parts", 0)),
                      "cpu_bytes": int(counts.get("cpu_bytes", 0)), "cpu_ms": _ms(seconds),
                      "streamed_experts": int(counts.get("streamed_experts", 0)),
                      "cut_experts": int(counts.get("cut_experts", 0)),
                      "cpu_gb_per_s": (stable_float(counts["cpu_bytes"] / seconds / 1e9) if seconds > 0 else None)}
        parts, betweens = counts.get("cpu_parts", 0), counts.get("betweens", 0)
        if parts and "route_seconds" in counts:
            # the host thread's work beside each CPU part, ms per part (between: per experts op that follows another)
            out[phase]["host_ms_per_cpu_part"] = {
                part: _ms(counts[f"{part}_seconds"] / parts) for part in ("route", "dispatch", "merge")}
            out[phase]["host_ms_per_cpu_part"]["between"] = (_ms(counts["between_seconds"] / betweens)
                                                             if betweens else None)
    return out


def write_metrics(path, metrics: dict) -> None:
    """Atomically: a reader never sees half a file, and a failed run leaves none."""
    write_atomic(path, json.dumps(metrics, indent=2, sort_keys=True) + "\n")


def summary_lines(metrics: dict) -> list[str]:
    """The few lines `lia-run` prints."""
    lines = [f"plan {metrics['plan']}: {metrics['backend']['gpu']}; CPU kernels '{metrics['backend']['cpu_kernels']}'"
             f", {metrics['backend']['dtype']}"]
    lines += [f"note: {note}" for note in metrics["notes"]]
    warm = metrics.get("warmup")
    lines.append(f"loaded in {metrics['load_seconds']:.2f} s, "
                 + (f"warmed up in {metrics['warmup_seconds']:.2f} s (batch {warm['batch_size']}, prompt "
                    f"{warm['prompt_len']})" if warm else "no warm-up"))
    run = metrics["run"]
    per_token = metrics["decode_ms_per_token"]
    lines.append(f"batch {run['batch_size']}, prompt {run['prompt_len']}, {run['gen_len']} new tokens: prefill "
                 f"{metrics['prefill_ms']:.2f} ms, decode "
                 + (f"{per_token:.2f} ms/token" if per_token is not None else "-")
                 + f", {metrics['tokens_per_second']:.1f} tokens/s")
    predicted = metrics["predicted"]
    lines.append(f"plan predicted: prefill {predicted['prefill_ms']:.2f} ms, decode "
                 f"{predicted['decode_ms_per_token']:.2f} ms/token, {predicted['tokens_per_second']:.1f} tokens/s")
    scaled = metrics.get("predicted_for_request")
    if scaled and (scaled["prefill_ms"], scaled["decode_ms_per_token"]) != (predicted["prefill_ms"],
                                                                          predicted["decode_ms_per_token"]):
        lines.append(f"  scaled to this run: prefill {scaled['prefill_ms']:.2f} ms, decode "
                     f"{scaled['decode_ms_per_token']:.2f} ms/token, {scaled['tokens_per_second']:.1f} tokens/s")
    for row in metrics["memory"]:
        if row["tier"] == "hbm" and row.get("peak_footprint_bytes") is not None:
            lines.append(f"GPU footprint: peak {row['peak_footprint_bytes'] / GIB:.3f} GiB (allocator "
                         f"{row['peak_reserved_bytes'] / GIB:.3f} + CUDA context {row['context_bytes'] / GIB:.3f}) "
                         f"of a {row['budget_bytes'] / GIB:.3f} GiB budget"
                         + ("" if row["budget_enforced"] else " (not enforced)"))
        peak = row["peak_bytes"]
        lines.append(f"memory {row['tier']}: reserved {row['reserved_bytes'] / GIB:.3f} GiB of "
                     f"{row['planned_bytes'] / GIB:.3f} GiB planned"
                     + (f" ({row['shared_bytes'] / GIB:.3f} GiB shared weights)" if row["shared_bytes"] else "")
                     + (f", peak {peak / GIB:.3f} GiB" if peak is not None else "")
                     + {True: ", pinned", False: ", pageable", None: ""}[row["pinned"]])
    return lines
