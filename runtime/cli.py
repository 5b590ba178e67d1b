"""`lia-run`: execute an offload plan. Thin: parse, check the request, Engine.from_plan, generate, report, exit.

    lia-run PLAN.yaml (--weights DIR | --random-weights SEED) [--prompt-len N | --prompt-ids FILE] [--gen-len M]
            [--batch B] [--metrics-out FILE] [--profile-steps K] [--emulate-gpu]

A LiacError prints as one line on stderr and exits 2 (nothing is written); anything else is a bug and keeps its
traceback. Every flag has an API twin (docs/runtime.md).
"""

from __future__ import annotations

import json
import sys

import torch

from liac.cli import OneLineParser, version_text
from liac.errors import EXIT_USER_ERROR, LiacError
from liac.runtime.engine import Engine, RandomWeights, check_request, resolve_plan
from liac.runtime.metrics import build_metrics, summary_lines, write_metrics

__all__ = ["main", "build_parser", "read_prompt_ids"]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"must be a positive integer, got '{text}'") from None
    if value < 1:
        raise ValueError(f"must be a positive integer, got '{text}'")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="lia-run", description="Run an offload plan: greedy generation with each sublayer "
                                                       "on the device and each tensor in the tier the plan names.")
    parser.add_argument("--version", action="version", version=version_text("lia-run"))
    parser.add_argument("plan", help="offload plan (YAML, from 'liac compile')")
    weights = parser.add_mutually_exclusive_group(required=True)
    weights.add_argument("--weights", metavar="DIR", help="HF checkpoint directory (config.json + *.safetensors)")
    weights.add_argument("--random-weights", metavar="SEED", type=_count, help="seeded random weights")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt-len", metavar="N", type=_positive,
                        help="random prompt of N tokens per sequence (default: the plan's prompt_len)")
    prompt.add_argument("--prompt-ids", metavar="FILE",
                        help="JSON file: a list of token ids, or a list of equal-length lists (one per sequence)")
    parser.add_argument("--gen-len", metavar="M", type=_positive, help="new tokens (default: the plan's gen_len)")
    parser.add_argument("--batch", metavar="B", type=_positive,
                        help="sequences for --prompt-len (default: the plan's batch_size)")
    parser.add_argument("--metrics-out", metavar="FILE", help="write the run's metrics as JSON (atomically)")
    parser.add_argument("--profile-steps", metavar="K", type=_count, default=4,
                        help="decode steps of the separate per-sublayer profiling pass (0: skip it; default 4)")
    parser.add_argument("--emulate-gpu", action="store_true",
                        help="test mode: run 'gpu' sublayers on the CPU behind the GPU interface")
    return parser


def read_prompt_ids(path: str) -> list[list[int]]:
    """A JSON list of ints, or a list of equal-length lists of ints."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except OSError as e:
        raise LiacError("--prompt-ids", f"cannot read '{path}': {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LiacError("--prompt-ids", f"'{path}' is not valid JSON: {e}") from e
    rows = data if isinstance(data, list) and data and isinstance(data[0], list) else [data]
    ok = (isinstance(data, list) and all(isinstance(r, list) and r and len(r) == len(rows[0]) for r in rows)
          and all(isinstance(t, int) and not isinstance(t, bool) for r in rows for t in r))
    if not ok:
        raise LiacError("--prompt-ids", f"'{path}' must hold a non-empty list of token ids or a list of "
                                        f"equal-length lists of token ids")
    return rows


def run(args) -> int:
    plan, _ = resolve_plan(args.plan)
    work = plan.spec.workload
    if args.prompt_ids:
        prompt = torch.tensor(read_prompt_ids(args.prompt_ids), dtype=torch.long)
        if args.batch is not None and args.batch != prompt.shape[0]:
            raise LiacError("--batch", f"must equal the {prompt.shape[0]} sequences of --prompt-ids, got {args.batch}")
    else:
        batch = args.batch or work.batch_size
        length = args.prompt_len or work.prompt_len
        check_request(plan, batch, length, 1, flags=True)
        generator = torch.Generator().manual_seed(args.random_weights or 0)
        prompt = torch.randint(0, plan.model_config.vocab_size, (batch, length), generator=generator)
    gen_len = args.gen_len or work.gen_len
    check_request(plan, prompt.shape[0], prompt.shape[1], gen_len, flags=True)
    weights = RandomWeights(args.random_weights) if args.random_weights is not None else args.weights
    engine = Engine.from_plan(args.plan, weights, emulate_gpu=True if args.emulate_gpu else None, progress=True)
    generation = engine.generate(prompt, gen_len)
    profile = engine.profile(prompt, min(args.profile_steps, gen_len - 1)) if args.profile_steps else {}
    metrics = build_metrics(engine, generation, profile)
    for line in summary_lines(metrics):
        print(line)
    shown = generation.token_ids[0].tolist()
    print("tokens[0]: " + " ".join(str(t) for t in shown[:32]) + (" …" if len(shown) > 32 else ""))
    if args.metrics_out:
        write_metrics(args.metrics_out, metrics)
        print(f"metrics: {args.metrics_out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # usage errors (one line, status 2) and --help (status 0), as a return value
        return int(e.code or 0)
    try:
        return run(args)
    except LiacError as e:
        sys.stderr.write(f"lia-run: {e.line()}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
