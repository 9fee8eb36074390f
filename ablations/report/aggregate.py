"""A grid study's curves across seeds: per (variant, depth) cell the mean of every per-epoch curve with its 95%
interval, the paired difference to the study's baseline per epoch, and the cell's summary means; written to
TensorBoard as one run per cell beside the per-seed runs, with a Custom Scalars layout, HParams rows and the
claims as text (:func:`write_tensorboard`). The HTML report (:mod:`.html`) draws its curves from the same
:func:`aggregate`; the study runner refreshes the TensorBoard runs after each trial (:func:`refresh`).

**Curves.** A run's curves come from its TensorBoard event files when they are there (every scalar of ``train/``,
``val/``, ``test/`` and ``diag/``), else from the run summary (``val_acc_curve``, ``test_acc_curve``,
``train_loss_curve``), else from the per-epoch validation accuracy a ``runs.csv`` carries (``val_acc_curve``): an
imported study, or one regenerated from ``runs.csv`` alone, gets its ``val/acc`` aggregate. The x axis is the epoch
(1-based): Lightning's epoch metrics are logged at the optimizer step, which the run's ``epoch`` scalar maps back
to its epoch; diagnostics are logged at the 0-based epoch index. Only completed runs enter; a diverged run enters
with the epochs that have finite values (so n can fall after the epoch it diverged).

**Intervals.** At each epoch, over the n runs (seeds) with a finite value: mean ± t_{0.975, n−1} · s / √n (sample
sd, ddof = 1); an epoch with one run has no interval, its band is the mean itself (TensorBoard's margin charts need
a lower and an upper value at every step). The paired difference of a variant to the baseline (``standard`` with the
same extra grid axes, at the same depth) is the same interval over the per-seed differences d_s = v_s − b_s of the
seeds both have at that epoch: the paired t interval of :func:`ablations.report.stats.paired`, per epoch.

**TensorBoard** (``<runs>/<study>/agg``): run ``agg/<variant>/depth=<d>`` (then ``<axis>=<value>`` for other grid
axes) holds, at step = epoch,

- ``<tag>/<where>/mean``, ``…/lower``, ``…/upper``, ``…/n`` for each curve, ``<tag>`` its TensorBoard tag
  (``2_val/acc``, ``4_diag.ratio/ratio_mean/attn/00``, :func:`ablations.dashboard.display_tag`) and ``<where>`` the
  cell's ``depth=<d>`` (and other axes), not its variant: every variant's run of a depth holds the same tags, so a
  margin chart is one series that TensorBoard draws once per run (variant), and no run lacks a chart's tags;
- ``0_paired/<tag>/<where>/delta``, ``…/lower``, ``…/upper``, ``…/n``: the paired difference to the baseline
  (:data:`PAIRED_TAGS`; accuracies in percentage points, as the report's tables; group ``0_paired`` sorts first in
  the Time Series tab);
- the ``hp/*`` summary metrics (means over the cell's ok runs) and :data:`AGG_METRICS` (n, the interval of the
  study metric's mean, the learning rate), with an HParams entry of the cell's variant and axes (no seed), so the
  HParams table shows one row per variant beside the per-seed rows. Every run of the study lists the same metrics
  (:data:`STUDY_METRICS`, the study's HParams experiment): a per-seed row leaves the aggregate-only columns empty.

The run ``agg`` itself holds the Custom Scalars layout (margin charts: one category per metric, one chart per
depth whose one series every variant's run draws; the paired-Δ categories first; diagnostics in closed categories),
the claims as text and the study's HParams experiment (its axes and the tuned rate), so that
``tensorboard --logdir <runs>/<study>/agg`` opens on the aggregates with every chart and column there. The whole ``agg`` folder is rebuilt and swapped in at once, under a lock (several workers refresh it).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import layout as paths
from ..dashboard import display_tag, hparam_value, safe, short, study_experiment_pb, write_study_hparams
from ..training import HP_METRICS, HP_SUMMARY_KEYS
from .claims import claims_table
from .events import read_run
from .load import DIVERGED_KEY, Run, StudyData, collect, finite, first_line
from .stats import CONFIDENCE

# Imported where they are used, not here: SciPy and TensorBoard. Each takes from a tenth of a second to seconds to
# import, and the command-line tools start without them.

AGG_RUN = "agg"  # the aggregate runs' folder under a study's TensorBoard root (layout.runs_dir)
ALL = "all"  # a cell's place in the grid when the grid has no depth or other axes (CellAggregate.where)
PAIRED_GROUP = "0_paired"
#: Curves that get a paired difference to the baseline (the ones a reader compares variants on).
PAIRED_TAGS: tuple[str, ...] = ("val/acc", "test/acc", "val/loss", "train/loss", "train/acc")
#: Curves shown first, in open categories of the layout (diagnostics follow in closed ones).
MAIN_TAGS: tuple[str, ...] = ("val/acc", "test/acc", "val/loss", "train/loss", "train/acc", "val/acc_top5")
#: HParams metrics only the aggregate rows have: seeds, the interval of the study metric's mean, the learning rate.
AGG_METRICS: tuple[str, ...] = ("hp/n_seeds", "hp/ci_low", "hp/ci_high", "hp/lr")
#: The metric columns of a study's HParams experiment: the same for every run, per-seed or aggregate.
STUDY_METRICS: tuple[str, ...] = (*HP_METRICS, *AGG_METRICS)
#: Summary keys a run records its curves under (from epoch 1), when its event files are not at hand.
SUMMARY_CURVES = {"val_acc_curve": "val/acc", "test_acc_curve": "test/acc", "train_loss_curve": "train/loss"}
_CURVE_PREFIXES = ("train/", "val/", "test/", "diag/")
_LAYER = re.compile(r"/\d+(/|$)")


@dataclass(frozen=True)
class Band:
    """Mean of n values with its interval (lower = upper = mean when n = 1: no interval)."""

    mean: float
    lower: float
    upper: float
    n: int


def band(values: Iterable[Any], confidence: float = CONFIDENCE) -> Band | None:
    """Mean ± t_{(1+confidence)/2, n−1} · s / √n of the finite ``values`` (None when there are none)."""
    vals = [float(v) for v in values if finite(v)]
    if not vals:
        return None
    n = len(vals)
    mean = math.fsum(vals) / n
    if n < 2:
        return Band(mean, mean, mean, 1)
    from scipy import stats

    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return Band(mean, mean - half, mean + half, n)


# --- a run's curves -----------------------------------------------------------------------------------------------
def event_curves(log_dir: Path | None) -> dict[str, dict[int, float]]:
    """``{internal tag: {epoch (1-based): value}}`` of a run folder's ``train/``, ``val/``, ``test/`` and ``diag/``
    scalars ({} without event files). Lightning's metrics map to epochs through the run's ``epoch`` scalar; a step
    without one is dropped."""
    events = read_run(log_dir, prefix="")
    epoch_at = {step: int(round(value)) for step, value in events.scalars.get("epoch", {}).items()}
    curves: dict[str, dict[int, float]] = {}
    for tag, values in events.scalars.items():
        if not tag.startswith(_CURVE_PREFIXES):
            continue
        if tag.startswith("diag/"):  # diagnostics: step = 0-based epoch index
            points = {step + 1: v for step, v in values.items()}
        else:
            points = {epoch_at[step] + 1: v for step, v in sorted(values.items()) if step in epoch_at}
        points = {e: float(v) for e, v in points.items() if finite(v)}
        if points:
            curves[tag] = points
    return curves


def run_curves(run: Run) -> dict[str, dict[int, float]]:
    """A run's per-epoch curves: its event files' (:func:`event_curves`), completed by the curves its summary
    records (:data:`SUMMARY_CURVES`) and the validation curve a runs.csv carries (``Run.curve``)."""
    curves = event_curves(run.log_dir) if run.log_dir is not None else {}
    for key, tag in SUMMARY_CURVES.items():
        values = run.summary.get(key)
        if tag not in curves and isinstance(values, list):
            points = {e: float(v) for e, v in enumerate(values, start=1) if finite(v)}
            if points:
                curves[tag] = points
    if "val/acc" not in curves and run.curve:
        curves["val/acc"] = {e: float(v) for e, v in run.curve.items() if finite(v)}
    return curves


# --- cells --------------------------------------------------------------------------------------------------------
@dataclass
class CellAggregate:
    """One row × depth cell of a grid study, aggregated over its completed runs (seeds)."""

    row: str
    variant: str
    depth: int | None
    extras: tuple
    seeds: list[int]  # seeds of the completed runs
    curves: dict[str, dict[int, Band]] = field(default_factory=dict)  # internal tag -> epoch -> band over seeds
    deltas: dict[str, dict[int, Band]] = field(default_factory=dict)  # vs the baseline, paired by seed
    baseline: str | None = None  # the row the deltas are against (None: the baseline itself, or none)
    summary: dict[str, float] = field(default_factory=dict)  # HP summary key -> mean over the ok runs
    metric: Band | None = None  # the study metric (StudyData.metric) over the ok runs: the main table's mean
    lr: float | None = None  # the learning rate every run of the cell trained at (None: mixed or not recorded)
    n_ok: int = 0

    @property
    def path(self) -> str:
        """``<variant>/depth=<d>[/<axis>=<value> ...]``: the cell's run folder."""
        return "/".join([safe(self.variant), self.where] if self.where != ALL else [safe(self.variant)])

    @property
    def where(self) -> str:
        """``depth=<d>[/<axis>=<value> ...]`` (:data:`ALL` without either): the cell's place in the grid, the part
        of its tags that every variant there shares."""
        parts = ([] if self.depth is None else [f"depth={self.depth}"])
        return "/".join(parts + [f"{safe(str(a))}={safe(short(v))}" for a, v in self.extras]) or ALL


