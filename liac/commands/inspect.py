"""`liac inspect --model NAME`: the traced sublayer graph as a table (or JSON): weights, FLOPs, bytes per phase.

    liac inspect --model llama-3.1-70b --batch 8 --prompt-len 512
    liac inspect --model path/to/config.json --format json

Prefill is (B, Q=L, C=L); decode is the first step after it, (B, Q=1, C=L+1). The LM head is priced for the last
position only in prefill (generation needs only its logits), as the cost model does. Bytes are read + written.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from liac.commands.flags import positive_int
from liac.errors import LiacError
from liac.models import resolve_model
from liac.plan import LAYER_CLASSES
from liac.sizes import numel

__all__ = ["register", "run", "inspect_data", "render_table"]

FORMATS = ("table", "json")
_MB = 1e6
_GFLOP = 1e9


def register(sub) -> None:
    parser = sub.add_parser("inspect", help="show a model's sublayers with weights, FLOPs and bytes per phase",
                            description="Trace a model (zoo name, config.json, checkpoint directory or HF repo id) into its "
                                        "sublayer graph and print each sublayer's weights and its FLOPs and bytes "
                                        "in prefill and in the first decode step.")
    parser.add_argument("--model", required=True, help="zoo name, HF config.json, checkpoint directory, or Hugging "
                                                       "Face repo id (its config.json only)")
    parser.add_argument("--batch", default="1", help="sequences per batch (default 1)")
    parser.add_argument("--prompt-len", default="128", help="prompt tokens per sequence (default 128)")
    parser.add_argument("--format", default="table", help="'table' (default) or 'json'")
    parser.set_defaults(func=run)


def run(args) -> int:
    batch = positive_int(args.batch, "--batch")
    prompt_len = positive_int(args.prompt_len, "--prompt-len")
    if args.format not in FORMATS:
        raise LiacError("--format", f"unsupported value '{args.format}': must be one of 'table', 'json'")
    cfg = resolve_model(args.model)  # no torch yet: a mistyped name answers at once
    if prompt_len >= cfg.max_position:
        raise LiacError("--prompt-len", f"must be less than {cfg.max_position} (max_position of '{cfg.name}', "
                                        f"which the first decode step would reach), got {prompt_len}")
    from liac.passes.trace import trace_model  # late import: tracing loads torch

    data = inspect_data(trace_model(cfg), batch, prompt_len)
    if args.format == "json":
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(render_table(data))
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Data


def _phase(sub, point: tuple[int, int, int]) -> dict[str, Any]:
    flops, read, written = int(sub.flops(*point)), int(sub.bytes_read(*point)), int(sub.bytes_written(*point))
    total = read + written
    return {"flops": flops, "bytes_read": read, "bytes_written": written, "bytes": total,
            "kv_read": int(sub.kv_read(*point)), "kv_written": int(sub.kv_written(*point)),
            "ops_per_byte": flops / total if total else 0.0}


def inspect_data(graph, batch: int, prompt_len: int) -> dict[str, Any]:
    """Plain data for the table and the JSON: model header, workload points, one row per sublayer, totals."""
    from liac.ir import phase_point  # late import: the IR loads networkx, which `liac --help` does not need

    cfg = graph.graph["model"]
    counts = graph.graph["layer_counts"]
    points = {"prefill": phase_point("prefill", batch, prompt_len), "decode": phase_point("decode", batch, prompt_len)}
    rows, params = [], 0
    totals = {"weight_bytes": 0, **{phase: {"flops": 0, "bytes": 0} for phase in points}}
    for layer_class in LAYER_CLASSES:
        for sub in graph.sublayers(layer_class):
            count = counts[layer_class]
            row = {"node": f"{layer_class}.{sub.name}", "layer_class": layer_class, "count": count,
                   "name": sub.name, "kind": sub.kind, "unit": sub.unit, "weight_bytes": sub.weight_bytes}
            for phase, point in points.items():
                if layer_class == "head" and phase == "prefill":
                    point = (point[0], 1, point[2])  # only the last position's logits are needed
                row[phase] = _phase(sub, point)
                totals[phase]["flops"] += count * row[phase]["flops"]
                totals[phase]["bytes"] += count * row[phase]["bytes"]
            totals["weight_bytes"] += count * sub.weight_bytes
            params += count * sum(numel(w.shape) for w in sub.weights)
            rows.append(row)
    for phase in points:
        moved = totals[phase]["bytes"]
        totals[phase]["ops_per_byte"] = totals[phase]["flops"] / moved if moved else 0.0
    model = {key: cfg[key] for key in ("name", "family", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
                                       "head_dim", "ffn_dim", "vocab_size", "num_experts", "experts_top_k",
                                       "dtype")}
    model["params"] = params
    model["tied_weights"] = dict(graph.graph.get("tied_weights", {}))
    return {"model": model, "workload": {"batch_size": batch, "prompt_len": prompt_len},
            "points": {phase: list(point) for phase, point in points.items()}, "sublayers": rows,
            "totals": totals}


# ---------------------------------------------------------------------------------------------------------------
# Table


def _num(value: float, scale: float) -> str:
    scaled = value / scale
    if scaled == 0:
        return "0"
    return f"{scaled:.3g}" if abs(scaled) < 1000 else f"{scaled:,.0f}"


def render_table(data: dict[str, Any]) -> str:
    """The human view of `inspect_data`: header lines, one row per sublayer grouped by class, totals."""
    model, work, points = data["model"], data["workload"], data["points"]
    heads = f"{model['num_heads']} / {model['num_kv_heads']}"
    if model["num_kv_heads"] < model["num_heads"]:
        heads += f" (GQA, {model['num_heads'] // model['num_kv_heads']} query heads per KV head)"
    moe = f", {model['num_experts']} experts (top-{model['experts_top_k']})" if model["num_experts"] else ""
    lines = [
        f"model {model['name']}: family {model['family']}, {model['params'] / 1e9:.2f} B params, "
        f"{model['num_layers']} layers, d_model {model['hidden_size']}, heads / KV heads {heads}, "
        f"head_dim {model['head_dim']}, ffn {model['ffn_dim']}{moe}, vocab {model['vocab_size']}, {model['dtype']}",
        f"workload: batch {work['batch_size']}, prompt {work['prompt_len']} tokens; prefill (B, Q, C) = "
        f"{tuple(points['prefill'])}, decode first step = {tuple(points['decode'])}",
        "units: MB = 1e6 bytes, GFLOP = 1e9 FLOPs, bytes = read + written, per layer; the LM head's prefill row is "
        "for the last position",
    ]
    if model["num_experts"]:
        lines.append("experts: FLOPs are for the routed tokens (top-k of the experts); bytes count every expert's "
                     "weights, of which a step touches E·(1 − (1 − k/E)^(B·Q)) experts' worth")
    for head_weight, embed_weight in sorted(model["tied_weights"].items()):
        lines.append(f"tied: {embed_weight} is {head_weight}; its MB are listed once, under lm_head")
    lines.append("")
    header = ("sublayer", "kind", "unit", "weight MB", "prefill GFLOP", "prefill MB", "ops/byte",
              "decode GFLOP", "decode MB", "ops/byte")
    table = [header]
    current = None
    for row in data["sublayers"]:
        if row["layer_class"] != current:
            current = row["layer_class"]
            table.append((f"{current} (×{row['count']} layers)" if row["count"] > 1 else current,) + ("",) * 9)
        pre, dec = row["prefill"], row["decode"]
        table.append(("  " + row["name"], row["kind"], row["unit"] if row["unit"] != row["name"] else "",
                      _num(row["weight_bytes"], _MB), _num(pre["flops"], _GFLOP), _num(pre["bytes"], _MB),
                      f"{pre['ops_per_byte']:.3g}", _num(dec["flops"], _GFLOP), _num(dec["bytes"], _MB),
                      f"{dec['ops_per_byte']:.3g}"))
    totals = data["totals"]
    table.append(("total (all layers)", "", "", _num(totals["weight_bytes"], _MB),
                  _num(totals["prefill"]["flops"], _GFLOP), _num(totals["prefill"]["bytes"], _MB),
                  f"{totals['prefill']['ops_per_byte']:.3g}", _num(totals["decode"]["flops"], _GFLOP),
                  _num(totals["decode"]["bytes"], _MB), f"{totals['decode']['ops_per_byte']:.3g}"))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for index, row in enumerate(table):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].ljust(widths[2])]
        cells += [cell.rjust(width) for cell, width in zip(row[3:], widths[3:])]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("-" * len(lines[-1]))
    return "\n".join(lines) + "\n"
