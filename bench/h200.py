"""The H200 benchmark (issue 7): profile this host, compile for what was measured, run every contender, the peers
and the floor — all in the same run, since the CPU side of that machine varies 2-3x between machine starts.

    # on the GPU machine, from a checkout (liac installed editable; pulp and flexgen carried as wheels):
    python3 bench/h200.py --out $OUT --stages profile,compile,runs,floor --points 128:1,8,32,64
    python3 bench/h200.py --out $OUT --stages compile,runs,peers,floor --points 1024:1,8 \
        --profile bench/results/h200/profile.yaml            # a second call on the same (still warm) machine
    # here, as a smoke test of the orchestration (tiny model, the GPU emulated on the CPU, no peers):
    python bench/h200.py --out /tmp/h200 --emulate

Stages (each writes its files under --out as soon as it has them, so a call cut short keeps what finished):
  profile  `liac profile` → profile.yaml (full sizes: ≥ 1 GiB rotated weights)
  compile  `liac.api.compile_plans` with that profile (--compile-for-call: run-profile.yaml, that profile with
           the footprint and rates this call measured first), the GPU budget and every (prompt, batch) point, once per
           contender: optimal (liac, with splits), whole (liac without splits), lia-cpu, lia-partial, lia-gpu
           (each also as NAME+dN: compiled with prefetch depth N, N + 1 staging buffers, e.g. 'whole+d2'; and as
           NAME@copies: NAME's plans run again with every crossing to the GPU copied by the copy engine,
           Engine.from_plan(mapped_crossings=False), the A/B of the mapped crossings; and as NAME+nostart:
           compiled without Eq. 15b's start of a split's CPU part, split_cpu_start_seconds 0, its plans named
           for the profile with '-nostart', the A/B of the splits that term takes out); plus, with the contender 'shipped-profile', the plan for the shipped h200-amx16 profile at batch 1
           (issue 4's check) → plans/, plans.tar.gz
  rates    liac.probe.measure_rates (≈30 s): CPU GEMV, KV read, pinned H2D/D2H and CPU reads during H2D, plus the
           CPU prefill-attention curve, a split's synchronisation, a decode split's CPU start (Eq. 15b's w,
           liac.probe.split_cpu_start: ≤ 3 s) and the AMX GEMM curve on the model's decoder shapes
           (liac.probe.cpu_gemm_curve: ≤ 6 s), measured in this call → rates.json and run-profile.yaml (the
           profile with those fields replaced: cpu_amx_bf16_tflops, ...), which floor uses and, with
           --compile-for-call, compile. The split start stays in rates.json only: on the device the probe read
           0.11-0.14 ms where the same call's split parts fit 0.69 ms (docs/benchmarks.md (p)), so the profile's
           w (fit from runs, bench/reprice.py --split-start-from-runs) is the one plans are compiled with
  runs     bench/run_plans.py over the plans on ONE set of random weights, point by point in --points order (all
           contenders of a point in --contenders order, then the next point: put the points that matter most first;
           with --abba in order then in reverse, A B B A; with --warm-point after one untimed run of the point's
           first plan), each engine warmed up at
           its run's shapes and its first request timed; no run starts that would end past --deadline-s → runs.json
           (per run: prefill ms, decode ms/token, tokens/s, load and warm-up seconds, the GPU footprint against the
           plan's budget, per-sublayer measured vs predicted times; with --timeline-batches, a torch.profiler
           timeline of one decode step summarised by bench/timeline.py — main thread idle, copy and compute
           streams busy and overlapping — recorded after all the runs, the deadline keeping room for them)
  peers    bench/peers: Accelerate (pageable and pinned weights) and FlexGen's best --percent → peers.json
  rates-after  the rates stage's probe again, after the runs and peers → rates-after.json (same fields; run-profile.yaml
           keeps the first probe's) and summary.json's 'rates_probes': per field both probes, after / before, and
           the one the floor takes (per m for the curves; the shorter split start). The probe ran once at 124.5 GB/s shared DDR where every other call read 94-102,
           and that call's runs ran 20-40 % slower than priced (i12t): a second probe shows a rate that moved.
           The runs leave it --rates-after-s; with less than that left it is skipped, the reason recorded
  floor    bench/floor.py for every point with the measured profile → floor.json; where rates-after ran, per field
           the FASTER of the two probes (the higher GB/s or TFLOP/s, the shorter sync): a floor must stay a lower
           bound on step time, and the slower probe would raise it above what the faster machine state allows;
           where the footprint stage ran, the budget less the CUDA context and library workspaces it measured
           (floor.process_bytes: bytes no plan can give to weights; floor.json's reserved_bytes)
  footprint  the GPU footprint `liac profile` measures (runtime/footprint.py: CUDA context, library workspaces,
           the activation peak of small runs against Eq. 14's model) → summary.json's 'footprint', and its fields
           in run-profile.yaml
`summary.json` says which stages ran, when each started, the machine (boot id) and what was skipped and why.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from liac.sizes import GIB

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

CONTENDERS = ("optimal", "whole", "lia-cpu", "lia-partial", "lia-gpu")


COPIES = "@copies"  # a contender's plans run again with every crossing to the GPU copied by the copy engine
NOSTART = "+nostart"  # a contender compiled with split_cpu_start_seconds 0 (docs/cost-model.md Eq. 15b off)


def contender_parts(contender: str) -> tuple[str, int]:
    """'whole+d2' → ('whole', 2): a contender compiled with `prefetch_depth` 2 (three staging buffers); the plain
    name → prefetch depth 1 (the compiler's default). A trailing '@copies' is not part of it (`compiled_as`), nor
    is '+nostart' (`without_start`)."""
    base, _, depth = without_start(compiled_as(contender)).partition("+d")
    return base, int(depth) if depth.isdigit() and int(depth) >= 1 else 1


def without_start(contender: str) -> str:
    """'optimal+nostart' → 'optimal' (compiled with Eq. 15b's split_cpu_start_seconds at 0); others as they are."""
    return contender[:-len(NOSTART)] if contender.endswith(NOSTART) else contender


def compiled_as(contender: str) -> str:
    """'optimal@copies' → 'optimal': the contender whose plans it runs (with Engine.from_plan(mapped_crossings=
    False): the A/B of runtime/backend.py's mapped crossings, docs/benchmarks.md)."""
    return contender[:-len(COPIES)] if contender.endswith(COPIES) else contender


def known_contender(contender: str) -> bool:
    base, _, depth = without_start(compiled_as(contender)).partition("+d")
    return base in CONTENDERS and (depth == "" or (depth.isdigit() and int(depth) >= 1))
def decoder_gemv_shapes(model: str) -> tuple[tuple[int, int], ...]:
    """The decoder's weight GEMM matrices (rows, columns) of a zoo model, from its traced graph: the shapes the
    runtime's CPU GEMV reads, so that the rates stage's `cpu_ddr_read_gb_per_s` is that kernel's rate (on the H200
    the probe's one 1 GiB matrix of 74898-long rows read 49.5 GB/s where the runtime's qkv, out_proj and fc1 read
    56.1 in the same call, i12j: docs/cost-model.md, A8)."""
    from liac.models import resolve_model
    from liac.passes.trace import trace_model

    graph = trace_model(resolve_model(model))
    shapes = []
    for _, data in sorted(graph.nodes(data=True)):
        sub = data.get("sublayer")
        if sub is not None and sub.layer_class == "decoder" and sub.kind == "linear":
            shapes += [tuple(w.shape) for w in sub.weights if len(w.shape) == 2 and tuple(w.shape) not in shapes]
    return tuple(shapes)


STAGES = ("profile", "rates", "compile", "runs", "peers", "rates-after", "floor", "footprint")


def check_stage_order(stages: list[str]) -> None:
    """'rates-after' probes the rates after the runs and peers, and the floor reads it: it must come after 'runs'
    and 'peers' and before 'floor' where those are named in --stages."""
    if "rates-after" not in stages:
        return
    at = stages.index("rates-after")
    for name in ("runs", "peers"):
        if name in stages and stages.index(name) > at:
            raise SystemExit(f"--stages: 'rates-after' must come after '{name}'")
    if "floor" in stages and stages.index("floor") < at:
        raise SystemExit("--stages: 'rates-after' must come before 'floor'")


def floor_rates(before: dict, after: dict) -> tuple[dict, dict]:
    """The two rates probes of a call (rates.json, rates-after.json) → (the fields the floor prices with, per field
    {before, after, ratio: after / before, floor}). The floor is a lower bound on step time, so it takes the FASTER
    probe: the higher rate (GB/s, TFLOP/s; per `m` for the attention curve) and the shorter `*_seconds`. A field
    only one probe has is taken as it is."""
    chosen, record = {}, {}
    for field in sorted(set(before) | set(after)):
        if field not in before or field not in after:
            chosen[field] = before.get(field, after.get(field))
            continue
        a, b = before[field], after[field]
        if isinstance(a, list):  # the attention curve: [{m, tflops}, ...], per m
            by_m = {p["m"]: p["tflops"] for p in b}
            chosen[field] = [{"m": p["m"], "tflops": max(p["tflops"], by_m.get(p["m"], 0.0))} for p in a]
            record[field] = [{"m": p["m"], "before": p["tflops"], "after": by_m[p["m"]],
                              "ratio": round(by_m[p["m"]] / p["tflops"], 3) if p["tflops"] else None,
                              "floor": max(p["tflops"], by_m[p["m"]])} for p in a if p["m"] in by_m]
            continue
        chosen[field] = min(a, b) if field.endswith("_seconds") else max(a, b)
        record[field] = {"before": a, "after": b, "ratio": round(b / a, 3) if a else None, "floor": chosen[field]}
    return chosen, record


def parse_points(text: str) -> list[tuple[int, int]]:
    """'128:1,8,32;1024:1,8' → [(128, 1), (128, 8), (128, 32), (1024, 1), (1024, 8)] as (prompt, batch)."""
    points = []
    for group in text.split(";"):
        prompt, _, batches = group.partition(":")
        for batch in batches.split(","):
            points.append((int(prompt), int(batch)))
    if not points or any(p < 1 or b < 1 for p, b in points):
        raise SystemExit(f"--points: must look like '128:1,8,32;1024:1,8', got {text!r}")
    return points


class Bench:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.began = time.monotonic()
        self.summary = {"argv": sys.argv[1:], "boot_id": _boot_id(), "stages": {}, "skipped": []}
        self.profile_path = Path(args.profile) if args.profile else self.out / "profile.yaml"
        self.plans_dir = Path(args.plans_dir)
        previous = self.out / "summary.json"  # plans compiled by an earlier call (or here), which 'runs' reads
        if previous.exists() and "plans" in json.loads(previous.read_text()):
            self.summary["plans"] = json.loads(previous.read_text())["plans"]

    def left(self) -> float:
        return self.args.deadline_s - (time.monotonic() - self.began)

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.began:6.1f}s] {text}", flush=True)

    def save(self) -> None:
        from liac.fileio import write_atomic

        write_atomic(self.out / "summary.json", json.dumps(self.summary, indent=1, sort_keys=True) + "\n")

    def stage(self, name: str, fn) -> None:
        self.summary["stages"][name] = {"started_s": round(time.monotonic() - self.began, 1)}
        self.log(f"== {name}")
        try:
            fn()
            self.summary["stages"][name]["status"] = "done"
        except Exception as e:  # one stage failing must not lose the others
            import traceback

            traceback.print_exc()
            self.summary["stages"][name]["status"] = f"error: {type(e).__name__}: {e}"[:500]
        self.summary["stages"][name]["seconds"] = round(time.monotonic() - self.began
                                                        - self.summary["stages"][name]["started_s"], 1)
        self.save()

    # -- stages ----------------------------------------------------------------------------------------------
    def profile(self) -> None:
        command = [sys.executable, "-m", "liac.cli", "profile", "-o", str(self.profile_path), "--name", "h200-measured"]
        if self.args.emulate:
            command += ["--quick", "--no-gpu"]
        subprocess.run(command, check=True, timeout=max(60.0, self.left() - 60))
        self.summary["profile"] = str(self.profile_path)

    def compile_profile(self) -> Path:
        """The profile the plans are compiled for: --profile (or the profile stage's), or with --compile-for-call
        run-profile.yaml, that profile with what this call measured before compiling (the footprint and rates
        stages): `liac profile` → `liac compile` on the host that runs the plans."""
        run_profile = self.out / "run-profile.yaml"
        if self.args.compile_for_call and run_profile.exists():
            return run_profile
        if self.args.compile_for_call:
            self.log("--compile-for-call: no run-profile.yaml yet (run footprint and rates first): compiling for "
                     f"{self.profile_path}")
        return self.profile_path

    def compile(self) -> None:
        from liac.api import compile_plans, write_plans

        model, budget = self.args.model, int(self.args.gpu_budget_gib * GIB)
        profile = self.compile_profile()
        self.summary["compiled_for"] = str(profile)
        plans = []
        by_prompt: dict[int, list[int]] = {}
        for prompt, batch in self.args.points:
            by_prompt.setdefault(prompt, []).append(batch)
        for contender in dict.fromkeys(compiled_as(c) for c in self.args.contenders if known_contender(c)):
            base, depth = contender_parts(contender)
            hw = str(profile)
            if contender.endswith(NOSTART):  # Eq. 15b off; the plans named apart from the contender's own
                import dataclasses

                from liac.profile import resolve_profile

                loaded = resolve_profile(str(profile))
                hw = dataclasses.replace(loaded, name=f"{loaded.name}-nostart", split_cpu_start_seconds=0.0)
            for prompt, batches in by_prompt.items():
                began = time.monotonic()
                result = compile_plans(model, hw, batches=tuple(batches), prompt_len=prompt,
                                       gen_len=self.args.gen_len, gpu_mem=budget,
                                       policy=None if base == "optimal" else base, prefetch_depth=depth)
                folder = self.plans_dir / contender / f"p{prompt}"
                written = write_plans(result, folder)
                for point in result.points:
                    path = folder / _plan_file(written, point.plan)
                    plans.append({"contender": contender, "prompt_len": prompt,
                                  "batch": point.plan.spec.workload.batch_size, "plan": str(path)})
                for batch, reason in result.infeasible:
                    self.summary["skipped"].append({"stage": "compile", "contender": contender, "prompt_len": prompt,
                                                    "batch": batch, "reason": reason})
                self.log(f"compiled {contender} p{prompt} b{','.join(map(str, batches))} in "
                         f"{time.monotonic() - began:.1f} s")
        if "shipped-profile" in self.args.contenders and not self.args.emulate:  # issue 4: a plan compiled for the
            # *shipped* h200-amx16 profile, run by lia-run
            result = compile_plans(model, "h200-amx16", batches=(1,), prompt_len=128, gen_len=self.args.gen_len,
                                   gpu_mem=budget)
            path = write_plans(result, self.plans_dir / "shipped-h200-amx16.yaml")[0]
            plans.append({"contender": "shipped-profile", "prompt_len": 128, "batch": 1, "plan": str(path)})
        self.summary["plans"] = plans
        # The device returns few files: the plans travel back as one archive (their folder stays outside --out).
        with tarfile.open(self.out / "plans.tar.gz", "w:gz") as tar:
            tar.add(self.plans_dir, arcname="plans")

    def rates(self) -> None:
        fields = self._probe_rates("rates.json")
        # the split-start probe reads 4-6x below the runs' own fit (docs/benchmarks.md (p)): recorded, not priced
        priced = {k: v for k, v in fields.items() if k != "split_cpu_start_seconds"}
        self._update_run_profile(priced, "bench/h200.py rates stage, in the same call as the runs")

    def rates_after(self) -> None:
        """The rates probe again after the runs (and peers) → rates-after.json; run-profile.yaml keeps the first
        probe's fields (the ones the plans were compiled and priced for); summary.json records both."""
        if self.left() < self.args.rates_after_s:
            self.summary["skipped"].append({"stage": "rates-after", "reason": f"out of time: {self.left():.0f} s "
                                            f"left, the probe needs --rates-after-s {self.args.rates_after_s:g}"})
            return
        after = self._probe_rates("rates-after.json")
        before_path = self.out / "rates.json"
        if before_path.exists() and self.summary["stages"].get("rates", {}).get("status") == "done":
            _, record = floor_rates(json.loads(before_path.read_text()), after)
            self.summary["rates_probes"] = record
            moved = {f: r["ratio"] for f, r in record.items() if isinstance(r, dict)}
            self.log(f"rates after / before: {moved}")

    def _probe_rates(self, name: str) -> dict:
        import torch

        from liac.fileio import write_atomic
        from liac.models import resolve_model
        from liac.probe import (ATTENTION_QUERIES, ProbeSizes, attention_curve, cpu_gemm_curve, measure_rates,
                                split_cpu_start, split_sync_seconds)
        from liac.schema_tools import stable_float

        sizes = ProbeSizes.quick() if self.args.emulate else ProbeSizes(
            weight_bytes=GIB, rotate_bytes=3 * GIB, gemm_k=7168, copy_bytes=GIB, repeats=3,
            gemv_shapes=decoder_gemv_shapes(self.args.model))
        began = time.monotonic()
        gpu = False if self.args.emulate else None
        rates = measure_rates(sizes, use_gpu=gpu)
        rates = {k: round(v, 3) for k, v in rates.items()}
        cuda = torch.cuda.is_available() and not self.args.emulate
        rates["split_sync_seconds"] = split_sync_seconds(cuda)
        # Eq. 15b's w after a GPU wait on an idle host: a lower bound of the runs' (rates() records it, no plan is
        # priced with it); emulated: small slices after a host sleep (the number prices nothing real there)
        rates["split_cpu_start_seconds"] = split_cpu_start(cuda) if not self.args.emulate else split_cpu_start(
            False, hidden=256, features=(32, 64), waits=(0.001, 0.002), rotate_bytes=4 * 2**20, repeats=4)
        queries = ATTENTION_QUERIES[:2] if self.args.emulate else ATTENTION_QUERIES
        curve = [{"m": q, "tflops": round(t, 4)} for q, t in attention_curve(queries, 2 if self.args.emulate else 3)]
        # the AMX curve on the model's decoder shapes, this machine start's (prefill prices its CPU GEMMs by it)
        hidden = resolve_model(self.args.model).hidden_size
        amx = cpu_gemm_curve(hidden, rotate_bytes=4 * 2**20, repeats=2, max_seconds=1.0) if self.args.emulate \
            else cpu_gemm_curve(hidden, rotate_bytes=GIB, repeats=3, max_seconds=6.0)
        amx = [{"m": m, "tflops": stable_float(max(t, 1e-6), 4)} for m, t in amx]  # 4 significant digits
        self.log(f"{name} in {time.monotonic() - began:.0f} s: {rates}; CPU prefill attention {curve}; "
                 f"CPU GEMM {amx}")
        fields = {**rates, "cpu_attention_bf16_tflops": curve, "cpu_amx_bf16_tflops": amx}
        write_atomic(self.out / name, json.dumps(fields, indent=1, sort_keys=True) + "\n")
        if torch.cuda.is_available():  # the probes' weights were drawn on the GPU: give the runs their memory
            torch.cuda.empty_cache()
        return fields

    def _update_run_profile(self, fields: dict, source: str) -> None:
        update_run_profile(self.out / "run-profile.yaml", self.profile_path, fields, source)

    def runs(self) -> None:
        from run_plans import RunSpec, run_plans

        plans = self.summary.get("plans") or json.loads((self.out / "summary.json").read_text())["plans"]
        order = {c: i for i, c in enumerate(self.args.contenders)}  # a point's runs in the order --contenders gives
        by_point: dict[tuple[int, int], list[dict]] = {}
        for entry in plans:
            for contender in self.args.contenders:  # 'optimal@copies' runs the plans compiled as 'optimal'
                if compiled_as(contender) == entry["contender"]:
                    by_point.setdefault((entry["prompt_len"], entry["batch"]), []).append(
                        dict(entry, contender=contender))
        specs, index = [], []
        for point in self.args.points:  # the order of --points: what matters most first
            entries = sorted(by_point.pop(point, []), key=lambda e: (order.get(e["contender"], len(order)),
                                                                   e["contender"]))
            if getattr(self.args, "warm_point", False) and entries:  # one untimed run of the point first
                first = entries[0]
                copies = {"mapped_crossings": False} if first["contender"].endswith(COPIES) else {}
                specs.append(RunSpec(first["plan"], gen_len=self.args.measure_gen_len, **copies))
                index.append(dict(first, contender="warmup"))
            for entry in abba(entries) if getattr(self.args, "abba", False) else entries:
                # the spread across repeats: the liac plan at batch 1 runs `--repeats` times
                times = self.args.repeats if entry["contender"] == "optimal" and entry["batch"] == 1 else 1
                copies = {"mapped_crossings": False} if entry["contender"].endswith(COPIES) else {}
                for _ in range(times):
                    specs.append(RunSpec(entry["plan"], gen_len=self.args.measure_gen_len, **copies))
                    index.append(entry)
        # Each engine warms up at its run's shapes (Engine.warm_up), so without --warm-point no run is thrown away
        # to warm the process: the first timed request is what a user's first request costs. That first run of a
        # point decoded 7-32 % slower than the same plan's later runs in every call of 2026-12-03 (i12b1, i12tl,
        # i12ord), and A B B A charges it to A alone: --warm-point runs the point's first plan once, untimed
        # ('warmup' in runs_index; bench/report.py leaves it out), so that A B B A compares plans, not positions.
        self.summary["runs_index"] = index
        self.save()
        deadline = self.began + self.args.deadline_s - self.args.reserve_s
        if "rates-after" in getattr(self.args, "stage_names", ()):  # the second probe runs after them
            deadline -= self.args.rates_after_s
        run_plans(specs, seed=0, out=self.out / "runs.json", max_seconds=self.args.max_run_seconds,
                  profile_steps=self.args.profile_steps, emulate_gpu=True if self.args.emulate else None,
                  log=self.log, deadline=deadline, timeline_batches=self.args.timeline_batches)
        import gc

        import torch

        gc.collect()
        if torch.cuda.is_available():  # later stages (peers) start processes of their own on this GPU
            torch.cuda.empty_cache()

    def peers(self) -> None:
        results = []
        peer_dir = HERE / "peers"
        jobs = []
        for prompt, batch in self.args.peer_points:
            common = ["--model", self.args.model, "--batch", str(batch), "--prompt-len", str(prompt),
                      "--gpu-budget-gib", str(self.args.gpu_budget_gib)]
            if "flexgen" in self.args.peers:
                jobs.append(("flexgen", [str(peer_dir / "flexgen_opt.py"), *common, "--gen-len",
                                         str(self.args.measure_gen_len), "--search", "--search-budget-s",
                                         str(self.args.flexgen_search_s), "--max-candidates", "2"]))
            if "accelerate" in self.args.peers and batch == 1:  # pageable copies: ~6 GB/s, a few tokens suffice
                jobs.append(("accelerate", [str(peer_dir / "accelerate_opt.py"), *common, "--gen-len", "3"]))
            if "accelerate-pinned" in self.args.peers:
                jobs.append(("accelerate-pinned", [str(peer_dir / "accelerate_opt.py"), *common, "--pinned",
                                                   "--gen-len", "4"]))
        for name, command in jobs:
            # peers stop by --peers-until-s (seconds into the call), leaving the later stages their time
            until = min(self.args.deadline_s, self.args.peers_until_s or self.args.deadline_s)
            if "rates-after" in getattr(self.args, "stage_names", ()):  # the second probe runs after the peers
                until = min(until, self.args.deadline_s - self.args.rates_after_s)
            peer_left = until - (time.monotonic() - self.began)
            if peer_left < 60:
                self.summary["skipped"].append({"stage": "peers", "peer": name, "command": command[1:],
                                                "reason": "out of time"})
                continue
            json_out = self.out / f"peer-{len(results):02d}.json"
            began = time.monotonic()
            record = {"peer": name, "command": command}
            try:
                proc = subprocess.run([sys.executable, *command, "--json-out", str(json_out)], capture_output=True,
                                      text=True, timeout=min(self.args.peer_timeout_s, peer_left))
                record["returncode"] = proc.returncode
                record["stderr_tail"] = proc.stderr[-1500:]
                if json_out.exists():
                    record["result"] = json.loads(json_out.read_text())
                    json_out.unlink()
            except subprocess.TimeoutExpired:
                record["error"] = "timed out"
            record["wall_seconds"] = round(time.monotonic() - began, 1)
            results.append(record)
            self.log(f"peer {name} {command[2:8]}: {json.dumps(record.get('result', record.get('error')))[:300]}")
            from liac.fileio import write_atomic

            write_atomic(self.out / "peers.json", json.dumps(results, indent=1, sort_keys=True) + "\n")

    def floor(self) -> None:
        from floor import process_bytes, workload_floor

        from liac.models import resolve_model
        from liac.passes import trace_model
        from liac.profile import load_profile

        run_profile = self.out / "run-profile.yaml"  # the rates of this call, where the rates stage ran
        hw = load_profile(run_profile if run_profile.exists() else self.profile_path)
        hw = self._floor_profile(hw)
        graph = trace_model(resolve_model(self.args.model))
        reserved = process_bytes(self.summary.get("footprint"))  # measured in this call, else 0
        floors = []
        for prompt, batch in self.args.points:
            f = workload_floor(graph, hw, batch=batch, prompt_len=prompt, gen_len=self.args.gen_len,
                               gpu_budget_bytes=self.args.gpu_budget_gib * GIB, reserved_bytes=reserved)
            alone = workload_floor(graph, hw, batch=batch, prompt_len=prompt, gen_len=self.args.gen_len,
                                   gpu_budget_bytes=self.args.gpu_budget_gib * GIB, paired=False)
            floors.append({"prompt_len": prompt, "batch": batch, "profile": hw.name, "reserved_bytes": reserved,
                           **_plain(f), "paths_alone": {k: v for k, v in _plain(alone).items()
                                                        if k in ("decode_seconds_per_token", "prefill_seconds")}})
        from liac.fileio import write_atomic

        write_atomic(self.out / "floor.json", json.dumps(floors, indent=1, sort_keys=True) + "\n")


    def _floor_profile(self, hw):
        """Where rates-after ran in this call: `hw` with, per field, the faster of the two probes (floor_rates)."""
        if self.summary["stages"].get("rates-after", {}).get("status") != "done":
            return hw
        after_path, before_path = self.out / "rates-after.json", self.out / "rates.json"
        if not after_path.exists():  # skipped for time
            return hw
        before = json.loads(before_path.read_text()) \
            if self.summary["stages"].get("rates", {}).get("status") == "done" and before_path.exists() else {}
        chosen, _ = floor_rates(before, json.loads(after_path.read_text()))
        from liac.profile import parse_profile
        from liac.schema_tools import to_data

        data = to_data(hw)
        fields = {k: v for k, v in chosen.items() if k in data}
        data.update(fields)
        data["sources"] = {**data["sources"], **{k: "bench/h200.py: the faster of the rates and rates-after probes"
                                                 for k in fields}}
        self.summary["floor_rates"] = {k: fields[k] for k in sorted(fields)}
        return parse_profile(data, "rates-after")

    def footprint(self) -> None:
        import torch

        if self.args.emulate or not torch.cuda.is_available():
            self.summary["skipped"].append({"stage": "footprint", "reason": "no CUDA device"})
            return
        record = measure_call_footprint(self.profile_path)
        self.log(f"footprint: {record['profile_fields']}")
        self.summary["footprint"] = record  # in summary.json: a call returns at most 8 files
        self._update_run_profile(record["profile_fields"], "bench/h200.py footprint stage (runtime/footprint.py)")


