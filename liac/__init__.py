"""liac: a declarative offload-plan compiler (and its runtime) for single-GPU LLM inference with CPU compute.

Pipeline: model → sublayer graph (liac.passes.trace) → costs on a hardware profile (liac.passes.costs) →
placement ILP (liac.passes.ilp) → versioned YAML plan (liac.plan) → liac.runtime executes it.

For a notebook, one call compiles (or reuses a cached plan) and runs (liac/quick.py):

    import liac
    print(liac.generate("ckpts/tiny-llama", "The GPU").text[0])
"""

__version__ = "0.1.0"
__all__ = ["__version__", "generate", "load"]


def __getattr__(name: str):
    # late import: liac.quick pulls in torch, and `import liac` (the CLI's first line) stays instant without it
    if name in ("generate", "load"):
        from liac import quick

        return getattr(quick, name)
    raise AttributeError(f"module 'liac' has no attribute {name!r}")
