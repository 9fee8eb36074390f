"""Read a trial's TensorBoard run folder back: the ``diag/*`` scalars and JSON texts written by
:mod:`lit_modules.diagnostics` (used by :mod:`ablations.report` and its figures).

A run's diagnostics also travel without its folder: :func:`carried_text` packs the last logged epoch of the
diagnostics the report's tables and figures read (:data:`CARRIED`: the collapse count and its means, the per-layer
attention similarities, the per-site branch ratios and skip scales, the stream mixing's composite gains) into one
JSON cell, ``runs.csv``'s ``diagnostics`` column (:data:`DIAGNOSTICS_KEY`), and :func:`run_events` reads a run from
its event files, else from that cell: a study continued elsewhere with ``--import-runs`` keeps its reported runs'
collapse table and diagnostic figures. The full L×L similarity matrix and the parameters' evolution over epochs stay
in the event files.

Tags are read back under their internal names (``diag/...``; :func:`ablations.dashboard.internal_tag` undoes
TensorBoard's grouping). A run folder may hold several event files (the fit, the end-of-run summary, a resumed run); all are read.
Steps follow the diagnostics convention (``global_step`` = 0-based epoch index). When a step was written twice
(a resumed run repeating an epoch), the value read last wins.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from lit_modules.names import DIAGNOSTIC_TAGS

from ..dashboard import internal_tag

# Imported where they are used, not here: TensorBoard. Each takes from a tenth of a second to seconds to import, and
# the command-line tools start without them.

TEXT_SUFFIX = "/text_summary"  # torch's SummaryWriter.add_text appends it to the tag
RATIO_RE = re.compile(r"^diag/ratio_mean/(?P<sublayer>[^/]+)/(?P<layer>\d+)$")
SITE_RE = r"^diag/{kind}/(?P<sublayer>[^/]+)/(?P<layer>\d+)$"  # per (sublayer, layer): ratio_mean, skip_scale, ...
LAYER_RE = r"^diag/{kind}/(?P<layer>\d+)$"  # per layer: attn_sim_adj, attn_sim_k, stream_rms, ...
PARAM_RE = re.compile(r"^diag/param/(?P<sublayer>[^/]+)/(?P<layer>\d+)/(?P<key>[^/]+)$")
ATTN_SIM_JSON = DIAGNOSTIC_TAGS["attn_sim_full_json"]
SIMILAR_BLOCKS = DIAGNOSTIC_TAGS["similar_blocks"]  # DeepViT's collapse count
ATTN_SIM_ADJ_MEAN = DIAGNOSTIC_TAGS["attn_sim_adj_mean"]
ATTN_ENTROPY_MEAN = DIAGNOSTIC_TAGS["attn_entropy_mean"]
DIAGNOSTICS_KEY = "diagnostics"  # runs.csv's column and an imported trial's user attr: carried_text's JSON
#: the diagnostics a run carries without its event files, by their DIAGNOSTIC_TAGS name, at the last logged epoch
CARRIED = ("similar_blocks", "similar_blocks_fraction", "attn_sim_adj_mean", "attn_sim_k_mean", "attn_entropy_mean",
           "ratio_mean_avg", "composite_gain_forward", "composite_gain_backward",  # one value each
           "attn_sim_adj", "attn_sim_k",  # one per layer
           "ratio_mean", "skip_scale")  # one per (sublayer, layer)


@dataclass
class RunEvents:
    """``scalars[tag][step] = value`` and ``texts[tag][step] = str`` (text tags without torch's suffix)."""

    scalars: dict[str, dict[int, float]] = field(default_factory=dict)
    texts: dict[str, dict[int, str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.scalars and not self.texts

    def last_step(self, pattern: re.Pattern) -> int | None:
        steps = [s for tag, values in self.scalars.items() if pattern.match(tag) for s in values]
        return max(steps) if steps else None

    def last_value(self, tag: str) -> tuple[int, float] | None:
        """``(step, value)`` of a scalar tag at its last logged step; None if the run never logged it."""
        values = self.scalars.get(tag)
        if not values:
            return None
        step = max(values)
        return step, values[step]

    def ratio_means(self, step: int | None = None) -> dict[str, dict[int, float]]:
        """``{sublayer: {layer: ratio_mean}}`` at ``step`` (default: the last step with any ratio logged)."""
        return self.per_site("ratio_mean", step)

    def per_site(self, kind: str, step: int | None = None) -> dict[str, dict[int, float]]:
        """``{sublayer: {layer: value}}`` of a per-site diagnostic (``ratio_mean``, ``skip_scale``, ...) at ``step``
        (default: the last step it was logged)."""
        pattern = re.compile(SITE_RE.format(kind=re.escape(kind)))
        step = self.last_step(pattern) if step is None else step
        out: dict[str, dict[int, float]] = {}
        for tag, values in self.scalars.items():
            m = pattern.match(tag)
            if m and step in values:
                out.setdefault(m["sublayer"], {})[int(m["layer"])] = values[step]
        return out

    def per_layer(self, kind: str, step: int | None = None) -> dict[int, float]:
        """``{layer: value}`` of a per-layer diagnostic (``attn_sim_adj``, ``attn_sim_k``, ...) at ``step``
        (default: the last step it was logged)."""
        pattern = re.compile(LAYER_RE.format(kind=re.escape(kind)))
        step = self.last_step(pattern) if step is None else step
        return {int(m["layer"]): values[step] for tag, values in self.scalars.items()
                if (m := pattern.match(tag)) and step in values}

    def params(self) -> dict[tuple[str, int, str], dict[int, float]]:
        """``{(sublayer, layer, key): {step: value}}`` of the variant's own parameters over training."""
        out = {}
        for tag, values in self.scalars.items():
            m = PARAM_RE.match(tag)
            if m:
                out[m["sublayer"], int(m["layer"]), m["key"]] = dict(values)
        return out

    def json_matrix(self, tag: str = ATTN_SIM_JSON, step: int | None = None) -> tuple[int, list[list[float]]] | None:
        """``(step, matrix)`` of a JSON text tag at ``step`` (default: the last one), null -> NaN; None if absent."""
        values = self.texts.get(tag)
        if not values:
            return None
        step = max(values) if step is None else step
        if step not in values:
            return None
        try:
            rows = json.loads(values[step])
        except json.JSONDecodeError:
            return None
        return step, [[math.nan if v is None else float(v) for v in row] for row in rows]


def read_run(log_dir: str | Path | None, prefix: str = "diag/") -> RunEvents:
    """The ``prefix`` scalars and texts of one run folder (an empty RunEvents if it has no event files)."""
    if log_dir is None:
        return RunEvents()
    return _read_run(str(Path(log_dir).resolve()), prefix)


@lru_cache(maxsize=256)
def _read_run(log_dir: str, prefix: str) -> RunEvents:
    path = Path(log_dir)
    if not path.is_dir() or not any(path.glob("events.out.tfevents.*")):
        return RunEvents()
    from tensorboard.backend.event_processing import event_accumulator as ea_mod
    from tensorboard.util import tensor_util

    guidance = {ea_mod.SCALARS: 0, ea_mod.TENSORS: 0, ea_mod.IMAGES: 1, ea_mod.HISTOGRAMS: 1,
                ea_mod.COMPRESSED_HISTOGRAMS: 1, ea_mod.AUDIO: 1}
    acc = ea_mod.EventAccumulator(log_dir, size_guidance=guidance)
    acc.Reload()
    tags = acc.Tags()
    events = RunEvents()
    for tag in sorted(tags.get("scalars", [])):
        name = internal_tag(tag)  # TensorBoard's grouped tag -> the internal name (older runs: the same)
        if name.startswith(prefix):
            events.scalars[name] = {int(e.step): float(e.value) for e in acc.Scalars(tag)}
    for tag in sorted(tags.get("tensors", [])):
        name = tag[: -len(TEXT_SUFFIX)] if tag.endswith(TEXT_SUFFIX) else tag
        if not name.startswith(prefix):
            continue
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "text":
            continue
        texts = {}
        for e in acc.Tensors(tag):
            value = tensor_util.make_ndarray(e.tensor_proto)
            item = value.reshape(-1)[0] if value.size else b""
            texts[int(e.step)] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
        events.texts[name] = texts
    return events


def carried_text(events: RunEvents) -> str | None:
    """The :data:`CARRIED` diagnostics of a run at its last logged epoch as compact JSON: ``{"step": s, name: value
    | [value per layer] | {sublayer: [value per layer]}}`` (a value exactly, since the tables print it; the
    per-layer ones to 6 significant digits, since only figures draw them; null for a missing layer or a non-finite
    value), each family at its own last step and ``step`` the latest of them; None when the run logged none of them."""
    out: dict = {}
    steps = []
    for name in CARRIED:
        tag = DIAGNOSTIC_TAGS[name]
        if "{" not in tag:
            last = events.last_value(tag)
            if last is not None:
                steps.append(last[0])
                out[name] = last[1] if math.isfinite(last[1]) else None  # exact: the tables print these
            continue
        kind, sited = tag.split("/")[1], "{sublayer}" in tag
        step = events.last_step(re.compile((SITE_RE if sited else LAYER_RE).format(kind=re.escape(kind))))
        if step is None:
            continue
        steps.append(step)
        per_site = events.per_site(kind, step) if sited else {"": events.per_layer(kind, step)}
        lists = {site: [_short(layers[i]) if i in layers else None for i in range(max(layers) + 1)]
                 for site, layers in per_site.items()}
        out[name] = lists[""] if "" in lists else lists
    if not out:
        return None
    return json.dumps({"step": max(steps), **out}, separators=(",", ":"))


def from_carried(text: str | None) -> RunEvents:
    """The inverse of :func:`carried_text`: every carried value at the one step it names (an empty RunEvents for an
    empty or unreadable cell)."""
    try:
        packed = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return RunEvents()
    if not isinstance(packed, dict) or not isinstance(packed.get("step"), int):
        return RunEvents()
    step, events = packed["step"], RunEvents()
    for name, value in packed.items():
        if name not in CARRIED:
            continue
        tag = DIAGNOSTIC_TAGS[name]
        sites = value.items() if isinstance(value, dict) else [(None, value)]
        for sublayer, values in sites:
            if not isinstance(values, list):
                if isinstance(values, (int, float)):
                    events.scalars[tag] = {step: float(values)}
                continue
            for layer, v in enumerate(values):
                if isinstance(v, (int, float)):
                    events.scalars[tag.format(sublayer=sublayer, layer=layer)] = {step: float(v)}
    return events


def run_events(run) -> RunEvents:
    """A report run's diagnostics: its event files (``run.log_dir``), else the :data:`DIAGNOSTICS_KEY` cell its
    summary carries (a run imported from a runs.csv, a report made from one)."""
    events = read_run(run.log_dir)
    return events if not events.empty else from_carried(run.summary.get(DIAGNOSTICS_KEY))


def _short(value: float) -> float | None:
    return float(f"{value:.6g}") if math.isfinite(value) else None