def measure_call_footprint(base_profile, models=None, measure=None) -> dict:
    """The footprint stage of a benchmark call (bench/h200.py, bench/moe_h200.py): run liac.host's footprint probes
    (plans of small models; `models` replaces its FOOTPRINT_MODELS) through the runtime on this GPU
    (runtime/footprint.py `measure_footprint`, or `measure`) → {library_bytes, context_bytes, runs: [...],
    profile_fields: the Eq. 14 fields of `base_profile` (a path or a HardwareProfile) with what was measured}."""
    from liac.host import FOOTPRINT_MODELS, footprint_probes, op_probes, with_footprint
    from liac.profile import HardwareProfile, resolve_profile

    if measure is None:
        from liac.runtime.footprint import measure_footprint as measure
    base = base_profile if isinstance(base_profile, HardwareProfile) else resolve_profile(str(base_profile))
    models = FOOTPRINT_MODELS if models is None else models
    # op_probes: Eq. 24's runs that cross PCIe in every layer (dense models: LIA's policies have no experts)
    probes = footprint_probes(base, models) + op_probes(base, tuple(m for m in models if not m.num_experts))
    measured = measure([(p.plan, p.batch, p.prompt_len) for p in probes])
    profile = with_footprint(base, probes, measured.library_bytes, measured.context_bytes, measured.activation_bytes,
                             getattr(measured, "decode_step_seconds", ()))
    return {"library_bytes": measured.library_bytes, "context_bytes": measured.context_bytes,
            "runs": [{"plan": p.plan.metadata.name, "batch": p.batch, "prompt_len": p.prompt_len,
                      "modelled_activation_bytes": p.activation_bytes, "measured_activation_bytes": m}
                     for p, m in zip(probes, measured.activation_bytes)],
            "decode_step_seconds": list(getattr(measured, "decode_step_seconds", ())),
            "profile_fields": {f: getattr(profile, f) for f in ("gpu_context_mib", "gpu_library_workspace_mib",
                                                                "gpu_activation_factor", "runtime_op_seconds")}}


