"""A run's measurements beside the plan's predictions, as one JSON document (docs/runtime.md, "Metrics").

This is the only module of the runtime that reads `plan.status`, and only to print the compiler's predictions next
to what was measured: nothing the runtime does depends on it.
"""

from __future__ import annotations

import json

import torch

from liac.fileio import write_atomic
from liac.plan import OffloadPlan
from liac.runtime.kernels import cpu_backend
from liac.schema_tools import stable_float
from liac.sizes import GIB

__all__ = ["build_metrics", "write_metrics", "summary_lines", "METRICS_VERSION"]

METRICS_VERSION = 1


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else stable_float(seconds * 1e3)


def _predicted_sublayers(plan: OffloadPlan) -> dict[tuple[str, str, str], tuple[float, float, float]]:
    # Reporting only: status is the compiler's observation, never an input to execution.
    return {(t.group, t.name, t.phase): (t.compute_seconds, t.transfer_seconds, t.stream_seconds)
            for t in plan.status.predicted.sublayers}


def build_metrics(engine, generation, sublayer_seconds: dict[tuple, float]) -> dict:
    """The metrics document of one run (see the module docstring); `sublayer_seconds` from `Engine.profile`."""
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
        sublayers.append(row)
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
                    "cpu_small_m_gb_per_s": ({k: stable_float(v) for k, v in engine.cpu_linear[1].items()}
                                             if engine.cpu_linear[1] else None)},
        "run": {"batch_size": batch, "prompt_len": generation.prompt_len, "gen_len": new_tokens,
                "decode_steps": steps},
        "prefill_ms": _ms(generation.prefill_seconds),
        "decode_ms": _ms(generation.decode_seconds),
        "decode_ms_per_token": _ms(generation.decode_seconds / steps) if steps else None,
        "total_ms": _ms(total),
        "tokens_per_second": stable_float(batch * new_tokens / total) if total > 0 else None,
        "predicted": {"prefill_ms": _ms(predicted.prefill_seconds),
                      "decode_ms_per_token": _ms(predicted.decode_seconds_per_token),
                      "tokens_per_second": stable_float(predicted.tokens_per_second),
                      "total_ms": _ms(predicted.total_seconds)},
        "sublayers": sublayers,
        "memory": memory,
        "transfers": dict(transfers),
        "notes": list(engine.notes),
    }


def write_metrics(path, metrics: dict) -> None:
    """Atomically: a reader never sees half a file, and a failed run leaves none."""
    write_atomic(path, json.dumps(metrics, indent=2, sort_keys=True) + "\n")


def summary_lines(metrics: dict) -> list[str]:
    """The few lines `lia-run` prints."""
    lines = [f"plan {metrics['plan']}: {metrics['backend']['gpu']}; CPU kernels '{metrics['backend']['cpu_kernels']}'"
             f", {metrics['backend']['dtype']}"]
    lines += [f"note: {note}" for note in metrics["notes"]]
    run = metrics["run"]
    per_token = metrics["decode_ms_per_token"]
    lines.append(f"batch {run['batch_size']}, prompt {run['prompt_len']}, {run['gen_len']} new tokens: prefill "
                 f"{metrics['prefill_ms']:.2f} ms, decode "
                 + (f"{per_token:.2f} ms/token" if per_token is not None else "-")
                 + f", {metrics['tokens_per_second']:.1f} tokens/s")
    predicted = metrics["predicted"]
    lines.append(f"plan predicted: prefill {predicted['prefill_ms']:.2f} ms, decode "
                 f"{predicted['decode_ms_per_token']:.2f} ms/token, {predicted['tokens_per_second']:.1f} tokens/s")
    for row in metrics["memory"]:
        peak = row["peak_bytes"]
        lines.append(f"memory {row['tier']}: reserved {row['reserved_bytes'] / GIB:.3f} GiB of "
                     f"{row['planned_bytes'] / GIB:.3f} GiB planned"
                     + (f" ({row['shared_bytes'] / GIB:.3f} GiB shared weights)" if row["shared_bytes"] else "")
                     + (f", peak {peak / GIB:.3f} GiB" if peak is not None else "")
                     + {True: ", pinned", False: ", pageable", None: ""}[row["pinned"]])
    return lines
