"""The results folder layout, named once: every tool that builds one of these paths asks here.

Two results folders have this layout. ``outputs/`` (:data:`OUTPUT_DIR`, git ignores it) is where a user's runs,
storage, reports and index go by default (``--results-dir`` moves them); ``results/`` (:data:`RESULTS_DIR`) holds
the repository's committed studies, device records and claims ledger, written only when a tool is pointed at it
(``--results-dir results``). Device records are read from ``results/device`` for the default output folder too
(:func:`device_dir`): the committed GPU measurements price a dry run wherever the user's outputs go.

    <results-dir>/                       OUTPUT_DIR by default (--results-dir)
    <results-dir>/optuna.db              the default SQLite storage (storage_url)
    <results-dir>/runs/<study>/          TensorBoard runs of a study's trials (runs_dir); the report's own run is
    <results-dir>/runs/<study>/_report   (report_run_dir)
    <results-dir>/<study>/               the report's tables and figures (report_dir)
    <results-dir>/index.html             the HTML index of the reports there
    results/device/                      device checks, GPU benches and measured mode tables (device_dir)
    <run folder>/hparams.yaml            a trial's hyperparameters (Lightning's), <run folder>/checkpoints/ its checkpoints
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS_DIR = "results"  # the repository's committed results
OUTPUT_DIR = "outputs"  # a user's runs, storage, reports and index (the tools' --results-dir default; git-ignored)
STORAGE_FILE = "optuna.db"
RUNS = "runs"
REPORT_RUN = "_report"  # TensorBoard run (folder) of the report's text, next to the trials' runs
DEVICE = "device"
#: user attr of a study's trial: the backbone it trained, resolved (``lit_modules.config.ViTConfig.to_dict()``)
MODEL_KEY = "model"
#: user attr of a study's trial (and runs.csv column): the form its model was built in, each swappable part's kind and
#: options with their defaults filled in (``ablations.run.objective.form_of`` as :func:`canonical_form` JSON), so that
#: a row of an earlier default is told apart
FORM_KEY = "form"
HPARAMS = "hparams.yaml"  # written by Lightning's TensorBoard logger into each run folder
CHECKPOINTS = "checkpoints"


def storage_url(results_dir: str | Path = OUTPUT_DIR) -> str:
    """The SQLite URL of the storage in a results folder (``sqlite:///outputs/optuna.db``)."""
    return f"sqlite:///{Path(results_dir) / STORAGE_FILE}"


def runs_dir(results_dir: str | Path, study_name: str) -> Path:
    """``<results_dir>/runs/<study>``: the TensorBoard log root of a study (one run folder per trial)."""
    return Path(results_dir) / RUNS / study_name


def report_run_dir(results_dir: str | Path, study_name: str) -> Path:
    """``<results_dir>/runs/<study>/_report``: the report's TensorBoard text run."""
    return runs_dir(results_dir, study_name) / REPORT_RUN


def report_dir(results_dir: str | Path, study_name: str) -> Path:
    """``<results_dir>/<study>``: where the report writes its tables and figures."""
    return Path(results_dir) / study_name


def device_dir(results_dir: str | Path = RESULTS_DIR) -> Path:
    """``<results_dir>/device``: device checks, GPU benchmarks and measured precision/attention mode tables; for the
    default output folder the repository's ``results/device``, whose committed GPU measurements price a dry run
    (this machine's cached measurements sit beside them, ignored by git)."""
    if Path(results_dir) == Path(OUTPUT_DIR):
        results_dir = RESULTS_DIR
    return Path(results_dir) / DEVICE


DEFAULT_STORAGE = storage_url()


def canonical_form(form: Any) -> str:
    """A form (parsed, or its JSON text) as sorted, compact JSON: two spellings of one form give one text; ValueError
    for text that is not JSON."""
    return json.dumps(json.loads(form) if isinstance(form, str) else form, sort_keys=True, separators=(",", ":"))
