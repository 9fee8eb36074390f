"""``python -m ablations.report``: arguments, the report's run, and its outputs besides the table files
(stdout, TensorBoard text, optuna-dashboard note)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import yaml

from .. import layout
from ..cli import OneLineParser, add_study_arguments, program
from ..studies.overrides import OVERRIDES_ATTR, apply_sets, describe, parse_sets
from ..studies.spec import TUNE_MEANS, TUNED_LR, contend_name, load_spec, resolved, round_name
from ..studies.storage import check_sqlite_file, unusable_storage_error, unusable_storage_message
from . import format as fmt
from . import model_tables as mt
from . import runs as runs_csv
from . import tables as tb
from .aggregate import write_study
from .calibration import calibration_table
from .claims import claims_table
from .depth import depth_figure, depth_table
from .ledger import summary, write_ledger
from .load import (
    AUC_KEY,
    EPOCH_TIME_KEY,
    FRACTION_KEYS,
    WALL_TIME_KEY,
    ReportError,
    StudyData,
    best_per_row,
    collect,
    first_line,
    open_study,
    open_tune_study,
)
from .notes import READING_ATTR, reading_line, study_note, tuning_note
from .power import power_table
from .stats import main_cells
from .tuning import tuning_figure, tuning_records, tuning_table


def build_parser() -> argparse.ArgumentParser:
    doc = sys.modules[__package__].__doc__ or ""
    p = OneLineParser(prog=program("ablations.report"), description=doc.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[-1])
    add_study_arguments(p, report=True)
    p.add_argument("--results-dir", default=layout.OUTPUT_DIR,
                   help=f"results folder: tables go to <dir>/<study name>/, TensorBoard runs are in "
                        f"<dir>/{layout.RUNS}/ (default {layout.OUTPUT_DIR}, which git ignores; the committed studies "
                        f"are regenerated with --results-dir {layout.RESULTS_DIR})")
    p.add_argument("--out", help="folder for tables and figures (default: <results-dir>/<study name>)")
    p.add_argument("--runs", metavar="CSV",
                   help="regenerate the report from a runs.csv alone (no storage): main, paired, power, convergence, "
                        "claims, tuning (byte-identical to the report from the storage), depth, a grid's cost table "
                        "(each row priced at the model the study file builds) and figures, and its collapse and mixing "
                        "tables where the file carries the runs' diagnostics; a search's importance and cost tables and "
                        "its Optuna plots need the storage")
    p.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument("--html", action="store_true",
                   help="also write <out>/report.html (tables, figures, claims, protocol, run; opens in a browser) and "
                        "<results-dir>/index.html linking every study's report")
    p.add_argument("--no-tensorboard", action="store_true",
                   help="do not write the tables and the seed aggregates (runs agg/<variant>/depth=<d>) to TensorBoard")
    p.add_argument("--no-note", action="store_true", help="do not attach the tables to the study (dashboard note)")
    p.add_argument("--ledger", action="store_true",
                   help="write the claims ledger <results-dir>/claims.md and claims.csv from every study's runs.csv "
                        "(<results-dir>/<study>/runs.csv): each claim's verdict in its study and under one Holm "
                        "family over all claims, shared runs marked (no --study)")
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
    except Exception as exc:  # a storage file found damaged past the check in _main: one line, not a traceback

        damaged = unusable_storage_error(exc)
        if damaged is None:
            raise
        print(f"error: {unusable_storage_message(args.storage, damaged)}", file=sys.stderr)
        return 2


def _ledger(args: argparse.Namespace) -> int:
    """``--ledger``: the claims ledger from every study folder's runs.csv (:mod:`.ledger`)."""
    if args.study:
        raise ReportError("--ledger reads every study under --results-dir: give no --study")
    paths, records = write_ledger(Path(args.results_dir))
    counts = summary(records)
    for key, label in (("verdict", "in its study"), ("verdict_all", "all claims")):
        print(f"{label}: " + ", ".join(f"{n} {v}" for v, n in counts[key].items()))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _main(args: argparse.Namespace) -> int:
    if args.ledger:
        return _ledger(args)
    if not args.study:
        raise ReportError("--study is required (or --ledger)")
    spec = apply_sets(load_spec(args.study, args.budget), parse_sets(args.sets))
    study_name = args.study_name or spec.study_name
    results_dir = Path(args.results_dir)
    study = None
    if args.runs:
        data = runs_csv.read(Path(args.runs), spec, study_name)
    else:
        check_sqlite_file(args.storage)  # garbage or a truncated file: one line, and the file is never written
        study = open_study(args.storage, study_name, spec)
        data = collect(study, spec, results_dir, tune_study=open_tune_study(study),
                       contend_study=open_tune_study(study, contend_name),
                       round_study=open_tune_study(study, round_name))
    out = Path(args.out) if args.out else layout.report_dir(results_dir, study_name)
    if not any(r.state == "complete" for r in data.runs):
        if not any(r.state == "complete" for r in data.tune_runs):
            raise ReportError(f"study '{study_name}' has no completed trials in its report phase "
                              f"({_states(study, data)}); nothing to report")
        return _tuning_only(data, spec, out, figures=not args.no_figures)
    tables, cells, notes = build_tables(data, spec, study)
    if label_first_look(tables, spec):
        notes.insert(0, spec.first_look())
    overrides = spec.overrides if study is None else study.user_attrs.get(OVERRIDES_ATTR, {})
    if overrides:  # in main.md (the first table's notes) and on stdout
        tables[0].notes.append(f"run with overrides of the study's base (--set): {describe(overrides)}")

    written: list[Path] = []
    for table in tables:
        written += fmt.write_table(table, out, study_name)
    written.append(runs_csv.write(data, out / "runs.csv"))  # every result trial: the tables' one input
    written.append(write_resolved(spec, out / "study.yaml"))  # the study as it ran: base files and budget resolved
    notes = [f"{t.name}: {n}" for t in tables for n in t.notes] + notes + mixed_run_notes(data)
    if not args.no_figures:
        written += _figures(data, study, cells, tables, out, notes)
    if not args.no_tensorboard:
        written += _tensorboard(data, spec, study, tables, results_dir, study_name)
    page = None
    if args.html:
        page = _html(data, spec, tables, out, results_dir, study, args.runs)
        written.append(page)
        if out.resolve().parent == results_dir.resolve():  # results/<study>/report.html: the index lists it
            written.append(_index(results_dir))
    if study is not None and not args.no_note:
        notes += _dashboard_notes(study, spec, study_name, tables, page or out / "report.html")

    print(tables[0].markdown())
    for n in notes:
        print(f"note: {n}")
    print(f"\nfiles written ({len(written)}):")
    for path in written:
        print(f"  {path}")
    return 0


