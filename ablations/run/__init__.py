"""Running studies, ``python -m ablations.run``: the CLI (``cli``), the study in storage (``study``), the tuning
stage (``tuning``), the contending rates (``contend``) and a second look (``rounds``) after the reported grid, the
worker processes (``workers``), one trial (``objective``), the dry-run plan (``plan``; the later stages' price in
``later``, its GPU-hours from :mod:`ablations.pricing`), and continuing a study from a report's runs.csv
(``imported``). What a study is (its file, its
``--set`` overrides, its storage) is :mod:`ablations.studies`. Importing the package loads none of them: ``main``
and ``build_parser`` (the CLI's) load ``cli`` on first use."""

from __future__ import annotations

from typing import Any

__all__ = ["build_parser", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import cli

        return getattr(cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
