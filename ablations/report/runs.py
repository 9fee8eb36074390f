"""``runs.csv``: every result trial of a study as one CSV row, and the way back from that file to the same
:class:`~ablations.report.load.Run` / :class:`~ablations.report.load.StudyData` objects a storage gives, so that
``python -m ablations.report --study NAME --runs results/NAME/runs.csv`` regenerates the tables whose inputs it
holds (main, paired, convergence, claims, tuning) byte-identical to the report made from the storage.

Columns, in this order: ``number, run_name, state, phase, variant, row, depth, seed``, the study's other grid axes,
``residual, residual_options`` (JSON), ``lr``, ``num_classes`` (what a diverged run's chance level is computed
from; empty when not recorded), ``acc`` (the report's accuracy metric, :attr:`StudyData.metric`), every run-summary
key of :data:`ablations.training.HP_SUMMARY_KEYS` but ``diverged``, then ``test_acc``, ``test_acc_at_best_val`` and
``stack_size`` (the engine's stack a trial trained in, whose wall time it shared) when any trial has them, ``test_correct`` (per-image test results), ``machine`` (what the run trained on) and
``form`` (the options its model's parts were built with, defaults filled in) when any trial has them, ``diagnostics``
(a reported run's diagnostics at its last logged epoch, :func:`ablations.report.events.carried_text`: what the
collapse table and the diagnostic figures read) when any reported run logged them, ``diverged, ok, mode``, and last ``val_acc_curve`` when any trial has one: the per-epoch
validation accuracy the trial reported, a JSON list from epoch 1 (``null`` for an epoch without a value), so that a
study continued elsewhere from this file (``python -m ablations.run --import-runs``) keeps its curves. Numbers are
written so that they read back exactly (``repr`` of a float); an empty cell is a missing value.

Reading also accepts the shorter files of earlier reports (``number, run_name, state, variant, row, depth, seed,
acc, diverged, ok[, mode]``): only :data:`REQUIRED` columns must be there; a missing ``phase`` is ``report``, a
missing summary column leaves the tables that need it out (convergence), a missing ``lr`` shows as "—".
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from .. import layout
from ..training import HP_SUMMARY_KEYS
from .events import DIAGNOSTICS_KEY, carried_text, read_run
from .load import DIVERGED_KEY, PHASES, STACK_SIZE_KEY, ReportError, Run, StudyData, assemble, run_mode
from .stats import num_classes

# Imported where they are used, not here: pandas. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.

HEAD = ("number", "run_name", "state", "phase", "variant", "row", "depth", "seed")
CONFIG_COLUMNS = ("residual", "residual_options", "lr", "num_classes", "acc")
SUMMARY_COLUMNS = tuple(k for k in HP_SUMMARY_KEYS if k != DIVERGED_KEY)
#: written when any trial has them; ``stack_size``: a trial the engine trained in a stack of K, whose wall time is the
#: stack's (:func:`ablations.report.load.own_seconds`)
OPTIONAL_COLUMNS = ("test_acc", "test_acc_at_best_val", STACK_SIZE_KEY)
#: written when any trial has them: the final epoch's per-image test results (:func:`lit_modules.predictions.pack`),
#: what the report's two-level bootstrap (seeds x test images) resamples, and the machine the run trained on
#: (:func:`ablations.machine.modes.machine_text`) and the form its model was built in (:data:`ablations.layout.FORM_KEY`:
#: every part's options with their defaults filled in, as sorted JSON)
TEXT_COLUMNS = ("test_correct", "machine", layout.FORM_KEY, DIAGNOSTICS_KEY)
#: the phases whose runs carry their diagnostics (the ones the collapse table and the diagnostic figures read)
CARRYING = ("report", "round")
TAIL = ("diverged", "ok", "mode")
CURVE = "val_acc_curve"  # written when any trial has a per-epoch curve
STATES = ("complete", "pruned", "failed")
REQUIRED = ("number", "state", "variant", "depth", "seed", "acc", "diverged")  # what main and paired need


def columns(runs: list[Run], records: list[dict[str, Any]], axes: list[str]) -> list[str]:
    optional = [k for k in (*OPTIONAL_COLUMNS, *TEXT_COLUMNS)
                if any(k in r.summary for r in runs) or any(rec.get(k) is not None for rec in records)]
    curve = [CURVE] if any(r[CURVE] for r in records) else []
    return list(dict.fromkeys([*HEAD, *axes, *CONFIG_COLUMNS, *SUMMARY_COLUMNS, *optional, *TAIL, *curve]))


def all_runs(data: StudyData) -> list[Run]:
    """Every phase's runs: the tuning stage's (its own study: numbers from 0) first, then the reported runs, then the
    contending rates' (their own study), each phase by trial number."""
    order = {"tune": 0, "report": 1, "contend": 2}
    return sorted([*data.runs, *data.tune_runs, *data.contend_runs], key=lambda r: (order.get(r.phase, 1), r.number))


