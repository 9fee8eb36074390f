"""Tables and figures of a study, regenerated from its Optuna storage and TensorBoard event files (never retrains).

    python -m ablations.report --study residual_variants                       # default budget, default storage
    python -m ablations.report --study residual_variants --budget smoke --storage sqlite:///runs/o.db
    python -m ablations.report --study init_values --study-name my-search --out paper/tables
    python -m ablations.report --study residual_variants --runs results/residual_variants/runs.csv --out /tmp/x
    python -m ablations.report --study residual_variants --budget smoke --set max_epochs=2   # a --set study
    python -m ablations.report --study residual_variants --runs results/residual_variants/runs.csv --html  # web page

``--set FIELD=VALUE`` (as given to ``ablations.run``) finds the study those overrides ran as
(:mod:`ablations.studies.overrides`); the main table's notes say which overrides the study ran with.

Writes to ``<results-dir>/<study name>/`` (or ``--out``):

* grid studies: ``main`` (variant × depth accuracy on the study's metric — ``test_acc`` for the re-run studies,
  ``best_val_acc`` for older ones —, mean ± sd over seeds, each variant's learning rate, and the paired difference
  to the ``standard`` variant with its unadjusted 95% CI, Holm-significant ones marked), ``paired`` (one line per
  variant × depth: pairs, Δ, CI, paired t-test and Wilcoxon p-values raw and Holm-adjusted over one family,
  noncentral-t minimum detectable effect, diverged runs counted at chance level), ``claims`` (the verdict of each
  claim the study file lists: held / not held / not resolved / untestable, :mod:`.claims`), ``power`` (the seeds
  each comparison would need for an MDE of 2 / 1 / 0.5 pp, and what the whole table would cost, :mod:`.power`),
  ``tuning`` (val accuracy per variant × LR of the ``phase: tune`` trials, with a figure), ``convergence`` and
  ``cost`` tables, and ``collapse`` (DeepViT's number of similar blocks per variant × depth with the adjacent-block
  similarity) when the trials logged ``diag/similar_blocks``, and ``mixing`` (the composite gain of
  Hyper-Connections' / mHC's stream mixing per variant × depth) when they logged ``diag/composite_gain``;
* search studies: ``search_best`` (best trial per variant), ``importance`` (parameter importances) and ``cost``;

each as ``.md``, ``.tex`` (booktabs) and ``.csv``; ``runs.csv`` lists every result trial of both phases with its
TensorBoard run name (``<variant>/depth=<d>/seed=<s>``), axes, LR, every summary metric, diverged flag and mode
(:mod:`.runs`), and ``--runs runs.csv`` regenerates main, paired, claims, power, tuning and convergence from it
alone, byte-identical to the report from the storage, and a grid's cost table, figures and (where the file carries
its runs' diagnostics) collapse and mixing tables; figures as ``.png`` and ``.pdf``. The headline table
(``main``, or ``search_best`` for search studies) is printed; all tables are written to TensorBoard as text (run
``_report`` next to the trials' runs, ``<results-dir>/runs/<study name>/_report``; it carries no hparams data, so
the HParams table of the trials is unchanged) and attached to the study as an optuna-dashboard note. Two reports of
the same storage give byte-identical tables. A ``smoke`` or ``quick`` budget the study file defines is labelled a
first look, not evidence, in every table's title and caption. A missing storage or study, or one without completed
trials, exits 2 with one line.

Package layout: :mod:`.load` (storage → runs), :mod:`.runs` (runs.csv ↔ runs), :mod:`.stats` (paired statistics),
:mod:`.tables` (tables as DataFrames and their one Markdown / LaTeX / CSV formatter), :mod:`.claims` (claim
verdicts), :mod:`.power` (seeds needed), :mod:`.tuning` (the LR tuning table and figure), :mod:`.cli` (arguments,
writing); figures are drawn by :mod:`ablations.report.figures` (the diagnostics' by :mod:`.diagnostic_figures`, both in the frame of :mod:`.plot`). :mod:`.aggregate` (curves across seeds, TensorBoard's
aggregate runs ``agg/<variant>/depth=<d>``, also written by the study runner), :mod:`.html` (``--html``:
``report.html`` and ``index.html``; its charts :mod:`.charts`, its text :mod:`.markup`) and :mod:`.notes` (the optuna-dashboard notes): docs/dashboards.md.
"""

from __future__ import annotations

from ..layout import REPORT_RUN
from .cli import build_parser, main
from .format import Column, Table, render, write_table
from .load import BASELINE, ReportError, Run, StudyData, best_per_row, collect, open_study, result_trials
from .model_tables import collapse_records, collapse_table, cost_table, gain_records, gain_table
from .stats import ALPHA, POWER, Cell, Paired, family_size, holm, main_cells, mde, paired
from .tables import cell_text, convergence_table, importance_table, main_table, paired_table, search_table

__all__ = [
    "ALPHA", "BASELINE", "POWER", "REPORT_RUN", "Cell", "Column", "Paired", "ReportError", "Run", "StudyData", "Table",
    "best_per_row", "build_parser", "cell_text", "collapse_records", "collapse_table", "collect", "convergence_table", "cost_table", "family_size", "gain_records",
    "gain_table", "holm",
    "importance_table", "main", "main_cells", "main_table", "mde", "open_study", "paired", "paired_table",
    "render", "result_trials", "search_table", "write_table",
]
