"""Reading a study: open the Optuna storage read-only, pick the trials that are results, and turn them into
:class:`Run` objects (as a pandas DataFrame: :func:`ablations.report.runs.frame`).

Each trial's configuration comes from what the trial stored (``user_attrs["config"]`` = ``RunConfig.to_dict()``,
``params`` = variant and grid axes, the run summary in the other user attrs); the spec only gives the study's
variant order, metric and grid axes.
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import layout
from ..machine.modes import mode_text, ran_on_cuda
from ..studies.spec import tune_name
from ..studies.storage import redact, repeated_results, with_installed_driver
from ..training import HP_SUMMARY_KEYS

# Imported where they are used, not here: Optuna, SQLAlchemy and the model (lit_modules: torch). Each takes from a
# tenth of a second to seconds to import, and the command-line tools start without them.

BASELINE = "standard"  # the variant every other one is compared with


def summary_key(name: str) -> str:
    """``name`` if it is a run-summary key (:data:`ablations.training.HP_SUMMARY_KEYS`); KeyError otherwise, so a
    renamed summary key breaks here at import time instead of emptying a column."""
    if name not in HP_SUMMARY_KEYS:
        raise KeyError(f"'{name}' is not a run-summary key of ablations.training.HP_SUMMARY_KEYS")
    return name


ACC_KEY = summary_key("best_val_acc")  # the accuracy of studies whose metric is not an accuracy (and old ones)
#: Accuracy keys a study's ``metric`` may name; the report's accuracy column follows it (test_acc and
#: test_acc_at_best_val: the test split's accuracy at the final epoch / at the epoch chosen on validation).
ACC_KEYS = (ACC_KEY, summary_key("final_val_acc"), "test_acc", "test_acc_at_best_val")
#: a trial's user attr "phase" (absent in older studies: "report"): the tuning stage's runs, the reported runs at
#: each row's chosen rate, and the reported seeds at a row's contending rates (a rate choice not settled)
PHASES = ("tune", "report", "contend", "round")  # round: the reported runs of a second look (more seeds)
DIVERGED_KEY = summary_key("diverged")
FRACTION_KEYS = tuple(summary_key(f"epochs_to_{p}pct_of_best") for p in (90, 95, 99))
AUC_KEY = summary_key("val_acc_auc")
EPOCH_TIME_KEY = summary_key("time_per_epoch_s")
WALL_TIME_KEY = summary_key("wall_time_s")
THROUGHPUT_KEY = summary_key("train_images_per_s")
PARAMS_KEY = summary_key("param_count")


#: run-summary fact of a trial the engine trained in a stack of K (``ablations.engine.loop``): its wall time is the
#: stack's, shared by the K trials
STACK_SIZE_KEY = "stack_size"


def own_share(summary: dict, key: str) -> float | None:
    """A trial's own share of a time its run summary records (``key``: :data:`WALL_TIME_KEY` or
    :data:`EPOCH_TIME_KEY`): the time divided among the trials of its stack when the engine trained K at once
    (:data:`STACK_SIZE_KEY`); None where no positive time is recorded."""
    value, k = summary.get(key), summary.get(STACK_SIZE_KEY)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value) / (int(k) if isinstance(k, (int, float)) and not isinstance(k, bool) and k >= 1 else 1)


def own_seconds(summary: dict) -> float | None:
    """A trial's own share of its worker's time (:func:`own_share` of :data:`WALL_TIME_KEY`): what pricing and
    worker-hours add up (a stack's K trials sum to the stack's time, not K times it)."""
    return own_share(summary, WALL_TIME_KEY)


class ReportError(Exception):
    """A problem with the user's input (storage, study): reported as one line, exit status 2."""


