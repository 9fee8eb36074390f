"""The learning-rate tuning stage of a study (trials with ``phase: tune``): the ``tuning`` table (mean validation
accuracy per variant × LR over the tuning seeds) and the figure ``tuning`` (val accuracy vs LR per variant). The
chosen LR of a variant is the one its report-phase runs trained at (the main table's LR column)."""

from __future__ import annotations

import statistics
from pathlib import Path

from .format import Column, Table, fmt_param, frame
from .load import StudyData, finite

TUNING_KEYS = ["variant", "depth", "lr", "n", "mean", "std", "n_diverged", "n_failed", "seeds", "chosen"]


def tuning_records(data: StudyData) -> list[dict]:
    """One record per row × depth × LR of the tuning runs (rows in the table's order, depths and LRs ascending):
    the mean and sd of the tuning metric over the tuning seeds, a diverged or failed run counting as 0 — the
    tuning stage's choice rule (``ablations.run.study.choose_lrs``) —, and whether the row's reported runs (at that depth,
    or at any depth when none ran at it) trained at this LR."""
    order = {row: i for i, row in enumerate(data.rows)}
    groups: dict[tuple, list] = {}
    for run in data.tune_runs:
        if run.lr is not None:
            groups.setdefault((run.row, run.depth, run.lr), []).append(run)

    def key(item):
        (row, depth, lr), _ = item
        return order.get(row, len(order)), row, depth if depth is not None else -1, lr

    records = []
    for (row, depth, lr), runs in sorted(groups.items(), key=key):
        values = [float(r.summary[data.tune_metric]) if r.ok and finite(r.summary.get(data.tune_metric)) else 0.0
                  for r in runs]
        reported = [r for r in data.runs if r.row == row and r.depth == depth] or \
            [r for r in data.runs if r.row == row]
        records.append({"variant": row, "depth": depth, "lr": lr, "n": len(values),
                        "mean": statistics.fmean(values) if values else None,
                        "std": statistics.stdev(values) if len(values) >= 2 else None,
                        "n_diverged": sum(1 for r in runs if r.diverged),
                        "n_failed": sum(1 for r in runs if not r.ok and not r.diverged),
                        "seeds": sorted({r.seed for r in runs if r.seed is not None}),
                        "chosen": lr in {r.lr for r in reported}})
    return records


def grid_edge(records: list[dict]) -> list[tuple[str, object, float]]:
    """(variant, depth, lr) of each row whose chosen LR is the smallest or largest it was tuned at: its best
    learning rate may lie beyond the tuning grid."""
    edges = []
    for row, depth in dict.fromkeys((rec["variant"], rec["depth"]) for rec in records):
        lrs = sorted(rec["lr"] for rec in records if (rec["variant"], rec["depth"]) == (row, depth))
        chosen = [rec["lr"] for rec in records if (rec["variant"], rec["depth"]) == (row, depth) and rec["chosen"]]
        if len(lrs) >= 2 and chosen and chosen[0] in (lrs[0], lrs[-1]):
            edges.append((row, depth, chosen[0]))
    return edges


def edge_note(records: list[dict]) -> str:
    """The caption's warning about :func:`grid_edge` rows ('' when every chosen LR is inside the grid)."""
    edges = grid_edge(records)
    if not edges:
        return ""
    where = ", ".join(f"{row}{f' (depth {depth})' if depth is not None else ''} at {fmt_param(lr)}"
                      for row, depth, lr in edges)
    return (f" At the edge of the tuning grid: {where} — the best learning rate of these rows may lie beyond the "
            "grid, so their rows may understate them.")


def tuning_table(data: StudyData, records: list[dict]) -> Table:
    columns = [Column("variant", "variant"), Column("depth", "depth", fmt="d"),
               Column("lr", "LR", render=lambda rec, style: fmt_param(rec["lr"])),
               Column("mean", "val acc. (%)", fmt=".2f", scale=100.0), Column("std", "sd (pp)", fmt=".2f", scale=100.0),
               Column("n", "n", fmt="d"), Column("n_diverged", "diverged", fmt="d"), Column("n_failed", "failed", fmt="d"),
               Column("chosen", "chosen", render=lambda rec, style: "yes" if rec["chosen"] else "", align="l")]
    fmts = {"lr": ".6g", "mean": ".6f", "std": ".6f"}
    seeds = sorted({s for rec in records for s in rec["seeds"]})
    caption = (f"Learning-rate tuning of study {data.name}: {data.tune_metric} (a validation metric; the test split is "
               f"never used to choose), mean and sample sd over the tuning runs (n) on seeds "
               f"{', '.join(map(str, seeds))}, disjoint from the reported seeds; a diverged or failed tuning run counts "
               f"as 0, as in the stage's choice. chosen = the LR the variant's reported runs trained at (the main "
               f"table's LR column).{edge_note(records)}")
    return Table("tuning", f"{data.name}: learning-rate tuning", caption, frame(records, TUNING_KEYS), columns,
                 [(k, k, fmts.get(k, "")) for k in TUNING_KEYS])


def tuning_figure(data: StudyData, records: list[dict], out: Path) -> list[Path]:
    """Val accuracy (mean ± sd over the tuning seeds) vs LR (log axis) per variant; the chosen LR marked."""
    import matplotlib.pyplot as plt

    from .figures import apply_style, close, colors, save

    apply_style()
    palette = colors(data.rows)
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for row, depth in dict.fromkeys((rec["variant"], rec["depth"]) for rec in records):
        points = [rec for rec in records if (rec["variant"], rec["depth"]) == (row, depth) and rec["mean"] is not None]
        if not points:
            continue
        xs, ys = [p["lr"] for p in points], [100 * p["mean"] for p in points]
        color = palette.get(row, "black")
        ax.errorbar(xs, ys, yerr=[100 * (p["std"] or 0.0) for p in points], marker="o", capsize=3, label=row if len({r["depth"] for r in records}) == 1 else f"{row}, depth {depth}", color=color)
        chosen = [p for p in points if p["chosen"]]
        ax.scatter([p["lr"] for p in chosen], [100 * p["mean"] for p in chosen], s=120, facecolors="none",
                   edgecolors=color, linewidths=1.5)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(f"val accuracy (%) [{data.tune_metric}], tuning seeds")
    ax.set_title(f"{data.name}: LR tuning (circled: chosen)")
    ax.legend(fontsize="small")
    paths = save(fig, out, "tuning")
    close(fig)
    return paths
