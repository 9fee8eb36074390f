"""Tables and figures of a study, regenerated from its Optuna storage and TensorBoard event files (never retrains).

    python -m ablations.report --study residual_variants                       # default budget, default storage
    python -m ablations.report --study residual_variants --budget smoke --storage sqlite:///runs/o.db
    python -m ablations.report --study init_values --study-name my-search --out paper/tables

Writes to ``<results-dir>/<study name>/`` (or ``--out``):

* grid studies: ``main`` (CaiT-style variant × depth accuracy table), ``convergence`` and ``cost`` tables;
* search studies: ``search_best`` (best trial per variant), ``importance`` (parameter importances) and ``cost``;

each as ``.md``, ``.tex`` (booktabs) and ``.csv``; figures as ``.png`` and ``.pdf``. The headline table (``main``, or
``search_best`` for search studies) is printed, written to TensorBoard as text (run ``_report`` next to the trials'
runs, ``<results-dir>/runs/<study name>/_report``; it carries no hparams data, so the HParams table of the trials is
unchanged) and attached to the study as an optuna-dashboard note. Two reports of the same storage give
byte-identical tables. A missing storage or study, or one without completed trials, exits 2 with one line.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cli import OneLineParser

ALPHA = 0.05  # significance level of the Welch test in the main table
MARK = "†"
BASELINE = "standard"
ACC_KEY = "best_val_acc"
FRACTION_KEYS = ("epochs_to_90pct_of_best", "epochs_to_95pct_of_best", "epochs_to_99pct_of_best")
REPORT_RUN = "_report"  # TensorBoard run (folder) of the report's text, next to the trials' runs
MIN_IMPORTANCE_TRIALS = 4  # fewer completed trials in a scope: a note instead of importances


class ReportError(Exception):
    """A problem with the user's input (storage, study): reported as one line, exit status 2."""


# --- loading -------------------------------------------------------------------------------------------------------
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
    acc: float | None = None  # best_val_acc (fraction)
    diverged: bool = False
    searched: dict[str, Any] = field(default_factory=dict)  # searched residual options: option -> value
    summary: dict[str, Any] = field(default_factory=dict)  # user attrs (the run summary)
    curve: dict[int, float] = field(default_factory=dict)  # epoch (1-based) -> val acc (fraction)
    config: dict[str, Any] = field(default_factory=dict)
    log_dir: Path | None = None

    @property
    def ok(self) -> bool:
        """A completed, non-diverged run with a finite accuracy: it enters means, stds and tests."""
        return self.state == "complete" and not self.diverged and _finite(self.acc)


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

    def by_row_depth(self, row: str, depth: int | None) -> list[Run]:
        return [r for r in self.runs if r.row == row and r.depth == depth]


def open_study(url: str, study_name: str, spec=None):
    """``optuna.load_study`` on an existing storage, never creating a file, table or study; ReportError if any
    of them is missing."""
    if "://" not in url:
        raise ReportError(f"storage '{url}' is not a URL; e.g. sqlite:///results/optuna.db")
    from .storage import _redact

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
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True, skip_compatibility_check=True)
        if names is None:
            names = [s.study_name for s in storage.get_all_studies()]
    except (sqlalchemy.exc.SQLAlchemyError, ImportError) as exc:
        first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ReportError(f"cannot read storage '{_redact(url)}': {first}") from None
    if study_name not in names:
        hint = ""
        if spec is not None:
            others = [b for b in ("smoke", "default", "paper")
                      if (spec.name if b == "default" else f"{spec.name}-{b}") in names and b != spec.budget]
            if others:
                hint = f" (run with --budget {others[0]}?)"
        raise ReportError(f"study '{study_name}' not found in {_redact(url)}; studies there: "
                          f"{', '.join(sorted(names)) or 'none'}{hint}")
    return optuna.load_study(study_name=study_name, storage=storage)


def _sqlite_study_names(path: Path) -> list[str]:
    import sqlite3

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
    and FAIL trials that a later trial retried (``system_attrs['failed_trial']``)."""
    from optuna.trial import TrialState

    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)

    def origin(t) -> int:
        return t.system_attrs.get("failed_trial", t.number)

    retried = {t.system_attrs["failed_trial"] for t in trials if "failed_trial" in t.system_attrs}
    latest = {}
    for t in trials:
        latest[origin(t)] = max(latest.get(origin(t), -1), t.number)
    results, pending, skipped = [], 0, 0
    for t in trials:
        if t.user_attrs.get("surplus") or "duplicate_of" in t.user_attrs:
            skipped += 1
        elif t.state in (TrialState.RUNNING, TrialState.WAITING):
            pending += 1
        elif t.state == TrialState.FAIL and (t.number in retried or latest[origin(t)] != t.number):
            skipped += 1
        else:
            results.append(t)
    return results, pending, skipped


def collect(study, spec, results_dir: Path | None = None) -> StudyData:
    """The study's results as Runs, in a deterministic order (spec variant order, depth, seed, trial number)."""
    from optuna.trial import TrialState

    trials, pending, skipped = result_trials(study)
    labels = [v.label for v in spec.variants]
    extra_axes = [a for a in spec.axes if a not in ("depth", "seed")]
    runs = []
    for t in trials:
        state = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}.get(t.state, "failed")
        attrs = dict(t.user_attrs)
        config = attrs.get("config") or {}
        variant = str(t.params.get("variant", config.get("residual", "?")))
        depth = _int(t.params.get("depth", config.get("depth")))
        seed = _int(t.params.get("seed", config.get("seed")))
        extras = tuple((a, t.params.get(a, config.get(a))) for a in extra_axes)
        row = variant if not extras else f"{variant} [" + ", ".join(f"{a}={v}" for a, v in extras) + "]"
        acc = attrs.get(ACC_KEY)
        if acc is None and state == "complete" and spec.metric == ACC_KEY and "diverged" not in attrs:
            acc = t.value
        prefix = f"{variant}."
        runs.append(Run(
            number=t.number, state=state, variant=variant, depth=depth, seed=seed, row=row, extras=extras,
            acc=None if acc is None else float(acc), diverged=bool(attrs.get("diverged", False)),
            searched={k[len(prefix):]: v for k, v in sorted(t.params.items()) if k.startswith(prefix)},
            summary=attrs, config=config,
            curve={int(step) + 1: float(v) for step, v in sorted(t.intermediate_values.items()) if _finite(v)},
            log_dir=_resolve_log_dir(attrs.get("log_dir"), results_dir, study.study_name),
        ))

    def row_key(run: Run):
        index = labels.index(run.variant) if run.variant in labels else len(labels)
        return (index, run.variant, tuple(str(v) for _, v in run.extras))

    runs.sort(key=lambda r: (row_key(r), r.depth if r.depth is not None else -1,
                             r.seed if r.seed is not None else -1, r.number))
    rows = list(dict.fromkeys(r.row for r in runs))
    row_variant = {r.row: r.variant for r in runs}
    row_extras = {r.row: r.extras for r in runs}
    if not extra_axes:  # every variant of the spec gets a row, also before it has results ("—")
        rows = [*labels, *[r for r in rows if r not in labels]]
        for label in labels:
            row_variant.setdefault(label, label)
            row_extras.setdefault(label, ())
    return StudyData(
        name=study.study_name, kind=spec.kind, runs=runs, rows=rows, row_variant=row_variant, row_extras=row_extras,
        depths=sorted({r.depth for r in runs if r.depth is not None}), pending=pending, skipped=skipped,
    )


def _resolve_log_dir(value: str | None, results_dir: Path | None, study_name: str) -> Path | None:
    """The trial's TensorBoard folder: as stored, else under ``<results_dir>/runs/<study>/`` by its name."""
    if not value:
        return None
    path = Path(value)
    if path.is_dir():
        return path
    if results_dir is not None:
        alt = results_dir / "runs" / study_name / path.name
        if alt.is_dir():
            return alt
    return None


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _finite(value: Any) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


# --- statistics ----------------------------------------------------------------------------------------------------
@dataclass
class Cell:
    row: str
    depth: int | None
    values: list[float]  # accuracies (fractions) of the ok runs, by seed
    seeds: list[int | None]
    n_diverged: int = 0
    n_failed: int = 0  # failed or pruned (no result) + completed without an accuracy
    mean: float | None = None
    std: float | None = None  # sample std (ddof=1), only for n >= 2
    p_value: float | None = None
    significant: bool = False
    best: bool = False

    @property
    def n(self) -> int:
        return len(self.values)


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided Welch t-test p-value (``scipy.stats.ttest_ind(equal_var=False)``); None when a group has < 2
    values or the test is undefined (e.g. both groups constant)."""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_ind(list(a), list(b), equal_var=False).pvalue)
    return p if math.isfinite(p) else None


def main_cells(data: StudyData, baseline: str = BASELINE, alpha: float = ALPHA) -> list[Cell]:
    """Row × depth cells: mean ± sample std of best_val_acc over the ok runs (seeds), Welch test against the
    baseline variant's row at the same depth (and the same extra axes), best mean per depth flagged."""
    cells = []
    for row in data.rows:
        for depth in data.depths or [None]:
            runs = data.by_row_depth(row, depth)
            ok = [r for r in runs if r.ok]
            cell = Cell(row=row, depth=depth, values=[float(r.acc) for r in ok], seeds=[r.seed for r in ok],
                        n_diverged=sum(1 for r in runs if r.diverged),
                        n_failed=sum(1 for r in runs if not r.ok and not r.diverged))
            if cell.n:
                import numpy as np

                cell.mean = float(np.mean(cell.values))
                cell.std = float(np.std(cell.values, ddof=1)) if cell.n >= 2 else None
            cells.append(cell)
    by_key = {(c.row, c.depth): c for c in cells}
    for c in cells:
        if data.row_variant.get(c.row) == baseline:
            continue
        base_row = next((r for r in data.rows if data.row_variant[r] == baseline
                         and data.row_extras.get(r) == data.row_extras.get(c.row)), None)
        base = by_key.get((base_row, c.depth)) if base_row is not None else None
        if base is not None:
            c.p_value = welch_p(c.values, base.values)
            c.significant = c.p_value is not None and c.p_value < alpha
    for depth in data.depths or [None]:
        column = [c for c in cells if c.depth == depth and c.mean is not None]
        if column:
            top = max(c.mean for c in column)
            for c in column:
                c.best = math.isclose(c.mean, top, rel_tol=0.0, abs_tol=1e-12)
    return cells


def _mean(values: Iterable[Any]) -> float | None:
    vals = [float(v) for v in values if _finite(v)]
    return sum(vals) / len(vals) if vals else None


# --- formatting ----------------------------------------------------------------------------------------------------
def pct(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{100.0 * x:.{digits}f}"


def num(x: float | None, fmt: str) -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, fmt)


def csv_num(x: float | None, fmt: str = ".6f") -> str:
    return "" if x is None or not math.isfinite(x) else format(x, fmt)


def cell_text(c: Cell, style: str) -> str:
    """A main-table cell as Markdown (``md``) or LaTeX (``tex``) text."""
    notes = []
    if c.n_diverged:
        notes.append(f"{c.n_diverged} div.")
    if c.n_failed:
        notes.append(f"{c.n_failed} failed")
    tail = "".join(f" ({n})" for n in notes)
    if c.mean is None:
        return "—" + tail
    pm = " ± " if style == "md" else r" $\pm$ "
    core = pct(c.mean) + (pm + pct(c.std) if c.std is not None else "")
    if c.best:
        core = f"**{core}**" if style == "md" else rf"\textbf{{{core}}}"
    mark = (MARK if style == "md" else r"$^{\dagger}$") if c.significant else ""
    return f"{core}{mark} (n={c.n}){tail}"


def latex_escape(text: str) -> str:
    out = []
    for ch in str(text):
        out.append({"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                    "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                    "†": r"$^{\dagger}$", "±": r"$\pm$", "×": r"$\times$", "≥": r"$\geq$", "<": r"$<$",
                    "—": "---", "–": "--", "‖": r"$\|$", "Δ": r"$\Delta$", "γ": r"$\gamma$",
                    "α": r"$\alpha$"}.get(ch, ch))
    return "".join(out)


@dataclass
class Table:
    """One table in its three forms; ``md`` / ``tex`` cells are pre-formatted strings, ``csv`` raw numbers."""

    name: str
    title: str
    caption: str
    md_frame: Any  # pandas DataFrame of Markdown strings
    tex_frame: Any  # pandas DataFrame of LaTeX strings
    csv_frame: Any  # pandas DataFrame of CSV strings
    notes: list[str] = field(default_factory=list)
    text_columns: int = 1  # the first columns hold text (left-aligned); the rest numbers (right-aligned)
    align: str | None = None  # explicit per-column alignment, e.g. "lrrl" (overrides text_columns)

    @property
    def alignment(self) -> str:
        k, n = self.text_columns, self.md_frame.shape[1]
        return self.align or "l" * k + "r" * (n - k)

    def markdown(self) -> str:
        body = self.md_frame.to_markdown(index=False, disable_numparse=True,
                                         colalign=[{"l": "left", "r": "right"}[a] for a in self.alignment])
        parts = [f"### {self.title}", "", body, "", self.caption]
        parts += [f"\nNote: {n}" for n in self.notes]
        return "\n".join(parts) + "\n"

    def latex(self, label: str) -> str:
        frame = self.tex_frame
        styler = frame.style.hide(axis="index")
        caption = latex_escape(self.caption + "".join(f" Note: {n}" for n in self.notes))
        return styler.to_latex(hrules=True, caption=caption, label=label, position_float="centering",
                               column_format=self.alignment)

    def csv(self) -> str:
        return self.csv_frame.to_csv(index=False, lineterminator="\n")


def _frame(rows: list[list[str]], columns: list[str]):
    import pandas as pd

    return pd.DataFrame(rows, columns=columns, dtype=object)


def _tex_columns(columns: Sequence[str]) -> list[str]:
    return [latex_escape(c) for c in columns]


def main_table(data: StudyData, cells: list[Cell]) -> Table:
    depths = data.depths or [None]
    by_key = {(c.row, c.depth): c for c in cells}
    headers = ["variant"] + [f"depth {d}" if d is not None else "accuracy" for d in depths]
    md_rows, tex_rows, csv_rows = [], [], []
    for row in data.rows:
        md_rows.append([row] + [cell_text(by_key[row, d], "md") for d in depths])
        tex_rows.append([latex_escape(row)] + [cell_text(by_key[row, d], "tex") for d in depths])
    for c in cells:
        csv_rows.append([c.row, "" if c.depth is None else str(c.depth), str(c.n), csv_num(c.mean),
                         csv_num(c.std), str(c.n_diverged), str(c.n_failed), csv_num(c.p_value, ".6g"),
                         str(int(c.significant)), str(int(c.best)), " ".join(str(s) for s in c.seeds)])
    has_baseline = any(v == BASELINE for v in data.row_variant.values())
    test = (f"{MARK}: differs from {BASELINE} at the same depth, p < {ALPHA} in Welch's two-sided t-test across "
            f"seeds (unequal variances; scipy.stats.ttest_ind(equal_var=False), unpaired)" if has_baseline
            else f"no significance test: the study has no '{BASELINE}' variant")
    caption = (f"Top-1 validation accuracy (%) of study {data.name}: best_val_acc (the best epoch's val accuracy of "
               f"each run), mean ± sample std (ddof=1) over seeds, n runs. Bold: best mean per depth. {test}. Cells "
               f"with n < 2 show no std and no test. Diverged runs (non-finite loss) are excluded from mean, std "
               f"and test and counted as '(k div.)'; failed or pruned runs as '(k failed)'.")
    notes = _status_notes(data)
    return Table("main", f"{data.name}: top-1 val accuracy (%) by depth", caption, _frame(md_rows, headers),
                 _frame(tex_rows, _tex_columns(headers)),
                 _frame(csv_rows, ["variant", "depth", "n", "mean_best_val_acc", "std_best_val_acc", "n_diverged",
                                   "n_failed", "p_welch_vs_standard", "significant", "best_in_depth", "seeds"]),
                 notes)


def _status_notes(data: StudyData) -> list[str]:
    notes = []
    if data.pending:
        notes.append(f"{data.pending} trial(s) still running or waiting are not included.")
    return notes


def convergence_table(data: StudyData) -> Table:
    headers = ["variant", "depth", "n", "epochs to 90%", "epochs to 95%", "epochs to 99%", "val-acc AUC (%)",
               "s / epoch", "wall time (s)", "div."]
    md_rows, csv_rows = [], []
    for row in data.rows:
        for depth in data.depths or [None]:
            runs = data.by_row_depth(row, depth)
            if not runs:
                continue
            ok = [r for r in runs if r.ok]
            ep = [_mean(r.summary.get(k) for r in ok) for k in FRACTION_KEYS]
            auc = _mean(r.summary.get("val_acc_auc") for r in ok)
            tpe = _mean(r.summary.get("time_per_epoch_s") for r in ok)
            wall = _mean(r.summary.get("wall_time_s") for r in ok)
            n_div = sum(1 for r in runs if r.diverged)
            d = "" if depth is None else str(depth)
            md_rows.append([row, d, str(len(ok)), *(num(e, ".1f") for e in ep), pct(auc), num(tpe, ".2f"),
                            num(wall, ".1f"), str(n_div)])
            csv_rows.append([row, d, str(len(ok)), *(csv_num(e, ".4f") for e in ep), csv_num(auc), csv_num(tpe),
                             csv_num(wall), str(n_div)])
    caption = ("Convergence per variant and depth, means over the non-diverged completed runs (n): first epoch "
               "(1-based) reaching 90/95/99% of the run's own best val accuracy; val-acc AUC = mean val accuracy "
               "over the planned epochs (unmeasured epochs count 0); wall time per epoch (train + val) and per run; "
               "div. = diverged runs (not in the means).")
    tex_rows = [[latex_escape(v) for v in r] for r in md_rows]
    return Table("convergence", f"{data.name}: convergence", caption, _frame(md_rows, headers),
                 _frame(tex_rows, _tex_columns(headers)),
                 _frame(csv_rows, ["variant", "depth", "n", *FRACTION_KEYS, "val_acc_auc", "time_per_epoch_s",
                                   "wall_time_s", "n_diverged"]))


# --- cost ----------------------------------------------------------------------------------------------------------
_DIM_RE = re.compile(r"^(img_size|in_chans|num_classes|patch_size|mlp_ratio): *([0-9.]+) *$", re.M)


def model_dims(run: Run) -> dict[str, Any]:
    """img_size / in_chans / num_classes / patch_size of the trained model: from the run's ``hparams.yaml``
    (what was trained), else from the dataset's DataModule (cheap: constructed, not set up)."""
    dims: dict[str, Any] = {}
    if run.log_dir is not None and (run.log_dir / "hparams.yaml").is_file():
        for key, value in _DIM_RE.findall((run.log_dir / "hparams.yaml").read_text()):
            dims[key] = float(value) if key == "mlp_ratio" else int(float(value))
    if not {"img_size", "in_chans", "num_classes"} <= set(dims):
        try:
            import data as datasets

            dm = datasets.build_datamodule(run.config.get("dataset", "digits"), data_dir=run.config.get("data_dir"),
                                           **(run.config.get("dataset_options") or {}))
            dims.update(img_size=dm.img_size, in_chans=dm.in_chans, num_classes=dm.num_classes)
            dims.setdefault("patch_size", run.config.get("patch_size") or getattr(dm, "default_patch_size", 4))
        except Exception:  # noqa: BLE001 - e.g. a folder dataset whose data_dir is not on this machine
            return dims
    if run.config.get("patch_size"):
        dims.setdefault("patch_size", run.config["patch_size"])
    return dims


def cost_table(data: StudyData, representative: dict[str, Run], *, depth_note: str) -> Table:
    """Params and forward FLOPs (``costs.measure``, batch 1) of each row's representative config vs the same
    config with the standard residual; measured train images/s (mean over the row's completed runs at that
    depth)."""
    import inspect

    from .costs import measure

    accepted = set(inspect.signature(measure).parameters)
    cache: dict[tuple, dict] = {}
    headers = ["variant", "residual", "options", "params", "+params vs standard", "forward MFLOPs",
               "+FLOPs vs standard", "trained params", "train img/s", "n"]
    md_rows, csv_rows, notes = [], [], []
    ignored: set[str] = set()
    for row in data.rows:
        run = representative.get(row)
        if run is None:
            continue
        cfg = run.config
        dims = model_dims(run)
        size = dict(embed_dim=cfg.get("embed_dim"), depth=run.depth or cfg.get("depth"), num_heads=cfg.get("num_heads"),
                    img_size=dims.get("img_size"), patch_size=dims.get("patch_size"),
                    num_classes=dims.get("num_classes"), in_chans=dims.get("in_chans"))
        for key in ("mlp_ratio", "global_pool", "qkv_bias", "class_token"):
            if key in accepted and key in cfg:
                size[key] = cfg[key]
            elif key == "mlp_ratio" and cfg.get(key) is not None:
                ignored.add(f"mlp_ratio={cfg[key]}")
        options = dict(cfg.get("residual_options") or {})
        residual = cfg.get("residual", run.variant)
        try:
            if any(v is None for v in size.values()):
                raise ValueError("model size unknown (no hparams.yaml and the dataset cannot be constructed)")
            own = _measure(measure, cache, residual, options, size)
            base = _measure(measure, cache, "standard", {}, size)
        except Exception as exc:  # noqa: BLE001 - one unmeasurable row must not stop the report
            own = base = None
            notes.append(f"{row}: not measured ({(str(exc).splitlines() or [type(exc).__name__])[0]}).")
        same_depth = [r for r in data.runs if r.row == row and r.depth == run.depth and r.state == "complete"]
        ips = _mean(r.summary.get("train_images_per_s") for r in same_depth)
        n_ips = sum(1 for r in same_depth if _finite(r.summary.get("train_images_per_s")))
        trained = _mean(r.summary.get("param_count") for r in same_depth)
        if own and base:
            dp = 100.0 * (own["params"] - base["params"]) / base["params"]
            df = 100.0 * (own["flops"] - base["flops"]) / base["flops"] if base["flops"] else None
        else:
            dp = df = None
        opts = ", ".join(f"{k}={_fmt_param(v)}" for k, v in sorted(options.items()))
        md_rows.append([row, residual, opts or "—", f"{own['params']:,}" if own else "—",
                        num(dp, "+.2f") + ("%" if dp is not None else ""),
                        num(own["flops"] / 1e6, ".3f") if own else "—",
                        num(df, "+.2f") + ("%" if df is not None else ""),
                        f"{round(trained):,}" if trained is not None else "—", num(ips, ".0f"), str(n_ips)])
        csv_rows.append([row, residual, opts, str(own["params"]) if own else "", csv_num(dp, ".4f"),
                         str(own["flops"]) if own else "", csv_num(df, ".4f"),
                         str(round(trained)) if trained is not None else "", csv_num(ips, ".2f"), str(n_ips)])
    caption = (f"Cost per variant {depth_note}: parameters and forward FLOPs (batch 1, matrix products only; "
               "torch FlopCounterMode via ablations.costs.measure) of the variant's own configuration, overhead vs "
               "the same configuration with the standard residual; trained params = param_count of the trained runs "
               "(run summary); train img/s = measured training throughput, mean over the variant's completed runs "
               "at that depth (n).")
    if ignored:
        notes.append(f"costs.measure() takes no mlp_ratio: FLOPs/params are for its default MLP width, not the "
                     f"trained {', '.join(sorted(ignored))}.")
    tex_rows = [[latex_escape(v) for v in r] for r in md_rows]
    return Table("cost", f"{data.name}: cost", caption, _frame(md_rows, headers), _frame(tex_rows, _tex_columns(headers)),
                 _frame(csv_rows, ["variant", "residual", "options", "params", "params_overhead_pct", "flops",
                                   "flops_overhead_pct", "trained_params", "train_images_per_s", "n"]), notes,
                 text_columns=3)


def _measure(measure, cache: dict, residual: str, options: dict, size: dict) -> dict:
    key = (residual, repr(sorted(options.items())), repr(sorted(size.items())))
    if key not in cache:
        cache[key] = measure(residual, options, **size)
    return cache[key]


# --- search studies ------------------------------------------------------------------------------------------------
def best_per_row(data: StudyData) -> dict[str, Run]:
    """The best ok run of each row (highest accuracy; ties: lowest trial number)."""
    best: dict[str, Run] = {}
    for run in data.runs:
        if run.ok and (run.row not in best or run.acc > best[run.row].acc):
            best[run.row] = run
    return best


def search_table(data: StudyData) -> Table:
    best = best_per_row(data)
    headers = ["variant", "complete", "pruned", "failed", "best top-1 (%)", "trial", "searched values"]
    md_rows, csv_rows = [], []
    for row in data.rows:
        runs = [r for r in data.runs if r.row == row]
        counts = [sum(1 for r in runs if r.state == "complete"), sum(1 for r in runs if r.state == "pruned"),
                  sum(1 for r in runs if r.state == "failed")]
        b = best.get(row)
        values = ", ".join(f"{k}={_fmt_param(v)}" for k, v in sorted(b.searched.items())) if b else ""
        md_rows.append([row, *map(str, counts), pct(b.acc) if b else "—", str(b.number) if b else "—",
                        values or "—"])
        csv_rows.append([row, *map(str, counts), csv_num(b.acc) if b else "", str(b.number) if b else "",
                         values])
    caption = (f"Search study {data.name}: best trial per variant by best_val_acc (the best epoch's top-1 val "
               "accuracy), its searched values, and trial counts (pruned trials stopped early by the pruner).")
    tex_rows = [[latex_escape(v) for v in r] for r in md_rows]
    return Table("search_best", f"{data.name}: best trial per variant", caption, _frame(md_rows, headers),
                 _frame(tex_rows, _tex_columns(headers)),
                 _frame(csv_rows, ["variant", "complete", "pruned", "failed", "best_val_acc", "trial",
                                   "searched_values"]), _status_notes(data), align="lrrrrrl")


def _fmt_param(v: Any) -> str:
    return format(v, ".4g") if isinstance(v, float) else str(v)


def importance_table(study, data: StudyData) -> Table:
    """Parameter importances with PED-ANOVA (named in the caption): over all completed trials for the
    parameters every trial has, then per variant for its own (conditional) searched parameters."""
    import optuna
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    evaluator_name = "PedAnovaImportanceEvaluator"
    numbers = {r.number for r in data.runs if r.state == "complete"}
    complete = [t for t in study.get_trials(deepcopy=False) if t.number in numbers and t.value is not None]
    scopes: list[tuple[str, list, list[str]]] = []
    common = sorted(set.intersection(*(set(t.params) for t in complete))) if complete else []
    scopes.append(("all variants", complete, common))
    for row in data.rows:
        label = data.row_variant[row]
        trials = [t for t in complete if t.params.get("variant") == label]
        names = sorted({k for t in trials for k in t.params if k.startswith(f"{label}.")})
        if names:
            scopes.append((row, trials, names))
    md_rows, csv_rows, notes = [], [], []
    for scope, trials, names in scopes:
        names = [n for n in names if all(n in t.params for t in trials)]
        if not names:
            continue
        if len(trials) < MIN_IMPORTANCE_TRIALS:
            notes.append(f"{scope}: too few completed trials ({len(trials)} < {MIN_IMPORTANCE_TRIALS}) for "
                         f"importances of {', '.join(names)}.")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sub = optuna.create_study(direction=study.direction)  # in memory: never touches the storage
                sub.add_trials(trials)
                result = get_param_importances(sub, evaluator=PedAnovaImportanceEvaluator(), params=names,
                                               normalize=True)
        except Exception as exc:  # noqa: BLE001 - importance is a best-effort summary
            notes.append(f"{scope}: importances not computed ({(str(exc).splitlines() or [type(exc).__name__])[0]}).")
            continue
        if len(names) == 1:
            notes.append(f"{scope}: one parameter ({names[0]}), so its normalised importance is 1 by definition.")
        for name in sorted(result, key=lambda n: (-round(float(result[n]), 12), n)):
            value = float(result[name])
            md_rows.append([scope, name, str(len(trials)), num(value, ".4f")])
            csv_rows.append([scope, name, str(len(trials)), csv_num(value)])
    headers = ["scope", "parameter", "trials", f"importance ({evaluator_name})"]
    caption = (f"Parameter importances of study {data.name} for best_val_acc, from optuna.importance."
               f"get_param_importances with evaluator {evaluator_name} (default settings, normalised to sum 1 "
               "per scope), over completed trials: 'all variants' for the parameters every trial has, then each "
               "variant over its own conditional search space.")
    if not md_rows:
        md_rows.append(["—", "—", "0", "—"])
    tex_rows = [[latex_escape(v) for v in r] for r in md_rows]
    return Table("importance", f"{data.name}: parameter importances", caption, _frame(md_rows, headers),
                 _frame(tex_rows, _tex_columns(headers)),
                 _frame(csv_rows, ["scope", "parameter", "trials", "importance"]), notes, text_columns=2)