def aggregate(data: StudyData, curves_of: Callable[[Run], Mapping[str, Mapping[int, float]]] = run_curves,
              confidence: float = CONFIDENCE) -> list[CellAggregate]:
    """Every row × depth cell with a completed report-phase run, in the table's order: per-epoch bands of each
    curve, paired differences to the baseline row (same depth) for :data:`PAIRED_TAGS`, summary means."""
    complete = {r.number: r for r in data.runs if r.state == "complete"}
    curves = {number: curves_of(run) for number, run in complete.items()}
    cells = []
    for row in data.rows:
        for depth in data.depths or [None]:
            runs = [r for r in data.by_row_depth(row, depth) if r.state == "complete"]
            if not runs:
                continue
            cell = CellAggregate(row=row, variant=data.row_variant.get(row, row), depth=depth,
                                 extras=data.row_extras.get(row, ()), seeds=sorted({r.seed for r in runs
                                                                                    if r.seed is not None}))
            for tag in sorted({tag for r in runs for tag in curves[r.number]}):
                epochs = sorted({e for r in runs for e in curves[r.number].get(tag, {})})
                cell.curves[tag] = {e: b for e in epochs if (b := band(
                    [curves[r.number].get(tag, {}).get(e) for r in runs], confidence)) is not None}
            _paired_deltas(cell, data, runs, curves, confidence)
            _summaries(cell, runs, confidence)
            cells.append(cell)
    return cells


