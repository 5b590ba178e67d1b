"""liac: a declarative offload-plan compiler (and its runtime) for single-GPU LLM inference with CPU compute.

Pipeline: model → sublayer graph (liac.passes.trace) → costs on a hardware profile (liac.passes.costs) →
placement ILP (liac.passes.ilp) → versioned YAML plan (liac.plan) → liac.runtime executes it.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
