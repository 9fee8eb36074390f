"""The learning-rate tuning stage of a study (trials with ``phase: tune``): the ``tuning`` table (per variant × LR the
mean ± sd of the validation metric over the tuning seeds, the chosen rate's margin over the next, and how stable
the choice is under a bootstrap over the tuning seeds) and the figures ``tuning`` (val accuracy vs LR per variant)
and ``tuning_stability``. The chosen LR of a variant is the one its report-phase runs trained at (the main table's
LR column)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .format import Column, Table, fmt_param, frame
from .load import StudyData, finite

TUNING_KEYS = ["variant", "depth", "lr", "added", "n", "mean", "std", "n_diverged", "n_failed_training", "n_failed",
               "seeds", "chosen", "margin", "stability"]
#: bootstrap resamples of the tuning seeds behind the stability of a choice (fixed seed: byte-identical reports)
BOOTSTRAP = 2000
BOOTSTRAP_SEED = 0
#: a choice picked in fewer than this share of the resamples is named as unstable in the caption
STABLE = 0.8


def tune_run_value(run, metric: str) -> float:
    """A tuning run's value in the choice: its metric; 0 when it diverged, failed to train or has none (the rule of
    ``ablations.run.tuning.tune_value``)."""
    return float(run.summary[metric]) if run.ok and finite(run.summary.get(metric)) else 0.0


def choice_stability(by_seed: dict[float, dict[int, float]], chosen: float, resamples: int = BOOTSTRAP,
                     seed: int = BOOTSTRAP_SEED) -> float | None:
    """The share of bootstrap resamples of the tuning seeds (with replacement, the seeds every rate ran on) whose
    highest mean picks ``chosen`` (a tie shares the resample among the tied rates). None with fewer than 2 seeds."""
    import numpy as np

    lrs = sorted(by_seed)
    seeds = sorted(set.intersection(*(set(v) for v in by_seed.values()))) if by_seed else []
    if len(seeds) < 2 or chosen not in by_seed:
        return None
    values = np.array([[by_seed[lr][s] for s in seeds] for lr in lrs])  # (rates, seeds)
    picks = np.random.default_rng(seed).integers(0, len(seeds), size=(resamples, len(seeds)))
    means = values[:, picks].mean(axis=2)  # (rates, resamples)
    best = means >= means.max(axis=0, keepdims=True) - 1e-12
    return float((best[lrs.index(chosen)] / best.sum(axis=0)).mean())


def tuning_records(data: StudyData) -> list[dict]:
    """One record per row × depth × LR of the tuning runs (rows in the table's order, depths and LRs ascending):
    the mean and sd of the tuning metric over the tuning seeds, a diverged run or one that failed to train counting
    as 0 — the tuning stage's choice rule (``ablations.run.tuning.tune_outcome``) —, whether the rate was added
    beyond the starting grid, and whether the row's reported runs at that depth trained at this LR (a row tuned at
    one depth only, its rate used at every depth: its reported runs at any depth). A depth whose reported runs have
    not completed yet has no chosen rate. The chosen line also carries the margin of its mean over the next-best
    rate's and the stability of the choice (:func:`choice_stability`)."""
    order = {row: i for i, row in enumerate(data.rows)}
    groups: dict[tuple, list] = {}
    for run in data.tune_runs:
        if run.lr is not None:
            groups.setdefault((run.row, run.depth, run.lr), []).append(run)

    def key(item):
        (row, depth, lr), _ = item
        return order.get(row, len(order)), row, depth if depth is not None else -1, lr

    grid = {float(lr) for lr in data.tune_grid}
    records = [_rate_record(data, row, depth, lr, runs, grid)
               for (row, depth, lr), runs in sorted(groups.items(), key=key)]
    for cell in _cells(records).values():
        _mark_choice(data, cell, groups)
    return records


def _rate_record(data: StudyData, row: str, depth, lr: float, runs: list, grid: set[float]) -> dict:
    """The record of one row × depth × LR of the tuning runs (:func:`tuning_records`), its margin and stability
    not yet set."""
    values = [tune_run_value(r, data.tune_metric) for r in runs]
    reported = [r for r in data.runs if r.row == row and r.depth == depth]
    if not reported and len({r.depth for r in data.tune_runs if r.row == row}) == 1:
        reported = [r for r in data.runs if r.row == row]  # tuned at one depth, its rate used at every depth
    return {"variant": row, "depth": depth, "lr": lr, "added": bool(grid) and lr not in grid,
            "n": len(values), "mean": statistics.fmean(values) if values else None,
            "std": statistics.stdev(values) if len(values) >= 2 else None,
            "n_diverged": sum(1 for r in runs if r.diverged),
            "n_failed_training": sum(1 for r in runs if r.failed_training),
            "n_failed": sum(1 for r in runs if not r.ok and not r.at_chance),
            "seeds": sorted({r.seed for r in runs if r.seed is not None}),
            "chosen": lr in {r.lr for r in reported}, "margin": None, "stability": None}


