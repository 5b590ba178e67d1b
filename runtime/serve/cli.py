"""`lia-serve`: an OpenAI-compatible HTTP server over one offload plan, with continuous batching.

    lia-serve PLAN (--weights DIR|ORG/NAME | --random-weights SEED) [--host H] [--port N] [--model-name NAME]
              [--max-waiting N] [--max-prefill-tokens N] [--grace-seconds S] [--dtype D] [--emulate-gpu]
              [--log-level L]

PLAN is best a serving plan (`liac compile --serve`: one memory placement, a compute placement per live batch
size); any plan serves, its batch_size the most sequences at once. The server listens until SIGINT (Ctrl-C) or
SIGTERM: it then stops taking requests, lets those in flight finish for --grace-seconds, cancels the rest (their
streams end with finish_reason 'cancelled'), frees the engine and exits: 0 after SIGTERM, 130 after Ctrl-C (one
line). A second Ctrl-C exits at once. Bad input or environment (a missing extra, a bad plan, a busy port): one
line on stderr, status 2. The API: runtime/serve/app.py; docs/serving.md.

Needs the optional extra 'serve' (FastAPI, uvicorn, prometheus_client): pip install 'liac[serve]'.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import sys
from pathlib import Path

from liac.cli import OneLineParser, checked_type, seed_type, version_text
from liac.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, LiacError, require

__all__ = ["main", "build_parser", "serve"]


_positive = checked_type(int, lambda v: 1 <= v < 2**31, "a positive integer")
_seconds = checked_type(float, lambda v: v >= 0, "a number of seconds at least 0")
_port = checked_type(int, lambda v: 0 <= v <= 65535, "a port number 0..65535 (0: any free port)")


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="lia-serve", description="Serve an offload plan over an OpenAI-compatible HTTP API "
                                                         "(/v1/completions, /v1/chat/completions, /v1/models) with "
                                                         "continuous batching.")
    parser.add_argument("--version", action="version", version=version_text("lia-serve"))
    parser.add_argument("plan", help="offload plan (YAML); a serving plan (liac compile --serve) gives each live "
                                     "batch size its own compute placement")
    weights = parser.add_mutually_exclusive_group(required=True)
    weights.add_argument("--weights", metavar="DIR", help="HF checkpoint directory (config.json, *.safetensors, its "
                                                          "tokenizer), or a Hugging Face repo id in the HF cache")
    weights.add_argument("--random-weights", metavar="SEED", type=seed_type,
                         help="seeded random weights (benchmarks: token ids in, no tokenizer)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8000, help="port to listen on (default 8000; 0: any free one)")
    parser.add_argument("--model-name", metavar="NAME",
                        help="the model id clients name (default: the checkpoint's folder name, or the plan's model)")
    parser.add_argument("--max-waiting", metavar="N", type=_positive, default=64,
                        help="requests that may wait for a batch row; beyond it they get 429 (default 64)")
    parser.add_argument("--max-prefill-tokens", metavar="N", type=_positive,
                        help="prompt tokens prefilled between two decode steps at most (default: the plan's "
                             "prompt_len)")
    parser.add_argument("--static-batching", action="store_true",
                        help="admit requests only into an empty batch, which then runs to its end (the baseline "
                             "continuous batching is measured against)")
    parser.add_argument("--grace-seconds", metavar="S", type=_seconds, default=30.0,
                        help="on shutdown, how long requests in flight may finish before they are cancelled "
                             "(default 30)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                        help="compute and storage dtype (default: the plan's model dtype)")
    parser.add_argument("--emulate-gpu", action="store_true",
                        help="test mode: run 'gpu' sublayers on the CPU behind the GPU interface")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                        help="uvicorn's log level (default info: one line per request)")
    return parser


def _check_port(host: str, port: int) -> None:
    """A busy address is one line before the model is loaded, not a traceback after."""
    if port == 0:
        return
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror})"
        raise LiacError("--port", f"{host}:{port} {why}") from None


def serve(args, ready=None) -> int:
    """Load the plan's engine and serve it until a signal; `ready(port)` is called once it listens."""
    require("fastapi", "server")
    require("uvicorn", "server")
    require("prometheus_client", "server")
    # late import: the optional extra 'serve' (checked above, one line when missing) and the engine's torch
    import uvicorn

    from liac.hub import resolve_checkpoint
    from liac.runtime.batching import check_servable
    from liac.runtime.engine import DTYPES, Engine, RandomWeights, resolve_plan
    from liac.runtime.serve.app import create_app
    from liac.runtime.serve.engine import AsyncEngine
    from liac.runtime.serve.metrics import ServeMetrics

    _check_port(args.host, args.port)
    plan, _ = resolve_plan(args.plan)
    check_servable(plan, args.plan)  # before any weights load
    if args.weights is not None:
        weights = str(resolve_checkpoint(args.weights))
        name = args.model_name or Path(weights).name
    else:
        weights = RandomWeights(args.random_weights)
        name = args.model_name or plan.model_config.name
    engine = Engine.from_plan(args.plan, weights, emulate_gpu=True if args.emulate_gpu else None,
                              dtype=DTYPES[args.dtype] if args.dtype else None)
    metrics = ServeMetrics(engine)
    server_engine = AsyncEngine(engine, max_waiting=args.max_waiting, max_prefill_tokens=args.max_prefill_tokens,
                                observer=metrics, grace_seconds=args.grace_seconds,
                                static_batching=args.static_batching)
    app = create_app(server_engine, name, metrics)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on",
                            timeout_graceful_shutdown=args.grace_seconds + 10)
    if ready is None:
        def ready(port: int) -> None:
            sys.stderr.write(f"lia-serve: listening on http://{args.host}:{port}/v1 (Ctrl-C stops)\n")
            sys.stderr.flush()
    server = _Server(config, server_engine, ready)
    work = plan.spec.workload
    serving = len(plan.spec.serving.batches) if plan.spec.serving is not None else 0
    sys.stderr.write(f"lia-serve: model '{name}' from plan {args.plan} ({work.batch_size} sequences at once, "
                     f"{work.prompt_len}-token prompts, {work.prompt_len + work.gen_len}-token context"
                     + (f", {serving} batch-size placements" if serving else "") + ")\n")
    try:
        asyncio.run(server.serve())
    finally:
        server_engine.close()
        engine.close()
    if server.signals and server.signals[0] == signal.SIGINT:
        sys.stderr.write("lia-serve: interrupted: stopped taking requests, finished or cancelled those in flight\n")
        return EXIT_INTERRUPTED
    return 0