def _paired_deltas(cell: CellAggregate, data: StudyData, runs: Sequence[Run], curves: Mapping[int, Mapping],
                   confidence: float) -> None:
    """The cell's paired differences to its baseline row at the same depth, seed by seed, per epoch of each of
    :data:`PAIRED_TAGS` (``cell.deltas``), and the baseline they are against when any seed pairs."""
    base_row = data.baseline_row(cell.row)
    if base_row is None or base_row == cell.row:
        return
    base = {r.seed: r for r in data.by_row_depth(base_row, cell.depth) if r.state == "complete"}
    own = {r.seed: r for r in runs}
    seeds = sorted(s for s in set(own) & set(base) if s is not None)
    cell.baseline = base_row if seeds else None
    for tag in PAIRED_TAGS:
        epochs = sorted({e for s in seeds for e in curves[own[s].number].get(tag, {})})
        deltas = {}
        for e in epochs:
            diffs = [curves[own[s].number].get(tag, {}).get(e, math.nan)
                     - curves[base[s].number].get(tag, {}).get(e, math.nan) for s in seeds]
            b = band(diffs, confidence)
            if b is not None:
                deltas[e] = b
        if deltas:
            cell.deltas[tag] = deltas


def _summaries(cell: CellAggregate, runs: Sequence[Run], confidence: float) -> None:
    """The cell's summary means over its ok runs (the divergence share over all), its metric's band and the
    learning rate all its runs trained at."""
    ok = [r for r in runs if r.ok]
    cell.n_ok = len(ok)
    for key in HP_SUMMARY_KEYS:
        pool = runs if key == DIVERGED_KEY else ok
        values = [float(r.summary[key]) for r in pool if finite(r.summary.get(key))]
        if values:
            cell.summary[key] = math.fsum(values) / len(values)
    cell.metric = band([r.acc for r in ok], confidence)
    lrs = {r.lr for r in runs}
    cell.lr = lrs.pop() if len(lrs) == 1 else None


