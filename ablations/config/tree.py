"""Nested settings, generically: a tree of frozen dataclasses read by its leaves' names, values checked against
their type hints, and the one merge of layered mappings.

- :func:`leaves`: every option of a dataclass tree (a field with a ``help`` in its metadata) by its own name, which
  is unique in the tree, with its path (``lr`` -> ``("optim", "lr")``) and type hint. A run's settings are written
  by these names (study files, ``--set``, stored results); ``optim: {lr: ...}`` and ``optim.lr`` name the same leaf.
- :func:`coerce`: a value checked against a leaf's type hint and normalised (an int where a float goes, a list
  where a tuple goes, a copy of a mapping), or a one-line ValueError saying what it must be.
- :func:`merge`: a study file is laid over its base file, a budget over the study, ``--set`` over a study's base:
  mappings merge key by key, recursively; anything else (a list, a number, a string) replaces.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Leaf:
    """An option of a dataclass tree: its ``name`` (the field's), ``path`` from the root, type ``hint`` and the
    field itself (``field.metadata``: ``help``, ``choices``)."""

    name: str
    path: tuple[str, ...]
    hint: Any
    field: dataclasses.Field

    @property
    def help(self) -> str:
        return self.field.metadata["help"]

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self.field.metadata.get("choices", ()))

    @property
    def is_mapping(self) -> bool:
        """Whether the leaf holds a mapping of named options (``residual_options``, ...)."""
        return _origin(self.hint) in (dict, Mapping)

    def default(self, root: Any) -> Any:
        """The leaf's value in ``root`` (an instance of the tree)."""
        for name in self.path:
            root = getattr(root, name)
        return root


def leaves(cls: type) -> dict[str, Leaf]:
    """The options of dataclass tree ``cls``: its own and its subtrees' fields that have a ``help``, in declaration
    order, by name (a name used twice in the tree is an error of the tree's declaration)."""
    out: dict[str, Leaf] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            found = {name: dataclasses.replace(leaf, path=(f.name, *leaf.path))
                     for name, leaf in leaves(hints[f.name]).items()}
        elif "help" in f.metadata:
            found = {f.name: Leaf(f.name, (f.name,), hints[f.name], f)}
        else:
            continue
        twice = set(found) & set(out)
        assert not twice, f"{cls.__name__}: options named twice: {sorted(twice)}"
        out |= found
    return out


def subtrees(cls: type) -> dict[str, type]:
    """The fields of ``cls`` that are dataclass trees of their own, by name."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}


def coerce(name: str, hint: Any, value: Any) -> Any:
    """``value`` as a leaf of type ``hint`` takes it (int -> float, list -> tuple, a mapping copied, None -> {} for
    a mapping, a number written as text -> float: YAML 1.1 reads ``1e-3`` as text); ValueError ``NAME must be
    <what>, got VALUE`` (one line) when it does not fit."""
    try:
        return _coerce(hint, value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {describe(hint)}, got {value!r}") from None


def describe(hint: Any) -> str:
    """What a value of type ``hint`` is, in words (``an integer or None``)."""
    if _origin(hint) in (types.UnionType, typing.Union):
        return " or ".join(describe(member) for member in typing.get_args(hint))
    if _origin(hint) is typing.Literal:
        return " or ".join(repr(v) for v in typing.get_args(hint))
    return _WORDS.get(_origin(hint), "a value")


def _coerce(hint: Any, value: Any) -> Any:
    origin = _origin(hint)
    if origin in (types.UnionType, typing.Union):  # the first member that takes it; None only for None
        for member in typing.get_args(hint):
            try:
                return _coerce(member, value)
            except (TypeError, ValueError):
                continue
        raise ValueError(value)
    if origin is typing.Literal:
        if value in typing.get_args(hint):
            return value
        raise ValueError(value)
    return _SCALARS.get(origin, _any)(value)


def _origin(hint: Any) -> Any:
    if hint is type(None) or hint is None:
        return type(None)
    return typing.get_origin(hint) or hint


def _none(value: Any) -> None:
    if value is not None:
        raise ValueError(value)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(value)
    return value


def _float(value: Any) -> float:
    if isinstance(value, str):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(value)
    return float(value)


def _of_type(kind: type) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, kind):
            raise ValueError(value)
        return value

    return check


def _floats(value: Any) -> tuple[float, ...]:
    if not isinstance(value, (tuple, list)) or any(isinstance(v, (bool, str)) for v in value):
        raise ValueError(value)
    return tuple(_float(v) for v in value)


def _mapping(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(value)
    return dict(value)


def _any(value: Any) -> Any:
    return value


_SCALARS: dict[Any, Callable[[Any], Any]] = {
    type(None): _none, int: _int, float: _float, str: _of_type(str), bool: _of_type(bool), tuple: _floats,
    dict: _mapping, Mapping: _mapping,
}
_WORDS = {type(None): "None", int: "an integer", float: "a number", str: "a string", bool: "true or false",
          tuple: "a list of numbers", dict: "a mapping of option names to values",
          Mapping: "a mapping of option names to values"}


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