class _Server:
    """uvicorn's Server, told to shut the engine down gracefully on the first signal (the engine stops taking
    requests at once; those in flight finish for up to --grace-seconds, then are cancelled, so their connections
    close and uvicorn's own wait ends)."""

    def __new__(cls, config, engine, ready):
        import uvicorn  # late import: the optional extra 'serve'

        class Server(uvicorn.Server):
            signals: list[int] = []

            def handle_exit(self, sig, frame):  # uvicorn re-raises the signals it captured: we report them instead
                self.signals.append(sig)
                if self.should_exit:
                    self.force_exit = True  # a second signal: now
                    return
                self.should_exit = True
                engine.accepting = False
                loop = engine._loop
                if loop is not None and not loop.is_closed():
                    loop.call_soon_threadsafe(lambda: asyncio.ensure_future(engine.shutdown(engine.grace_seconds)))

            async def startup(self, sockets=None):
                engine._loop = asyncio.get_running_loop()
                await super().startup(sockets)
                if ready is not None and self.started:
                    ready(self.servers[0].sockets[0].getsockname()[1])

        server = Server(config)
        server.signals = []
        return server


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # usage errors (one line, status 2) and --help (status 0), as a return value
        return int(e.code or 0)
    try:
        return serve(args)
    except LiacError as e:
        sys.stderr.write(f"lia-serve: {e.line()}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("\nlia-serve: interrupted\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