# --- TensorBoard ----------------------------------------------------------------------------------------------------
def curve_tags(tag: str, cell: CellAggregate) -> tuple[str, str, str, str]:
    """(mean, lower, upper, n) TensorBoard tags of a cell's curve ``tag`` (an internal name): the same for every
    variant at the cell's depth and axes (:attr:`CellAggregate.where`)."""
    head = f"{display_tag(tag)}/{cell.where}"
    return f"{head}/mean", f"{head}/lower", f"{head}/upper", f"{head}/n"


def delta_tags(tag: str, cell: CellAggregate) -> tuple[str, str, str, str]:
    """(delta, lower, upper, n) TensorBoard tags of a cell's paired difference on ``tag`` (an internal name)."""
    head = f"{PAIRED_GROUP}/{tag}/{cell.where}"
    return f"{head}/delta", f"{head}/lower", f"{head}/upper", f"{head}/n"


def delta_scale(tag: str) -> float:
    """What a paired difference on ``tag`` is written in: accuracies in percentage points (×100), as the report's
    tables give them; losses as they are."""
    return 100.0 if tag.endswith("acc") else 1.0


def layout(cells: Sequence[CellAggregate], baseline: str) -> Any:
    """The Custom Scalars layout (``tensorboard.plugins.custom_scalar.layout_pb2.Layout``): per metric one category
    and per depth one margin chart with a series per variant (row); the paired differences first, then the main
    curves, then each diagnostic family in a closed category."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    percent = f"{100 * CONFIDENCE:.0f}%"

    def charts(tag: str, tags_of, what: str) -> list:
        out = []
        for where in dict.fromkeys(c.where for c in cells):  # one chart per depth (and axes); each variant a run
            tags = {tags_of(tag, c)[:3] for c in cells if c.where == where
                    and tag in (c.deltas if tags_of is delta_tags else c.curves)}
            if tags:
                (value, lower, upper), = tags
                unit = " (pp)" if tags_of is delta_tags and delta_scale(tag) == 100.0 else ""
                title = " ".join(filter(None, (what, tag))) + unit + ("" if where == ALL else f", {where}")
                series = [layout_pb2.MarginChartContent.Series(value=value, lower=lower, upper=upper)]
                out.append(layout_pb2.Chart(title=title, margin=layout_pb2.MarginChartContent(series=series)))
        return out

    categories = []
    paired = [t for t in PAIRED_TAGS if any(t in c.deltas for c in cells)]
    for tag in paired:
        categories.append(layout_pb2.Category(
            title=f"Δ {tag} vs {baseline}{' (pp)' if delta_scale(tag) == 100.0 else ''}, paired by seed (mean and "
                  f"{percent} CI per epoch)",
            chart=charts(tag, delta_tags, "Δ")))
    tags = sorted({t for c in cells for t in c.curves})
    main = [t for t in MAIN_TAGS if t in tags] + [t for t in tags if not t.startswith("diag/") and t not in MAIN_TAGS]
    for tag in main:
        categories.append(layout_pb2.Category(title=f"{tag}: mean and {percent} CI over seeds",
                                              chart=charts(tag, curve_tags, "")))
    families: dict[str, list[str]] = {}
    for tag in (t for t in tags if t.startswith("diag/")):
        families.setdefault(_LAYER.sub(r"\1", tag).rstrip("/"), []).append(tag)
    for family, members in families.items():
        chart_list = [chart for tag in members for chart in charts(tag, curve_tags, "")]
        categories.append(layout_pb2.Category(title=f"{family}: mean and {percent} CI over seeds", chart=chart_list,
                                              closed=True))
    return layout_pb2.Layout(category=categories)


def _scalar_event(tag: str, value: float, step: int, wall_time: float):
    from tensorboard.compat.proto import event_pb2, summary_pb2

    return event_pb2.Event(wall_time=wall_time, step=step,
                           summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]))


def _summary_event(summary, step: int = 0, wall_time: float | None = None):
    from tensorboard.compat.proto import event_pb2

    return event_pb2.Event(wall_time=time.time() if wall_time is None else wall_time, step=step, summary=summary)


def layout_summary(scalars_layout) -> Any:
    """The layout as the summary the Custom Scalars plugin reads (its metadata, the serialized proto as a string
    tensor): what ``custom_scalar.summary.pb`` builds, without TensorFlow."""
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.custom_scalar import metadata
    from tensorboard.util import tensor_util

    summary = summary_pb2.Summary()
    summary.value.add(tag=metadata.CONFIG_SUMMARY_TAG, metadata=metadata.create_summary_metadata(),
                      tensor=tensor_util.make_tensor_proto(scalars_layout.SerializeToString()))
    return summary


def hparams_values(cell: CellAggregate) -> dict[str, Any]:
    """The aggregate row's values of the study's HParams columns: its variant and grid axes, no seed."""
    values: dict[str, Any] = {"variant": cell.variant}
    if cell.depth is not None:
        values["depth"] = cell.depth
    values |= {str(a): hparam_value(v) for a, v in cell.extras}
    if cell.lr is not None:
        values["lr"] = cell.lr
    return values


def tuned_columns(cells: Sequence[CellAggregate]) -> dict[str, list]:
    """The HParams columns the aggregate rows add to the study's: ``lr``, the rate each row trained at."""
    rates = sorted({c.lr for c in cells if c.lr is not None})
    return {"lr": rates} if rates else {}


