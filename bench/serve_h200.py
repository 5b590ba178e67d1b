"""lia-serve under load on the H200 machine: OPT-30B-shaped random weights, a 24 GiB GPU budget, several server
configurations one after another (each a fresh lia-serve), the same load phases against each, in ONE command.

    # on the GPU machine, from a checkout, ONE command (≤ 8.5 min; the 'serve' wheels carried in .whl/):
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \\
      export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-index --no-build-isolation --no-deps -e . && \\
      PYTHONUNBUFFERED=1 python3 bench/serve_h200.py --out $OUT --configs serving,static \\
      --phases rate:0.25,rate:0.5,rate:1 --seconds 30 --drain 22 --budget 475   # then --configs plain:8,plain:32
    # here, as a smoke test of the orchestration (a tiny model, the GPU emulated on the CPU):
    python bench/serve_h200.py --out /tmp/serve --emulate --configs serving,static,plain:4

Configurations (`--configs`, comma-separated, run in that order; default `serving`):
  serving   the committed serving plan bench/serve/opt-30b.h200-measured.serve.yaml (one memory placement, a compute
            placement per live batch size; compiled with `liac compile --model opt-30b --hw h200-measured --gpu-mem
            24GiB --serve --batch 1,2,4,8,16,32 --prompt-len 256 --gen-len 64`), continuous batching
  static    the same plan, `lia-serve --static-batching` (admit only into an empty batch, which runs to its end)
  plain:B   the plain-sweep plan for batch B (`liac compile ... --batch B`, same model, profile, budget and lengths:
            bench/serve/opt-30b.h200-measured.plain-bB.yaml, or `*plain-bB.yaml` in --plain-plan-dir), continuous
            batching: its one memory and compute placement, batch B's own optimum, at every live batch size; at most
            B sequences live (the plan's batch is the KV cache's rows), the rest queue
With --compile (implied by --emulate) every plan is compiled here instead, into $OUT/plans/ (compile.txt).

Per configuration: start `lia-serve PLAN --random-weights 0 --port 0` (its stderr appended to server.txt), one
warm-up request, then each of `--phases` (bench/serve_load.py: `clients:N` closed-loop clients or `rate:R` Poisson
arrivals, prompts of --prompt-lens token ids and max_tokens in --max-tokens, sending for --seconds and draining
for --drain at most), /metrics scraped around each phase (the mean live decode batch and the mean measured prefill
and decode pass of the phase) and appended to metrics.txt at the end, then SIGTERM.

**Budget.** `--budget` seconds cover every configuration: each gets an equal share of what is left when it starts
(what one leaves unused passes to the next); a configuration is skipped when its share cannot hold
`--server-seconds` (start, warm-up, stop) and one phase, a phase when the rest of the share, less 10 s to stop the
server, cannot hold --seconds + --drain + 5; skipped ones are listed in summary.json. A configuration whose server fails is recorded as failed and
the next one runs (exit status 1).

Written under --out (few files: the device returns at most 8): summary.json (per configuration: its plan, sha256,
rows, the plan's predicted step times, server start seconds, exit status, and per phase bench/serve_load.py's
summary — requests done, errors, unfinished ('cut'), output tokens/s, TTFT/ITL/end-to-end p50/p99, ITL without /
beside a newcomer's prefill — with the mean live batch and pass times from /metrics), requests.jsonl.gz (every
request's record, tagged with its configuration and phase), load.txt (one line per phase), server.txt, metrics.txt.
The last lines printed are a table: configuration × phase → tokens/s, TTFT, ITL and end-to-end p50/p99, done/errors.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_load import Load, build_parser as load_parser, summary_line  # noqa: E402

BENCH_SERVE = HERE / "serve"  # the committed plans
STOP_SECONDS = 10.0  # kept back from a configuration's share for SIGTERM and the server's exit


def parse_phases(text: str) -> list[tuple[str, float]]:
    phases = []
    for item in text.split(","):
        kind, _, value = item.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = 0.0
        if kind not in ("clients", "rate") or not number > 0 or (kind == "clients" and number != int(number)):
            raise SystemExit(f"--phases: items look like 'clients:8' or 'rate:0.5', got {item!r}")
        phases.append((kind, number))
    return phases


def parse_configs(text: str) -> list[str]:
    configs = []
    for item in text.split(","):
        item = item.strip()
        if not re.fullmatch(r"serving|static|plain:[1-9][0-9]*", item):
            raise SystemExit(f"--configs: items are 'serving', 'static' or 'plain:B' (B a batch size), got {item!r}")
        if item in configs:
            raise SystemExit(f"--configs: {item!r} is listed twice")
        configs.append(item)
    return configs


def config_name(config: str) -> str:
    """A file-name-safe name: 'plain:8' → 'plain-b8'."""
    return config.replace("plain:", "plain-b")


def scrape(base: str) -> dict[str, float]:
    """The server's /metrics as {series: value}: 'liac_decode_batch_size_sum', 'liac_step_seconds_count{phase="decode"}'
    and so on (Prometheus' text format, read here so the client needs no prometheus_client)."""
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    series = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                series[name] = float(value)
            except ValueError:
                pass
    return series


def _mean(before: dict, after: dict, name: str, labels: str = "") -> float | None:
    count = after.get(f"{name}_count{labels}", 0.0) - before.get(f"{name}_count{labels}", 0.0)
    total = after.get(f"{name}_sum{labels}", 0.0) - before.get(f"{name}_sum{labels}", 0.0)
    return round(total / count, 4) if count > 0 else None


def served(before: dict, after: dict) -> dict:
    """What /metrics says of one phase: its decode steps, their mean live batch, the mean measured passes."""
    return {"decode_steps": int(after.get("liac_decode_batch_size_count", 0.0)
                                - before.get("liac_decode_batch_size_count", 0.0)),
            "mean_decode_batch": _mean(before, after, "liac_decode_batch_size"),
            "mean_decode_pass_seconds": _mean(before, after, "liac_step_seconds", '{phase="decode"}'),
            "mean_prefill_pass_seconds": _mean(before, after, "liac_step_seconds", '{phase="prefill"}')}


def predicted(plan) -> list[dict]:
    """The plan's predicted passes per live batch size it has a placement for (a serving plan's status.serving;
    a plain plan's status.predicted at its one batch)."""
    rows = plan.status.serving.batches
    if rows:
        return [{"batch": r.batch_size, "prefill_seconds": r.prefill_seconds,
                 "decode_seconds_per_token": r.decode_seconds_per_token, "step_seconds": r.step_seconds,
                 "own_step_seconds": r.own_step_seconds} for r in rows]
    p = plan.status.predicted
    return [{"batch": plan.spec.workload.batch_size, "prefill_seconds": p.prefill_seconds,
             "decode_seconds_per_token": p.decode_seconds_per_token}]


class Run:
    def __init__(self, args):
        self.args = args
        self.configs = parse_configs(args.configs)
        self.phases = parse_phases(args.phases)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        for name in ("server.txt", "metrics.txt", "load.txt", "requests.jsonl.gz", "compile.txt"):
            (self.out / name).unlink(missing_ok=True)  # this run's, appended to per configuration
        self.began = time.monotonic()
        self.summary: dict = {"args": vars(args), "configs": [], "timings": {}}
        self.failed = False
        self.compiled: dict[int | None, Path] = {}  # --compile: batch (None: the serving plan) → plan file

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.began)

    def log(self, line: str) -> None:
        print(f"[{time.monotonic() - self.began:6.1f}s] {line}", flush=True)

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))

    # --------------------------------------------------------------------------------------------------------------
    def plan_for(self, config: str) -> Path:
        """The plan file a configuration serves: committed, or compiled here with --compile."""
        a = self.args
        batch = int(config.split(":")[1]) if config.startswith("plain:") else None
        if a.compile:
            return self.compile(batch)
        if batch is None:
            return Path(a.plan)
        found = sorted(Path(a.plain_plan_dir).glob(f"*plain-b{batch}.yaml"))
        if len(found) != 1:
            raise RuntimeError(f"{config}: expected one '*plain-b{batch}.yaml' in {a.plain_plan_dir}, found "
                               f"{len(found)}: compile it with `liac compile --model {a.model} --hw {a.hw} --gpu-mem "
                               f"{a.gpu_mem} --batch {batch} --prompt-len {a.prompt_len} --gen-len {a.gen_len}`")
        return found[0]

    def compile(self, batch: int | None) -> Path:
        """`liac compile` here: the serving plan (batch None: batches 1..--max-batch) or the plain plan of one batch."""
        a = self.args
        folder = self.out / "plans"
        folder.mkdir(exist_ok=True)
        if batch is None:
            plan = folder / "serve.yaml"
            batches = ",".join(str(1 << i) for i in range(a.max_batch.bit_length()) if 1 << i <= a.max_batch)
            extra = ["--serve", "--batch", batches]
        else:
            plan = folder / f"plain-b{batch}.yaml"
            extra = ["--batch", str(batch)]
        if batch in self.compiled:
            return plan  # 'serving' and 'static' share one
        began = time.monotonic()
        command = [sys.executable, "-m", "liac.cli", "compile", "--model", a.model, "--hw", a.hw, *extra,
                   "--prompt-len", str(a.prompt_len), "--gen-len", str(a.gen_len), "-o", str(plan)]
        if a.gpu_mem:
            command += ["--gpu-mem", a.gpu_mem]
        done = subprocess.run(command, capture_output=True, text=True)
        with open(self.out / "compile.txt", "a") as f:
            f.write(f"$ {' '.join(command[1:])}\n{done.stdout}{done.stderr}\n")
        seconds = round(time.monotonic() - began, 1)
        self.summary["timings"][f"compile_{plan.stem}_seconds"] = seconds
        if done.returncode != 0:
            raise RuntimeError(f"compile failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        self.log(f"compiled {plan} in {seconds} s")
        self.compiled[batch] = plan
        return plan

    def server_command(self, config: str, plan: Path) -> list[str]:
        a = self.args
        command = [sys.executable, "-m", "liac.runtime.serve.cli", str(plan), "--random-weights", "0", "--port", "0",
                   "--model-name", "bench", "--log-level", "warning", "--max-waiting", str(a.max_waiting),
                   "--grace-seconds", "5"]
        if a.emulate:
            command += ["--emulate-gpu"]
        if config == "static":
            command += ["--static-batching"]
        return command

    def serve(self, config: str, plan: Path) -> tuple[subprocess.Popen, str, float]:
        began = time.monotonic()
        command = self.server_command(config, plan)
        log = open(self.out / "server.txt", "a")
        log.write(f"===== {config}: {' '.join(command[1:])}\n")
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        port = None
        while port is None:
            line = process.stderr.readline()
            if not line:
                log.close()
                process.wait()
                raise RuntimeError(f"lia-serve exited ({process.returncode}) before listening: see server.txt")
            log.write(line)
            log.flush()
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
            port = int(match.group(1)) if match else None

        def drain() -> None:
            for rest in process.stderr:
                log.write(rest)
                log.flush()
            log.close()
        threading.Thread(target=drain, daemon=True).start()
        seconds = round(time.monotonic() - began, 1)
        self.log(f"{config}: lia-serve listening on port {port} after {seconds} s")
        return process, f"http://127.0.0.1:{port}/v1", seconds

    def phase(self, record: dict, url: str, vocab: int, kind: str, value: float) -> None:
        a = self.args
        name = f"{kind}-{value:g}"
        argv = ["--url", url, "--model", "bench", f"--{kind}", f"{value:g}" if kind == "rate" else str(int(value)),
                "--seconds", str(a.seconds), "--drain", str(a.drain), "--prompt-len", a.prompt_lens,
                "--max-tokens", a.max_tokens, "--token-ids", str(vocab), "--seed", "0"]
        load = Load(load_parser().parse_args(argv))
        base = url.removesuffix("/v1")
        before = scrape(base)
        summary = asyncio.run(load.run())
        summary.update(phase=name, unfinished=summary["errors"].get("cut", 0), served=served(before, scrape(base)))
        with gzip.open(self.out / "requests.jsonl.gz", "at") as f:
            for r in load.records:
                f.write(json.dumps({"config": record["config"], "phase": name, **asdict(r)}) + "\n")
        line = f"{record['config']:>10} " + summary_line(summary)
        with open(self.out / "load.txt", "a") as f:
            f.write(line + "\n")
        record["phases"].append(summary)
        self.save()
        self.log(line)

    def config(self, config: str, index: int) -> None:
        a = self.args
        began = time.monotonic()
        share = self.left() / (len(self.configs) - index)
        deadline = began + share
        need = a.seconds + a.drain + 5
        record = {"config": config, "phases": [], "skipped": []}
        self.summary["configs"].append(record)
        if share < a.server_seconds + need:
            record["skipped"] = [{"phase": f"{k}-{v:g}", "reason": f"the configuration's share of the budget is "
                                  f"{share:.0f} s, it needs {a.server_seconds + need:.0f} s"} for k, v in self.phases]
            self.log(f"{config}: skipped, {share:.0f} s of the budget for it")
            self.save()
            return
        from liac.plan import load_plan

        plan_path = self.plan_for(config)
        plan = load_plan(plan_path)
        record.update(plan=str(plan_path), plan_name=plan.metadata.name,
                      plan_sha256=hashlib.sha256(plan_path.read_bytes()).hexdigest(),
                      rows=plan.spec.workload.batch_size,
                      continuous=config != "static", predicted=predicted(plan))
        self.save()
        process, url, record["server_start_seconds"] = self.serve(config, plan_path)
        base = url.removesuffix("/v1")
        try:
            health = json.loads(urllib.request.urlopen(base + "/health", timeout=30).read())
            record["server_rows"] = health.get("rows")  # the most sequences live at once: the plan's batch
            warm = Load(load_parser().parse_args(["--url", url, "--model", "bench", "--clients", "1", "--seconds",
                                                  "0.01", "--drain", "600", "--max-tokens", "2", "--token-ids",
                                                  str(plan.model_config.vocab_size)]))
            asyncio.run(warm.run())  # the first request: kernels, allocator, each placement's executor
            self.log(f"{config}: warm-up request done")
            for kind, value in self.phases:
                rest = deadline - time.monotonic() - STOP_SECONDS
                if rest < need:
                    reason = f"{rest:.0f} s left of the configuration's share of the budget, needs {need:.0f}"
                    record["skipped"].append({"phase": f"{kind}-{value:g}", "reason": reason})
                    self.log(f"{config}: skipped {kind}-{value:g}: {rest:.0f} s left of its share")
                    continue
                self.phase(record, url, plan.model_config.vocab_size, kind, value)
            metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
            with open(self.out / "metrics.txt", "a") as f:
                f.write(f"# ===== {config}\n{metrics}")
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                record["server_exit"] = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                record["server_exit"] = "killed after 60 s"
            record["seconds"] = round(time.monotonic() - began, 1)
            self.save()
        self.log(f"{config}: done in {record['seconds']} s; server exit {record['server_exit']}")

    def main(self) -> int:
        self.save()
        for index, config in enumerate(self.configs):
            try:
                self.config(config, index)
            except Exception as e:  # noqa: BLE001 - one configuration's failure: record it, run the next
                self.failed = True
                self.summary["configs"][-1]["error"] = f"{type(e).__name__}: {e}"
                self.log(f"{config}: FAILED: {e}")
        self.summary["timings"]["total_seconds"] = round(time.monotonic() - self.began, 1)
        self.save()
        self.log(f"done in {self.summary['timings']['total_seconds']} s")
        print(table(self.summary))
        return 1 if self.failed else 0


def table(summary: dict) -> str:
    """Configuration × phase, as a Markdown table (milliseconds)."""
    def ms(block: dict, key: str) -> str:
        value = (block or {}).get(key)
        return "-" if value is None else f"{value * 1000:.0f}"
    lines = ["| config | phase | done / errors (cut) | tokens/s | TTFT p50 / p99 | ITL p50 / p99 | "
             "ITL p50 w/o / beside prefill | e2e p50 / p99 | mean batch |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in summary["configs"]:
        for p in c["phases"]:
            errors = sum(p["errors"].values())
            batch = p["served"]["mean_decode_batch"]
            lines.append(
                f"| {c['config']} | {p['phase']} | {p['completed']} / {errors} ({p['unfinished']}) | "
                f"{p['output_tokens_per_second']:.1f} | "
                f"{ms(p['ttft_seconds'], 'p50')} / {ms(p['ttft_seconds'], 'p99')} | "
                f"{ms(p['itl_seconds'], 'p50')} / {ms(p['itl_seconds'], 'p99')} | "
                f"{ms(p['itl_without_prefill_seconds'], 'p50')} / {ms(p['itl_beside_prefill_seconds'], 'p50')} | "
                f"{ms(p['e2e_seconds'], 'p50')} / {ms(p['e2e_seconds'], 'p99')} | "
                f"{'-' if batch is None else f'{batch:.1f}'} |")
        for s in c["skipped"]:
            lines.append(f"| {c['config']} | {s['phase']} | skipped: {s['reason']} | | | | | | |")
        if c.get("error"):
            lines.append(f"| {c['config']} | - | FAILED: {c['error'][:120]} | | | | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "serve-out"), help="output folder (default $OUT)")
    parser.add_argument("--emulate", action="store_true",
                        help="smoke test here: a tiny model, the GPU emulated on the CPU, short phases")
    parser.add_argument("--configs", default="serving",
                        help="comma-separated server configurations, run in order: serving, static, plain:B "
                             "(default serving)")
    parser.add_argument("--plan", default=str(BENCH_SERVE / "opt-30b.h200-measured.serve.yaml"),
                        help="the serving plan of 'serving' and 'static' (default: the committed OPT-30B, 24 GiB one)")
    parser.add_argument("--plain-plan-dir", default=str(BENCH_SERVE),
                        help="where 'plain:B' finds its plan, '*plain-bB.yaml' (default bench/serve)")
    parser.add_argument("--compile", action="store_true",
                        help="compile every configuration's plan here instead (--model, --hw, --gpu-mem, "
                             "--max-batch, ...)")
    parser.add_argument("--model", default="opt-30b")
    parser.add_argument("--hw", default="h200-measured")
    parser.add_argument("--gpu-mem", default="24GiB")
    parser.add_argument("--max-batch", type=int, default=32, help="with --compile: the serving plan's largest batch")
    parser.add_argument("--prompt-len", type=int, default=256, help="the plans' prompt_len (longest prompt)")
    parser.add_argument("--gen-len", type=int, default=64, help="the plans' gen_len")
    parser.add_argument("--prompt-lens", default="32:256", help="the clients' prompt lengths (token ids)")
    parser.add_argument("--max-tokens", default="8:48", help="the clients' max_tokens")
    parser.add_argument("--phases", default="clients:1,clients:8,clients:32,rate:1")
    parser.add_argument("--seconds", type=float, default=45.0, help="each phase sends for this long")
    parser.add_argument("--drain", type=float, default=45.0, help="then drains for this long at most")
    parser.add_argument("--max-waiting", type=int, default=256)
    parser.add_argument("--static-batching", action="store_true", help="the same as --configs static")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds the whole run may take, over every configuration; what would pass it is skipped")
    parser.add_argument("--server-seconds", type=float, default=50.0,
                        help="seconds a configuration needs besides its phases: server start, warm-up, stop (default "
                             "50; OPT-30B starts in about 35-40 s on the H200)")
    args = parser.parse_args(argv)
    if args.static_batching:
        if args.configs not in ("serving", "static"):
            parser.error("--static-batching is --configs static; give one of them")
        args.configs = "static"
    if args.emulate:
        args.compile, args.model, args.hw, args.gpu_mem, args.max_batch = True, "opt-125m", "spr-h100", None, 4
        args.prompt_len, args.gen_len, args.prompt_lens, args.max_tokens = 32, 16, "4:32", "2:16"
        args.seconds, args.drain = min(args.seconds, 6.0), min(args.drain, 30.0)
        args.phases = "clients:1,clients:4,rate:2"
        args.server_seconds = min(args.server_seconds, 20.0)
    parse_configs(args.configs), parse_phases(args.phases)  # bad lists fail before anything runs
    return Run(args).main()


if __name__ == "__main__":
    sys.exit(main())
