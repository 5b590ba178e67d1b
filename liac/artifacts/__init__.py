"""Plans as artifacts: validate, explain, diff, migrate and render `OffloadPlan` files and sweep directories.

The library behind `liac validate | explain | diff | docs`. Modules, one concern each:

    footprint.py     ModelConfig + placement → bytes per memory tier (recomputed, independent of the compiler)
    schema_check.py  plain data → every schema violation with its YAML path (the loader stops at the first)
    sweep.py         a sweep directory → its plan files and index.yaml
    index.py         index.yaml + the plans it lists → disagreements
    validate.py      plan file / sweep directory → every error, one line each (schema, semantics, capacities)
    migrate.py       older apiVersion documents → the next version (pure dict → dict functions)
    explain.py       plan → why each sublayer runs where it does (prices recomputed through liac.api)
    diff.py          two plans or sweep directories → semantic differences
    render.py        directory of sweeps → Markdown pages (docs/plans/)
    figures.py       a page's data → placement, latency and memory figures (matplotlib, PNG)
    schemadoc.py     JSON Schema → docs/plan-format.md
    refresh.py       the checked-in plans/, docs/plans/, docs/plan-format.md, regenerated (scripts/refresh-artifacts)

This package imports nothing at import time: `liac.plan` registers the migrations of `migrate.py`, and the runtime
imports `liac.plan`.
"""

__all__: list[str] = []
