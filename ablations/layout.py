"""The results folder layout, named once: every tool that builds one of these paths asks here.

    results/                       RESULTS_DIR (--results-dir)
    results/optuna.db              the default SQLite storage (storage_url)
    results/runs/<study>/          TensorBoard runs of a study's trials (runs_dir); the report's own run is
    results/runs/<study>/_report   (report_run_dir)
    results/<study>/               the report's tables and figures (report_dir)
    results/device/                device checks, GPU benches and measured mode tables (device_dir)
    <run folder>/hparams.yaml      a trial's hyperparameters (Lightning's), <run folder>/checkpoints/ its checkpoints
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS_DIR = "results"
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


def storage_url(results_dir: str | Path = RESULTS_DIR) -> str:
    """The SQLite URL of the storage in a results folder (``sqlite:///results/optuna.db``)."""
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
    """``<results_dir>/device``: device checks, GPU benchmarks and measured precision/attention mode tables."""
    return Path(results_dir) / DEVICE


DEFAULT_STORAGE = storage_url()


def canonical_form(form: Any) -> str:
    """A form (parsed, or its JSON text) as sorted, compact JSON: two spellings of one form give one text; ValueError
    for text that is not JSON."""
    return json.dumps(json.loads(form) if isinstance(form, str) else form, sort_keys=True, separators=(",", ":"))