@dataclass
class Run:
    """One trial that counts as a result (surplus, duplicate and retried-then-replaced trials never become Runs)."""

    number: int
    state: str  # complete | pruned | failed
    variant: str
    depth: int | None
    seed: int | None
    row: str  # the table row: the variant label (+ any extra grid axes)
    extras: tuple = ()  # ((axis, value), ...) of grid axes other than variant/depth/seed
    acc: float | None = None  # the study's accuracy metric (StudyData.metric; fraction)
    diverged: bool = False
    searched: dict[str, Any] = field(default_factory=dict)  # searched residual options: option -> value
    summary: dict[str, Any] = field(default_factory=dict)  # user attrs (the run summary)
    curve: dict[int, float] = field(default_factory=dict)  # epoch (1-based) -> val acc (fraction)
    config: dict[str, Any] = field(default_factory=dict)  # the trial's stored RunConfig.to_dict()
    log_dir: Path | None = None
    run_name: str | None = None  # the TensorBoard run (``<variant>/depth=<d>/seed=<s>``; older studies: trial_NNNN)
    phase: str = "report"  # tune (LR tuning seeds) | report (the reported seeds)
    mode: str | None = None  # precision + attention kernel as runs.csv recorded it (None: from summary / config)
    #: completed below the study's floor (``floor:``, :class:`ablations.studies.spec.Floor`): counted like a diverged run
    failed_training: bool = False

    @property
    def lr(self) -> float | None:
        """The peak learning rate the run trained at (its stored config), None if not stored."""
        value = (self.config or {}).get("lr")
        return float(value) if finite(value) else None

    @property
    def ok(self) -> bool:
        """A completed run that neither diverged nor failed to train, with a finite accuracy: it enters means, stds
        and paired tests at its accuracy (a diverged or failed one enters the pairs at chance level)."""
        return self.state == "complete" and not self.diverged and not self.failed_training and finite(self.acc)

    @property
    def at_chance(self) -> bool:
        """A run that counts at chance level in the pairs: it diverged, or completed below the study's floor."""
        return self.diverged or self.failed_training


@dataclass
class StudyData:
    name: str
    kind: str
    runs: list[Run]
    rows: list[str]  # table rows in the spec's variant order
    row_variant: dict[str, str]
    row_extras: dict[str, tuple]
    depths: list[int]
    pending: int = 0  # RUNNING + WAITING trials
    skipped: int = 0  # surplus / duplicate / retried trials
    metric: str = ACC_KEY  # the accuracy key of Run.acc (the study's metric when it is one of ACC_KEYS)
    tune_runs: list[Run] = field(default_factory=list)  # phase "tune": only the tuning table and figure use them
    #: phase "contend": the reported seeds at a row's contending rates (only the rate-aware verdicts use them)
    contend_runs: list[Run] = field(default_factory=list)
    tune_metric: str = ACC_KEY  # the validation metric the tuning stage chose by (spec.tune.metric)
    floor: str | None = None  # the study's floor for failed trainings, in words (None: it declares none)
    tune_grid: tuple[float, ...] = ()  # the tuning stage's starting rates (spec.tune.lr); others were added
    tune_bounds: tuple[float, float] | None = None  # the rates the grid may extend to (spec.tune.bounds)

    def by_row_depth(self, row: str, depth: int | None) -> list[Run]:
        return [r for r in self.runs if r.row == row and r.depth == depth]

    def baseline_row(self, row: str, baseline: str = BASELINE) -> str | None:
        """The baseline variant's row with the same extra grid axes as ``row`` (None if the study has none)."""
        return next((r for r in self.rows if self.row_variant.get(r) == baseline
                     and self.row_extras.get(r) == self.row_extras.get(row)), None)

    def config_value(self, key: str, default: Any = None) -> Any:
        """A RunConfig field shared by the study's runs: ``default`` when no run stored it, None when they
        disagree."""
        values = {(r.config or {}).get(key, default) for r in self.runs}
        return values.pop() if len(values) == 1 else (default if not values else None)

    def modes(self) -> dict[str, int]:
        """How many result runs trained in each mode (precision + attention kernel, from the run summary; runs from
        before ``precision: auto`` recorded only their config's precision)."""
        return self._count(run_mode)

    def machines(self) -> dict[str, int]:
        """How many result runs trained on each machine (``machine`` of the run summary; runs that did not record
        it count under "not recorded")."""
        return self._count(lambda run: str(run.summary.get("machine") or "not recorded"))

    def mixed_forms(self) -> dict[str, int]:
        """The table rows whose completed result runs were built in more than one recorded form
        (:data:`ablations.layout.FORM_KEY`: a default changed between them), each with its number of forms; runs
        that did not record one are left out; options added since a run recorded its form count as they were
        (``lit_modules.upgraded_form``)."""
        from lit_modules import upgraded_form

        forms: dict[str, set[str]] = {}
        for run in self.runs:
            if run.state == "complete" and run.summary.get(layout.FORM_KEY):
                forms.setdefault(run.row or run.variant, set()).add(
                    layout.canonical_form(upgraded_form(run.summary[layout.FORM_KEY])))
        return {row: len(found) for row, found in forms.items() if len(found) > 1}

    def _count(self, name_of) -> dict[str, int]:
        """The result runs counted by ``name_of(run)``, in the order the names first appear."""
        counts: dict[str, int] = {}
        for run in self.runs:
            counts[name_of(run)] = counts.get(name_of(run), 0) + 1
        return counts


