"""Plans as artifacts: validate, explain, diff, migrate and render `OffloadPlan` files and sweep directories.

The library behind `liac validate | explain | diff | docs`. Modules, one concern each:

    footprint.py  ModelConfig + placement → bytes per memory tier (recomputed, independent of the compiler)
    sweep.py      a plan file or sweep directory → loaded plans, index.yaml entries
    validate.py   plan file / sweep directory → every error, one line each (schema, semantics, capacities)
    migrate.py    older apiVersion documents → current one (pure dict → dict functions)
    explain.py    plan → why each sublayer runs where it does (prices recomputed through liac.api)
    diff.py       two plans or sweep directories → semantic differences
    render.py     sweep directories → Markdown pages + matplotlib figures (docs/plans/)
    schemadoc.py  JSON Schema → docs/plan-format.md

This package imports nothing at import time: `liac.plan` registers the migrations of `migrate.py`, and the runtime
imports `liac.plan`.
"""

__all__: list[str] = []
