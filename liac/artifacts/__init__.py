"""Plans as artifacts: validate, explain, diff and render `OffloadPlan` files and sweep directories.

The library behind `liac validate | explain | diff | docs`. Modules, one concern each:

    footprint.py     ModelConfig + placement → bytes per memory tier (recomputed, independent of the compiler)
    schema_check.py  plain data → every schema violation with its YAML path (the loader stops at the first)
    index.py         index.yaml + the plans it lists → disagreements
    validate.py      plan file / sweep directory / directory of sweeps → every error, one line each
    explain.py       plan → why each sublayer runs where it does (prices from liac.passes.price)
    diff.py          two plans or sweep directories → semantic differences
    render.py        directory of sweeps → Markdown pages (docs/plans/)
    figures.py       a page's data → placement, latency and memory figures (matplotlib, PNG)
    schemadoc.py     JSON Schema → docs/plan-format.md
    refresh.py       the checked-in plans/, docs/plans/, docs/plan-format.md, regenerated (scripts/refresh-artifacts)

What a sweep directory holds is named in liac/sweep.py; the plan's schema and its migrations are liac/plan.py and
liac/migrate.py. Nothing here is imported by the plan or the runtime: this package is tooling on top of them.
"""

__all__: list[str] = []