def mixed_run_notes(data: StudyData) -> list[str]:
    """Notes on runs that a pair compares although they differ: in their modes, their machines or their forms."""
    notes = []
    modes = data.modes()
    if len(modes) > 1:  # e.g. a study continued after precision auto: its pairs mix numerics (runs.csv: 'mode')
        notes.append("runs trained in different modes (" + "; ".join(f"{m}: {n}" for m, n in modes.items())
                     + "): paired differences mix numerics; fix precision and fused_attn in the study base to compare alike")
    machines = data.machines()
    if len(set(machines) - {"not recorded"}) > 1:  # e.g. continued elsewhere (--import-runs): runs.csv's 'machine'
        notes.append("runs trained on different machines (" + "; ".join(f"{m}: {n}" for m, n in machines.items())
                     + "): a seed gives the same weights, data and batch order on each, but machines of different "
                       "kinds compute different floats, so a pair that straddles two is paired only up to that")
    if mixed := data.mixed_forms():  # e.g. runs stored before a variant's default changed (runs.csv: 'form')
        notes.append("rows whose runs were built in more than one form (a default changed between them): "
                     + "; ".join(f"{v}: {n} forms" for v, n in mixed.items())
                     + "; their means mix designs: train them again (--import-runs leaves out rows of an earlier "
                       "form)")
    return notes


def _figures(data: StudyData, study, cells, tables: Sequence, out: Path, notes: list[str]) -> list[Path]:
    """The tuning and depth figures, and every other figure (their notes added to ``notes``): a grid study's from
    runs.csv alone too (its curves and carried diagnostics), a search's Optuna plots from its storage only."""
    written = tuning_figure(data, tuning_records(data), out) if data.tune_runs else []
    depth = next((t for t in tables if t.name == "depth"), None)
    if depth is not None:
        written += depth_figure(depth.frame.to_dict("records"), data.rows, data.name, out)
    if study is not None or data.kind == "grid":
        from .figures import report_figures  # matplotlib, optuna's plots and torch: only when figures are drawn

        figs, fig_notes = report_figures(study, data, cells, out)
        written += figs
        notes += fig_notes
    return written


