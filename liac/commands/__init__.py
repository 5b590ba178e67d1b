"""Subcommands of `liac`, one module each (see liac/cli.py)."""