def update_run_profile(path: Path, base: Path | str, fields: dict, source: str, name: str = "h200-run") -> None:
    """`path` (run-profile.yaml: a profile `--hw` takes) becomes the profile at `path` if it exists, else `base` (a
    profile file, or a shipped profile's name), with `fields` (what this call measured) replaced and their source
    recorded."""
    import yaml

    from liac.fileio import write_atomic
    from liac.profile import OPTIONAL_FIELDS

    path = Path(path)
    if path.exists():
        text = path.read_text()
    elif Path(base).exists():
        text = Path(base).read_text()
    else:
        from importlib import resources

        text = (resources.files("liac") / "profiles" / f"{base}.yaml").read_text()
    profile = yaml.safe_load(text)
    for field, value in fields.items():
        if field in profile or field in OPTIONAL_FIELDS:
            profile[field] = value
            profile.setdefault("sources", {})[field] = source
            if field in profile.get("estimates", []):
                profile["estimates"].remove(field)
    profile["name"] = name
    write_atomic(path, yaml.safe_dump(profile, sort_keys=True))


def _plan_file(written: list[Path], plan) -> str:
    for path in written:
        if path.stem == plan.metadata.name:
            return path.name
    return f"{plan.metadata.name}.yaml"


def _plain(record) -> dict:
    import dataclasses

    return dataclasses.asdict(record) if dataclasses.is_dataclass(record) else dict(record)