def run_mode(run: Run) -> str:
    """``<precision> + <fused|explicit> attention[ on cuda]`` of one run, as its summary recorded what it trained in
    and where (a CPU says nothing). (The multi-stream kernels, ``stream_kernels``, and the engine that trained it,
    ``engine``, are not part of it: they compute the same function.)"""
    if run.mode is not None:
        return run.mode
    precision = run.summary.get("precision") or (run.config or {}).get("precision") or "32-true"
    fused = run.summary.get("fused_attn")
    if fused is None:  # before precision auto: the config's flag, None meaning timm's fused default
        fused = (run.config or {}).get("fused_attn") is not False
    return mode_text(precision, fused, cuda=ran_on_cuda(run.summary.get("device"), (run.config or {}).get("accelerator")))


def open_study(url: str, study_name: str, spec=None):
    """``optuna.load_study`` on an existing storage, never creating a file, table or study; ReportError if any
    of them is missing."""
    if "://" not in url:
        raise ReportError(f"storage '{url}' is not a URL; e.g. {layout.DEFAULT_STORAGE}")

    names: list[str] | None = None
    if url.startswith("sqlite:"):
        path = url.split("://", 1)[1]
        path = path[1:] if path.startswith("/") else path  # sqlite:///rel, sqlite:////abs
        if path in ("", ":memory:") or "mode=memory" in path:
            raise ReportError(f"storage '{url}' is in memory: it holds no study to report")
        path = path.split("?", 1)[0]
        if not Path(path).is_file():
            raise ReportError(f"storage file '{path}' does not exist")
        names = _sqlite_study_names(Path(path))
    import optuna
    import sqlalchemy.exc

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = optuna.storages.RDBStorage(with_installed_driver(url), skip_table_creation=True,
                                             skip_compatibility_check=True)  # postgresql:// with psycopg2 too
        if names is None:
            names = [s.study_name for s in storage.get_all_studies()]
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ImportError) as exc:
        if isinstance(exc, optuna.exceptions.StorageInternalError):  # Optuna wraps a failed connection
            exc = exc.__cause__ or exc
        raise ReportError(f"cannot read storage '{redact(url)}': {first_line(getattr(exc, 'orig', None) or exc)}"
                          ) from None
    if study_name not in names:
        hint = ""
        if spec is not None:
            others = [b for b in ("smoke", "default", "paper")
                      if (spec.name if b == "default" else f"{spec.name}-{b}") in names and b != spec.budget]
            if others:
                hint = f" (run with --budget {others[0]}?)"
            elif any(n.startswith(f"{study_name}+") for n in names):  # ablations.studies.overrides' naming rule
                hint = " (a study run with --set: pass the same --set arguments)"
        raise ReportError(f"study '{study_name}' not found in {redact(url)}; studies there: "
                          f"{', '.join(sorted(names)) or 'none'}{hint}")
    return optuna.load_study(study_name=study_name, storage=storage)


def _sqlite_study_names(path: Path) -> list[str]:
    try:
        con = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "studies" not in tables:
                raise ReportError(f"storage file '{path}' is not an Optuna storage (no 'studies' table)")
            return [r[0] for r in con.execute("SELECT study_name FROM studies")]
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise ReportError(f"storage file '{path}' is not a readable SQLite database: {exc}") from None


def result_trials(study) -> tuple[list, int, int]:
    """(trials that are results, pending count, skipped count). Not results: surplus and duplicate grid trials,
    a completed point's later completed copies (:func:`ablations.studies.storage.repeated_results`), and FAIL
    trials that a later trial retried (``system_attrs['failed_trial']``)."""
    from optuna.trial import TrialState

    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    repeats = repeated_results(trials)

    def origin(t) -> int:
        return t.system_attrs.get("failed_trial", t.number)

    retried = {t.system_attrs["failed_trial"] for t in trials if "failed_trial" in t.system_attrs}
    latest = {}
    for t in trials:
        latest[origin(t)] = max(latest.get(origin(t), -1), t.number)
    results, pending, skipped = [], 0, 0
    for t in trials:
        if t.user_attrs.get("surplus") or "duplicate_of" in t.user_attrs or t.number in repeats:
            skipped += 1
        elif t.state in (TrialState.RUNNING, TrialState.WAITING):
            pending += 1
        elif t.state == TrialState.FAIL and (t.number in retried or latest[origin(t)] != t.number):
            skipped += 1
        else:
            results.append(t)
    return results, pending, skipped


