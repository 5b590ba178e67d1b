"""lia-serve under load on the H200 machine: OPT-30B-shaped random weights, a 24 GiB GPU budget, the serving plan
(one memory placement, a compute placement per live batch size), concurrent streaming clients on loopback.

    # on the GPU machine, from a checkout, ONE command (≤ 8 min; the 'serve' wheels carried in .whl/):
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \\
      export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-index --no-build-isolation --no-deps -e . && \\
      PYTHONUNBUFFERED=1 python3 bench/serve_h200.py --out $OUT
    # here, as a smoke test of the orchestration (a tiny model, the GPU emulated on the CPU):
    python bench/serve_h200.py --out /tmp/serve --emulate

Steps (each writes under --out as soon as it has it, so a run cut short keeps what finished):
  1. plan     the committed serving plan bench/serve/opt-30b.h200-amx16.serve.yaml (compiled with
              `liac compile --model opt-30b --hw h200-amx16 --gpu-mem 24GiB --serve --batch 1,2,4,8,16,32
              --prompt-len 256 --gen-len 64`: no solver time on the device) → serve.yaml; with --compile, that
              command for --model, --hw, --gpu-mem, batches 1..--max-batch → serve.yaml, compile.txt
  2. serve    `lia-serve serve.yaml --random-weights 0 --port 0` in a child process → server.txt (its stderr)
  3. load     bench/serve_load.py phases (`--phases`, e.g. 'clients:1,clients:8,clients:32,rate:0.5'), each
              sending for --seconds and draining for --drain at most, skipped once the --budget would be passed
              → load-<phase>.json (summary + every request) and load.txt (one line per phase)
  4. metrics  the server's /metrics after the load → metrics.txt; then SIGTERM, and the exit status in summary
`summary.json` lists every phase's summary (p50/p99 TTFT, ITL, end-to-end; tokens/s; errors) and the timings.
Each phase's ITL is also split by whether a newcomer's prefill ran in the gap (`itl_beside_prefill_seconds`,
`itl_without_prefill_seconds`: bench/serve_load.py's `split_by_prefill`): the closed-loop clients send a new
request whenever one ends and the Poisson arrivals come at random, so every phase has gaps of both kinds; the
last lines printed give, per phase, ITL p50 without / beside a newcomer's prefill.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_load import Load, build_parser as load_parser, summary_line  # noqa: E402


def parse_phases(text: str) -> list[tuple[str, float]]:
    phases = []
    for item in text.split(","):
        kind, _, value = item.partition(":")
        if kind not in ("clients", "rate") or not value:
            raise SystemExit(f"--phases: items look like 'clients:8' or 'rate:0.5', got {item!r}")
        phases.append((kind, float(value)))
    return phases


class Run:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.began = time.monotonic()
        self.summary: dict = {"args": vars(args), "phases": [], "skipped": [], "timings": {}}

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.began)

    def log(self, line: str) -> None:
        print(f"[{time.monotonic() - self.began:6.1f}s] {line}", flush=True)

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))

    def compile(self) -> Path:
        a = self.args
        plan = self.out / "serve.yaml"
        if not a.compile:
            plan.write_text(Path(a.plan).read_text())
            return plan
        began = time.monotonic()
        batches = ",".join(str(1 << i) for i in range(a.max_batch.bit_length()) if 1 << i <= a.max_batch)
        command = [sys.executable, "-m", "liac.cli", "compile", "--model", a.model, "--hw", a.hw, "--serve",
                   "--batch", batches, "--prompt-len", str(a.prompt_len), "--gen-len", str(a.gen_len),
                   "-o", str(plan)]
        if a.gpu_mem:
            command += ["--gpu-mem", a.gpu_mem]
        done = subprocess.run(command, capture_output=True, text=True)
        (self.out / "compile.txt").write_text(done.stdout + done.stderr)
        self.summary["timings"]["compile_seconds"] = round(time.monotonic() - began, 1)
        if done.returncode != 0:
            raise SystemExit(f"compile failed ({done.returncode}):\n{done.stderr[-2000:]}")
        self.log(f"compiled {plan} in {self.summary['timings']['compile_seconds']} s")
        print(done.stdout + done.stderr, flush=True)
        return plan

    def serve(self, plan: Path) -> tuple[subprocess.Popen, str]:
        a = self.args
        began = time.monotonic()
        command = [sys.executable, "-m", "liac.runtime.serve.cli", str(plan), "--random-weights", "0", "--port", "0",
                   "--model-name", "bench", "--log-level", "warning", "--max-waiting", str(a.max_waiting),
                   "--grace-seconds", "5"]
        if a.emulate:
            command += ["--emulate-gpu"]
        if a.static_batching:
            command += ["--static-batching"]
        log = open(self.out / "server.txt", "w")
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        port = None
        while port is None:
            line = process.stderr.readline()
            if not line:
                log.close()
                raise SystemExit("lia-serve exited before listening: see server.txt")
            log.write(line)
            log.flush()
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
            port = int(match.group(1)) if match else None

        def drain() -> None:
            for rest in process.stderr:
                log.write(rest)
                log.flush()
        threading.Thread(target=drain, daemon=True).start()
        self.summary["timings"]["server_start_seconds"] = round(time.monotonic() - began, 1)
        self.log(f"lia-serve listening on port {port} after {self.summary['timings']['server_start_seconds']} s")
        return process, f"http://127.0.0.1:{port}/v1"

    def load(self, url: str, vocab: int) -> None:
        a = self.args
        for kind, value in parse_phases(a.phases):
            name = f"{kind}-{value:g}"
            need = a.seconds + a.drain + 5
            if self.left() < need:
                self.summary["skipped"].append({"phase": name, "reason": f"{self.left():.0f} s left, needs {need:.0f}"})
                self.log(f"skipped {name}: {self.left():.0f} s left of the budget")
                continue
            argv = ["--url", url, "--model", "bench", f"--{kind}", f"{value:g}" if kind == "rate" else str(int(value)),
                    "--seconds", str(a.seconds), "--drain", str(a.drain), "--prompt-len", a.prompt_lens,
                    "--max-tokens", a.max_tokens, "--token-ids", str(vocab), "--seed", "0"]
            load = Load(load_parser().parse_args(argv))
            import asyncio
            summary = asyncio.run(load.run())
            (self.out / f"load-{name}.json").write_text(json.dumps(
                {"summary": summary, "requests": [r.__dict__ for r in load.records]}, indent=1))
            line = summary_line(summary)
            with open(self.out / "load.txt", "a") as f:
                f.write(line + "\n")
            self.summary["phases"].append(summary)
            self.save()
            self.log(line)

    def main(self) -> int:
        a = self.args
        plan = self.compile()
        self.save()
        from liac.plan import load_plan

        vocab = load_plan(plan).model_config.vocab_size
        process, url = self.serve(plan)
        try:
            warm = Load(load_parser().parse_args(["--url", url, "--model", "bench", "--clients", "1", "--seconds",
                                                  "0.01", "--drain", "600", "--max-tokens", "2", "--token-ids",
                                                  str(vocab)]))
            import asyncio
            asyncio.run(warm.run())  # the first request: kernels, allocator, each placement's executor
            self.log("warm-up request done")
            self.load(url, vocab)
            (self.out / "metrics.txt").write_text(urllib.request.urlopen(url.removesuffix("/v1") + "/metrics",
                                                                         timeout=30).read().decode())
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                self.summary["server_exit"] = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                self.summary["server_exit"] = "killed after 60 s"
            self.summary["timings"]["total_seconds"] = round(time.monotonic() - self.began, 1)
            self.save()
        self.log(f"done in {self.summary['timings']['total_seconds']} s; server exit {self.summary['server_exit']}")
        for phase in self.summary["phases"]:
            print(summary_line(phase))
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "serve-out"), help="output folder (default $OUT)")
    parser.add_argument("--emulate", action="store_true",
                        help="smoke test here: a tiny model, the GPU emulated on the CPU, short phases")
    parser.add_argument("--plan", default=str(HERE / "serve" / "opt-30b.h200-amx16.serve.yaml"),
                        help="the serving plan to run (default: the committed OPT-30B, 24 GiB one)")
    parser.add_argument("--compile", action="store_true",
                        help="compile the serving plan here instead (--model, --hw, --gpu-mem, --max-batch, ...)")
    parser.add_argument("--model", default="opt-30b")
    parser.add_argument("--hw", default="h200-amx16")
    parser.add_argument("--gpu-mem", default="24GiB")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=256, help="the plan's prompt_len (longest prompt)")
    parser.add_argument("--gen-len", type=int, default=64, help="the plan's gen_len")
    parser.add_argument("--prompt-lens", default="32:256", help="the clients' prompt lengths (token ids)")
    parser.add_argument("--max-tokens", default="8:48", help="the clients' max_tokens")
    parser.add_argument("--phases", default="clients:1,clients:8,clients:32,rate:1")
    parser.add_argument("--seconds", type=float, default=45.0, help="each phase sends for this long")
    parser.add_argument("--drain", type=float, default=45.0, help="then drains for this long at most")
    parser.add_argument("--max-waiting", type=int, default=256)
    parser.add_argument("--static-batching", action="store_true",
                        help="serve with lia-serve --static-batching (the baseline; run the command twice, into two "
                             "output folders, to compare)")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds the whole run may take; phases that would pass it are skipped")
    args = parser.parse_args(argv)
    if args.emulate:
        args.compile, args.model, args.hw, args.gpu_mem, args.max_batch = True, "opt-125m", "spr-h100", None, 4
        args.prompt_len, args.gen_len, args.prompt_lens, args.max_tokens = 32, 16, "4:32", "2:16"
        args.seconds, args.drain, args.phases = min(args.seconds, 6.0), min(args.drain, 30.0), "clients:1,clients:4,rate:2"
    return Run(args).main()


if __name__ == "__main__":
    sys.exit(main())
