"""`python -m liac`: the same command line as `liac` (liac/cli.py)."""

import sys

from liac.cli import main

sys.exit(main())