def write_cell(run_dir: Path, cell: CellAggregate) -> None:
    """One cell's aggregate run: bands, paired differences, HParams entry and metrics."""
    from tensorboard.plugins.hparams import summary_v2 as hp
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(run_dir), max_queue_size=1000)
    now = time.time()
    try:
        writer.add_event(_summary_event(hp.hparams_pb(hparams_values(cell), trial_id=f"{AGG_RUN}/{cell.path}"),
                                        wall_time=now))
        last = 1
        for source, tags_of in ((cell.curves, curve_tags), (cell.deltas, delta_tags)):
            for tag, points in source.items():
                names = tags_of(tag, cell)
                scale = delta_scale(tag) if tags_of is delta_tags else 1.0
                for epoch, b in sorted(points.items()):
                    for name, value in zip(names, (scale * b.mean, scale * b.lower, scale * b.upper, b.n), strict=True):
                        writer.add_event(_scalar_event(name, float(value), epoch, now))
                    last = max(last, epoch)
        metrics = {f"hp/{k}": v for k, v in cell.summary.items()}
        metrics["hp/n_seeds"] = float(cell.n_ok)
        if cell.metric is not None and cell.metric.n >= 2:
            metrics |= {"hp/ci_low": cell.metric.lower, "hp/ci_high": cell.metric.upper}
        if cell.lr is not None:
            metrics["hp/lr"] = cell.lr
        for key, value in metrics.items():
            writer.add_event(_scalar_event(display_tag(key), float(value), last, now))
    finally:
        writer.close()


