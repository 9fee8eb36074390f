"""``--set FIELD=VALUE``: change a study's base from the command line, and the rule that keeps a stored study to one
configuration.

    python -m ablations.run --study residual_variants --budget smoke --set max_epochs=2 --set precision=32-true
    # -> stored study 'residual_variants-smoke+max_epochs=2+precision=32-true'

- A value is read as YAML (``2``, ``32-true``, ``1e-3``, ``true``, ``null``, ``[0.9, 0.999]``) and the field is any
  :class:`~ablations.config.RunConfig` option, by its flat name (``lr``) or its path in the tree (``optim.lr``); it
  is laid over the study's base (as if the study file's ``base`` had it: :func:`ablations.config.layer`), so the
  tuning stage trains with it too. A field the study varies itself (a grid axis, a field a variant sets, the residual and its
  options, the learning rate of a study with a tuning stage) is refused: the study, not the command line, decides it.
- **Naming rule.** A study never mixes trials of two configurations: a ``--set`` that changes what a trial trains
  runs in its own stored study, named ``<study name>+FIELD=VALUE+...`` (fields sorted by name; the value as the
  configuration normalises it, so ``max_epochs=02`` and ``max_epochs=2`` are one study; a value with characters other
  than letters, digits and ``._,-`` is written as ``h`` + the first 8 hex digits of its sha1). Its tuning stage is
  that name + ``-tune``. Fields that do not change results (:data:`RUN_ONLY`: ``threads``, ``data_dir``) are exempt.
- The overrides are stored with the study (user attr ``overrides``: field -> value text). Continuing a stored study
  (e.g. ``--study-name NAME``) with other overrides than it was run with is refused in one line.
- ``python -m ablations.report --study NAME --set ...`` (the same arguments) finds the same study, and the report
  says which overrides it ran with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from ..cli import parse_value
from ..config import OPTIONS, flat, layer
from ..config.tree import coerce
from ..recipes import RECIPE_FIELDS

#: Fields that do not change what a trial trains: a ``--set`` of them needs no study of its own.
RUN_ONLY = ("threads", "data_dir")
#: Study user attr holding the overrides a stored study was run with (field -> value text).
OVERRIDES_ATTR = "overrides"
_SAFE = re.compile(r"[A-Za-z0-9._,-]*")


def parse_sets(items: Sequence[str] | None) -> dict[str, Any]:
    """``["max_epochs=2", ...]`` -> ``{"max_epochs": 2, ...}``, each field a RunConfig option (its flat name, or its
    path: ``optim.lr`` is ``lr``) and each value of the option's type. ValueError (one line) for a malformed item, an
    unknown field, a bad value or a field given twice."""
    values: dict[str, Any] = {}
    for item in items or ():
        path, sep, text = item.partition("=")
        name = next(iter(flat({path.strip(): None}))) if path.strip() else ""
        if not sep or not name:
            raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
        if name not in OPTIONS:
            raise ValueError(f"--set: unknown field {name!r}; valid fields: {', '.join(OPTIONS)}")
        if name in values:
            raise ValueError(f"--set {name} is given twice; give it once")
        value = parse_value(text)
        try:
            coerce(name, OPTIONS[name].hint, value)
        except ValueError as exc:
            raise ValueError(f"--set {name}: {exc}") from None
        values[name] = value
    return values


def value_text(name: str, value: Any) -> str:
    """The value as study names and the stored attr write it: normalised by the field's type (``2`` not ``2.0``
    for an int, ``0.001`` for ``1e-3``), ``true``/``false``/``none``, lists comma-joined."""
    value = coerce(name, OPTIONS[name].hint, value)
    if value is None or isinstance(value, bool):
        return {None: "none", True: "true", False: "false"}[value]
    if isinstance(value, (tuple, list)):
        return ",".join(repr(v) if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return repr(value) if isinstance(value, float) else str(value)


def name_suffix(overrides: dict[str, str]) -> str:
    """``+FIELD=VALUE`` per override, sorted by field; a value with unsafe characters as its hash (module doc)."""
    parts = []
    for name in sorted(overrides):
        text = overrides[name]
        if not _SAFE.fullmatch(text):
            text = "h" + hashlib.sha1(text.encode()).hexdigest()[:8]
        parts.append(f"+{name}={text}")
    return "".join(parts)


def describe(overrides: dict[str, str]) -> str:
    """``max_epochs=2, precision=32-true`` (sorted), or ``none``."""
    return ", ".join(f"{k}={overrides[k]}" for k in sorted(overrides)) or "none"


def apply_sets(spec, sets: dict[str, Any]):
    """The study with ``sets`` over its base and its ``overrides`` (the result-changing ones, as text: they name the
    stored study, :attr:`StudySpec.study_name`). ValueError (one line) for a field the study varies itself, or a
    value that makes a point's configuration invalid."""
    if not sets:
        return spec

    owners = _owners(spec)
    for name in sets:
        if name in owners:
            raise ValueError(f"--set {name}: {owners[name]}; the study decides it, not --set (edit the study file, or "
                             "copy it, to change it)")
    if "recipe" in sets:
        varied = sorted(set(RECIPE_FIELDS) & set(owners))
        if varied:
            raise ValueError(f"--set recipe: the study varies {', '.join(varied)} (recipe fields), which a new recipe "
                             "would reset; edit the study file instead")
    texts = {name: value_text(name, value) for name, value in sets.items() if name not in RUN_ONLY}
    changed = dataclasses.replace(spec, base=layer(spec.base, sets),
                                  overrides={**spec.overrides, **texts})
    _check_points(changed)
    return changed


def _owners(spec) -> dict[str, str]:
    """Fields the study varies itself -> why (a grid axis, a variant's own, the residual, tuned)."""
    owners = {"residual": "each variant sets its residual", "residual_options": "each variant sets its options"}
    for axis, values in spec.axes.items():
        owners[axis] = f"{axis} is an axis of the study (values {list(values)})"
    for variant in spec.variants:
        for name in variant.overrides:
            owners.setdefault(name, f"variant '{variant.label}' sets {name} itself")
    if spec.tune is not None:
        owners.setdefault("lr", "the tuning stage chooses each variant's lr")
    return owners


def _check_points(spec) -> None:
    """Every point's configuration (the tuning stage's too) with the new base: RunConfig's one-line ValueError,
    prefixed with ``--set``."""
    stages = [spec] + ([spec.tune_stage()] if spec.tune is not None else [])
    for stage in stages:
        points = stage.grid() if stage.kind == "grid" else [{"variant": v.label} for v in stage.variants]
        for params in points:
            try:
                stage.run_config(params)
            except ValueError as exc:
                raise ValueError(f"--set: {exc}") from None


def check_stored(study, spec) -> None:
    """Record the study's overrides on a new stored study; refuse (one line) to continue one that was run with
    others. A study stored before ``--set`` existed (trials, no attr) was run without overrides."""
    stored = study.user_attrs.get(OVERRIDES_ATTR)
    if stored is None and not study.get_trials(deepcopy=False):
        study.set_user_attr(OVERRIDES_ATTR, dict(spec.overrides))
        return
    stored = stored or {}
    if stored != spec.overrides:
        raise ValueError(f"study '{study.study_name}' in the storage was run with overrides {describe(stored)}, this "
                         f"command has {describe(spec.overrides)}: one study never mixes two configurations; drop "
                         "--study-name (the name follows the overrides) or pass the overrides it was run with")
