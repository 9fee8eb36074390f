"""A study trains in one mode: precision ``auto`` keeps the mode the study's runs so far trained in.

Precision ``auto`` picks the fastest train-step mode of the machine it runs on (:mod:`ablations.machine.modes`:
precision and attention kernel). Two machines, or one machine whose modes table changed, can pick differently, and
the modes do not give identical numbers (fused and explicit attention compute the same function in another order;
fp32 and bf16 do not even compute the same one), so a study continued elsewhere would pair runs of two modes.

So a trial whose config says ``auto`` trains in the mode the study's completed runs of the same model size on the
same kind of device trained in (imported runs included): the most common one of its reported runs where they are
mixed, the tuning stage's where no reported run has trained yet. Only a study with no run of that size yet takes
the machine's own choice. A mode named by ``--retrain-mode`` is
never kept: its rows train again in the machine's own mode, and so does everything after them. The study's first
trials, started side by side before any completes, all ask ``auto`` on one machine and get the same answer; each
worker reads the kept modes again before a trial (at most every :data:`REFRESH_S` seconds), so where several
machines start a fresh study together their first runs may differ (the report counts the modes) and from then on
the most common mode wins everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import optuna
from optuna.trial import TrialState

import data

from .. import layout
from ..machine.modes import Mode, choose_mode, mode_text, ran_on_cuda, tokens
from ..studies.spec import parent_name, tune_name
from ..training import lightning_accelerator, with_mode

# The datasets are reached through their package (data: lazy, it loads torch on first use), so that --help and
# --list answer without torch (about 1.7 s, measured with python -X importtime).

#: Seconds between two readings of a running study's kept modes by one worker (reading every trial of a study of
#: hundreds takes about a second): other machines' runs count within minutes, as the study's first runs complete.
REFRESH_S = 120.0

#: (device type, width, tokens): the model size a mode is chosen for (:func:`ablations.machine.modes.choose_mode`).
Cell = tuple[str, int, int]


def trial_cell(attrs: dict[str, Any]) -> Cell | None:
    """The cell of a trained trial from its user attrs: its model's width and tokens, and where it trained (a run
    on a GPU records ``device: cuda``; None for a trial that recorded no model)."""
    model = attrs.get(layout.MODEL_KEY) or {}
    if not all(isinstance(model.get(k), int) for k in ("embed_dim", "img_size", "patch_size")):
        return None
    on_gpu = ran_on_cuda(attrs.get("device"), (attrs.get("config") or {}).get("accelerator"))
    return ("cuda" if on_gpu else "cpu", model["embed_dim"], tokens(model["img_size"], model["patch_size"]))


def config_cell(config: Any) -> Cell:
    """The cell a run of ``config`` trains in on this machine (its accelerator resolved as the run resolves it)."""
    shape = data.dataset_shape(config)
    device = "cuda" if lightning_accelerator(config.accelerator) == "gpu" else "cpu"
    return device, config.embed_dim, tokens(shape["img_size"], config.patch_size or shape["patch_size"])


def mode_facts(attrs: dict[str, Any]) -> dict[str, Any]:
    """What :func:`kept_modes` reads of a run's user attrs: its model, precision, attention kernel, device and
    stage (``phase``)."""
    return {k: attrs[k] for k in (layout.MODEL_KEY, "precision", "fused_attn", "device", "phase") if k in attrs} | {
        "config": {"accelerator": (attrs.get("config") or {}).get("accelerator")}}


def completed(trials: Iterable[Any]) -> list[dict[str, Any]]:
    """The mode facts of the completed ``trials``, in trial order: what :func:`kept_modes` reads."""
    return [mode_facts(t.user_attrs) for t in sorted(trials, key=lambda t: t.number) if t.state == TrialState.COMPLETE]


def stored_kept(storage, study_name: str, stage: str, exclude: Iterable[str] = ()) -> dict[Cell, Mode]:
    """:func:`kept_modes` of a stored study's completed runs (its tuning stage's too, for the reported stage)."""
    return kept_modes(completed(study_trials(storage, study_name, stage)), exclude)


def recorded_modes(runs: Iterable[dict[str, Any]]) -> dict[Cell, dict[tuple[str, bool], int]]:
    """How many completed runs (their trials' user attrs, in order) trained in each mode (precision, fused
    attention), per cell; runs that recorded no precision or model are not counted."""
    found: dict[Cell, dict[tuple[str, bool], int]] = {}
    for attrs in runs:
        cell = trial_cell(attrs)
        if cell is None or not isinstance(attrs.get("precision"), str) or attrs["precision"] == "auto":
            continue  # a run that recorded no mode it trained in
        mode = (attrs["precision"], attrs.get("fused_attn") is not False)
        counts = found.setdefault(cell, {})
        counts[mode] = counts.get(mode, 0) + 1
    return found


def kept_modes(runs: Iterable[dict[str, Any]], exclude: Iterable[str] = ()) -> dict[Cell, Mode]:
    """The mode each cell keeps: the most common one of the completed reported ``runs`` (mode facts, in trial
    order; the first trained on a tie), else of the tuning stage's (``phase: tune``) where no reported run of the
    cell has trained yet — the pairs are the reported runs, so theirs decides even where more tuning runs trained
    in another mode. The modes in ``exclude`` (as :func:`ablations.machine.modes.mode_text` names them, e.g.
    ``32-true + fused attention``) are never kept."""
    runs = list(runs)
    kept: dict[Cell, Mode] = {}
    for stage in ("tuning", "reported"):  # the reported runs' mode replaces the tuning stage's
        mine = [r for r in runs if (r.get("phase") == "tune") == (stage == "tuning")]
        kept |= _most_common(recorded_modes(mine), set(exclude), f"this study's {stage} runs")
    return kept


def _most_common(recorded: dict[Cell, dict[tuple[str, bool], int]], skip: set[str], whose: str) -> dict[Cell, Mode]:
    kept = {}
    for cell, counts in recorded.items():
        usable = {m: n for m, n in counts.items() if mode_text(*m, cuda=cell[0] == "cuda") not in skip}
        if not usable:
            continue
        (precision, fused), count = max(usable.items(), key=lambda item: item[1])  # max keeps the first of a tie
        others = sum(counts.values()) - count
        kept[cell] = Mode(precision, fused, f"kept: the mode of {count} of {whose} at this size"
                                            + (f" ({others} in other modes)" if others else ""))
    return kept


def study_trials(storage, study_name: str, stage: str) -> list[Any]:
    """The trials of a study and, for its reported stage, of its tuning stage (the same study's runs); for its
    contending rates' stage (``<study>-contend``), also the study's reported and tuning runs, whose mode the
    contending runs must keep (their differences from the chosen rate's runs are the rate's, not the kernel's)."""
    if stage in ("contend", "round"):
        parent = parent_name(study_name)
        names = [study_name, parent, tune_name(parent)]
    else:
        names = [study_name] + ([tune_name(study_name)] if stage != "tune" else [])
    trials = []
    for name in names:
        try:
            trials += optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        except KeyError:  # that stage has not started
            continue
    return trials


def kept_for(config: Any, kept: dict[Cell, Mode]) -> Mode | None:
    """The study's kept mode for a run of ``config`` (as the study file gives it): None where its precision is not
    ``auto`` or no run of its cell has trained yet (the run chooses its own)."""
    if config.precision != "auto" or not kept:
        return None
    return kept.get(config_cell(config))


def keep_mode(config: Any, kept: dict[Cell, Mode]) -> Any:
    """``config`` in the study's kept mode of its cell (:func:`kept_for`; an explicit attention kernel of the
    config stays); else ``config`` as it is."""
    mode = kept_for(config, kept)
    if mode is None:
        return config

    return with_mode(config, mode)


def kept_lines(kept: dict[Cell, Mode], configs: Iterable[Any], results_dir, threads: int) -> list[str]:
    """One line per cell of ``configs`` (precision ``auto``) whose kept mode is not what ``auto`` picks on this
    machine now (on ``threads`` threads), or whose runs so far are mixed: what the study trains in and why."""
    if not kept:
        return []

    lines, seen = [], set()
    for config in configs:
        if config.precision != "auto":
            continue
        cell = config_cell(config)
        if cell in seen or cell not in kept:
            continue
        seen.add(cell)
        mode = kept[cell]
        device, width, count = cell
        own = choose_mode(device, width, count, results_dir=results_dir, threads=threads)
        guess = own.source.startswith("rule: no modes")  # a dry run on a CPU not measured yet: the run will measure
        if not guess and (own.precision, own.fused_attn) == (mode.precision, mode.fused_attn) \
                and "other modes" not in mode.source:
            continue
        cuda = device == "cuda"
        alone = ("measure its modes first (no table for this CPU yet)" if guess
                 else f"pick {mode_text(own.precision, own.fused_attn, cuda)}")
        lines.append(f"precision auto, width {width}, {count} tokens: trains in "
                     f"{mode_text(mode.precision, mode.fused_attn, cuda)}, {mode.source.removeprefix('kept: ')}; "
                     f"this machine alone would {alone} (--import-runs with --retrain-mode MODE trains a mode's "
                     "reported rows again in this machine's mode)")
    return lines