# --- figures -------------------------------------------------------------------------------------------------------
def make_figures(study, data: StudyData, cells: list[Cell] | None, out: Path) -> tuple[list[Path], list[str]]:
    from . import figures as F
    from .events import read_run

    F.apply_style()
    written: list[Path] = []
    notes: list[str] = []
    variants = data.rows

    def keep(fig, name: str, tight: bool = False) -> None:
        written.extend(F.save(fig, out, name, tight=tight))

    if data.kind == "grid":
        cell_rows = [{"variant": c.row, "depth": c.depth if c.depth is not None else 0, "n": c.n,
                      "mean": None if c.mean is None else 100 * c.mean,
                      "std": None if c.std is None else 100 * c.std} for c in cells or []]
        keep(F.accuracy_vs_depth(cell_rows, variants, ylabel="top-1 val accuracy (%) [best_val_acc]"),
             "acc_vs_depth")
        selected = {row: [r for r in data.runs if r.row == row and r.depth == (data.depths[-1] if data.depths
                                                                                 else None) and r.state == "complete"]
                    for row in variants}
        curves = {d if d is not None else 0: {row: [{e: 100 * v for e, v in r.curve.items()}
                                                   for r in data.by_row_depth(row, d) if r.curve]
                                             for row in variants} for d in (data.depths or [None])}
        depth = data.depths[-1] if data.depths else 0
    else:
        best = best_per_row(data)
        selected = {row: [best[row]] for row in variants if row in best}
        curves = {}
        for row, run in sorted(selected.items(), key=lambda kv: variants.index(kv[0])):
            d = run[0].depth or 0
            curves.setdefault(d, {})[row] = [{e: 100 * v for e, v in run[0].curve.items()}]
        depth = max(curves) if curves else 0
        for name, plot, kwargs in _optuna_plots(study):
            try:
                fig = F.optuna_figure(plot, study, **kwargs)
            except Exception as exc:  # noqa: BLE001
                notes.append(f"figure {name} skipped ({(str(exc).splitlines() or [type(exc).__name__])[0]}).")
                continue
            keep(fig, name, tight=True)
            F.close(fig)
    if curves:
        keep(F.val_curves(curves, variants), "val_curves")

    events = {row: [read_run(r.log_dir) for r in runs] for row, runs in selected.items()}
    events = {row: [e for e in evs if not e.empty] for row, evs in events.items()}
    which = "best trial per variant" if data.kind == "search" else "all seeds"
    fig = F.branch_ratio(events, variants, depth=depth)
    if fig is None:
        notes.append(f"figure branch_ratio skipped: no diag/ratio_mean tags in the event files (depth {depth}).")
    else:
        keep(fig, "branch_ratio")
    matrices = _similarity_matrices(data, events, cells, depth)
    if matrices:
        keep(F.attention_similarity(matrices, depth=depth), "attn_similarity")
    else:
        notes.append("figure attn_similarity skipped: no diag/attn_sim_full_json text in the event files.")
    fig = F.param_evolution(events, variants, depth=depth)
    if fig is None:
        notes.append("figure param_evolution skipped: no variant logged diag/param tags.")
    else:
        keep(fig, "param_evolution")
    if data.kind == "grid" or selected:
        notes.append(f"diagnostic figures use {which} at depth {depth}, last logged epoch.")
    return written, notes


def _optuna_plots(study):
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.visualization import matplotlib as ovm

    return [("optuna_history", ovm.plot_optimization_history, {"target_name": "best_val_acc"}),
            ("optuna_importance", ovm.plot_param_importances,
             {"evaluator": PedAnovaImportanceEvaluator(), "target_name": "best_val_acc"}),
            ("optuna_intermediate", ovm.plot_intermediate_values, {})]


def _similarity_matrices(data: StudyData, events: dict, cells: list[Cell] | None, depth: int) -> dict:
    """Mean (over the selected runs) attention-similarity matrix of the baseline (standard, else the first
    variant) and of the best other variant (highest mean accuracy at that depth)."""
    import numpy as np

    mats = {}
    for row, evs in events.items():
        found = [m for m in (e.json_matrix() for e in evs) if m is not None]
        shapes = {np.asarray(m[1]).shape for m in found}
        if found and len(shapes) == 1:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                mats[row] = np.nanmean(np.stack([np.asarray(m[1], dtype=float) for m in found]), axis=0)
    if not mats:
        return {}
    order = [r for r in data.rows if r in mats]
    base = next((r for r in order if data.row_variant[r] == BASELINE), order[0])
    if data.kind == "grid" and cells is not None:
        score = {c.row: c.mean for c in cells if c.depth == (data.depths[-1] if data.depths else None)}
    else:
        score = {row: run.acc for row, run in best_per_row(data).items()}
    others = [r for r in order if r != base and score.get(r) is not None]
    chosen = {f"{base} (baseline)": mats[base]}
    if others:
        top = max(others, key=lambda r: (score[r], -order.index(r)))
        chosen[f"{top} (best)"] = mats[top]
    return chosen