def _tensorboard(data: StudyData, spec, study, tables: Sequence, results_dir: Path, study_name: str) -> list[Path]:
    """The tables as TensorBoard text (from a storage) and the seed aggregates (from a storage or runs.csv alone)."""
    written = []
    if study is not None:
        written.append(write_tensorboard(tensorboard_dir(data, results_dir, study_name), tables))
    agg = write_study(data, spec, tensorboard_dir(data, results_dir, study_name).parent)
    return written + ([agg] if agg is not None else [])


def _html(data: StudyData, spec, tables: Sequence, out: Path, results_dir: Path, study, runs: str | None) -> Path:
    from .html import write_report  # plotly and markdown: only for --html

    return write_report(data, spec, tables, out, results_dir=results_dir, study=study,
                        source="storage" if study is not None else str(runs))


def _index(results_dir: Path) -> Path:
    from .html import write_index  # plotly and markdown: only for --html

    return write_index(results_dir)


def _dashboard_notes(study, spec, study_name: str, tables: Sequence, page: Path) -> list[str]:
    """Attach the report to the study, and the tuning choice to its tuning stage, as optuna-dashboard notes; what
    was saved, or the one line why not (a read-only storage must not lose the report)."""
    notes = []
    try:
        save_dashboard_note(study, study_note(study_name, tables, page, grid=spec.kind == "grid"))
        if spec.kind == "grid":  # on the study's first page, beside the Best Trial and Importance panels
            study.set_user_attr(READING_ATTR, reading_line(page))
        notes.append(f"optuna-dashboard note saved on study '{study_name}'.")
        tune_study = open_tune_study(study)
        if tune_study is not None and spec.tune is not None and study.user_attrs.get(TUNED_LR):
            save_dashboard_note(tune_study, tuning_note(study_name, study.user_attrs[TUNED_LR],
                                                        study.user_attrs.get(TUNE_MEANS) or {},
                                                        metric=spec.tune.metric, seeds=spec.tune.seeds))
            notes.append(f"optuna-dashboard note saved on its tuning stage '{tune_study.study_name}'.")
    except Exception as exc:  # noqa: BLE001 - a read-only storage must not lose the report
        notes.append(f"optuna-dashboard note not saved: {first_line(exc)}")
    return notes