def _mark_choice(data: StudyData, cell: list[dict], groups: dict[tuple, list]) -> None:
    """On a row × depth's one chosen rate (if it has one, with a mean): its margin over the next-best rate's mean and
    the stability of the choice over the tuning seeds."""
    chosen = [rec for rec in cell if rec["chosen"]]
    if len(chosen) != 1 or chosen[0]["mean"] is None:
        return
    others = [rec["mean"] for rec in cell if not rec["chosen"] and rec["mean"] is not None]
    chosen[0]["margin"] = chosen[0]["mean"] - max(others) if others else None
    by_seed = {rec["lr"]: {r.seed: tune_run_value(r, data.tune_metric)
                           for r in groups[(rec["variant"], rec["depth"], rec["lr"])] if r.seed is not None}
               for rec in cell}
    chosen[0]["stability"] = choice_stability(by_seed, chosen[0]["lr"])


def _cells(records: list[dict]) -> dict[tuple, list[dict]]:
    cells: dict[tuple, list[dict]] = {}
    for rec in records:
        cells.setdefault((rec["variant"], rec["depth"]), []).append(rec)
    return cells


def grid_edge(records: list[dict]) -> list[tuple[str, object, float]]:
    """(variant, depth, lr) of each row whose chosen LR is the smallest or largest it was tuned at: its best
    learning rate may lie beyond the rates tried (with declared bounds: beyond a bound)."""
    edges = []
    for (row, depth), cell in _cells(records).items():
        lrs = sorted(rec["lr"] for rec in cell)
        chosen = [rec["lr"] for rec in cell if rec["chosen"]]
        if len(lrs) >= 2 and chosen and chosen[0] in (lrs[0], lrs[-1]):
            edges.append((row, depth, chosen[0]))
    return edges


def _name(row: str, depth) -> str:
    return f"{row}{f' (depth {depth})' if depth is not None else ''}"


def _where(items) -> str:
    return ", ".join(f"{_name(row, depth)} at {fmt_param(lr)}" for row, depth, lr in items)


def edge_note(records: list[dict], bounds: tuple[float, float] | None = None) -> str:
    """The caption's warning about :func:`grid_edge` rows ('' when every chosen LR is inside the rates tried): with
    declared bounds, rows at a bound and rows whose stored tuning stopped at an edge inside the bounds (runs of a
    tuning stage that did not extend its grid) are named apart."""
    edges = grid_edge(records)
    if not edges:
        return ""
    if bounds is None:
        return (f" At the edge of the tuning grid: {_where(edges)} — the best learning rate of these rows may lie "
                "beyond the grid, so their rows may understate them.")
    at_bound = [e for e in edges if any(math.isclose(e[2], bound, rel_tol=1e-3) for bound in bounds)]
    inside = [e for e in edges if e not in at_bound]
    note = ""
    if at_bound:
        note += (f" At a bound of the tuning grid ({fmt_param(bounds[0])}–{fmt_param(bounds[1])}, to which it extends "
                 f"while the best rate is at its edge): {_where(at_bound)} — the best learning rate of these rows may "
                 "lie beyond the bound.")
    if inside:
        note += (f" At the edge of the rates their stored tuning runs tried, inside the bounds (those runs did not "
                 f"extend the grid): {_where(inside)} — the best learning rate of these rows may lie beyond the rates "
                 "tried, so their rows may understate them.")
    return note


def unstable(records: list[dict]) -> list[tuple[str, object, float]]:
    """(variant, depth, stability) of the chosen lines whose choice is picked in fewer than :data:`STABLE` of the
    bootstrap resamples."""
    return [(rec["variant"], rec["depth"], rec["stability"]) for rec in records
            if rec["chosen"] and rec["stability"] is not None and rec["stability"] < STABLE]


def stability_note(records: list[dict]) -> str:
    """The caption's sentence naming the rows whose LR choice is unstable ('' when none is)."""
    rows = unstable(records)
    if not rows:
        return ""
    where = ", ".join(f"{_name(row, depth)} {100 * value:.0f}%" for row, depth, value in rows)
    return (f" Unstable choices (picked in under {100 * STABLE:.0f}% of the resamples): {where} — another rate is "
            "about as good on these tuning seeds, so the row's rate (and its Δ) could have come out otherwise.")


