"""Where a grid point's runs are, for the stages after the reported grid: the (row, depth) cell its runs carry (the
row labelled with its extra axes, the depth its configuration resolves to in a study without a depth axis), the
(variant, depth) cell a dry run prices it by (as a stored trial's parameters give it), and a study's first look
(its runs without a second look's)."""

from __future__ import annotations

import dataclasses
import math

from ..report.load import row_label


def run_cell(spec, point: dict) -> tuple[str, int | None]:
    """The (row, depth) of ``point`` as its runs carry them (``Run.row``, ``Run.depth``)."""
    extras = tuple((a, point[a]) for a in spec.axes if a not in ("depth", "seed"))
    depth = point["depth"] if "depth" in point else spec.run_config(point).depth  # a study without a depth axis
    return row_label(point["variant"], extras), depth


def price_cell(point: dict) -> tuple[str, int | None]:
    """The (variant, depth) of ``point`` as a stored trial's parameters give it: what its cost is measured by."""
    return point["variant"], point.get("depth")


def first_look_runs(spec, data):
    """``data`` without a second look's runs (its reported seeds and their contending rates): the first look."""
    seeds = {int(s) for s in spec.axes.get("seed", [])}
    first = [r for r in data.contend_runs if not seeds or r.seed in seeds]
    return dataclasses.replace(data, runs=[r for r in data.runs if r.phase != "round"], contend_runs=first)


def same_rate(a, b) -> bool:
    """Whether two learning rates are the same rate (a stored float and a computed one)."""
    return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-9)
