"""What the dashboards show: TensorBoard's tag groups and run names, the study-wide HParams table, extra loggers.

**Tag groups.** TensorBoard's time-series view groups cards by the part of a tag before the first ``/``, sorts
the groups by name (digits before letters) and opens the first two. The code logs under short internal names
(``train/loss``, ``val/acc``, ``hp/best_val_acc``, ``diag/ratio_mean/attn/03``, ...: the names Lightning's
callbacks monitor and the report reads); ``ablations.tb_logger.GroupedTensorBoardLogger`` writes them to the event files under
numbered groups, so the curves people open TensorBoard for come first and the diagnostics follow, by kind::

    1_train/…   2_val/…   3_summary/…  (the run summary: the hp/* metrics of the HParams table)
    4_diag.ratio/…   5_diag.similarity/…   6_diag.gradients/…   7_diag.params/…   8_diag.mixing/…   9_diag.other/…

:func:`display_tag` maps an internal name to its TensorBoard tag and :func:`internal_tag` back (the event reader,
:mod:`ablations.report.events`, uses it, so runs written before the grouping read the same). Text summaries keep their
internal names (the Text tab is not grouped).

**Run names.** A study trial's run folder says what it is: ``<variant>/depth=<d>/seed=<s>`` plus the study's other
grid axes, and ``trial_<n>`` where the point alone is not unique (search studies, or a folder left by an
earlier study of the same name). TensorBoard's run filter takes regular expressions: ``^layerscale/``,
``depth=12/``, ``seed=0$``.

**HParams.** One study-wide configuration is written once at the study's log root
(:func:`write_study_hparams`): the columns are the variant, the grid axes and the searched options, then the
``hp/*`` metrics; the configuration every trial shares is recorded once, as the text ``study/constants``. Each
run records only its values of those columns (``session_start_info``), so the table opens on what varies.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .cli import markdown_table

# Imported where they are used, not here: TensorBoard, torch, Lightning and MLflow. Each takes from a tenth of a
# second to seconds to import, and the command-line tools start without them.

#: Internal prefix -> TensorBoard group, in reading order (the number is the group's place).
_GROUPS: tuple[tuple[str, str], ...] = (("train", "1_train"), ("val", "2_val"), ("hp", "3_summary"))
#: Diagnostic kinds: (group, prefixes of the key after ``diag/``); the first match wins, then ``9_diag.other``.
_DIAG_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("4_diag.ratio", ("ratio_", "update_ratio", "skip_scale", "stream_rms")),
    ("5_diag.similarity", ("attn_", "similar_")),
    ("6_diag.gradients", ("grad_",)),
    ("7_diag.params", ("param",)),
    ("8_diag.mixing", ("dca_", "depth_", "composite_", "stream_mixing")),
)
_DIAG_OTHER = "9_diag.other"
_DISPLAY_RE = re.compile(r"^(?P<group>\d+_[A-Za-z.]+)/(?P<rest>.+)$")
_INTERNAL_OF_GROUP = {group: prefix for prefix, group in _GROUPS} | {
    group: "diag" for group in (*(g for g, _ in _DIAG_KINDS), _DIAG_OTHER)}

#: Extra Lightning loggers a run can write besides TensorBoard (``--logger``), all offline.
EXTRA_LOGGERS: tuple[str, ...] = ("csv", "mlflow", "wandb")


def display_tag(tag: str) -> str:
    """The TensorBoard tag of an internal metric name (unchanged for names outside the groups, e.g. ``epoch``)."""
    head, sep, rest = tag.partition("/")
    if not sep:
        return tag
    if head == "diag":
        group = next((g for g, prefixes in _DIAG_KINDS if rest.startswith(prefixes)), _DIAG_OTHER)
        return f"{group}/{rest}"
    group = dict(_GROUPS).get(head)
    return f"{group}/{rest}" if group else tag


def internal_tag(tag: str) -> str:
    """Inverse of :func:`display_tag`; an internal name (an older run's tag) is returned as it is."""
    m = _DISPLAY_RE.match(tag)
    if m is None or m["group"] not in _INTERNAL_OF_GROUP:
        return tag
    return f"{_INTERNAL_OF_GROUP[m['group']]}/{m['rest']}"


def extra_loggers(names: Sequence[str], *, run_dir: Path, run_name: str, experiment: str, mlflow_db: Path,
                  wandb_dir: Path | None = None) -> list:
    """The extra Lightning loggers ``names`` (see :data:`EXTRA_LOGGERS`): ``csv`` writes ``<run dir>/csv/
    metrics.csv`` (+ ``hparams.yaml``); ``mlflow`` writes to the local SQLite store ``mlflow_db`` (MLflow 3 keeps
    its plain-file store in maintenance mode and refuses it by default; browse with ``mlflow ui
    --backend-store-uri sqlite:///<db>``) under experiment ``experiment``, run name ``run_name``; ``wandb``: a
    Weights & Biases run in project ``experiment``, named ``run_name`` and grouped by its cell (the run name without
    its seed), so that W&B shows a row's seeds as one line with their spread (:func:`wandb_logger`)."""
    check_loggers(names)
    loggers = []
    for name in names:
        if name == "csv":
            from lightning.pytorch.loggers import CSVLogger

            loggers.append(CSVLogger(save_dir=str(run_dir), name="", version="csv"))
        elif name == "wandb":
            loggers.append(wandb_logger(run_name, experiment, Path(wandb_dir or Path(run_dir).parent)))
        else:
            from lightning.pytorch.loggers import MLFlowLogger

            try:
                import mlflow  # noqa: F401
            except ImportError:
                raise ValueError("--logger mlflow needs the mlflow package: pip install -e '.[mlflow]'") from None
            Path(mlflow_db).parent.mkdir(parents=True, exist_ok=True)
            loggers.append(MLFlowLogger(experiment_name=experiment, run_name=run_name,
                                        tracking_uri=mlflow_uri(mlflow_db)))
    return loggers


def wandb_mode() -> str:
    """W&B's mode: ``WANDB_MODE`` when set, else ``online`` when an API key is configured (``WANDB_API_KEY`` or a
    ``wandb login`` in ~/.netrc), else ``offline``: a run never stops to ask for a login, and ``wandb sync`` uploads
    an offline run later."""
    import netrc

    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        return "online" if netrc.netrc().authenticators("api.wandb.ai") else "offline"
    except (OSError, netrc.NetrcParseError):
        return "offline"


def wandb_group(run_name: str) -> str | None:
    """The W&B group of a study's run: its cell, the run name without ``seed=<s>`` (``layerscale/depth=4``); None
    for a run name without a seed (a single run)."""
    parts = run_name.split("/")
    kept = [p for p in parts if not p.startswith("seed=")]
    return "/".join(kept) if len(kept) < len(parts) else None


def wandb_logger(run_name: str, project: str, save_dir: Path):
    """Lightning's ``WandbLogger`` for one run (files under ``save_dir/wandb``, mode :func:`wandb_mode`); a W&B
    run a failed trial left open in this process is finished first, so every trial is its own run. ValueError
    (one line) when wandb is not installed."""
    try:
        import wandb
    except ImportError:
        raise ValueError("--logger wandb needs the wandb package: pip install -e '.[wandb]'") from None
    from lightning.pytorch.loggers import WandbLogger

    if wandb.run is not None:
        wandb.finish()
    save_dir.mkdir(parents=True, exist_ok=True)
    return WandbLogger(project=safe(project), name=run_name, group=wandb_group(run_name), save_dir=str(save_dir),
                       offline=wandb_mode() == "offline", mode=wandb_mode(), job_type="trial")


def finish_wandb(loggers: Sequence) -> None:
    """End the W&B run of each ``WandbLogger`` among ``loggers`` (Lightning leaves it open; the next trial of this
    process would otherwise log into it)."""
    from lightning.pytorch.loggers import WandbLogger

    for each in loggers:
        if isinstance(each, WandbLogger) and each._experiment is not None:
            each.experiment.finish()


def mlflow_uri(db: str | Path) -> str:
    return f"sqlite:///{Path(db).resolve()}"


def check_loggers(names: Iterable[str]) -> None:
    for name in names:
        if name not in EXTRA_LOGGERS:
            raise ValueError(f"unknown logger '{name}'; valid choices: {', '.join(EXTRA_LOGGERS)} "
                             "(TensorBoard is always on)")


# --- run names ----------------------------------------------------------------------------------------------------
def run_name(params: Mapping[str, Any], config: Any, axes: Iterable[str], *, trial: int | None = None) -> str:
    """``<variant>/depth=<d>/seed=<s>[/<axis>=<v> ...][/trial_<n>]``: the variant label, depth and seed of the
    run's config, then the study's other grid axes in the study file's order, then the trial number if given."""
    parts = [safe(str(params["variant"])), f"depth={config.depth}", f"seed={config.seed}"]
    parts += [f"{safe(a)}={safe(short(params[a]))}" for a in axes if a not in ("depth", "seed") and a in params]
    if trial is not None:
        parts.append(f"trial_{trial:04d}")
    return "/".join(parts)


def short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", text)


# --- HParams ------------------------------------------------------------------------------------------------------
STUDY_SUFFIX = ".study"  # the study-level event file at the log root (replaced, never appended)


def study_columns(spec: Any) -> dict[str, list]:
    """The HParams columns of a study, in order: ``variant``, the grid axes, the searched options (name -> the
    values they can take; ``[low, high]`` for a searched range)."""
    columns: dict[str, list] = {"variant": [v.label for v in spec.variants]}
    columns |= {axis: list(values) for axis, values in spec.axes.items()}
    for label, options in spec.space.items():
        for option, dist in options.items():
            columns[f"{label}.{option}"] = list(dist["choices"]) if "choices" in dist else [dist["low"], dist["high"]]
    return columns


def study_constants(spec: Any) -> dict[str, Any]:
    """The configuration every point of the study shares (``RunConfig.to_hparams`` keys equal at every point)."""
    flat = [spec.run_config(p).to_hparams() for p in spec.points()]
    return {k: v for k, v in flat[0].items() if all(f.get(k) == v for f in flat[1:])}


def study_experiment_pb(spec: Any, metrics: Sequence[str], extra: Mapping[str, list] | None = None):
    """The study's HParams experiment: its columns (:func:`study_columns`, then ``extra``, e.g. the aggregate rows'
    tuned ``lr``) and ``metrics`` (internal names, ``hp/...``); the columns whose values differ are marked so."""
    from tensorboard.plugins.hparams import summary_v2 as hp

    columns = study_columns(spec) | dict(extra or {})
    return _experiment_pb([hp.HParam(name, _domain(hp, name, values)) for name, values in columns.items()], metrics,
                          differs={name for name, values in columns.items() if len(set(map(repr, values))) > 1})


def write_study_hparams(log_root: str | Path, spec: Any, metrics: Sequence[str],
                        extra: Mapping[str, list] | None = None) -> Path:
    """Write the study's HParams configuration (:func:`study_experiment_pb`) and constants at ``log_root``
    (TensorBoard's ``.`` run), replacing an earlier one; ``metrics`` are internal names (``hp/...``). Returns the
    event file. The file is written in a folder of its own beside ``log_root`` and moved in whole (one rename), so
    that processes of one study starting at once never read or remove a half-made one: each removes the earlier
    files and moves its own in."""
    from torch.utils.tensorboard import SummaryWriter

    root = Path(log_root)
    root.mkdir(parents=True, exist_ok=True)
    pb = study_experiment_pb(spec, metrics, extra)
    staging = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}-"))
    try:
        writer = SummaryWriter(log_dir=str(staging), filename_suffix=STUDY_SUFFIX)
        try:
            writer._get_file_writer().add_summary(pb)
            constants = study_constants(spec)
            table = markdown_table(["key", "value"], [(k, str(v)) for k, v in constants.items()])
            writer.add_text("study/constants",
                            f"Configuration shared by every trial of `{spec.study_name}`:\n\n{table}")
            writer.add_text("study/description", spec.description or spec.study_name)
        finally:
            writer.close()
        written = next(staging.glob(f"events.out.tfevents.*{STUDY_SUFFIX}"))
        for old in root.glob(f"events.out.tfevents.*{STUDY_SUFFIX}"):
            old.unlink(missing_ok=True)
        os.replace(written, root / written.name)
        return root / written.name
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _experiment_pb(hparams: list, metrics: Sequence[str], differs: set[str] = frozenset()):
    """The HParams experiment summary: ``hparams`` columns, then the ``metrics`` (internal names, written under
    their TensorBoard tags and shown under their short names). TensorBoard sorts the columns by (values differ,
    name), so the columns in ``differs`` are marked as such: they come first."""
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp

    pb = hp.hparams_config_pb(hparams, [hp.Metric(display_tag(m), display_name=m.partition("/")[2] or m)
                                        for m in metrics])
    value = pb.value[0]
    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for info in data.experiment.hparam_infos:
        info.differs = info.name in differs
    value.metadata.plugin_data.content = data.SerializeToString()
    assert value.tag == metadata.EXPERIMENT_TAG
    return pb


