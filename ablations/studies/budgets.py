"""What a study's budget changes against its default, in one line (the run and the dry run print it first).

A budget is a set of overrides of the study's default (:mod:`ablations.studies.spec`): the small ones shrink it
(epochs, seeds, width, tuning rates), the larger ones move it to a GPU's data and depth. The line names each field,
axis, row and tuning setting that differs, the trials before and after, and whether the data stays or changes: a
budget that would silently train on other images is the surprise it exists to prevent.
"""

from __future__ import annotations

from typing import Any

from .spec import DATA_FIELDS, StudySpec, load_spec


def _values(values: list) -> str:
    """An axis' or a grid's values, short: up to six listed, else the first three, an ellipsis and the count."""
    shown = values if len(values) <= 6 else [*values[:3], "…"]
    return "[" + ", ".join(map(str, shown)) + "]" + (f" ({len(values)})" if len(values) > 6 else "")


def _size(spec: StudySpec) -> str:
    return f"{spec.size}+{spec.tune_stage().size}" if spec.tune is not None else str(spec.size)


def _changed(old: dict, new: dict, skip: tuple[str, ...] = ()) -> list[str]:
    """``key old -> new`` for every key whose value differs (a key only one side sets: ``unset`` on the other)."""
    out = []
    for key in dict.fromkeys([*old, *new]):
        if key in skip or old.get(key, None) == new.get(key, None):
            continue
        out.append(f"{key} {old.get(key, 'unset')} -> {new.get(key, 'unset')}")
    return out


def budget_line(spec: StudySpec) -> str | None:
    """What ``spec``'s budget changes against the study's default budget (None for the default itself, or when the
    default cannot be loaded). ``--set`` fields apply to both and are left out."""
    if spec.budget == "default" or not spec.source:
        return None
    try:
        default = load_spec(spec.source)
    except ValueError:
        return None
    sets = tuple(spec.overrides)
    data_keys = tuple(k for k in DATA_FIELDS if k not in sets)
    parts = _changed(default.base, spec.base, skip=(*sets, *data_keys))
    for axis in dict.fromkeys([*default.axes, *spec.axes]):
        old, new = default.axes.get(axis, []), spec.axes.get(axis, [])
        if old != new:
            parts.append(f"{axis} {_values(old)} -> {_values(new)}")
    added = [v.label for v in spec.variants if v.label not in {d.label for d in default.variants}]
    dropped = [v.label for v in default.variants if v.label not in {s.label for s in spec.variants}]
    parts += [f"rows added: {', '.join(added)}"] if added else []
    parts += [f"rows left out: {', '.join(dropped)}"] if dropped else []
    parts += _tune_changes(default, spec)
    text = f"budget '{spec.budget}' against the study's default: " + (", ".join(parts) or "the same settings")
    text += f"; trials {_size(default)} -> {_size(spec)}"
    data = _changed(default.base, spec.base, skip=tuple(k for k in spec.base | default.base if k not in data_keys))
    if data:
        return text + "; its data changes: " + ", ".join(data)
    kept = [f"{k}={spec.base[k]}" for k in data_keys if k in spec.base]
    return text + "; the data stays" + (f" ({', '.join(kept)})" if kept else "")


def _tune_changes(default: StudySpec, spec: StudySpec) -> list[str]:
    old, new = default.tune, spec.tune
    if old is None and new is None:
        return []
    if old is None or new is None:
        return ["tuning stage " + ("added" if old is None else "left out")]
    out: list[Any] = []
    for name, a, b in (("tuning rates", list(old.lr), list(new.lr)), ("tuning seeds", list(old.seeds), list(new.seeds)),
                       ("tuning bounds", old.bounds, new.bounds)):
        if a != b:
            text = [_values(x) if isinstance(x, list) else "none (one grid, never extended)" if x is None
                    else list(x) for x in (a, b)]
            out.append(f"{name} {text[0]} -> {text[1]}")
    return out
