"""Studies: the study files (``spec``), their overrides and recipes, one trial (``objective``), the storage and its
stop signals, and ``python -m ablations.run`` — the CLI (``cli``), the study in storage (``study``), the worker
processes (``workers``) and the dry-run plan (``plan``)."""

from .cli import build_parser, main

__all__ = ["build_parser", "main"]
