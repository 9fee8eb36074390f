"""The command-line options of a settings tree, generated from its fields and type hints (``python -m
ablations.train``'s ``--lr``, ``--embed-dim``, ``--no-augment``, ``--residual-option KEY=VALUE``, ...): every option of
:data:`ablations.config.OPTIONS` is a flag without further edits, and a value that does not fit its hint is argparse's
one-line error."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any, get_args

from ..cli import NONE_WORDS, parse_value
from .tree import Leaf, coerce, describe


def option_name(leaf: Leaf) -> str:
    """The flag of a settings leaf: ``embed_dim`` -> ``--embed-dim``; a mapping of options is set one option at a time,
    ``residual_options`` -> ``--residual-option KEY=VALUE`` (repeatable)."""
    name = leaf.name[: -len("s")] if leaf.is_mapping else leaf.name
    return "--" + name.replace("_", "-")


def add_options(groups: Mapping[str, Any], options: Mapping[str, Leaf], help_of: Callable[[Leaf], str]) -> None:
    """One option per leaf of a settings tree (:func:`ablations.config.tree.leaves`), in the argument group of the
    top-level field it is in (``groups``: the first element of its path), typed by its type hint: a number or text
    (``--lr X``), a switch for a bool (``--augment`` / ``--no-augment``), ``X X ...`` for a tuple, ``KEY=VALUE`` for a
    mapping, ``None`` where the hint allows it. The value is checked against the hint when the settings are built; a
    leaf not given is left out of the namespace. ``help_of(leaf)``: its help line."""
    for name, leaf in options.items():
        kind = _argparse_kind(leaf)
        groups[leaf.path[0]].add_argument(
            option_name(leaf), dest=name, default=argparse.SUPPRESS,
            help=help_of(leaf), **kind)


def _argparse_kind(leaf: Leaf) -> dict[str, Any]:
    if leaf.is_mapping:
        return {"action": "append", "metavar": "KEY=VALUE"}
    if leaf.hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    words = describe(leaf.hint)
    if words == "a list of numbers":
        return {"type": _typed(leaf), "nargs": "+", "metavar": "X"}
    metavar = {"an integer": "N", "a number": "X", "a string": "NAME", "true or false": "true|false"}
    return {"type": _typed(leaf), "metavar": "|".join(metavar.get(w, w.strip("'")) for w in words.split(" or "))}


def _typed(leaf: Leaf) -> Callable[[str], Any]:
    """A command-line word as the leaf takes it (its elements, for a tuple): text for text, else read as YAML
    (:func:`parse_value`), then checked against the hint; a value that does not fit is argparse's one-line error."""
    hint = get_args(leaf.hint)[0] if describe(leaf.hint) == "a list of numbers" else leaf.hint
    text_ok = "a string" in describe(hint)

    def parse(text: str) -> Any:
        value = text if text_ok and text.strip() not in NONE_WORDS else parse_value(text)
        try:
            return coerce(leaf.name, hint, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse
