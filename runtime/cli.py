"""`lia-run`: execute an offload plan. Thin: parse, build the request, pick the plan, Engine.from_plan, generate,
report, exit.

    lia-run PLAN|SWEEP_DIR (--weights DIR | --random-weights SEED)
            [--prompt TEXT ... | --prompt-file FILE | --prompt-len N | --prompt-ids FILE] [--chat] [--gen-len M]
            [--batch B] [--temperature T] [--top-p P] [--top-k K] [--seed S] [--ignore-eos]
            [--json | --jsonl] [--metrics-out FILE] [--profile-steps K] [--dtype D] [--no-warm-up]
            [--emulate-gpu]

stdout carries what was generated: text (one sequence streamed as it is produced; a batch, each sequence when it
is done), or token ids, or with --json one JSON document (--jsonl: one JSON line per sequence when it is done);
stderr carries everything about the run (the plan chosen, progress bars on a terminal, notes, the timing summary).
Exit status: 0 done; 2 bad input or environment (a LiacError, or an OSError: a file or device the host refused;
one line on stderr, nothing written); 130 interrupted (Ctrl-C, also while torch loads: one line). Anything else is
a bug and keeps its traceback. `--metrics-out` is checked writable before the run. Files named on the command line
are read through liac.fileio (regular files only, bounded). docs/cli.md lists every flag; each has an API twin
(docs/runtime.md).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass

# torch-free imports only: torch loads inside run(), within main()'s try, so the flags answer at once and Ctrl-C
# while it loads is one line (tests/runtime/test_lia_run.py checks both)
from liac.cli import OneLineParser, checked_type, interrupted, report_os_error, seed_type, version_text
from liac.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, LiacError, brief
from liac.fileio import MAX_JSON_BYTES, check_writable, load_json, read_text
from liac.hub import resolve_checkpoint
from liac.models.config import DTYPES
from liac.progress import progress_bar
from liac.runtime.sweep import is_sweep, plan_for_request
from liac.runtime.text import decode, encode_prompts, load_tokenizer, pad_token_id
# (PromptBatch and Generation in annotations are liac.runtime.sequences' and .engine's, imported where used: the
# annotations are never evaluated.)

__all__ = ["main", "build_parser", "read_prompt_ids", "read_prompt_file", "EXIT_INTERRUPTED"]


_positive = checked_type(int, lambda v: 1 <= v < 2**31, "a positive integer")
_count = seed_type

MAX_PROMPT_FILE_BYTES = 64 * 2**20  # --prompt-file: far beyond any context window, well below memory
_non_negative = checked_type(float, lambda v: math.isfinite(v) and v >= 0, "a number at least 0")
_fraction = checked_type(float, lambda v: 0 < v <= 1, "a number greater than 0 and at most 1")


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="lia-run", description="Run an offload plan: each sublayer on the device and each "
                                                       "tensor in the tier the plan names; text or token ids in, "
                                                       "text or token ids out.")
    parser.add_argument("--version", action="version", version=version_text("lia-run"))
    parser.add_argument("plan", help="offload plan (YAML, from 'liac compile'), or a sweep directory / its "
                                     "index.yaml: the plan with the smallest batch that holds the request is run")
    weights = parser.add_mutually_exclusive_group(required=True)
    weights.add_argument("--weights", metavar="DIR", help="HF checkpoint directory (config.json + *.safetensors; "
                                                          "its tokenizer for text prompts), or a Hugging Face repo "
                                                          "id resolved through the HF cache")
    weights.add_argument("--random-weights", metavar="SEED", type=_count, help="seeded random weights")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", metavar="TEXT", action="append",
                        help="a text prompt (repeat for a batch); tokenized with the checkpoint's tokenizer")
    prompt.add_argument("--prompt-file", metavar="FILE", help="text prompts, one a line ('-': standard input)")
    prompt.add_argument("--prompt-len", metavar="N", type=_positive,
                        help="random prompt of N tokens per sequence (default: the plan's prompt_len)")
    prompt.add_argument("--prompt-ids", metavar="FILE",
                        help="JSON file: a list of token ids, or a list of lists (one per sequence, any lengths)")
    parser.add_argument("--chat", action="store_true", help="wrap each text prompt in the checkpoint's chat template")
    parser.add_argument("--gen-len", "--max-new-tokens", dest="gen_len", metavar="M", type=_positive,
                        help="at most M new tokens per sequence (default: the plan's gen_len; up to what the plan's "
                             "context leaves)")
    parser.add_argument("--batch", metavar="B", type=_positive,
                        help="sequences for --prompt-len (default: the plan's batch_size; 1 for a sweep)")
    parser.add_argument("--temperature", metavar="T", type=_non_negative, default=0.0,
                        help="sampling temperature (default 0: greedy)")
    parser.add_argument("--top-p", metavar="P", type=_fraction, default=1.0,
                        help="sample from the most probable tokens whose probabilities add up to P (default 1)")
    parser.add_argument("--top-k", metavar="K", type=_count, default=0,
                        help="sample from the K most probable tokens (default 0: no limit)")
    parser.add_argument("--seed", metavar="S", type=_count, help="sampling seed (same seed, same text)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="do not stop a text sequence at its EOS token: always generate --gen-len tokens")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true",
                        help="print one JSON document on stdout (outputs and metrics); human text goes to stderr")
    output.add_argument("--jsonl", action="store_true",
                        help="print one JSON line per sequence on stdout as soon as it is done")
    parser.add_argument("--metrics-out", metavar="FILE", help="write the run's metrics as JSON (atomically)")
    parser.add_argument("--profile-steps", metavar="K", type=_count, default=4,
                        help="decode steps of the separate per-sublayer profiling pass, run when metrics are written "
                             "(--metrics-out, --json; 0: skip it; default 4)")
    parser.add_argument("--dtype", choices=tuple(DTYPES),
                        help="compute and storage dtype (default: the plan's model dtype, bfloat16)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="skip the warm-up at load (one prefill and one decode step of the request's shapes "
                             "through the first layer of each layer group, then a whole two-token request); its "
                             "first request then pays one-off costs")
    parser.add_argument("--emulate-gpu", action="store_true",
                        help="test mode: run 'gpu' sublayers on the CPU behind the GPU interface")
    return parser


def read_prompt_ids(path: str) -> list[list[int]]:
    """A JSON list of token ids, or a list of non-empty lists of token ids (any lengths: they are left-padded);
    each id an integer from 0 below 2³¹."""
    source = f"--prompt-ids {brief(path)}"
    data = load_json(path, source, MAX_JSON_BYTES)
    rows = data if isinstance(data, list) and data and isinstance(data[0], list) else [data]
    ok = (isinstance(data, list) and all(isinstance(r, list) and r for r in rows)
          and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for r in rows for t in r))
    if not ok:
        raise LiacError(source, "must hold a non-empty list of token ids (integers from 0) or a list of non-empty "
                                "lists of token ids")
    return rows


def read_prompt_file(path: str) -> list[str]:
    """Text prompts, one a line; blank lines are skipped. '-' reads standard input. A file must be a regular UTF-8
    file of at most MAX_PROMPT_FILE_BYTES (liac.fileio.read_text: a FIFO or device never blocks the run)."""
    source = "--prompt-file " + ("-" if path == "-" else brief(path))
    if path == "-":
        data = sys.stdin.buffer.read(MAX_PROMPT_FILE_BYTES + 1)
        if len(data) > MAX_PROMPT_FILE_BYTES:
            raise LiacError(source, f"standard input must be at most {MAX_PROMPT_FILE_BYTES} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise LiacError(source, f"must be UTF-8 text (byte {e.start} is not)") from e
    else:
        text = read_text(path, source, MAX_PROMPT_FILE_BYTES)
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise LiacError(source, "holds no prompt (one a line)")
    return prompts


@dataclass
class _Request:
    """What to generate from: the prompts (None: random ones of the plan's size), their text, the tokenizer."""

    batch: PromptBatch | None
    texts: list[str] | None = None
    tokenizer: object = None


def _request(args) -> _Request:
    from liac.runtime.sequences import PromptBatch  # late import: torch (see the imports above)

    texts = args.prompt or (read_prompt_file(args.prompt_file) if args.prompt_file else None)
    if texts is not None:
        if args.weights is None:
            raise LiacError("--prompt" if args.prompt else "--prompt-file", "text prompts need --weights DIR: the "
                            "checkpoint's tokenizer turns them into token ids")
        tokenizer = load_tokenizer(args.weights)
        rows = encode_prompts(tokenizer, texts, args.chat, "--prompt" if args.prompt else "--prompt-file")
        batch = PromptBatch.from_lists(rows, pad_token_id(tokenizer))
        _check_batch_flag(args, batch.size, "prompts")
        return _Request(batch, texts, tokenizer)
    if args.chat:
        raise LiacError("--chat", "applies to text prompts (--prompt, --prompt-file)")
    if args.prompt_ids:
        batch = PromptBatch.from_lists(read_prompt_ids(args.prompt_ids), 0, "--prompt-ids")
        _check_batch_flag(args, batch.size, "sequences of --prompt-ids")
        return _Request(batch)
    return _Request(None)


def _check_batch_flag(args, size: int, what: str) -> None:
    if args.batch is not None and args.batch != size:
        raise LiacError("--batch", f"must equal the {size} {what}, got {args.batch}")


def _choose_plan(args, request: _Request) -> str:
    if not is_sweep(args.plan) and not os.path.isdir(args.plan):  # a directory that is no sweep: one line says so
        return args.plan
    batch = request.batch.size if request.batch is not None else (args.batch or 1)
    prompt_len = request.batch.width if request.batch is not None else args.prompt_len
    chosen = plan_for_request(args.plan, batch, prompt_len, args.gen_len)
    _say(f"sweep {args.plan}: running {chosen.name} (the smallest planned batch that holds batch {batch})")
    return str(chosen)


def _say(line: str) -> None:
    sys.stderr.write(f"lia-run: {line}\n")
    sys.stderr.flush()


class _Printer:
    """Sends each finished sequence to stdout as text (`[i] ...`) or as a JSON line (--jsonl), as it finishes."""

    def __init__(self, request: _Request, eos: tuple[int, ...], jsonl: bool):
        size = request.batch.size
        self.request, self.eos, self.jsonl = request, eos, jsonl
        self.tokens: list[list[int]] = [[] for _ in range(size)]
        self.printed = [False] * size

    def step(self, step: int, row: list[int]) -> None:
        for index, token in enumerate(row):
            if self.printed[index]:
                continue
            self.tokens[index].append(token)
            if token in self.eos:
                self.emit(index, "eos")

    def emit(self, index: int, reason: str) -> None:
        self.printed[index] = True
        tokens = self.tokens[index]
        if self.jsonl:
            print(json.dumps(_output(self.request, index, tokens, reason)), flush=True)
        else:
            print(f"[{index}] {decode(self.request.tokenizer, tokens)}", flush=True)

    def finish(self, generation: Generation) -> None:
        for index, (tokens, reason) in enumerate(zip(generation.sequences, generation.finish_reasons)):
            if not self.printed[index]:
                self.tokens[index] = tokens
                self.emit(index, reason)


def _output(request: _Request, index: int, tokens: list[int], reason: str) -> dict:
    out = {"index": index, "prompt_tokens": request.batch.lengths[index] if request.batch is not None else None,
           "new_tokens": len(tokens), "finish_reason": reason, "token_ids": tokens}
    if request.texts is not None:
        out.update(prompt=request.texts[index], text=decode(request.tokenizer, tokens))
    return out


def _writers(args, request: _Request, tokenizer_eos: tuple[int, ...], gen_len: int, tty: bool):
    """(HF streamer, _Printer, tqdm bar): what follows the tokens as they come; each may be None."""
    text = request.texts is not None
    streamer = printer = bar = None
    if text and request.batch.size == 1 and not (args.json or args.jsonl):
        from transformers import TextStreamer  # late import: text prompts already loaded transformers

        streamer = TextStreamer(request.tokenizer, skip_prompt=True, skip_special_tokens=True)
    elif not args.json and (text or args.jsonl):
        printer = _Printer(request, tokenizer_eos, args.jsonl)
    if tty and streamer is None:  # one streamed sequence is its own progress
        bar = progress_bar(gen_len, "lia-run: generating", unit="tok")
    return streamer, printer, bar


def run(args) -> int:
    # late imports: torch loads here, inside main(), where Ctrl-C is one line
    import torch

    from liac.runtime.engine import DTYPES as TORCH_DTYPES, Engine, RandomWeights, check_request, resolve_plan
    from liac.runtime.metrics import build_metrics, summary_lines, write_metrics
    from liac.runtime.sampling import SamplingParams
    from liac.runtime.sequences import PromptBatch

    if args.metrics_out:  # before the run: a finished run must not lose its metrics to an unwritable path
        check_writable(args.metrics_out, "--metrics-out")
    if args.weights is not None:  # a directory, or a Hugging Face repo id through the HF cache
        args.weights = str(resolve_checkpoint(args.weights))
    request = _request(args)
    plan_path = _choose_plan(args, request)
    plan, _ = resolve_plan(plan_path)
    work = plan.spec.workload
    if request.batch is None:  # random prompts, the plan's size unless asked otherwise
        batch = args.batch or (1 if is_sweep(args.plan) else work.batch_size)
        length = args.prompt_len or work.prompt_len
        check_request(plan, batch, length, 1, flags=True)
        generator = torch.Generator().manual_seed(args.random_weights or 0)
        request.batch = PromptBatch.from_tensor(torch.randint(0, plan.model_config.vocab_size, (batch, length),
                                                              generator=generator))
    gen_len = args.gen_len or work.gen_len
    check_request(plan, request.batch.size, request.batch.width, gen_len, flags=True)
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    weights = RandomWeights(args.random_weights) if args.random_weights is not None else args.weights
    tty = sys.stderr.isatty()
    with Engine.from_plan(plan_path, weights, emulate_gpu=True if args.emulate_gpu else None, progress=tty,
                          tokenizer=request.tokenizer, dtype=TORCH_DTYPES[args.dtype] if args.dtype else None,
                          warm_up=False if args.no_warm_up else (request.batch.size, request.batch.width)) as engine:
        text = request.texts is not None
        eos = engine.text.eos_ids() if text and not args.ignore_eos else ()
        streamer, printer, bar = _writers(args, request, eos, gen_len, tty)

        def on_step(step: int, row: list[int]) -> None:
            if bar is not None:
                bar.update(1)
            if printer is not None:
                printer.step(step, row)

        try:
            generation = engine.generate(request.batch, gen_len, sampling=[sampling] * request.batch.size,
                                         eos_token_id=eos or None, streamer=streamer,
                                         on_step=None if bar is None and printer is None else on_step)
        finally:
            if bar is not None:
                bar.close()
        if printer is not None:
            printer.finish(generation)
        elif not args.json and not text:
            for index, row in enumerate(generation.sequences):
                print(f"tokens[{index}]: " + " ".join(str(t) for t in row))
        want_metrics = bool(args.metrics_out or args.json)
        steps = min(args.profile_steps, generation.decode_steps) if want_metrics else 0
        profile = engine.profile(request.batch, steps) if steps else {}
        metrics = build_metrics(engine, generation, profile, profile_steps=steps)
    for line in summary_lines(metrics):
        _say(line)
    if args.json:
        outputs = [_output(request, index, tokens, reason) for index, (tokens, reason)
                   in enumerate(zip(generation.sequences, generation.finish_reasons))]
        print(json.dumps({"plan_file": str(plan_path), "outputs": outputs, "metrics": metrics}, indent=2,
                         sort_keys=True))
    if args.metrics_out:
        try:
            write_metrics(args.metrics_out, metrics)
        except LiacError:  # the disk filled up since the check: keep the run's metrics (on stdout, unless --json
            if not args.json:  # printed them already)
                print(json.dumps(metrics, indent=2, sort_keys=True))
            raise
        _say(f"metrics: {args.metrics_out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # usage errors (one line, status 2) and --help (status 0), as a return value
            return int(e.code or 0)
        return run(args)
    except LiacError as e:
        sys.stderr.write(f"lia-run: {e.line()}\n")
        return EXIT_USER_ERROR
    except OSError as e:
        sys.stderr.write(f"lia-run: {report_os_error(e)}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("\n")  # ends a line of streamed text
        return interrupted("lia-run", "nothing was written")


if __name__ == "__main__":
    sys.exit(main())