# --- writing -------------------------------------------------------------------------------------------------------
def write_table(table: Table, out: Path, study_name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{table.name}.md", out / f"{table.name}.tex", out / f"{table.name}.csv"]
    label = "tab:" + re.sub(r"[^A-Za-z0-9]+", "-", f"{study_name}-{table.name}")
    for path, text in zip(paths, (table.markdown(), table.latex(label), table.csv()), strict=True):
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
    return paths


def write_tensorboard(run_dir: Path, tables: Sequence[Table]) -> Path:
    """The tables as TensorBoard text (Markdown) in ``run_dir`` (a run without hparams data, so the trials'
    HParams table is unaffected); earlier report event files there are replaced."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob("events.out.tfevents.*"):
        old.unlink()
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(run_dir))
    try:
        for table in tables:
            writer.add_text(f"report/{table.name}", table.markdown(), global_step=0)
    finally:
        writer.close()
    return run_dir


def save_dashboard_note(study, markdown: str) -> None:
    import optuna_dashboard

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna_dashboard.save_note(study, markdown)


# --- CLI -----------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from .storage import DEFAULT_STORAGE

    p = OneLineParser(prog="python -m ablations.report", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--study", required=True, help="a study name (see python -m ablations.run --list) or a .yaml path")
    p.add_argument("--budget", default="default", help="study size the study was run at: smoke, default, paper")
    p.add_argument("--storage", default=os.environ.get("ABLATIONS_STORAGE", DEFAULT_STORAGE),
                   help=f"Optuna storage URL (default {DEFAULT_STORAGE}, or $ABLATIONS_STORAGE)")
    p.add_argument("--study-name", help="name in the storage (default: the study's name, suffixed by the budget)")
    p.add_argument("--results-dir", default="results",
                   help="results folder: tables go to <dir>/<study name>/, TensorBoard runs are in <dir>/runs/")
    p.add_argument("--out", help="folder for tables and figures (default: <results-dir>/<study name>)")
    p.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument("--no-tensorboard", action="store_true", help="do not write the table to TensorBoard")
    p.add_argument("--no-note", action="store_true", help="do not attach the table to the study (dashboard note)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*(ExperimentalWarning|experimental).*")
            return _main(args)
    except (ReportError, ValueError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into head: the files are written, stdout is gone
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the interpreter's flush at exit
        return 0


def _main(args: argparse.Namespace) -> int:
    from .spec import load_spec

    spec = load_spec(args.study, args.budget)
    study_name = args.study_name or spec.study_name
    study = open_study(args.storage, study_name, spec)
    results_dir = Path(args.results_dir)
    data = collect(study, spec, results_dir)
    if not any(r.state == "complete" for r in data.runs):
        states = {}
        for t in study.get_trials(deepcopy=False):
            states[t.state.name.lower()] = states.get(t.state.name.lower(), 0) + 1
        detail = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no trials"
        raise ReportError(f"study '{study_name}' has no completed trials ({detail}); nothing to report")
    out = Path(args.out) if args.out else results_dir / study_name

    tables: list[Table] = []
    cells = None
    if spec.kind == "grid":
        cells = main_cells(data)
        tables.append(main_table(data, cells))
        tables.append(convergence_table(data))
        top_depth = max([*data.depths, *[int(d) for d in spec.axes.get("depth", [])]], default=None)
        representative = {}
        for row in data.rows:
            runs = sorted((r for r in data.runs if r.row == row and r.config), key=lambda r: (
                r.depth != top_depth, -(r.depth or 0), r.seed if r.seed is not None else -1, r.number))
            if runs:
                rep = runs[0]
                if rep.depth != top_depth and top_depth is not None:  # price it at the study's largest depth
                    rep = Run(**{**rep.__dict__, "depth": top_depth, "config": {**rep.config, "depth": top_depth}})
                representative[row] = rep
        tables.append(cost_table(data, representative, depth_note=f"at depth {top_depth}"))
    else:
        tables.append(search_table(data))
        tables.append(importance_table(study, data))
        tables.append(cost_table(data, best_per_row(data), depth_note="for its best trial's configuration"))

    written: list[Path] = []
    for table in tables:
        written += write_table(table, out, study_name)
    notes = [f"{t.name}: {n}" for t in tables for n in t.notes]
    if not args.no_figures:
        figs, fig_notes = make_figures(study, data, cells, out)
        written += figs
        notes += fig_notes
    headline = tables[0]
    if not args.no_tensorboard:
        run_dir = _tensorboard_dir(data, results_dir, study_name)
        written.append(write_tensorboard(run_dir, tables))
    if not args.no_note:
        try:
            save_dashboard_note(study, f"## Report: {study_name}\n\n" + "\n".join(t.markdown() for t in tables))
            notes.append(f"optuna-dashboard note saved on study '{study_name}'.")
        except Exception as exc:  # noqa: BLE001 - a read-only storage must not lose the report
            notes.append(f"optuna-dashboard note not saved: {(str(exc).splitlines() or [type(exc).__name__])[0]}")

    print(headline.markdown())
    for n in notes:
        print(f"note: {n}")
    print(f"\nfiles written ({len(written)}):")
    for path in written:
        print(f"  {path}")
    return 0


def _tensorboard_dir(data: StudyData, results_dir: Path, study_name: str) -> Path:
    """``<results-dir>/runs/<study>/_report``, or next to the trials' runs when they live elsewhere."""
    default = results_dir / "runs" / study_name
    parents = {r.log_dir.parent for r in data.runs if r.log_dir is not None}
    if not default.is_dir() and len(parents) == 1:
        return next(iter(parents)) / REPORT_RUN
    return default / REPORT_RUN


if __name__ == "__main__":
    raise SystemExit(main())