def _axes(data: StudyData) -> list[str]:
    return list(dict.fromkeys(a for r in all_runs(data) for a, _ in r.extras))


def record(run: Run) -> dict[str, Any]:
    config = run.config or {}
    rec = {"number": run.number, "run_name": run.run_name, "state": run.state, "phase": run.phase,
           "variant": run.variant, "row": run.row, "depth": run.depth, "seed": run.seed, **dict(run.extras),
           "residual": config.get("residual", run.variant),
           "residual_options": json.dumps(config.get("residual_options") or {}, sort_keys=True),
           "lr": run.lr, "num_classes": num_classes(run), "acc": run.acc,
           "diverged": run.diverged, "ok": run.ok, "mode": run_mode(run), CURVE: curve_text(run.curve)}
    for key in (*SUMMARY_COLUMNS, *OPTIONAL_COLUMNS, *TEXT_COLUMNS):
        rec[key] = run.summary.get(key)
    if rec[DIAGNOSTICS_KEY] is None and run.ok and run.phase in CARRYING:
        rec[DIAGNOSTICS_KEY] = carried_text(read_run(run.log_dir))
    return rec


def frame(data: StudyData):
    """runs.csv as a pandas DataFrame (dtype object: values as :func:`text` writes them)."""
    import pandas as pd

    cols, records = _table(data)
    return pd.DataFrame([[text(rec.get(c)) for c in cols] for rec in records], columns=cols, dtype=object)


def _table(data: StudyData) -> tuple[list[str], list[dict[str, Any]]]:
    """runs.csv's columns and one record per run, in :func:`all_runs` order."""
    runs = all_runs(data)
    records = [record(r) for r in runs]
    return columns(runs, records, _axes(data)), records


def to_csv(data: StudyData) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    cols, records = _table(data)
    writer.writerow(cols)
    for rec in records:
        writer.writerow([text(rec.get(c)) for c in cols])
    return out.getvalue()