def abba(entries: list) -> list:
    """A point's runs in order, then in reverse (A B B A): each contender once first and once last, so that what
    the order costs (the first run of a point was the slower in 5 of 6 pairs of the 2026-12-02 Eq. 24 call, byte-
    identical plans included) is not read as a difference between plans."""
    return list(entries) + list(reversed(entries))


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for every result file")
    parser.add_argument("--stages", default="profile,compile,runs,floor")
    parser.add_argument("--model", default="opt-30b")
    parser.add_argument("--gpu-budget-gib", type=float, default=24.0)
    parser.add_argument("--points", type=parse_points, default=parse_points("128:1,8,32,64"),
                        help="(prompt, batch) points, e.g. '128:1,8,32,64;1024:1,8'")
    parser.add_argument("--peer-points", type=parse_points, default=parse_points("128:1,32"))
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--gen-len", type=int, default=32, help="new tokens the plans are compiled for")
    parser.add_argument("--measure-gen-len", type=int, default=8, help="new tokens each timed run generates")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the liac plan at batch 1 (the spread)")
    parser.add_argument("--warm-point", action="store_true",
                        help="before each point's runs, one untimed run of its first plan (the first run of a point "
                             "pays one-off costs of the process; 'warmup' in runs_index)")
    parser.add_argument("--abba", action="store_true",
                        help="run each point's contenders in order, then in reverse (A B B A): the order's effect apart")
    parser.add_argument("--profile-steps", type=int, default=1, help="decode steps of the per-sublayer profile")
    parser.add_argument("--max-run-seconds", type=float, default=40.0, help="skip runs predicted to take longer")
    parser.add_argument("--timeline-batches", default="", help="e.g. '8,32': runs at these batches also record a "
                        "timeline of one decode step (bench/timeline.py) into runs.json")
    parser.add_argument("--peers", default="flexgen,accelerate,accelerate-pinned")
    parser.add_argument("--flexgen-search-s", type=float, default=150.0)
    parser.add_argument("--peer-timeout-s", type=float, default=200.0, help="wall-clock cap of one peer run")
    parser.add_argument("--deadline-s", type=float, default=520.0, help="wall-clock budget of this call")
    parser.add_argument("--reserve-s", type=float, default=40.0,
                        help="seconds the runs leave for the stages after them (floor, footprint)")
    parser.add_argument("--rates-after-s", type=float, default=32.0,
                        help="seconds the runs leave for the rates-after stage (its probe: ~13 s on the H200 before "
                             "the split start and the AMX curve joined it, which add ≤ 3 and ≤ 7 s); with less left "
                             "it is skipped")
    parser.add_argument("--peers-until-s", type=float, default=None,
                        help="the peers stage ends by this many seconds into the call (default: the deadline)")
    parser.add_argument("--plans-dir", default=os.path.join(tempfile.gettempdir(), "liac-bench-plans"),
                        help="where the compiled plans go (outside --out; plans.tar.gz in --out holds them)")
    parser.add_argument("--profile", help="reuse this measured profile (a second call on the same machine)")
    parser.add_argument("--compile-for-call", action="store_true",
                        help="compile for run-profile.yaml: --profile with this call's footprint and rates (put "
                             "'footprint,rates' before 'compile' in --stages)")
    parser.add_argument("--emulate", action="store_true", help="smoke test here: opt-125m, GPU emulated, quick")
    args = parser.parse_args(argv)
    args.contenders = [c for c in args.contenders.split(",") if c]
    for contender in args.contenders:
        if not known_contender(contender) and contender != "shipped-profile":
            raise SystemExit(f"--contenders: unknown contender {contender!r} (one of {', '.join(CONTENDERS)}, "
                             "'shipped-profile', or one of the first with '+dN': compiled with prefetch depth N, "
                             "and/or '@copies': its plans run with every crossing copied by the copy engine, "
                             "and/or '+nostart': compiled without Eq. 15b's split start)")
    args.peers = [p for p in args.peers.split(",") if p]
    args.timeline_batches = tuple(int(b) for b in args.timeline_batches.split(",") if b)
    if args.emulate:
        args.model, args.gpu_budget_gib = "opt-125m", 1.0  # the CUDA context (0.75 GiB) counts in the budget
    bench = Bench(args)
    stages = [s for s in args.stages.split(",") if s]
    for name in stages:
        if name not in STAGES:
            raise SystemExit(f"--stages: unknown stage {name!r}")
    check_stage_order(stages)
    args.stage_names = tuple(stages)
    if "compile" not in stages and "runs" in stages and not (bench.out / "summary.json").exists():
        raise SystemExit("--stages: 'runs' needs 'compile' in this call or an earlier summary.json in --out")
    if args.profile and "profile" in stages:
        raise SystemExit("--profile reuses a profile: drop 'profile' from --stages")
    if args.profile and _boot_id() != "unknown":
        previous = Path(args.profile).with_name("summary.json")
        if previous.exists() and json.loads(previous.read_text()).get("boot_id") not in (None, _boot_id()):
            bench.log("this is another machine than the one the profile was measured on: measuring again")
            bench.profile_path = bench.out / "profile.yaml"
            stages.insert(0, "profile")
    for name in stages:
        bench.stage(name, getattr(bench, name.replace("-", "_")))
    bench.log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
