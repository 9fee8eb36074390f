"""Nested settings, generically: the one merge of layered mappings and the check of a mapping's keys.

A study file is laid over its base file, a budget over the study, ``--set`` over a study's base, each with
:func:`merge`: mappings merge key by key, recursively; anything else (a list, a number, a string) replaces.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any


def merge(earlier: Mapping, later: Mapping, at: Mapping[str, Callable[[Any, Any], Any]] | None = None) -> dict:
    """``later`` laid over ``earlier`` (both left as they are): a mapping in both merges key by key, recursively; a
    list or a value replaces; a key only in ``earlier`` stays, in its place (new keys follow in ``later``'s order).
    ``at`` names keys, at any depth, whose two values another function lays over each other (e.g. the recipe rule
    of a run's settings, :func:`ablations.config.layer`)."""
    out = copy.deepcopy(dict(earlier))
    for key, value in later.items():
        if at and key in at and isinstance(value, Mapping):
            out[key] = at[key](out.get(key) or {}, value)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value, at)
        else:
            out[key] = copy.deepcopy(value)
    return out


def check_keys(mapping: Any, valid: tuple, where: str) -> None:
    """A one-line ValueError naming ``where`` and the valid keys, for a mapping with another key or for no mapping."""
    if not isinstance(mapping, dict):
        raise ValueError(f"{where} must be a mapping with keys: {', '.join(valid)}")
    for key in mapping:
        if key not in valid:
            raise ValueError(f"{where}: unknown key '{key}'; valid keys: {', '.join(valid)}")