def tuning_table(data: StudyData, records: list[dict]) -> Table:
    def pp(rec, key):
        return "" if rec[key] is None else f"{100 * rec[key]:+.2f}".replace("-", "−")

    columns = [Column("variant", "variant"), Column("depth", "depth", fmt="d"),
               Column("lr", "LR", render=lambda rec, style: fmt_param(rec["lr"]) + (" (added)" if rec["added"] else "")),
               Column("mean", "val acc. (%)", fmt=".2f", scale=100.0), Column("std", "sd (pp)", fmt=".2f", scale=100.0),
               Column("n", "n", fmt="d"), Column("n_diverged", "diverged", fmt="d"),
               Column("n_failed_training", "failed to train", fmt="d"), Column("n_failed", "failed", fmt="d"),
               Column("chosen", "chosen", render=lambda rec, style: "yes" if rec["chosen"] else "", align="l"),
               Column("margin", "margin (pp)", render=lambda rec, style: pp(rec, "margin")),
               Column("stability", "stability", render=lambda rec, style: "" if rec["stability"] is None
                      else f"{100 * rec['stability']:.0f}%")]
    fmts = {"lr": ".6g", "mean": ".6f", "std": ".6f", "margin": ".6f", "stability": ".4f"}
    seeds = sorted({s for rec in records for s in rec["seeds"]})
    extends = (f" Starting from {', '.join(fmt_param(v) for v in data.tune_grid)}, a row's rates extend (×2 above, ÷2 "
               f"below; 'added') while its best rate is the largest or smallest it tried, within "
               f"{fmt_param(data.tune_bounds[0])}–{fmt_param(data.tune_bounds[1])}." if data.tune_bounds else "")
    caption = (f"Learning-rate tuning of study {data.name}: {data.tune_metric} (a validation metric; the test split is "
               f"never used to choose), mean and sample sd over the tuning runs (n) on seeds "
               f"{', '.join(map(str, seeds))}, disjoint from the reported seeds; a diverged tuning run or one that "
               f"failed to train counts as 0, as in the stage's choice. chosen = the LR the variant's reported runs "
               f"trained at (the main table's LR column); margin = its mean minus the next-best rate's; stability = "
               f"the share of {BOOTSTRAP:,} bootstrap resamples of the tuning seeds in which it is still the best "
               f"rate.{extends}{edge_note(records, data.tune_bounds)}{stability_note(records)}")
    return Table("tuning", f"{data.name}: learning-rate tuning", caption, frame(records, TUNING_KEYS), columns,
                 [(k, k, fmts.get(k, "")) for k in TUNING_KEYS])


#: (line style, marker) of a row's curve at its study's first, second, ... depth in the tuning figure
DEPTH_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))


def tuning_figure(data: StudyData, records: list[dict], out: Path) -> list[Path]:
    """Val accuracy (mean ± sd over the tuning seeds) vs LR (log axis) per variant, the chosen LR circled; and the
    stability of each row's choice (``tuning_stability``: bars, the :data:`STABLE` line drawn)."""
    from .plot import apply_style, close, colors, new_figure, place_legends, save, text_width

    apply_style()
    palette = colors(data.rows)
    depths = sorted({r["depth"] for r in records}, key=lambda d: (d is None, d))
    many_depths = len(depths) > 1
    cells = _cells(records)
    entries = [f"{row}, depth {depth}" if many_depths else row for row, depth in cells]
    fig = new_figure(6.0, 4.0, legend=entries)
    ax = fig.add_subplot()
    for entry, ((row, depth), cell) in zip(entries, cells.items(), strict=True):
        points = [rec for rec in cell if rec["mean"] is not None]
        if not points:
            continue
        xs, ys = [p["lr"] for p in points], [100 * p["mean"] for p in points]
        color = palette.get(row, "black")
        style = DEPTH_STYLES[depths.index(depth) % len(DEPTH_STYLES)]  # a row's depths: one colour, own line and marker
        ax.errorbar(xs, ys, yerr=[100 * (p["std"] or 0.0) for p in points], marker=style[1], linestyle=style[0],
                    capsize=3, label=entry, color=color)
        chosen = [p for p in points if p["chosen"]]
        ax.scatter([p["lr"] for p in chosen], [100 * p["mean"] for p in chosen], s=120, facecolors="none",
                   edgecolors=color, linewidths=1.5)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(f"val accuracy (%) [{data.tune_metric}], tuning seeds")
    ax.set_title(f"{data.name}: LR tuning (circled: chosen)")
    place_legends(fig, [ax], entries, fontsize="small")
    paths = save(fig, out, "tuning")
    close(fig)
    chosen = [rec for rec in records if rec["chosen"] and rec["stability"] is not None]
    if chosen:
        labels = [f"{rec['variant']} d{rec['depth']}" if many_depths else rec["variant"] for rec in chosen]
        # the bars keep 4.8 in beside the labels, however long the row names
        fig = new_figure(4.8 + text_width(labels), 0.9 + 0.28 * len(chosen))
        ax = fig.add_subplot()
        ax.barh(range(len(chosen)), [100 * rec["stability"] for rec in chosen],
                color=[palette.get(rec["variant"], "black") for rec in chosen])
        ax.axvline(100 * STABLE, color="grey", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(chosen)), labels, fontsize="small")
        ax.invert_yaxis()
        ax.set_xlim(0, 100)
        ax.set_xlabel(f"LR choice stability (% of {BOOTSTRAP:,} bootstrap resamples of the tuning seeds)")
        ax.set_title(f"{data.name}: how often the chosen rate stays best")
        paths += save(fig, out, "tuning_stability")
        close(fig)
    return paths
