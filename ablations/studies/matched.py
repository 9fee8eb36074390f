"""Parameter-matched controls: the MLP width at which a row has another row's parameter count at the same point.

A control declared ``params_of: <label>`` in a study file is its residual with the MLP widened (or narrowed) until
its parameter count is the nearest it can be to ``<label>``'s, resolved per study point: at every depth, width,
dataset and budget the study trains, not only the one its author counted for. The MLP hidden width is a whole
number of units (``int(embed_dim * mlp_ratio)`` in every block), so the match is to the nearest unit; a study file
whose control cannot come within :data:`TOLERANCE` of its target is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any

from ..config import RunConfig

# Imported where they are used, not here: the datasets (data: torch), torch and the model (lit_modules: torch). Each
# takes from a tenth of a second to seconds to import, and the command-line tools start without them.

#: the largest relative parameter difference a resolved control may keep (the protocol's "within 1%")
TOLERANCE = 0.01
_COUNTS: dict[str, int] = {}  # parameter counts by backbone configuration, per process


def param_count(fields: dict[str, Any]) -> int:
    """Parameters of the backbone that a run with these RunConfig ``fields`` trains."""
    from data import dataset_shape

    config = RunConfig.from_dict(fields)
    model_config = config.model_config(dataset_shape(config))
    key = json.dumps(dataclasses.asdict(model_config), sort_keys=True, default=repr)
    if key not in _COUNTS:
        _COUNTS[key] = _count(model_config)
    return _COUNTS[key]


def _count(model_config) -> int:
    import torch

    from lit_modules import VisionTransformer

    try:  # no memory and no init work: only the shapes are needed
        with torch.device("meta"):
            model = VisionTransformer(model_config, init_seed=0)
    except (RuntimeError, NotImplementedError):  # a module whose constructor computes on its tensors
        model = VisionTransformer(model_config, init_seed=0)
    return sum(p.numel() for p in model.parameters())


def ratio_for(hidden: int, dim: int) -> float:
    """The ``mlp_ratio`` whose hidden width ``int(dim * ratio)`` is exactly ``hidden`` (``hidden / dim``, or the
    next float above it where the product rounds down)."""
    ratio = hidden / dim
    while int(dim * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def matched_mlp_ratio(fields: dict[str, Any], target: int, label: str, of: str) -> float:
    """The ``mlp_ratio`` at which a run with ``fields`` has the parameter count nearest ``target`` (that of row
    ``of``); ValueError (one line) when the nearest is not within :data:`TOLERANCE`."""
    config = RunConfig.from_dict(fields)
    dim = config.embed_dim
    count = functools.cache(lambda hidden: param_count(fields | {"mlp_ratio": ratio_for(hidden, dim)}))
    start = max(1, int(dim * config.mlp_ratio))
    per_unit = (count(start + dim) - count(start)) / dim  # the count is affine in the hidden width
    guess = max(1, round(start + (target - count(start)) / per_unit))
    hidden = min((h for h in (guess - 1, guess, guess + 1) if h >= 1), key=lambda h: (abs(count(h) - target), h))
    if abs(count(hidden) / target - 1) > TOLERANCE:
        raise ValueError(f"variant '{label}' cannot match the parameter count of '{of}' ({target:,}) by its MLP "
                         f"width: the nearest is {count(hidden):,} at mlp_ratio {ratio_for(hidden, dim):g}")
    return ratio_for(hidden, dim)