def _domain(hp: Any, name: str, values: list) -> Any:
    """A Discrete domain of the column's values when they share one type (a searched range: an interval)."""
    if name.count(".") and len(values) == 2 and all(_is_number(v) for v in values):  # a searched [low, high]
        low, high = values
        return hp.IntInterval(int(low), int(high)) if all(isinstance(v, int) for v in values) \
            else hp.RealInterval(float(low), float(high))
    kinds = {bool if isinstance(v, bool) else float if _is_number(v) else str for v in values}
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    return hp.Discrete([kind(v) for v in values])


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def write_run_hparams(writer: Any, values: Mapping[str, Any], metrics: Sequence[str], *, run: str,
                      own_experiment: bool) -> None:
    """Register one run with the HParams plugin: its ``values`` (written as the run starts) and, for a run outside a study
    (``own_experiment``), an experiment of its own listing its values' keys and the ``metrics``.

    No placeholder values: the metrics are listed by the experiment (the study's, at its log root), and the run
    logs each of them once, at its end. (A NaN placeholder at step 0 was read *after* the final values whenever
    torch's event-file names sorted out of order, ``….9`` after ``….10``, and TensorBoard then dropped the final
    values as orphaned: the table showed NaN.)"""
    from tensorboard.plugins.hparams import summary_v2 as hp

    values = {k: hparam_value(v) for k, v in values.items()}
    if own_experiment:
        writer._get_file_writer().add_summary(_experiment_pb([hp.HParam(k) for k in values], metrics))
    writer._get_file_writer().add_summary(hp.hparams_pb(values, trial_id=run, start_time_secs=time.time()))
    writer.flush()


def hparam_value(value: Any) -> bool | int | float | str:
    if isinstance(value, (bool, int, float, str)):
        return value
    return "None" if value is None else str(value)
