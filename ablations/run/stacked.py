"""A study's waiting trials trained as stacks: each group is the waiting trials of one cell, claimed and trained
together, and each trial ends as its own Optuna trial.

A *cell* is everything of a trial's config but its seed and learning rate (:func:`ablations.engine.loop.cell_key`):
a reported grid's seeds of one variant and depth, or a tuning stage's learning rates × seeds of one. A worker takes
the cell of the oldest waiting trial and up to ``max_stack`` waiting trials of that cell, oldest first (so a grid
enqueued seed-major is still trained a block of seeds at a time), and no more than its share of all the waiting
trials among the command's ``--workers`` (:func:`stack_limit`: at a stage's end two workers split its last four
trials two and two instead of one worker training all four while the other waits), claims them one by one as ``study.ask`` claims a
trial (WAITING → RUNNING; one another worker took first is skipped), keeps their heartbeats, and prepares each
exactly as the plain objective does (:meth:`ablations.run.objective.Objective.prepare`: its point, config, run
folder, user attrs). Then :func:`ablations.engine.loop.train_stacked` trains them; every epoch each trial gets its
intermediate value and may be pruned on its own; at the end each is told COMPLETE (its summary as user attrs,
:meth:`~ablations.run.objective.Objective.conclude`), PRUNED, or FAIL.

A retried trial (its worker died) resumes from its engine checkpoint when it has one; retries are stacked with
retries of the same cell that resume from the same epoch. What cannot stack (:class:`ablations.engine.loop.NotStackable`)
trains as plain runs, with one line saying why, and the worker leaves that cell's other trials to the plain loop —
except on a GPU where only ``vmap`` failed (a hand-written autograd Function without a vmap rule): there each trial
of the cell trains through the engine alone, its step still one CUDA graph replay.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import Trial, TrialState

from .. import layout
from ..engine.choice import for_config
from ..engine.loop import CHECKPOINT, NotStackable, StackedRun, cell_key, device_of, train_stacked
from ..studies.stopping import stop_signal
from ..studies.storage import set_user_attrs
from .objective import jsonable
from .study import STOPPED
from .write_errors import ResultsWriteError, one_line, write_error

# torch (about 1.7 s, measured with python -X importtime) is imported where a retried trial's checkpoint is read, so
# that --help and --list answer without it.


def cell_label(params: dict) -> str:
    """A short name of a trial's cell for messages: its point without the seed and learning rate."""
    return ", ".join(f"{k}={v}" for k, v in params.items() if k not in ("seed", "lr")) or "the study's point"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class StackedWorker:
    """One worker's stacked trials (module docstring). ``objective``: the worker's
    :class:`~ablations.run.objective.Objective`; ``max_stack``: trials per stack at most (None:
    :data:`DEFAULT_STACK` of the cell's device); ``workers``: the command's workers, who share the waiting trials
    (:func:`stack_limit`); ``choose(config) -> reason or None``: whether a cell trains
    stacked (None: yes; a reason: plain, said once); ``between()``: called before each group (stop signals,
    stale trials); ``after()``: called once each group's trials are told (the seed aggregates' refresh)."""

    def __init__(self, study, objective, *, max_stack: int | None = None, choose: Callable[[Any], str | None] | None = None,
                 between: Callable[[], None] | None = None, after: Callable[[], None] | None = None,
                 say: Callable[[str], None] = _say, graph: bool | None = None, workers: int = 1) -> None:
        self.study, self.objective, self.max_stack, self.workers = study, objective, max_stack, workers
        self.choose = choose or (lambda config: None)
        self.between = between or (lambda: None)
        self.after = after or (lambda: None)
        self.say = say
        self.graph = graph
        self.plain_cells: dict[str, str] = {}  # cell key -> why it trains plain (said once)
        self.single_cells: dict[str, str] = {}  # cell key -> why its trials train one at a time (on CUDA)
        self.said: set[str] = set()
        self.groups = 0

    def run(self) -> int:
        """Train groups until no waiting trial of a stackable cell is left; returns the number of groups."""
        while True:
            self.between()
            if not self.run_group():
                return self.groups

    # --- choosing and claiming -------------------------------------------------------------------------------------
    def _candidates(self) -> list[tuple[Any, dict, Any, str]]:
        """(waiting trial, its point, its config, its stack key) for every waiting grid trial of a stackable cell,
        oldest first. A retry's key adds the epoch its engine checkpoint resumes from; a retry without one (a plain
        attempt's Lightning checkpoint, or none) is left to the plain loop."""
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            params = t.system_attrs.get("fixed_params")
            if not params:
                continue
            try:
                config = self.objective.config(dict(params))
            except (ValueError, KeyError):
                continue
            key = cell_key(config)
            if key in self.plain_cells:
                continue
            if "failed_trial" in t.system_attrs:
                epoch = self._resume_epoch(t)
                if epoch is None:
                    continue
                key += f"|resume@{epoch}"
            out.append((t, dict(params), config, key))
        return out

    def _resume_epoch(self, waiting) -> int | None:
        """The epoch a retried trial's engine checkpoint holds (None: it has none)."""
        import torch

        original = waiting.system_attrs.get("failed_trial")
        dead = next((t for t in self.study.get_trials(deepcopy=False) if t.number == original), None)
        folder = dead.user_attrs.get("log_dir") if dead is not None else None
        if not folder:
            return None
        path = Path(folder) / layout.CHECKPOINTS / CHECKPOINT
        if not path.is_file():
            return None
        try:
            return int(torch.load(path, map_location="cpu", weights_only=False)["epoch"])
        except Exception:  # noqa: BLE001 - unreadable: the plain path restarts it
            return None

    def _claim(self, waiting) -> Any | None:
        """``waiting`` as a RUNNING trial of this worker, or None when another worker took it first."""
        storage = self.study._storage
        try:
            if not storage.set_trial_state_values(waiting._trial_id, state=TrialState.RUNNING):
                return None
        except UpdateFinishedTrialError:
            return None
        return Trial(self.study, waiting._trial_id)

    def run_group(self) -> bool:
        """Claim and train one group; False when no stackable waiting trial is left."""
        candidates = self._candidates()
        while candidates:
            first = candidates[0]
            reason = self.choose(first[2])
            if reason is None:
                break
            self.plain_cells[cell_key(first[2])] = reason
            if reason not in self.said:  # one line per reason: the cells of one size share one measured choice
                self.said.add(reason)
                self.say(f"engine: {cell_label(first[1])} trains as plain runs: {reason}")
            candidates = [c for c in candidates if cell_key(c[2]) != cell_key(first[2])]
        if not candidates:
            return False
        key = candidates[0][3]
        limit = self.max_stack or DEFAULT_STACK[device_of(candidates[0][2]).type]
        if cell_key(candidates[0][2]) in self.single_cells:
            limit = 1
        limit = stack_limit(len(candidates), limit, self.workers)
        group = [c for c in candidates if c[3] == key][:limit]
        trials = [t for t in (self._claim(c[0]) for c in group) if t is not None]
        if not trials:
            return True  # others took them: look again
        self.groups += 1
        with contextlib.ExitStack() as beats:
            for trial in trials:
                beats.enter_context(get_heartbeat_thread(trial._trial_id, self.study._storage))
            self._train(trials)
        self.after()
        return True

    # --- training ----------------------------------------------------------------------------------------------------
    def _train(self, trials: list) -> None:
        prepared = []
        for trial in trials:
            try:
                prepared.append((trial, self.objective.prepare(trial, engine=True)))
            except optuna.TrialPruned:  # a surplus or duplicate grid trial, as the plain objective ends it
                self.study.tell(trial, state=TrialState.PRUNED)
            except Exception:
                self.study.tell(trial, state=TrialState.FAIL)
                raise
        if prepared:
            self._train_prepared(prepared)

    def _train_prepared(self, prepared: list) -> None:
        objective = self.objective
        specs = [StackedRun(p.config, p.run_name, objective.log_root, checkpoint_dir=p.ckpt_dir,
                            resume=p.resume, hparams=objective.hparams(p.params))
                 for _, p in prepared]

        def on_epoch(k: int, epoch: int, value: float) -> bool:
            trial = prepared[k][0]
            trial.report(value, step=epoch)
            return trial.should_prune()

        try:
            outcomes = train_stacked(specs, results_dir=objective.results_dir, on_epoch=on_epoch, graph=self.graph)
        except NotStackable as exc:
            key, label = cell_key(prepared[0][1].config), cell_label(prepared[0][1].params)
            if exc.one_at_a_time and device_of(prepared[0][1].config).type == "cuda":
                # no vmap, but each trial alone through the engine: its step still one CUDA graph replay
                self.single_cells[key] = str(exc)
                self.say(f"engine: {label} trains one trial at a time (no stack): {exc}")
                for one in prepared:
                    self._train_prepared([one])
                return
            self.plain_cells[key] = str(exc)
            self.say(f"engine: {label} trains as plain runs: {exc}")
            for trial, p in prepared:
                self._plain(trial, p)
            return
        except KeyboardInterrupt as exc:
            self._stopped(prepared, exc)
            raise
        except Exception as exc:
            self._failed(prepared, exc)
            self._write_error(exc, prepared)
            if isinstance(exc, RuntimeError):  # as study.optimize(catch=(RuntimeError,)): the study goes on
                self.say(f"engine: trials {', '.join(str(t.number) for t, _ in prepared)} failed: "
                         f"{' '.join(str(exc).split())[:300]}")
                return
            raise
        for (trial, p), outcome in zip(prepared, outcomes, strict=True):
            if outcome.status == "pruned":
                objective.pruned(trial, p, outcome.summary)
                self.study.tell(trial, state=TrialState.PRUNED)
            else:
                self.study.tell(trial, objective.conclude(trial, p, outcome.summary))

    def _write_error(self, exc: BaseException, prepared: list) -> None:
        """A results folder that takes no more writes stops the study with one line (as the plain worker's guard)."""
        error = write_error(exc, self.objective.log_root)
        if error is not None:
            folders = ", ".join(str(self.objective.log_root / p.run_name) for _, p in prepared)
            raise ResultsWriteError(
                f"trials {', '.join(str(t.number) for t, _ in prepared)} cannot write their files in {folders}: "
                f"{one_line(error)}; the trials are marked failed and completed trials are kept: free space or make "
                "the folder writable, then rerun the same command (the trials resume from their last checkpoint)"
            ) from exc

    def _plain(self, trial, prepared) -> None:
        """One claimed trial as a plain run, ended as ``study.optimize`` ends it."""
        try:
            value = self.objective.train(trial, prepared)
        except optuna.TrialPruned:
            self.study.tell(trial, state=TrialState.PRUNED)
            return
        except KeyboardInterrupt as exc:
            self._stopped([(trial, prepared)], exc)
            raise
        except Exception as exc:
            self._failed([(trial, prepared)], exc)
            self._write_error(exc, [(trial, prepared)])
            if isinstance(exc, RuntimeError):
                return
            raise
        self.study.tell(trial, value)

    def _stopped(self, prepared: list, exc: BaseException) -> None:
        """Ctrl-C / SIGTERM: each trial marked stopped (the next run retries it from its checkpoint) and failed."""
        name = signal.Signals(stop_signal() or signal.SIGINT).name
        summaries = getattr(exc, "run_summaries", None) or [None] * len(prepared)
        for (trial, _), summary in zip(prepared, summaries, strict=False):
            with contextlib.suppress(Exception):  # the storage may be what is failing
                self._attrs(trial, summary, {STOPPED: name})
                self.study.tell(trial, state=TrialState.FAIL)

    def _failed(self, prepared: list, exc: BaseException) -> None:
        summaries = getattr(exc, "run_summaries", None) or [None] * len(prepared)
        for (trial, _), summary in zip(prepared, summaries, strict=False):
            with contextlib.suppress(Exception):
                self._attrs(trial, summary, {"fail_reason": " ".join(str(exc).split())[:500] or type(exc).__name__})
                self.study.tell(trial, state=TrialState.FAIL)

    @staticmethod
    def _attrs(trial, summary: dict | None, more: dict) -> None:
        """The run's summary so far and ``more`` (why it ended) in one write."""
        set_user_attrs(trial, jsonable(summary or {}) | more)



#: ``--stack``'s default: at most this many trials per stack, by device
DEFAULT_STACK = {"cuda": 32, "cpu": 8}


def stack_limit(waiting: int, max_stack: int, workers: int) -> int:
    """The trials of a worker's next stack at most: ``max_stack``, and no more than the worker's share of the
    ``waiting`` trials among ``workers`` (rounded up), so that the end of a stage is spread over every worker."""
    return max(1, min(max_stack, -(-waiting // max(1, workers))))


def work_stacked(study, objective, args, between: Callable[[], None], after: Callable[[], None] | None = None) -> int:
    """A study worker's stacked part (``ablations.run``'s ``--engine``, not ``plain``): train the waiting trials of
    every stackable cell in stacks until none is left, calling ``after()`` once each stack's trials are told; the
    worker's plain loop then takes what remains. Returns the number of stacks trained."""
    def choose(config) -> str | None:
        choice = for_config(config, args.engine, objective.results_dir)
        return None if choice.stacked else choice.source

    return StackedWorker(study, objective, max_stack=args.stack, choose=choose, between=between, after=after,
                         workers=args.workers).run()
