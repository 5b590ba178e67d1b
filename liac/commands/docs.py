"""`liac docs PLANS_DIR -o OUT`: one Markdown page per model × hardware sweep, with figures, and an index page.

`--plan-format FILE` also (or only) writes the plan-format reference generated from the JSON Schema.
"""

from __future__ import annotations

import sys

from liac.errors import LiacError
from liac.fileio import write_atomic

__all__ = ["register", "run"]


def register(sub) -> None:
    parser = sub.add_parser("docs", help="render sweep directories as Markdown pages with figures",
                            description="Render every sweep under PLANS_DIR (PLANS_DIR itself and each "
                                        "subdirectory holding plans) as one Markdown page per model × hardware "
                                        "profile, with PNG figures beside it and an index.md linking them. Files "
                                        "an earlier run generated in OUT and this one did not are removed.")
    parser.add_argument("plans_dir", nargs="?", metavar="PLANS_DIR", help="directory of sweeps (e.g. plans/)")
    parser.add_argument("-o", "--out", metavar="OUT", help="output directory (e.g. docs/plans/)")
    parser.add_argument("--plan-format", metavar="FILE", help="also write the plan-format reference (Markdown, "
                                                              "generated from the JSON Schema) to FILE")
    parser.set_defaults(func=run)


def run(args) -> int:
    if not args.plans_dir and not args.plan_format:
        raise LiacError("docs", "PLANS_DIR (with -o OUT) or --plan-format FILE is required")
    if args.plans_dir and not args.out:
        raise LiacError("docs", "-o OUT is required with PLANS_DIR")
    # late import: the pages need jinja2 and, for figures, matplotlib; `liac --help` loads neither
    from liac.artifacts.render import render_docs
    from liac.artifacts.schemadoc import render_plan_format

    if args.plan_format:
        write_atomic(args.plan_format, render_plan_format())
        sys.stdout.write(f"wrote {args.plan_format}\n")
    if args.plans_dir:
        written = render_docs(args.plans_dir, args.out)
        pages = [p for p in written if p.suffix == ".md"]
        sys.stdout.write(f"wrote {len(pages)} pages and {len(written) - len(pages)} figures to {args.out}\n")
    return 0