def write_tensorboard(root: Path, spec, cells: Sequence[CellAggregate], *, claims: str | None = None,
                      baseline: str = "standard") -> Path:
    """The aggregate runs of a study under ``<root>/agg`` (``root``: the study's TensorBoard folder), its layout and
    claims text in the run ``agg``, and the study's HParams experiment (:data:`STUDY_METRICS`) at ``root``; the old
    ``agg`` folder is replaced at once, under a lock. Returns the ``agg`` folder."""
    from tensorboard.plugins.text import summary_v2 as text
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / AGG_RUN
    with _locked(root / f".{AGG_RUN}.lock"):
        extra = tuned_columns(cells)
        write_study_hparams(root, spec, STUDY_METRICS, extra=extra)
        building = root / f".{AGG_RUN}.new-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir()
        for cell in cells:
            write_cell(building / cell.path, cell)
        writer = EventFileWriter(str(building))
        try:
            writer.add_event(_summary_event(layout_summary(layout(cells, baseline))))
            # for `--logdir <study>/agg`; the same as the study root's, which TensorBoard may read instead of it
            # when both are in its log folder (it takes the first experiment it finds)
            writer.add_event(_summary_event(study_experiment_pb(spec, STUDY_METRICS, extra)))
            writer.add_event(_summary_event(text.text_pb("aggregate/about", about(cells, baseline))))
            if claims:
                writer.add_event(_summary_event(text.text_pb("aggregate/claims", claims)))
        finally:
            writer.close()
        old = root / f".{AGG_RUN}.old-{os.getpid()}"
        if final.exists():
            final.rename(old)
        building.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    return final


def about(cells: Sequence[CellAggregate], baseline: str) -> str:
    """The text beside the layout: what the aggregate runs hold."""
    percent = f"{100 * CONFIDENCE:.0f}%"
    rows = "\n".join(f"| `{AGG_RUN}/{c.path}` | {len(c.seeds)} | {', '.join(map(str, c.seeds))} |" for c in cells)
    return (f"Each run `{AGG_RUN}/<variant>/depth=<d>` holds, per epoch (the step), the mean over its completed runs "
            f"(seeds) of every curve with its {percent} t interval (`<tag>/depth=<d>/mean`, `lower`, `upper`, `n`: "
            f"the run is the variant), and the paired difference to `{baseline}` at the same depth "
            f"(`{PAIRED_GROUP}/...`: mean and {percent} interval of the per-seed differences, accuracies in "
            "percentage points). An epoch with one run has no interval: its band is the mean. Custom Scalars shows "
            "them as margin charts, one per metric and depth, a band per variant.\n\n"
            f"| run | seeds | which |\n|---|---:|---|\n{rows}")


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (fcntl where there is one)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def claims_text(data: StudyData, spec) -> str | None:
    """The claims' verdicts (the Markdown of claims.md) of a study that lists claims and has results."""
    if not spec.claims or not any(r.ok for r in data.runs):
        return None

    return claims_table(data, spec.claims, spec=spec, resamples=2_000).markdown()  # refreshed after each trial


def write_study(data: StudyData, spec, root: Path) -> Path | None:
    """Aggregate a grid study's runs and write them to TensorBoard under ``root`` (None: nothing to aggregate)."""
    if spec.kind != "grid":
        return None
    cells = aggregate(data)
    if not cells:
        return None
    return write_tensorboard(root, spec, cells, claims=claims_text(data, spec))


def refresh(study, spec, results_dir: str | Path) -> None:
    """The runner's hook after each trial: rewrite the study's aggregate runs from its storage (report phase only).
    Never fails the study: a problem is one line on stderr."""
    if spec.kind != "grid" or spec.stage != "report":  # a tuning, contending or second-look stage: not the study
        return
    try:
        data = collect(study, spec, Path(results_dir))
        write_study(data, spec, paths.runs_dir(results_dir, study.study_name))
    except Exception as exc:  # noqa: BLE001 - the aggregate view must never stop training
        print(f"aggregate TensorBoard runs not updated: {first_line(exc)}", file=sys.stderr)
