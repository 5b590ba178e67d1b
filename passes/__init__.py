"""The compiler's passes (installed as `liac.passes`), one per file, each a pure function over one IR.

    ModelConfig
        │  trace_model                 passes/trace.py (+ trace_ops.py, trace_lower.py): torch.export on meta,
        ▼                              aten ops grouped into sublayer nodes, costs as Poly in (B, Q, C)
    SublayerGraph[traced]
        │  annotate_costs              passes/costs.py: price every unit on CPU and GPU per phase, + HardwareProfile
        ▼
    CostGraph                          plain ids and numbers; serialises to JSON
        │  solve_placement             passes/ilp.py (+ ilp_master.py, ilp_knapsack.py, ilp_records.py): exact
        ▼                              placement over units × tiers
    Assignment
        │  emit_plan                   passes/emit.py: + workload and budgets
        ▼
    OffloadPlan                        liac/plan.py: the YAML contract the runtime executes

    passes/price.py prices a placement (not a pass: the ILP, emit_plan, `liac explain` and `liac calibrate` call it)

Stages are stamped in `graph.graph["stage"]` (liac.ir.STAGES); a pass checks its input's stage on entry.
Imports here are lazy so that `import liac.passes.ilp` does not pull in torch.
"""

from __future__ import annotations

import importlib

__all__ = ["trace_model"]

_LAZY = {"trace_model": "liac.passes.trace"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'liac.passes' has no attribute {name!r}")