def write_resolved(spec, path: Path) -> Path:
    """The study as trained (:func:`ablations.studies.spec.resolved`) as YAML at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ("# The study file with its base files and budget resolved, as the code that wrote this report reads it;\n"
              "# each stored run's own settings (learning rate, seed, tuning stage, mode) are its row of runs.csv.\n")
    path.write_text(header + yaml.safe_dump(resolved(spec), sort_keys=False, allow_unicode=True, width=120))
    return path


def label_first_look(tables: Sequence, spec) -> bool:
    """Put a first-look budget's label (``StudySpec.first_look``) into every table's title and caption, so that no
    copied table loses it; whether there was one."""
    label = spec.first_look()
    for table in tables if label else ():
        table.title += f" (first look: budget {spec.budget}, underpowered)"
        table.caption = f"{label}. {table.caption}"
    return label is not None


def _tuning_only(data: StudyData, spec, out: Path, figures: bool) -> int:
    """A study still in its tuning stage: its runs.csv (what ``python -m ablations.run --import-runs`` continues it
    from elsewhere) and the tuning table (and figure) so far; the reported tables wait for reported trials."""
    table = tuning_table(data, tuning_records(data))
    label_first_look([table], spec)
    written = [*fmt.write_table(table, out, data.name), runs_csv.write(data, out / "runs.csv")]
    if figures:
        written += tuning_figure(data, tuning_records(data), out)
    print(table.markdown())
    print(f"note: study '{data.name}' has no completed trial in its report phase yet ({len(data.tune_runs)} tuning "
          "trials): wrote runs.csv and the tuning table only; the other tables come with the reported trials")
    print(f"\nfiles written ({len(written)}):")
    for path in written:
        print(f"  {path}")
    return 0


CONVERGENCE_INPUTS = (*FRACTION_KEYS, AUC_KEY, EPOCH_TIME_KEY, WALL_TIME_KEY)


def build_tables(data: StudyData, spec, study=None) -> tuple[list, list | None, list[str]]:
    """(tables, the main table's cells (grid studies), notes). Without a ``study`` (from runs.csv) the tables whose
    inputs are not in runs.csv are skipped with a note."""

    cells, notes = None, []
    if spec.kind == "grid":
        cells = main_cells(data)
        tables = [tb.main_table(data, cells), tb.paired_table(data, cells)]
        power = power_table(data, cells)
        if power is not None:
            tables.append(power)
        if spec.claims:
            tables.append(claims_table(data, spec.claims, spec=spec))
        calibration = calibration_table(data, data.config_value("dataset") or spec.base.get("dataset"))
        if calibration is not None:
            tables.append(calibration)
    else:
        tables = [tb.search_table(data)]
    if data.tune_runs:
        tables.append(tuning_table(data, tuning_records(data)))
    if spec.kind == "grid" and any(key in r.summary for r in data.runs for key in CONVERGENCE_INPUTS):
        tables.append(tb.convergence_table(data))
    elif spec.kind == "grid":
        notes.append("convergence: no run has the summary metrics it needs (an earlier report's runs.csv?); not written.")
    if spec.kind == "grid" and (depth := depth_table(data, spec.verdicts)) is not None:
        tables.append(depth)
    if spec.kind == "grid":  # from runs.csv: each row priced at the model the study file builds at its point
        top_depth = max([*data.depths, *[int(d) for d in spec.axes.get("depth", [])]], default=None)
        chosen = mt.representatives(data, top_depth)
        chosen = chosen if study is not None else mt.priced_by_study_file(chosen, spec)
        tables.append(mt.cost_table(data, chosen, depth_note=f"at depth {top_depth}", from_file=study is None))
    elif study is not None:
        tables += [tb.importance_table(study, data),
                   mt.cost_table(data, best_per_row(data), depth_note="for its best trial's configuration")]
    # the runs that logged diag/similar_blocks (collapse) or a mixing gain (multi-stream variants), read from their
    # event files, else from runs.csv's diagnostics column
    collapse = mt.collapse_records(data) if spec.kind == "grid" else []
    gains = mt.gain_records(data) if spec.kind == "grid" else []
    tables += [*([mt.collapse_table(data, collapse)] if collapse else []),
               *([mt.gain_table(data, gains)] if gains else [])]
    if study is None and spec.kind != "grid":
        notes.append("from runs.csv: a search's importance and cost tables and its Optuna figures need the storage's "
                     "trials and were not regenerated.")
    elif study is None and not (collapse or gains):
        notes.append("from runs.csv without a diagnostics column: the collapse and mixing tables and the diagnostic "
                     "figures need the runs' event files or their carried diagnostics and were not regenerated.")
    return tables, cells, notes


def _states(study, data: StudyData) -> str:
    """'k complete, j failed, …' of the study's trials (or of the runs file's rows)."""
    states: dict[str, int] = {}
    names = ([t.state.name.lower() for t in study.get_trials(deepcopy=False)] if study is not None
             else [f"{r.state} ({r.phase})" for r in [*data.runs, *data.tune_runs]])
    for name in names:
        states[name] = states.get(name, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no trials"


def tensorboard_dir(data: StudyData, results_dir: Path, study_name: str) -> Path:
    """``<results-dir>/runs/<study>/_report``, or next to the trials' runs when they live elsewhere."""
    default = layout.runs_dir(results_dir, study_name)
    parents = {r.log_dir.parent for r in data.runs if r.log_dir is not None}
    if not default.is_dir() and len(parents) == 1:
        return next(iter(parents)) / layout.REPORT_RUN
    return default / layout.REPORT_RUN


def write_tensorboard(run_dir: Path, tables: Sequence) -> Path:
    """The tables as TensorBoard text (Markdown, tag ``report/<table>``) in ``run_dir`` (a run without hparams
    data, so the trials' HParams table is unaffected); earlier report event files there are replaced."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob("events.out.tfevents.*"):
        old.unlink()
    from torch.utils.tensorboard import SummaryWriter  # torch: only when the tables go to TensorBoard

    writer = SummaryWriter(log_dir=str(run_dir))
    try:
        for table in tables:
            writer.add_text(f"report/{table.name}", table.markdown(), global_step=0)
    finally:
        writer.close()
    return run_dir


def save_dashboard_note(study, markdown: str) -> None:
    import optuna_dashboard  # 2 s to import: only when a note is saved

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna_dashboard.save_note(study, markdown)