def write(data: StudyData, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(to_csv(data))
    return path


def text(value: Any) -> str:
    """A cell: '' for None, True/False, repr of a float (reads back exactly), str otherwise."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(float(value))  # float(): a numpy scalar's repr names its type
    return str(value)


def curve_text(curve: dict[int, float]) -> str | None:
    """A run's per-epoch curve ({epoch (1-based): value}) as a JSON list from epoch 1, None when it has none."""
    if not curve:
        return None
    return json.dumps([curve.get(epoch) for epoch in range(1, max(curve) + 1)])


def read_curve(cell: str) -> dict[int, float]:
    """The inverse of :func:`curve_text`; ValueError for a cell that is not a JSON list of numbers and nulls."""
    if not cell:
        return {}
    values = json.loads(cell)
    if not isinstance(values, list) or not all(v is None or isinstance(v, (int, float)) for v in values):
        raise ValueError(cell)
    return {epoch: float(v) for epoch, v in enumerate(values, start=1) if v is not None}


def value(cell: str) -> Any:
    """The inverse of :func:`text` for numbers, booleans and missing values; other text stays text."""
    if cell == "":
        return None
    if cell in ("True", "False"):
        return cell == "True"
    for kind in (int, float):
        try:
            return kind(cell)
        except ValueError:
            continue
    return cell


def read(path: Path, spec, name: str) -> StudyData:
    """StudyData from a runs.csv (``spec`` gives the variant order, the grid axes and the metric); ReportError
    (one line) for a missing, empty or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"runs file '{path}' does not exist")
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            lines = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ReportError(f"runs file '{path}' is not a readable CSV file ({exc})") from None
    axes = [a for a in spec.axes if a not in ("depth", "seed")]
    missing = [c for c in (*REQUIRED, *axes) if c not in header]
    if missing:
        full = dict.fromkeys([*HEAD, *axes, *CONFIG_COLUMNS, *SUMMARY_COLUMNS, *TAIL])
        raise ReportError(f"runs file '{path}' lacks column(s) {', '.join(missing)}; a runs.csv written by "
                          f"python -m ablations.report has: {', '.join(full)}")
    if not lines:
        raise ReportError(f"runs file '{path}' has no trials")
    summary_keys = [k for k in (*SUMMARY_COLUMNS, *OPTIONAL_COLUMNS) if k in header]
    text_keys = [k for k in TEXT_COLUMNS if k in header]
    runs = [_run(line, index + 2, path, axes, summary_keys, text_keys) for index, line in enumerate(lines)]
    return assemble(name, spec, runs)


def _run(line: dict[str, str], lineno: int, path: Path, axes: list[str], summary_keys: list[str],
         text_keys: list[str] = ()) -> Run:
    where = f"runs file '{path}' line {lineno}"
    if None in line or any(v is None for v in line.values()):
        raise ReportError(f"{where}: wrong number of fields")
    line = {"run_name": "", "phase": "report", "residual": line["variant"], "residual_options": "", "lr": "",
            "num_classes": "", "mode": ""} | line  # the columns an earlier report's runs.csv did not have
    cells = {k: value(v) for k, v in line.items()}
    for key in ("number", "depth", "seed", "num_classes"):
        if cells[key] is not None and not isinstance(cells[key], int):
            raise ReportError(f"{where}: column '{key}' must be an integer, got '{line[key]}'")
    if cells["number"] is None:
        raise ReportError(f"{where}: column 'number' is empty")
    for key in ("lr", "acc", *summary_keys):
        if cells[key] is not None and not isinstance(cells[key], (int, float)):
            raise ReportError(f"{where}: column '{key}' must be a number, got '{line[key]}'")
    if line["state"] not in STATES:
        raise ReportError(f"{where}: state '{line['state']}' is not valid; valid choices: {', '.join(STATES)}")
    if line["phase"] not in PHASES:
        raise ReportError(f"{where}: phase '{line['phase']}' is not valid; valid choices: {', '.join(PHASES)}")
    if not isinstance(cells["diverged"], bool):
        raise ReportError(f"{where}: column 'diverged' must be True or False, got '{line['diverged']}'")
    try:
        options = json.loads(line["residual_options"] or "{}")
    except json.JSONDecodeError:
        raise ReportError(f"{where}: column 'residual_options' is not JSON: '{line['residual_options']}'") from None
    config = {"residual": line["residual"], "residual_options": options, "lr": cells["lr"],
              "num_classes": cells["num_classes"]}
    summary = {k: cells[k] for k in summary_keys if cells[k] is not None}
    summary |= {k: line[k] for k in text_keys if line[k]}
    summary[DIVERGED_KEY] = cells["diverged"]
    try:
        curve = read_curve(line.get(CURVE) or "")
    except (ValueError, json.JSONDecodeError):
        raise ReportError(f"{where}: column '{CURVE}' is not a JSON list of numbers: '{line[CURVE]}'") from None
    return Run(number=cells["number"], state=line["state"], variant=line["variant"], depth=cells["depth"],
               seed=cells["seed"], row="", extras=tuple((a, cells[a]) for a in axes),
               acc=None if cells["acc"] is None else float(cells["acc"]), diverged=cells["diverged"],
               summary=summary, config={k: v for k, v in config.items() if v is not None},
               run_name=line["run_name"] or None, phase=line["phase"], mode=line["mode"] or None, curve=curve)
