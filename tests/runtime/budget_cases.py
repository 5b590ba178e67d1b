"""Run by tests/runtime/test_budget.py in a fresh process (a plan's GPU budget is its process's whole footprint: the
pytest process holds other tests' CUDA memory): measure this GPU's footprint as `liac profile` does, then run each
case given on the command line (model index, share, batch, prompt) under a budget that holds the footprint and `share`
of the weights and KV cache, and print one JSON line per case: the budget and the peak used (allocator reserved +
CUDA context)."""

from __future__ import annotations

import gc
import json
import sys

import torch

from liac.api import compile_plans
from liac.host import FOOTPRINT_MODELS, footprint_probes, with_footprint
from liac.profile import resolve_profile
from liac.runtime import Engine, RandomWeights
from liac.runtime.backend import CudaBackend
from liac.runtime.footprint import measure_footprint
from liac.sizes import GIB


def main(cases: list[str]) -> None:
    base = resolve_profile("h200-measured")
    probes = footprint_probes(base)
    measured = measure_footprint([(p.plan, p.batch, p.prompt_len) for p in probes])
    hw = with_footprint(base, probes, measured.library_bytes, measured.context_bytes, measured.activation_bytes)
    for case in cases:
        model, share, batch, prompt = case.split(",")
        share, batch, prompt = float(share), int(batch), int(prompt)
        cfg = FOOTPRINT_MODELS[int(model)].with_layers(8)
        roomy = compile_plans(cfg, hw, batches=(batch,), prompt_len=prompt, gen_len=8,
                              gpu_mem=64 * GIB).points[0].plan
        resident = roomy.spec.memory.hbm_bytes - roomy.spec.execution.workspace_bytes - hw.gpu_context_bytes
        budget = int(hw.gpu_context_bytes + roomy.spec.execution.workspace_bytes + share * resident)
        plan = compile_plans(cfg, hw, batches=(batch,), prompt_len=prompt, gen_len=8, gpu_mem=budget).points[0].plan
        ids = torch.randint(0, cfg.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0))
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        backend = CudaBackend()
        with Engine.from_plan(plan, RandomWeights(0), backend=backend) as engine:
            enforced = engine.budget.enforced
            engine.generate(ids, 8)
            used = backend.gpu_context_bytes() + torch.cuda.max_memory_reserved()
        print(json.dumps({"case": case, "budget": budget, "planned": plan.spec.memory.hbm_bytes, "used": used,
                          "enforced": enforced}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
