"""liac.runtime: execute an OffloadPlan on CPU (AMX) + GPU. The plan's `spec` is the only input it obeys.

    from liac.runtime import Engine, RandomWeights
    engine = Engine.from_plan("plan.yaml", weights="ckpt/")        # or RandomWeights(seed=0)
    out = engine.generate(input_ids, max_new_tokens=32)            # greedy; out.token_ids [B, 32]
    out = engine.generate(["Hi", "Once upon"], 32, temperature=0.7, seed=0)   # text in, out.text out

    host = HostWeights.random(cfg, seed=0)                         # several plans over one set of weights
    with Engine.from_plan("plan.yaml", weights=host) as engine:    # copies only its 'hbm' tensors; close frees them
        ...

Modules, in the order a run uses them:
    schedule.py   plan → per-phase ops, activation moves, streaming units, bytes per tier (computed once)
    backend.py    the 'gpu' device: CUDA, or the CPU-backed emulation for tests; streams, events, transfers
    numa.py       the CXL tier: first CPU-less NUMA node, libnuma allocation (or the DDR fallback)
    memory.py     one arena per tier (HBM, pinned DDR, CXL), sized before anything is allocated
    weights.py    safetensors checkpoints tensor by tensor into their tiers, or seeded random weights
    hostweights.py  one pinned host copy of a model's weights shared by several engines (benchmarks)
    kernels.py    (op kind, device) → kernel; optional IPEX
    kvcache.py    per-layer KV cache in its tier
    staging.py    host → GPU streaming into staging buffers on a copy stream, prefetch_depth layers ahead
    moe.py        the ratio an MoE step shares its routed host experts by (CPU vs PCIe), following the CPU
    executor.py   ops bound to liac.models sublayer modules; one loop per pass
    sequences.py  per-sequence state: left-padded prompts, EOS stops
    sampling.py   greedy / temperature, top-k, top-p sampling, reproducible per sequence
    text.py       the checkpoint's tokenizer: prompts → token ids → text, chat template, EOS ids
    engine.py     Engine.from_plan (checks, allocation, loading) and generate / profile; executor_for(live batch)
    batching.py   continuous batching: requests join and leave the running batch between steps
    serve/        lia-serve: the batcher on its own thread for asyncio code (AsyncEngine), the OpenAI-compatible
                  HTTP server (the optional extra 'serve': FastAPI, uvicorn, prometheus_client)
    metrics.py    measured vs predicted (scaled to the request), JSON
    sweep.py      a sweep's index → the plan for a request
    cli.py        lia-run

It never imports liac.passes (tests/runtime/test_runtime_imports.py checks it).
"""

import importlib

__all__ = ["Engine", "Generation", "RandomWeights", "HostWeights", "Backend", "CudaBackend", "EmulatedBackend",
           "make_backend", "Schedule", "build_schedule", "SamplingParams", "PromptBatch"]

# Loaded on first use (PEP 562): `lia-run`'s entry point imports this package, and torch must load inside its
# main(), where Ctrl-C is answered with one line rather than a traceback.
_HOMES = {"Engine": "engine", "Generation": "engine", "RandomWeights": "engine", "HostWeights": "hostweights",
          "Backend": "backend", "CudaBackend": "backend", "EmulatedBackend": "backend", "make_backend": "backend",
          "Schedule": "schedule", "build_schedule": "schedule", "SamplingParams": "sampling",
          "PromptBatch": "sequences"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"liac.runtime.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'liac.runtime' has no attribute {name!r}")
