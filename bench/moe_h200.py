"""The MoE benchmark (issue 16): a Mixtral-8x7B-shaped model with the GPU capped; liac's placements beside HF
Accelerate's offload and the floor, all compiled for and measured on the machine of the call.

    # on the GPU machine, from the repo root, carrying .whl/ (the pulp wheel, as bench/device-call.sh): one call
    # (≤ 10 min; the whole model: two calls, below), liac installed into /tmp/site first (compile needs pulp)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
    python3 -m pip install -q --no-index --no-build-isolation --no-deps --target /tmp/site . && \
    PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site python3 bench/moe_h200.py --out $OUT
    # here, as a smoke test (a tiny Mixtral, the GPU emulated on the CPU, quick rates, Accelerate on the CPU):
    python bench/moe_h200.py --out /tmp/moe --emulate

What one call does, each stage writing under --out as soon as it has it (at most 8 files come back from a device
call: summary.json, rates.json, run-profile.yaml, plans.tar.gz, runs.json, peers.json, floor.json):
  1. footprint  the GPU footprint of this process (bench/h200.py `measure_call_footprint`, the stage `liac profile`
                and bench/h200.py run: CUDA context, library workspaces, the activation factor of small runs, here
                with a small Mixtral among the probes) → summary.json 'footprint' and its fields in run-profile.yaml
  2. rates      liac.probe.measure_rates (≈10 s): CPU GEMV (on one expert's own matrices, [2F, D] and [D, F]: the
                kernel the CPU experts run), KV read, pinned H2D/D2H, DDR shared; and liac.probe.expert_rates
                (≈5 s): one expert at one row back to back, after a 5 ms idle pause, woken after it, and woken beside
                another expert's pinned copy (cpu_expert_beside_copy_gb_per_s, Eq. 21c) → rates.json and
                run-profile.yaml: the shipped h200-amx16 profile with what stages 1 and 2 measured
  3. compile    per contender, one plan per batch (prompt --prompt-len, --gen-len new tokens) for the GPU budget,
                for run-profile.yaml: 'optimal' (liac's ILP: experts resident / on the CPU / streamed by count,
                splits allowed), 'experts-cpu' (KTransformers' and llama.cpp --n-cpu-moe's placement: the experts
                unit on the CPU, everything else on the GPU; whole layers may stay resident) and 'experts-streamed'
                (LIA's all-GPU policy: every expert on the GPU, the non-resident ones copied when routed) → plans.tar.gz
  4. kernels    the CPU expert path's kernel on this host (`expert_kernel_rates`): one SwiGLU expert of the model's
                shape (liac.models.mixtral.expert_ffn, as the runtime calls it) over rotated experts at 1-64 rows,
                F.linear and torch.mv, thread counts, pageable and page-locked (the runtime's arena is page-locked)
                → summary.json 'kernels'
  5. runs       bench/run_plans.py over ONE set of random bf16 weights (pinned host arena), batch 1 of every
                contender first: per run prefill ms, decode ms/token and the plan's prediction, peak GPU memory, and
                (--profile-steps) a synchronised per-op pass → runs.json; summary.json 'table' rows carry
                'decode_breakdown_ms' (per decode step, ms in attention, router, experts by CPU part, GPU part and
                routing, stream waits, LM head) and, at batch 1, 'batch1_experts_model_ms' (`batch1_experts_ms`)
  6. peers      bench/peers/accelerate_opt.py on the same model shape: Accelerate's device_map offload with pinned
                CPU weights at --peer-batches, then (time allowing) its default pageable weights at batch 1 →
                peers.json
  7. floor      bench/floor.py at the measured rates: the bytes that must move per step → floor.json; the budget
                less the CUDA context and workspaces the footprint stage measured (floor.process_bytes)
`--stages` picks stages (with 16 layers, without 'kernels' and with `--peers accelerate-pinned`: ~5.5 min);
`--cpu-threads N` sets torch's CPU threads for stages 2-5, `--threads-ab 15` runs the batch-1 optimum again at 15,
`--share-ab` each optimum again with its expert share following the CPU ('auto'; the default keeps the load-time
ratio), `--wake-ab` each optimum again waking the CPU's thread team before its experts ops (cpu_wake=True),
`--split-ab` each optimum again cutting a decode step's last CPU expert by features between the CPU and PCIe
(expert_split=True), `--launcher-ab` each optimum again launching its split experts ops' GPU part from a second
host thread while the CPU part runs (expert_launcher=True). Each A/B flag runs A B B A (the optimum, the variant twice, the optimum again as
'optimal@no-TAG'), so that a plan's faster later runs do not favour the side that runs second; the table prints each
side's two runs and means. On the device a warm-up run precedes the first run at each batch size ('warmup',
'warmup:bN'; the first run at a batch paid one-off costs of ~0.5 s in the 2026-12-02 calls).
Then summary.json (what ran, how long) and a table on stdout: measured vs predicted vs floor per (contender, batch),
and liac's batch-1 decode against Accelerate's.

The model is Mixtral-8x7B's shape (hidden 4096, 8 experts of 14336, top-2, GQA 32/8) with --layers decoder layers
(default 32: the whole model, 87 GiB of bf16) and the issue's GPU budget (--gpu-budget-gib 24). On the H200 machine
(2026-12-03, call moe-full) the page-locked arena of all 32 layers was generated in 11 s and the stages footprint,
rates, compile, runs and floor at batch 1, 8 and 32 took 217 s; pinned Accelerate at those three batches, in a call
of its own right after it on the same machine start, 201 s (each batch loads the model in a process of its own):

    PYTHONPATH=/tmp/site python3 bench/moe_h200.py --out $OUT/moe-full --stages footprint,rates,compile,runs,floor \
        --measure-gen-len 12 --max-run-seconds 45 --deadline-s 540 --reserve-s 8
    PYTHONPATH=/tmp/site python3 bench/moe_h200.py --out $OUT/moe-full-peers --stages peers \
        --peers accelerate-pinned --peer-batches 1,8,32 --peer-timeout-s 180 --deadline-s 560 --reserve-s 0

The calls of 2026-12-01 to 2026-12-03 (moe … moe-launch) ran half the model, `--layers 16 --gpu-budget-gib 12` (the
same fraction of the model fits the GPU as 24 GiB of the whole one), when generating the arena was thought to take
minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run_plans import RunSpec, _import_liac, run_plans  # noqa: E402

_import_liac()

from h200 import measure_call_footprint, update_run_profile  # noqa: E402

from liac.models.config import ModelConfig  # noqa: E402
from liac.sizes import GIB  # noqa: E402

# The contenders: a policy name for liac.api.compile_plans (None: the optimum). 'experts-cpu' is a fixed policy over
# the six decoder units (qkv, attn_score, attn_context, out_proj, router, experts; 1 = GPU), registered here only.
CONTENDERS = {"optimal": None, "experts-cpu": "experts-cpu", "experts-streamed": "lia-gpu"}
EXPERTS_CPU = ((1, 1, 1, 1, 1, 0),)
STAGES = ("footprint", "rates", "compile", "kernels", "runs", "peers", "floor")
BASE_PROFILE = "h200-amx16"
# A small Mixtral among the footprint probes: an MoE layer's activations (tokens gathered per expert, partial sums)
# are not a dense layer's, and the activation factor is the largest measured-over-modelled ratio of the probes.
MOE_PROBE = ModelConfig(name="probe-mixtral", family="mixtral", hidden_size=1024, num_layers=2, num_heads=16,
                        num_kv_heads=4, head_dim=64, ffn_dim=1408, vocab_size=4096, max_position=1024,
                        norm="rmsnorm", norm_eps=1e-5, activation="silu", qkv_bias=False, proj_bias=False,
                        tie_embeddings=False, rope_theta=1e6, num_experts=8, experts_top_k=2)
# Per decode step, where the time of the synchronised profiling pass goes (runtime/metrics.py 'sublayers' rows).
CATEGORIES = {"embed": "embed", "qkv": "attention", "attn": "attention", "attn_score": "attention",
              "attn_context": "attention", "out_proj": "attention", "router": "router", "experts": "experts",
              "lm_head": "lm_head", "wait": "stream_wait", "release": "stream_wait"}


def model_config(layers: int, emulate: bool):
    from liac.models.zoo import ZOO

    cfg = ZOO["mixtral-8x7b"]
    if emulate:  # tiny: 2 layers of 128 wide, 8 experts of 256, top-2
        return dataclasses.replace(cfg.with_layers(2), name="mixtral-tiny", hidden_size=128, ffn_dim=256,
                                   num_heads=4, num_kv_heads=2, head_dim=32, vocab_size=512)
    return cfg.with_layers(layers) if layers != cfg.num_layers else cfg


def expert_kernel_rates(cfg, rotate_bytes: int, rows=(1, 2, 4, 8, 16, 32, 64), repeats: int = 3,
                        backend=None) -> dict:
    """GB/s of expert weights one SwiGLU expert of `cfg`'s shape reads on the CPU (liac.models.mixtral.expert_ffn
    over ≥ `rotate_bytes` of rotated bf16 experts, so none is cached), by rows (tokens routed to the expert), with
    F.linear ('linear') and, at 1 row, the runtime's torch.mv kernel ('mv'); at 1 row also by thread count; with a
    `backend` that page-locks host memory (CudaBackend: pin, unpin) again from page-locked memory, as the runtime's
    host arena is."""
    import torch

    from liac.models.mixtral import expert_ffn
    from liac.runtime.kernels import CPU_LINEAR

    D, F = cfg.hidden_size, cfg.ffn_dim
    one = 3 * D * F * 2
    count = max(2, -(-rotate_bytes // one))
    gate_up = torch.empty(count, 2 * F, D, dtype=torch.bfloat16).normal_(0.0, 0.02)
    down = torch.empty(count, D, F, dtype=torch.bfloat16).normal_(0.0, 0.02)

    def rate(m: int, kernel: str = "linear") -> float:
        x = torch.randn(m, D, dtype=torch.bfloat16)
        best = float("inf")
        with torch.inference_mode():
            for round_ in range(repeats + 1):
                began = time.perf_counter()
                for e in range(count):
                    expert_ffn(gate_up[e], down[e], x, CPU_LINEAR[kernel])
                if round_:  # the first round: oneDNN's kernel choice, first touch
                    best = min(best, time.perf_counter() - began)
        return round(count * one / best / 1e9, 2)

    out = {"expert_bytes": one, "experts_rotated": count, "threads": torch.get_num_threads(),
           "linear_gb_per_s_by_rows": {str(m): rate(m) for m in rows}, "mv_gb_per_s_1_row": rate(1, "mv")}
    threads = torch.get_num_threads()
    by_threads = {}
    for t in sorted({max(1, threads // 2), max(1, threads - 1), threads}):
        torch.set_num_threads(t)
        try:
            by_threads[str(t)] = rate(1)
        finally:
            torch.set_num_threads(threads)
    out["linear_gb_per_s_1_row_by_threads"] = by_threads
    if backend is not None and backend.pin(gate_up):
        try:
            if backend.pin(down):
                try:
                    out["pinned_linear_gb_per_s_by_rows"] = {str(m): rate(m) for m in (1, 8)}
                finally:
                    backend.unpin(down)
        finally:
            backend.unpin(gate_up)
    return out


def batch1_experts_ms(layers: list[tuple[int, int, int]], num_experts: int, top_k: int, expert_bytes: int,
                      cpu_gb_per_s: float, cpu_beside_h2d_gb_per_s: float, h2d_gb_per_s: float,
                      share: bool = True) -> float:
    """The experts' ms of one batch-1 decode step, by exact expectation over the C(E, k) equally likely routings
    (uniform top-k) rather than the cost model's max of expected works: per layer, the slower of its CPU part (the
    routed CPU experts' bytes, read at `cpu_beside_h2d_gb_per_s` while PCIe streams, else at `cpu_gb_per_s`) and its
    PCIe part (the routed streamed experts' bytes at `h2d_gb_per_s`); resident experts cost nothing here.
    `layers`: (layer count, resident, CPU) per group; `share`: the runtime's share of the routed host experts at the
    ratio of these rates (liac.runtime.schedule.ExpertRun.assign), else each on its planned device."""
    from itertools import combinations

    from liac.runtime.schedule import ExpertRun

    total = 0.0
    routings = list(combinations(range(num_experts), top_k))
    for count, hbm, cpu in layers:
        run = ExpertRun(num_experts, hbm, cpu, ("gpu",))
        seconds = 0.0
        for routed in routings:
            counts = [1 if e in routed else 0 for e in range(num_experts)]
            # the runtime's share at the ratio of the rates (CPU seconds per expert over PCIe's), or as planned
            on_cpu, streamed = run.assign(counts, h2d_gb_per_s / cpu_gb_per_s if share else None)
            cpu_bytes, copy = len(on_cpu) * expert_bytes, len(streamed) * expert_bytes / (h2d_gb_per_s * 1e9)
            beside = copy * cpu_beside_h2d_gb_per_s * 1e9  # bytes the CPU reads while the copies run
            cpu_seconds = (cpu_bytes / (cpu_beside_h2d_gb_per_s * 1e9) if cpu_bytes <= beside
                           else copy + (cpu_bytes - beside) / (cpu_gb_per_s * 1e9))
            seconds += max(cpu_seconds, copy)
        total += count * seconds / len(routings)
    return total * 1e3


def decode_breakdown(rows: list[dict], layer_counts: dict[str, int]) -> dict:
    """Per decode step, ms of the synchronised profiling pass (runtime/metrics.py 'sublayers' rows: mean per layer
    per pass) by category (CATEGORIES), each row × its group's layer count; the experts' split rows also by part:
    'experts_cpu_part', 'experts_gpu_part' (resident and streamed experts, the copies included) and
    'experts_route' (the routing read on the host); 'total' is the pass's step, which syncs after every op."""
    out: dict[str, float] = {}
    for row in rows:
        if row["phase"] != "decode" or row.get("measured_ms") is None:
            continue
        count = layer_counts.get(row["group"], 1)
        name = CATEGORIES.get(row["sublayers"][0], "other")
        if name == "experts":
            name = {"cpu": "experts_cpu", "gpu": "experts_gpu"}.get(row["device"], "experts_split")
            for part in ("cpu_part", "gpu_part", "route"):
                if row.get(f"measured_{part}_ms") is not None:
                    out[f"experts_{part}"] = out.get(f"experts_{part}", 0.0) + row[f"measured_{part}_ms"] * count
        out[name] = out.get(name, 0.0) + row["measured_ms"] * count
    out["total"] = sum(v for k, v in out.items() if not k.endswith(("_part", "_route")))
    return {k: round(v, 3) for k, v in sorted(out.items())}


class MoeBench:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.began = time.monotonic()
        self.cfg = model_config(args.layers, args.emulate)
        self.summary = {"argv": sys.argv[1:], "model": self.cfg.name, "layers": self.cfg.num_layers,
                        "gpu_budget_gib": args.gpu_budget_gib, "batches": args.batches, "stages": {}, "plans": [],
                        "skipped": []}
        self.profile = self.out / "run-profile.yaml"

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.began:6.1f}s] {text}", flush=True)

    def left(self) -> float:
        return self.args.deadline_s - (time.monotonic() - self.began)

    def save(self) -> None:
        from liac.fileio import write_atomic

        write_atomic(self.out / "summary.json", json.dumps(self.summary, indent=1, sort_keys=True) + "\n")

    def stage(self, name: str, fn) -> None:
        record = self.summary["stages"][name] = {"started_s": round(time.monotonic() - self.began, 1)}
        self.log(f"== {name}")
        try:
            fn()
            record["status"] = "done"
        except Exception as e:  # one stage failing must not lose the others
            import traceback

            traceback.print_exc()
            record["status"] = f"error: {type(e).__name__}: {e}"[:500]
        record["seconds"] = round(time.monotonic() - self.began - record["started_s"], 1)
        self.save()

    # -- stages ------------------------------------------------------------------------------------------------
    def footprint(self, measure=None) -> None:
        import torch

        if measure is None and (self.args.emulate or not torch.cuda.is_available()):
            self.summary["skipped"].append({"stage": "footprint", "reason": "no CUDA device"})
            return
        from liac.host import FOOTPRINT_MODELS

        try:
            record = measure_call_footprint(BASE_PROFILE, models=(*FOOTPRINT_MODELS, MOE_PROBE), measure=measure)
        except Exception as e:  # the MoE probe is this script's addition: the dense probes alone still serve
            self.log(f"footprint with the Mixtral probe failed ({type(e).__name__}: {e}): measuring the dense ones")
            self.summary["skipped"].append({"stage": "footprint", "probe": MOE_PROBE.name,
                                            "reason": f"{type(e).__name__}: {e}"[:300]})
            record = measure_call_footprint(BASE_PROFILE, models=FOOTPRINT_MODELS, measure=measure)
        self.log(f"footprint: {record['profile_fields']}")
        self.summary["footprint"] = record
        update_run_profile(self.profile, BASE_PROFILE, record["profile_fields"],
                           "bench/moe_h200.py footprint stage (runtime/footprint.py), in the same call as the runs",
                           name="h200-moe-run")

    def rates(self) -> None:
        from liac.fileio import write_atomic
        from liac.probe import ProbeSizes, expert_rates, measure_rates

        sizes = ProbeSizes.quick() if self.args.emulate else ProbeSizes(
            weight_bytes=GIB, rotate_bytes=3 * GIB, gemm_k=7168, copy_bytes=GIB, repeats=3)
        # the CPU read rate on the runtime's own kernel shapes: one expert's gate_up [2F, D] and down [D, F]
        D, F = self.cfg.hidden_size, self.cfg.ffn_dim
        sizes = dataclasses.replace(sizes, gemv_shapes=((2 * F, D), (D, F)))
        began = time.monotonic()
        use_gpu = False if self.args.emulate else None
        measured = measure_rates(sizes, use_gpu=use_gpu)
        # the expert kernel as the runtime runs it at batch 1: back to back, after an idle pause, and after the pause
        # beside another expert's copy (cpu_expert_beside_copy_gb_per_s: Eq. 21c's rate, into run-profile.yaml)
        measured.update(expert_rates(D, F, sizes.rotate_bytes * 2 // 3, sizes.repeats, use_gpu=use_gpu))
        rates = {k: round(v, 3) for k, v in measured.items()}
        self.log(f"rates in {time.monotonic() - began:.0f} s: {rates}")
        write_atomic(self.out / "rates.json", json.dumps(rates, indent=1, sort_keys=True) + "\n")
        update_run_profile(self.profile, BASE_PROFILE, rates, "bench/moe_h200.py rates, in the same call as the runs",
                           name="h200-moe-run")

    def compile(self) -> None:
        from liac.api import compile_plans, write_plans
        from liac.errors import LiacError
        from liac.passes import ilp

        ilp.POLICIES.setdefault("experts-cpu", EXPERTS_CPU)
        fields = dict(getattr(self.args, "profile_set", None) or ())
        if fields:  # set by hand on the command line (e.g. a field no stage of this script measures yet)
            update_run_profile(self.profile, BASE_PROFILE, fields, "bench/moe_h200.py --profile-set",
                               name="h200-moe-run")
            self.log(f"profile fields set by hand: {fields}")
        hw = str(self.profile) if self.profile.exists() else BASE_PROFILE
        self.summary["compiled_for"] = hw
        folder = Path(tempfile.mkdtemp(prefix="liac-moe-plans-"))
        budget = int(self.args.gpu_budget_gib * GIB)
        for contender, policy in CONTENDERS.items():
            began = time.monotonic()
            try:
                result = compile_plans(self.cfg, hw, batches=tuple(self.args.batches),
                                       prompt_len=self.args.prompt_len, gen_len=self.args.gen_len, gpu_mem=budget,
                                       policy=policy)
            except LiacError as e:  # no batch of this contender fits: the others still run
                self.summary["skipped"].append({"stage": "compile", "contender": contender, "reason": e.line()})
                self.log(f"compile {contender}: {e.line()}")
                continue
            written = {path.stem: path for path in write_plans(result, folder / contender)}
            for point in result.points:
                plan = point.plan
                path = written[plan.metadata.name]
                experts = [(g.layer_count, g.sublayers[-1].experts.hbm, g.sublayers[-1].experts.prefill_cpu,
                            g.sublayers[-1].experts.decode_cpu) for g in plan.spec.layer_groups
                           if g.layer_class == "decoder" and g.sublayers[-1].experts is not None]
                self.summary["plans"].append({
                    "contender": contender, "batch": plan.spec.workload.batch_size, "plan": str(path),
                    "predicted_prefill_ms": round(plan.status.predicted.prefill_seconds * 1e3, 3),
                    "predicted_decode_ms_per_token": round(plan.status.predicted.decode_seconds_per_token * 1e3, 3),
                    "experts_layers_hbm_prefillcpu_decodecpu": experts,
                    "layer_counts": {g.name: g.layer_count for g in plan.spec.layer_groups}})
            for batch, reason in result.infeasible:
                self.summary["skipped"].append({"stage": "compile", "contender": contender, "batch": batch,
                                                "reason": reason})
            self.log(f"compiled {contender} b{','.join(map(str, self.args.batches))} in "
                     f"{time.monotonic() - began:.1f} s")
            self.save()
        with tarfile.open(self.out / "plans.tar.gz", "w:gz") as tar:
            tar.add(folder, arcname="plans")

    def kernels(self) -> None:
        import torch

        backend = None
        if not self.args.emulate and torch.cuda.is_available():
            from liac.runtime.backend import CudaBackend

            backend = CudaBackend()
        began = time.monotonic()
        record = expert_kernel_rates(self.cfg, (GIB // 64) if self.args.emulate else 2 * GIB,
                                     repeats=1 if self.args.emulate else 3, backend=backend)
        self.log(f"expert kernel rates in {time.monotonic() - began:.0f} s: {record}")
        self.summary["kernels"] = record
        import gc

        gc.collect()

    def runs(self) -> None:
        # batch 1 of every contender first (the aim), then the larger batches
        order = {c: i for i, c in enumerate(CONTENDERS)}
        plans = sorted(self.summary["plans"], key=lambda p: (p["batch"], order[p["contender"]]))
        specs = [RunSpec(p["plan"], gen_len=self.args.measure_gen_len) for p in plans]
        names = [f"{p['contender']}:b{p['batch']}" for p in plans]
        if self.args.threads_ab and "optimal:b1" in names:  # the batch-1 optimum again at other CPU thread counts
            at = names.index("optimal:b1") + 1
            for threads in reversed(self.args.threads_ab):
                specs.insert(at, dataclasses.replace(specs[at - 1], threads=threads))
                names.insert(at, f"optimal@{threads}t:b1")
        # An A/B flag runs each optimum (A) with an engine option (B) as A B B A: a plan's later runs are faster
        # than its first (one-off costs, the CPU's rate moving within a call), so each side's mean over its two runs
        # has the same mean position in the call and the order cancels ('optimal@cut', 'optimal@cut#2', then the optimum
        # again as 'optimal@no-cut'; the table's A/B lines: `ab_pairs`).
        variants = [("auto", "share_ab", {"expert_share": "auto"}),  # the share following the CPU (runtime/moe.py)
                    ("wake", "wake_ab", {"cpu_wake": True}),  # the CPU's team woken before the routing read
                    ("cut", "split_ab", {"expert_split": True}),  # the last CPU expert cut by features
                    ("launch", "launcher_ab", {"expert_launcher": True})]  # the GPU part launched beside the CPU's
        for tag, flag, option in variants:
            for batch in (p["batch"] for p in plans if p["contender"] == "optimal") if getattr(self.args, flag,
                                                                                              False) else ():
                at = names.index(f"optimal:b{batch}") + 1
                plain = specs[at - 1]
                specs[at:at] = [dataclasses.replace(plain, **option), dataclasses.replace(plain, **option), plain]
                names[at:at] = [f"optimal@{tag}:b{batch}", f"optimal@{tag}#2:b{batch}", f"optimal@no-{tag}:b{batch}"]
        if not self.args.emulate:
            # The first run at each batch size pays one-off costs outside its CPU parts and their host chain (new
            # shapes' kernels; in the 2026-12-02 calls ~45-60 ms a decode step, the second run at that batch
            # 8-15): a warm-up run of that batch's first plan before it ('warmup' at the first batch, then
            # 'warmup:bN'), not timed into the table.
            for at in reversed([k for k, name in enumerate(names)
                                if k == 0 or name.rsplit(":b", 1)[1] != names[k - 1].rsplit(":b", 1)[1]]):
                specs.insert(at, specs[at])
                names.insert(at, "warmup" if at == 0 else f"warmup:b{names[at].rsplit(':b', 1)[1]}")
        self.summary["runs_index"] = names
        self.save()
        deadline = self.began + self.args.deadline_s - self.args.reserve_s
        run_plans(specs, seed=0, out=self.out / "runs.json", max_seconds=self.args.max_run_seconds,
                  profile_steps=self.args.profile_steps, emulate_gpu=True if self.args.emulate else None,
                  log=self.log, deadline=deadline)
        import gc

        import torch

        gc.collect()
        if torch.cuda.is_available():  # the peers start processes of their own on this GPU
            torch.cuda.empty_cache()

    def peers(self) -> None:
        from liac.fileio import write_atomic

        script = str(HERE / "peers" / "accelerate_opt.py")
        model = ["--model", "mixtral-8x7b", "--layers", str(self.cfg.num_layers)]
        if self.args.emulate:  # the tiny model as an HF config.json, run on the CPU
            sys.path.insert(0, str(HERE / "peers"))
            from accelerate_opt import hf_config

            model_file = Path(tempfile.mkdtemp(prefix="liac-moe-peer-")) / "config.json"
            model_file.write_text(json.dumps(hf_config(self.cfg).to_dict(), default=str))
            model = ["--model", str(model_file), "--device", "cpu"]
        jobs = []
        for batch in self.args.peer_batches:
            jobs.append(("accelerate-pinned", batch, ["--pinned", "--gen-len", "4"]))
        if "accelerate" in self.args.peers:  # Accelerate's default: pageable weights, a few GB/s; 2 tokens suffice
            jobs.append(("accelerate", 1, ["--gen-len", "2"]))
        results = []
        for name, batch, extra in jobs:
            if name not in self.args.peers:
                continue
            left = self.left() - 15  # the floor stage and the table after it
            if left < 45:
                self.summary["skipped"].append({"stage": "peers", "peer": name, "batch": batch,
                                                "reason": "out of time"})
                continue
            json_out = self.out / f".peer-{len(results):02d}.json"
            command = [sys.executable, script, *model, "--batch", str(batch), "--prompt-len",
                       str(self.args.prompt_len), "--gpu-budget-gib", str(self.args.gpu_budget_gib), *extra,
                       "--json-out", str(json_out)]
            record = {"peer": name, "batch": batch, "command": command[1:]}
            began = time.monotonic()
            try:
                proc = subprocess.run(command, capture_output=True, text=True, timeout=min(self.args.peer_timeout_s,
                                                                                           left))
                record["returncode"] = proc.returncode
                record["stderr_tail"] = proc.stderr[-1500:]
                if json_out.exists():
                    record["result"] = json.loads(json_out.read_text())
            except subprocess.TimeoutExpired:
                record["error"] = "timed out"
            finally:
                if json_out.exists():
                    json_out.unlink()
            record["wall_seconds"] = round(time.monotonic() - began, 1)
            results.append(record)
            result = record.get("result") or {}
            self.log(f"peer {name} b{batch}: decode {result.get('decode_ms_per_token')} ms/token, prefill "
                     f"{result.get('prefill_ms')} ms, error {result.get('error') or record.get('error')}")
            write_atomic(self.out / "peers.json", json.dumps(results, indent=1, sort_keys=True) + "\n")

    def floor(self) -> None:
        from floor import process_bytes, workload_floor

        from liac.fileio import write_atomic
        from liac.passes import trace_model
        from liac.profile import resolve_profile

        hw = resolve_profile(str(self.profile) if self.profile.exists() else BASE_PROFILE)
        graph = trace_model(self.cfg)
        reserved = process_bytes(self.summary.get("footprint"))  # measured in this call, else 0
        floors = []
        for batch in self.args.batches:
            f = workload_floor(graph, hw, batch=batch, prompt_len=self.args.prompt_len, gen_len=self.args.gen_len,
                               gpu_budget_bytes=int(self.args.gpu_budget_gib * GIB), reserved_bytes=reserved)
            floors.append({"batch": batch, "profile": hw.name, "reserved_bytes": reserved, **dataclasses.asdict(f)})
        write_atomic(self.out / "floor.json", json.dumps(floors, indent=1, sort_keys=True) + "\n")

    def batch1_model(self, plan: dict) -> dict | None:
        """`batch1_experts_ms` for a plan's decode placement at the rates of this call (rates.json; the CPU kernel's
        from the kernels stage where it ran, else the profile's GEMV rate), with and without the runtime's share."""
        rates = json.loads((self.out / "rates.json").read_text()) if (self.out / "rates.json").exists() else {}
        if not {"pcie_h2d_gb_per_s", "concurrent_cpu_gb_per_s", "cpu_ddr_read_gb_per_s"} <= set(rates):
            return None
        kernel = (self.summary.get("kernels") or {}).get("linear_gb_per_s_by_rows", {}).get("1")
        cpu = kernel or rates["cpu_ddr_read_gb_per_s"]
        layers = [(count, hbm, decode_cpu) for count, hbm, _, decode_cpu in
                  plan["experts_layers_hbm_prefillcpu_decodecpu"]]
        args = dict(num_experts=self.cfg.num_experts, top_k=self.cfg.experts_top_k,
                    expert_bytes=3 * self.cfg.hidden_size * self.cfg.ffn_dim * 2, cpu_gb_per_s=cpu,
                    cpu_beside_h2d_gb_per_s=min(cpu, rates["concurrent_cpu_gb_per_s"]),
                    h2d_gb_per_s=rates["pcie_h2d_gb_per_s"])
        return {"cpu_gb_per_s": cpu, "shared": round(batch1_experts_ms(layers, share=True, **args), 1),
                "as_planned": round(batch1_experts_ms(layers, share=False, **args), 1)}

    def table(self) -> None:
        """Measured vs predicted vs floor, one line per run, each run's decode-step breakdown, and Accelerate's
        decode beside liac's batch-1 optimum (also into summary.json)."""
        runs = json.loads((self.out / "runs.json").read_text())["runs"] if (self.out / "runs.json").exists() else []
        floors = {f["batch"]: f for f in json.loads((self.out / "floor.json").read_text())} \
            if (self.out / "floor.json").exists() else {}
        plans = {f"{p['contender']}:b{p['batch']}": p for p in self.summary["plans"]}
        index = self.summary.get("runs_index", [])
        rows = []
        print(f"{'contender':>17} {'batch':>5} | {'prefill ms':>10} {'pred':>8} {'floor':>8} | {'decode ms/tok':>13} "
              f"{'pred':>8} {'floor':>8} | decode error")
        for name, run in zip(index, runs):
            if name.split(":")[0] == "warmup":
                continue
            contender, batch = name.rsplit(":b", 1)
            name = f"{contender.split('@')[0].split('#')[0]}:b{batch}"  # a variant or a repeat: its plan's name
            got = run.get("summary")
            floor = floors.get(int(batch), {})
            row = {"contender": contender, "batch": int(batch), "predicted": run["predicted"], "measured": got,
                   "floor_decode_ms_per_token": None, "floor_prefill_ms": None,
                   "note": run.get("skipped") or run.get("error"), "cpu_threads": run.get("cpu_threads"),
                   "gpu_peak_gib": _gpu_peak_gib(run), "host_cpu": run.get("host_cpu"),
                   "expert_share": ((run.get("metrics") or {}).get("backend") or {}).get("expert_share"),
                   "experts": (run.get("metrics") or {}).get("experts"), "cpu_wake": run.get("cpu_wake", False),
                   "expert_split": run.get("expert_split", False),
                   "expert_launcher": run.get("expert_launcher", False)}
            if "decode_seconds_per_token" in floor:
                row["floor_decode_ms_per_token"] = round(floor["decode_seconds_per_token"] * 1e3, 3)
                row["floor_prefill_ms"] = round(floor["prefill_seconds"] * 1e3, 3)
            sublayers = (run.get("metrics") or {}).get("sublayers") or []
            if sublayers and name in plans:
                row["decode_breakdown_ms"] = decode_breakdown(sublayers, plans[name].get("layer_counts", {}))
            if int(batch) == 1 and name in plans:
                row["batch1_experts_model_ms"] = self.batch1_model(plans[name])
            rows.append(row)
            if got and got.get("decode_ms_per_token"):
                error = got["decode_ms_per_token"] / run["predicted"]["decode_ms_per_token"] - 1
                print(f"{contender:>17} {batch:>5} | {got['prefill_ms']:10.1f} {run['predicted']['prefill_ms']:8.1f} "
                      f"{row.get('floor_prefill_ms') or float('nan'):8.1f} | "
                      f"{got['decode_ms_per_token']:13.1f} {run['predicted']['decode_ms_per_token']:8.1f} "
                      f"{row['floor_decode_ms_per_token'] or float('nan'):8.1f} | {error:+.0%}"
                      f" | {row['cpu_threads']} threads, GPU peak {row['gpu_peak_gib']} GiB"
                      + ("" if not row["host_cpu"] else f", other processes {row['host_cpu']['others_cores']} "
                         f"cores, stolen {row['host_cpu']['steal_cores']}"))
                if row["expert_share"]:
                    share = row["expert_share"]
                    print(f"{'':>17} {'':>5}   expert share: CPU s per expert over PCIe's {share['at_load']} at "
                          f"load, {share['now']} at the end ({'following the CPU' if share['adapt'] else 'kept'}; "
                          f"{share['cpu_parts_observed']} CPU parts, {share['probes']} probes)")
                decode = (row["experts"] or {}).get("decode") or {}
                if decode.get("cpu_experts"):
                    print(f"{'':>17} {'':>5}   CPU experts in the timed decode steps: {decode['cpu_experts']} in "
                          f"{decode['cpu_parts']} CPU parts, {decode['cpu_ms']:.1f} ms, {decode['cpu_gb_per_s']} GB/s; "
                          f"{decode['streamed_experts']} streamed (CPU team woken: {row['cpu_wake']}; "
                          f"{decode.get('cut_experts', 0)} experts cut by features)")
                    if decode.get("host_ms_per_cpu_part"):
                        print(f"{'':>17} {'':>5}   host ms per CPU part beside it (timed steps): " + ", ".join(
                            f"{k} {v}" for k, v in decode["host_ms_per_cpu_part"].items()))
                if row.get("batch1_experts_model_ms"):
                    print(f"{'':>17} {'':>5}   experts per step by routing (bench model): " + ", ".join(
                        f"{k} {v}" for k, v in row["batch1_experts_model_ms"].items()))
                if "decode_breakdown_ms" in row:
                    print(f"{'':>17} {'':>5}   profiled decode step, ms: " + ", ".join(
                        f"{k} {v:.1f}" for k, v in row["decode_breakdown_ms"].items()))
            else:
                print(f"{contender:>17} {batch:>5} | {row['note']}")
        self.summary["table"] = rows
        self.summary["ab_pairs"] = ab_pairs(rows)
        for pair in self.summary["ab_pairs"]:
            a, b = (" ".join(f"{v:.1f}" for v in pair[side]) for side in ("a", "b"))
            print(f"{'A B B A':>17} {pair['batch']:>5} | {pair['tag']}: decode ms/token A (optimal) {a}, "
                  f"B (@{pair['tag']}) {b}"
                  + (f"; means {pair['a_mean']:.1f} vs {pair['b_mean']:.1f}: B {pair['b_over_a'] - 1:+.1%}"
                     if pair.get("b_over_a") else ""))
        peers = json.loads((self.out / "peers.json").read_text()) if (self.out / "peers.json").exists() else []
        versus = []
        for peer in peers:
            result = peer.get("result") or {}
            ours = next((r["measured"] for r in rows if r["contender"] == "optimal" and r["batch"] == peer["batch"]
                         and r["measured"]), None)
            line = {"peer": peer["peer"], "batch": peer["batch"],
                    "decode_ms_per_token": result.get("decode_ms_per_token"), "prefill_ms": result.get("prefill_ms"),
                    "error": result.get("error") or peer.get("error")}
            if ours and result.get("decode_ms_per_token"):
                line["liac_optimal_decode_speedup"] = round(result["decode_ms_per_token"]
                                                            / ours["decode_ms_per_token"], 2)
            if result.get("decode_ms_per_token"):  # every liac run at the peer's batch (threads variants too)
                line["liac_decode_speedup"] = {
                    r["contender"]: round(result["decode_ms_per_token"] / r["measured"]["decode_ms_per_token"], 2)
                    for r in rows if r["batch"] == peer["batch"] and (r["measured"] or {}).get("decode_ms_per_token")}
            versus.append(line)
            print(f"{peer['peer']:>17} {peer['batch']:>5} | {result.get('prefill_ms') or float('nan'):10.1f} "
                  f"{'':>8} {'':>8} | {result.get('decode_ms_per_token') or float('nan'):13.1f} {'':>8} {'':>8} | "
                  + ("liac " + ", ".join(f"{c} {x:.1f}x" for c, x in line["liac_decode_speedup"].items())
                     + " faster" if line.get("liac_decode_speedup") else str(line["error"])))
        self.summary["peers"] = versus


def ab_pairs(rows: list[dict]) -> list[dict]:
    """Per A/B flag's tag and batch, the A B B A runs' decode ms/token (table rows: 'optimal', 'optimal@TAG',
    'optimal@TAG#2', 'optimal@no-TAG'): A the optimum's two runs, B the variant's two, in run order; each side's
    mean and B's over A's where all four ran."""
    decode = {(r["contender"], r["batch"]): (r.get("measured") or {}).get("decode_ms_per_token") for r in rows}
    out = []
    for contender, batch in decode:
        if not contender.startswith("optimal@no-"):
            continue
        tag = contender[len("optimal@no-"):]
        a = [decode.get(("optimal", batch)), decode.get((contender, batch))]
        b = [decode.get((f"optimal@{tag}", batch)), decode.get((f"optimal@{tag}#2", batch))]
        pair = {"tag": tag, "batch": batch, "a": [v for v in a if v], "b": [v for v in b if v]}
        if all(a) and all(b):
            pair["a_mean"], pair["b_mean"] = sum(a) / 2, sum(b) / 2
            pair["b_over_a"] = round(pair["b_mean"] / pair["a_mean"], 4)
        out.append(pair)
    return out


def _gpu_peak_gib(run: dict) -> float | None:
    """A run's GPU peak (allocator reserved + CUDA context where measured, else allocated), GiB."""
    gpu = run.get("gpu") or {}
    peak = gpu.get("peak_footprint_bytes") or gpu.get("peak_allocated_bytes")
    return round(peak / GIB, 2) if peak else None


def _profile_field(text: str) -> tuple[str, float]:
    field, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return field.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIELD=NUMBER, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for every result file ($OUT on the device)")
    parser.add_argument("--layers", type=int, default=32, help="decoder layers of the Mixtral-8x7B shape (32: all)")
    parser.add_argument("--gpu-budget-gib", type=float, default=24.0, help="the plans' GPU budget")
    parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=32, help="new tokens the plans are compiled for")
    parser.add_argument("--measure-gen-len", type=int, default=8, help="new tokens each timed run generates")
    parser.add_argument("--profile-steps", type=int, default=1,
                        help="decode steps of a synchronised per-op profiling pass after each run (0: none; it "
                             "costs a prefill); its rows give the table's decode_breakdown_ms")
    parser.add_argument("--max-run-seconds", type=float, default=60.0, help="skip runs predicted to take longer")
    parser.add_argument("--peers", default="accelerate-pinned,accelerate",
                        help="Accelerate with pinned CPU weights, and with its default pageable ones (batch 1)")
    parser.add_argument("--peer-batches", type=lambda s: [int(b) for b in s.split(",") if b], default=[1],
                        help="batches of the pinned Accelerate runs")
    parser.add_argument("--peer-timeout-s", type=float, default=150.0, help="wall-clock cap of one peer run")
    parser.add_argument("--deadline-s", type=float, default=420.0, help="wall-clock budget of this call")
    parser.add_argument("--reserve-s", type=float, default=150.0,
                        help="seconds the runs leave for the stages after them (peers, floor)")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help="stages to run, in order (e.g. without 'kernels': "
                             "footprint,rates,compile,runs,peers,floor)")
    parser.add_argument("--cpu-threads", type=int, default=0,
                        help="torch's intra-op CPU threads for the rates, kernels and runs (0: torch's default, one "
                             "per core); the peers' processes keep their default")
    parser.add_argument("--wake-ab", action="store_true",
                        help="run each optimum A B B A with the CPU's thread team woken before its experts ops "
                             "(Engine cpu_wake=True) as B, beside the default (not woken)")
    parser.add_argument("--split-ab", action="store_true",
                        help="run each optimum A B B A with a decode step's last CPU expert cut by features between "
                             "the CPU and PCIe (Engine expert_split=True) as B, beside experts whole")
    parser.add_argument("--launcher-ab", action="store_true",
                        help="run each optimum A B B A with its split experts ops' GPU part launched from a second "
                             "host thread beside the CPU part (Engine expert_launcher=True) as B, beside launching "
                             "it first on the one host thread")
    parser.add_argument("--share-ab", action="store_true",
                        help="run each optimum A B B A with the expert share following the CPU parts (Engine "
                             "expert_share='auto') as B, beside the default measured at load and kept ('load')")
    parser.add_argument("--threads-ab", type=lambda s: [int(t) for t in s.split(",") if t], default=[],
                        help="also run the batch-1 optimum at these CPU thread counts, right after it (e.g. 15)")
    parser.add_argument("--profile-set", type=_profile_field, action="append", default=[], metavar="FIELD=VALUE",
                        help="set a profile field before the compile stage (repeatable), e.g. "
                             "runtime_op_seconds_beside_cpu=0.000307 (Eq. 21d, which no stage here measures)")
    parser.add_argument("--emulate", action="store_true", help="smoke test here: a tiny Mixtral, GPU emulated")
    args = parser.parse_args(argv)
    args.peers = [p for p in args.peers.split(",") if p]
    if args.emulate:
        # 1 GiB: the profile's CUDA context (0.75 GiB) counts in the budget, the tiny model fits beside it
        args.gpu_budget_gib, args.batches, args.prompt_len, args.gen_len = 1.0, [1, 4], 16, 8
        args.measure_gen_len, args.reserve_s = 4, 60.0
    stages = [s for s in args.stages.split(",") if s]
    for name in stages:
        if name not in STAGES:
            raise SystemExit(f"--stages: unknown stage {name!r} (one of {', '.join(STAGES)})")
    if args.cpu_threads:
        import torch

        torch.set_num_threads(args.cpu_threads)
    bench = MoeBench(args)
    for name in stages:
        bench.stage(name, getattr(bench, name))
    bench.table()
    bench.save()
    bench.log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