def accuracy_key(metric: str) -> str:
    """The report's accuracy column for a study metric: the metric itself when it is an accuracy, else best_val_acc."""
    return metric if metric in ACC_KEYS else ACC_KEY


def open_tune_study(study, name=tune_name):
    """The study's tuning stage (``<study>-tune`` in the same storage; ``name``: another stage's naming rule), None
    when it has none."""
    import optuna

    try:
        return optuna.load_study(study_name=name(study.study_name), storage=study._storage)
    except KeyError:
        return None


#: the first trial number a study's second look (``<study>-round``) carries here: its own study numbers its trials from
#: 0 again, and a run is known by its number
ROUND_OFFSET = 100_000


def collect(study, spec, results_dir: Path | None = None, tune_study=None, contend_study=None,
            round_study=None) -> StudyData:
    """The study's results as Runs, in a deterministic order (spec variant order, depth, seed, trial number); the
    trials of ``tune_study`` (its tuning stage) join as phase ``tune``, those of ``contend_study`` (its contending
    rates' stage) as phase ``contend``, those of ``round_study`` (its second look) as phase ``round``, reported runs
    numbered from :data:`ROUND_OFFSET`."""
    trials, pending, skipped = result_trials(study)
    runs = _runs(trials, spec, results_dir, study.study_name)
    for stage, phase, offset in ((tune_study, "tune", 0), (contend_study, "contend", 0),
                                 (round_study, "round", ROUND_OFFSET)):
        if stage is not None:
            runs += [dataclasses.replace(r, phase=phase, number=r.number + offset) for r in
                     _runs(result_trials(stage)[0], spec, results_dir, stage.study_name)]
    return assemble(study.study_name, spec, runs, pending=pending, skipped=skipped)


def _runs(trials: list, spec, results_dir: Path | None, study_name: str) -> list[Run]:
    from optuna.trial import TrialState

    extra_axes = [a for a in spec.axes if a not in ("depth", "seed")]
    metric = accuracy_key(spec.metric)
    runs = []
    for t in trials:
        state = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}.get(t.state, "failed")
        attrs = dict(t.user_attrs)
        config = attrs.get("config") or {}
        variant = str(t.params.get("variant", config.get("residual", "?")))
        acc = attrs.get(metric)
        if acc is None and state == "complete" and spec.metric == metric and DIVERGED_KEY not in attrs:
            acc = t.value
        prefix = f"{variant}."
        runs.append(Run(
            number=t.number, state=state, variant=variant, depth=_int(t.params.get("depth", config.get("depth"))),
            seed=_int(t.params.get("seed", config.get("seed"))), row="",
            extras=tuple((a, t.params.get(a, config.get(a))) for a in extra_axes),
            acc=None if acc is None else float(acc), diverged=bool(attrs.get(DIVERGED_KEY, False)),
            searched={k[len(prefix):]: v for k, v in sorted(t.params.items()) if k.startswith(prefix)},
            summary=attrs, config=config, phase=str(attrs.get("phase", "report")),
            curve={int(step) + 1: float(v) for step, v in sorted(t.intermediate_values.items()) if finite(v)},
            log_dir=_resolve_log_dir(attrs.get("log_dir"), results_dir, study_name),
            run_name=attrs.get("run_name") or (Path(attrs["log_dir"]).name if attrs.get("log_dir") else None),
        ))
    return runs


def row_label(variant: str, extras: tuple) -> str:
    """The table row of a variant with extra grid axes: ``variant [axis=value, ...]``."""
    return variant if not extras else f"{variant} [" + ", ".join(f"{a}={v}" for a, v in extras) + "]"


def assemble(name: str, spec, runs: list[Run], pending: int = 0, skipped: int = 0) -> StudyData:
    """StudyData of ``runs`` (from a storage or from runs.csv: both paths share this): rows labelled, runs sorted
    (spec variant order, extra axes, depth, seed, trial number), tuning-phase runs set apart."""
    labels = [v.label for v in spec.variants]
    extra_axes = [a for a in spec.axes if a not in ("depth", "seed")]
    floor = getattr(spec, "floor", None)
    for run in runs:
        run.row = row_label(run.variant, run.extras)
        if floor is not None and run.state == "complete" and not run.diverged:
            value = run.summary.get(floor.metric)
            run.failed_training = finite(value) and floor.failed(float(value), classes_of(run))

    def row_key(run: Run):
        index = labels.index(run.variant) if run.variant in labels else len(labels)
        return (index, run.variant, tuple(str(v) for _, v in run.extras))

    runs = sorted(runs, key=lambda r: (row_key(r), r.depth if r.depth is not None else -1,
                                       r.seed if r.seed is not None else -1, r.number))
    tune = [r for r in runs if r.phase == "tune"]
    contend = [r for r in runs if r.phase == "contend"]
    runs = [r for r in runs if r.phase not in ("tune", "contend")]
    rows = list(dict.fromkeys(r.row for r in runs))
    row_variant = {r.row: r.variant for r in runs}
    row_extras = {r.row: r.extras for r in runs}
    if not extra_axes:  # every variant of the spec gets a row, also before it has results ("—")
        rows = [*labels, *[r for r in rows if r not in labels]]
        for label in labels:
            row_variant.setdefault(label, label)
            row_extras.setdefault(label, ())
    return StudyData(
        name=name, kind=spec.kind, runs=runs, rows=rows, row_variant=row_variant, row_extras=row_extras,
        depths=sorted({r.depth for r in runs if r.depth is not None}), pending=pending, skipped=skipped,
        metric=accuracy_key(spec.metric), tune_runs=tune, contend_runs=contend,
        tune_metric=getattr(getattr(spec, "tune", None), "metric", None) or ACC_KEY,
        floor=floor.text() if floor is not None else None,
        tune_grid=tuple(getattr(getattr(spec, "tune", None), "lr", ()) or ()),
        tune_bounds=getattr(getattr(spec, "tune", None), "bounds", None),
    )


def classes_of(run: Run) -> int | None:
    """The run's number of classes as its summary or config recorded it (also inside ``dataset_options``)."""
    config = run.config or {}
    for value in (run.summary.get("num_classes"), config.get("num_classes"),
                  (config.get("dataset_options") or {}).get("num_classes")):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 2 and value == int(value):
            return int(value)
    return None


def best_per_row(data: StudyData) -> dict[str, Run]:
    """The best ok run of each row (highest accuracy; ties: lowest trial number)."""
    best: dict[str, Run] = {}
    for run in data.runs:
        if run.ok and (run.row not in best or run.acc > best[run.row].acc):
            best[run.row] = run
    return best


def _resolve_log_dir(value: str | None, results_dir: Path | None, study_name: str) -> Path | None:
    """The trial's TensorBoard folder: as stored, else the same folder under ``results_dir``.

    A trial stores its folder as the run saw it (``results/runs/<study>/<variant>/depth=4/seed=0/...``, relative to
    where it ran), so a report run elsewhere with ``--results-dir`` keeps the path below the stored ``runs/`` folder;
    a flat run name directly under ``<results_dir>/runs/<study>/`` is the fallback."""
    if not value:
        return None
    path = Path(value)
    if path.is_dir():
        return path
    if results_dir is None:
        return None
    parts = path.parts
    below = [parts[i + 1:] for i in range(len(parts) - 2, -1, -1) if parts[i] == layout.RUNS]
    candidates = [Path(results_dir, layout.RUNS, *rest) for rest in below]
    candidates.append(layout.runs_dir(results_dir, study_name) / path.name)
    return next((c for c in candidates if c.is_dir()), None)


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def finite(value: Any) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def mean_of(values: Iterable[Any]) -> float | None:
    """Mean of the finite values, None if there are none."""
    vals = [float(v) for v in values if finite(v)]
    return sum(vals) / len(vals) if vals else None


def median_of(values: Iterable[Any]) -> float | None:
    """Median of the finite values, None if there are none: what a study's times are summarised by, since a run whose
    worker was paused or whose machine was suspended mid-training records the pause in its wall clock."""
    vals = [float(v) for v in values if finite(v)]
    return statistics.median(vals) if vals else None


def first_line(exc: Any) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
