"""The report's tables: each built once as a pandas DataFrame of numbers (:class:`Table`), rendered by one
formatter (:func:`render`) to Markdown, LaTeX (booktabs) or CSV.

A table's ``frame`` holds one record per result line (numbers as floats/ints, None when undefined); its
``columns`` say how the Markdown/LaTeX view shows them. Columns marked ``per_depth`` are spread into one group per
depth (a wide table: one line per variant), everything else is shown as it is (a long table). The CSV is the frame
itself (``csv`` names and formats its columns), so the CSV always stays long and machine-readable.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .format import (
    MARK,
    MIN_IMPORTANCE_TRIALS,
    Column,
    Table,
    fmt_param,
    frame,
    latex_escape,
    num,
    p_text,
    pct,
    status_notes,
)
from .load import (
    AUC_KEY,
    BASELINE,
    EPOCH_TIME_KEY,
    FRACTION_KEYS,
    WALL_TIME_KEY,
    StudyData,
    best_per_row,
    first_line,
    mean_of,
    median_of,
    own_share,
)
from .stats import ALPHA, CONFIDENCE, POWER, ZERO_SD, Cell, family_size

# Imported where they are used, not here: Optuna. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.

# --- main table (grid studies) -------------------------------------------------------------------------------------
MAIN_KEYS = ["variant", "depth", "lr", "n", "n_runs", "mean", "std", "n_diverged", "n_failed_training", "n_failed",
             "best", "baseline",
             "seeds", "n_pairs", "delta", "sd", "ci_low", "ci_high", "boot_low", "boot_high", "p_t", "p_t_holm",
             "p_wilcoxon",
             "p_wilcoxon_holm", "wilcoxon_too_small", "mde", "significant", "n_diverged_pairs", "pair_seeds"]


CI_LABEL = f"{100 * CONFIDENCE:.0f}% CI, unadjusted"


def cell_records(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """The cells as plain records (accuracies and differences as fractions)."""
    records = []
    for c in cells:
        cmp = c.comparison
        records.append({
            "variant": c.row, "depth": c.depth, "n": c.n, "n_runs": c.n_runs, "mean": c.mean, "std": c.std,
            "n_diverged": c.n_diverged, "n_failed_training": c.n_failed_training, "n_failed": c.n_failed,
            "best": c.best, "baseline": c.baseline,
            "seeds": list(c.seeds), "n_pairs": cmp.n if cmp else None, "delta": cmp.delta if cmp else None,
            "sd": cmp.sd if cmp else None, "ci_low": cmp.ci_low if cmp else None,
            "ci_high": cmp.ci_high if cmp else None, "boot_low": cmp.boot_low if cmp else None,
            "boot_high": cmp.boot_high if cmp else None, "p_t": cmp.p_t if cmp else None, "p_t_holm": c.p_t_holm,
            "p_wilcoxon": cmp.p_wilcoxon if cmp else None, "p_wilcoxon_holm": c.p_wilcoxon_holm,
            "wilcoxon_too_small": cmp.wilcoxon_too_small if cmp else None, "mde": c.mde,
            "significant": c.significant if c.p_t_holm is not None else None,  # None: no test
            "n_diverged_pairs": c.n_diverged_pairs if cmp else None, "pair_seeds": list(c.pair_seeds),
        })
    return records


def acc_text(rec: Mapping[str, Any], style: str) -> str:
    """A main-table accuracy cell: ``mean ± sd (n=k)``, bold when best in its depth, with its diverged and
    failed runs."""
    tail = ""
    if rec["n_diverged"]:
        tail += f" ({rec['n_diverged']}/{rec['n_runs']} diverged)"
    if rec.get("n_failed_training"):
        tail += f" ({rec['n_failed_training']}/{rec['n_runs']} failed to train)"
    if rec["n_failed"]:
        tail += f" ({rec['n_failed']} failed)"
    if rec["mean"] is None:
        return ("—" if style == "md" else "---") + tail
    pm = " ± " if style == "md" else r" $\pm$ "
    core = pct(rec["mean"]) + (pm + pct(rec["std"]) if rec["std"] is not None else "")
    if rec["best"]:
        core = f"**{core}**" if style == "md" else rf"\textbf{{{core}}}"
    return f"{core} (n={rec['n']}){tail}"


def cell_text(cell: Cell, style: str) -> str:
    return acc_text(cell_records([cell])[0], style)


def signed(x: float | None, style: str, digits: int = 2) -> str:
    text = num(None if x is None else 100.0 * x, f"+.{digits}f").replace("-", "−")
    return text if style == "md" else latex_escape(text)


def all_equal(rec: Mapping[str, Any]) -> bool:
    """n ≥ 2 paired differences, all equal (s_d = 0): no interval, no test."""
    return rec["n_pairs"] is not None and rec["n_pairs"] >= 2 and rec["sd"] is not None and rec["sd"] <= ZERO_SD


def equal_text(rec: Mapping[str, Any], style: str) -> str:
    """The text of a comparison without variance: ``all n differences equal: Δ = x, no interval``."""
    return f"all {rec['n_pairs']} differences equal: Δ = {signed(rec['delta'], 'md')} pp, no interval" \
        if style == "md" else latex_escape(equal_text(rec, "md"))


def ci_text(rec: Mapping[str, Any], style: str) -> str:
    """``[CI low, CI high]`` in pp; the no-interval text for differences without variance; ``—``."""
    if all_equal(rec):
        return equal_text(rec, style)
    if rec["ci_low"] is None:
        return "—" if style == "md" else "---"
    return f"[{signed(rec['ci_low'], style)}, {signed(rec['ci_high'], style)}]"


def boot_text(rec: Mapping[str, Any], style: str) -> str:
    """``[low, high]`` of the two-level bootstrap interval in pp; ``—`` without one."""
    if rec.get("boot_low") is None:
        return "—" if style == "md" else "---"
    return f"[{signed(rec['boot_low'], style)}, {signed(rec['boot_high'], style)}]"


def bootstrap_text(cells: Sequence[Cell]) -> str:
    """The captions' sentence on the two-level bootstrap interval ('' when no comparison has one)."""
    from .bootstrap import RESAMPLES

    with_boot = [c for c in cells if c.comparison is not None and c.comparison.boot_low is not None]
    if not with_boot:
        return ""
    return (f" The t-interval covers seed-to-seed variation only (every run is scored on the same fixed test images); "
            f"the two-level bootstrap interval ({RESAMPLES:,} resamples of the seeds and, independently, of the test "
            f"images, the same images for both runs of a pair; percentile) also covers the sampling of the test "
            f"images: {len(with_boot)} comparison{'s' if len(with_boot) != 1 else ''} have one (those whose runs all "
            f"stored their per-image test results).")


def delta_text(rec: Mapping[str, Any], style: str) -> str:
    """``Δ [CI low, CI high]`` in percentage points, ``*`` when Holm-significant; ``baseline`` / ``—``."""
    if rec["baseline"]:
        return "baseline"
    if rec["n_pairs"] is None or rec["delta"] is None:
        return "—" if style == "md" else "---"
    if all_equal(rec):
        text = equal_text(rec, style)
    else:
        text = signed(rec["delta"], style) + (f" {ci_text(rec, style)}" if rec["ci_low"] is not None else "")
    if rec["significant"]:
        text += MARK if style == "md" else r"$^{*}$"
    if rec["n_pairs"] != rec["n"]:
        text += f" ({rec['n_pairs']} pair{'s' if rec['n_pairs'] != 1 else ''})"
    return text


def _mde_range(cells: Sequence[Cell]) -> str:
    values = sorted(c.mde for c in cells if c.mde is not None)
    if not values:
        return "no cell has an MDE (fewer than 2 pairs or all paired differences equal)"
    return (f"MDE over the table: {100 * values[0]:.2f} – {100 * statistics.median(values):.2f} – "
            f"{100 * values[-1]:.2f} pp (min – median – max)")


def _seeds_text(data: StudyData) -> str:
    seeds = sorted({r.seed for r in data.runs if r.seed is not None})
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))})" if seeds else "seeds"


def _method(data: StudyData, cells: Sequence[Cell]) -> str:
    """The statistics sentences shared by the main and the paired table's captions (and the claims')."""
    if not any(c.comparison is not None for c in cells):
        return f"No paired comparison: the study has no '{BASELINE}' variant (or no results for it)."
    return method_text(cells, f"{BASELINE} at the same depth", "of the table")


def method_text(cells: Sequence[Cell], against: str, family: str, wilcoxon: bool = True) -> str:
    """Test, correction, family size m for each test, interval, MDE and how diverged, tied and small-n comparisons
    are treated, for the comparisons of ``cells`` (one Holm family)."""
    m = family_size(cells)
    compared = [c for c in cells if c.comparison is not None]
    significant = [c for c in compared if c.significant]
    found = (f"{len(significant)} of the {m} comparisons significant after Holm" if m
             else "no comparison has a test")
    equal = [c for c in compared if c.comparison.all_equal]
    small = [c for c in compared if c.comparison.wilcoxon_too_small]
    diverged = sum(c.n_diverged_pairs for c in compared)
    check = (f"; Wilcoxon signed-rank test (two-sided, scipy.stats.wilcoxon) as a check, Holm-adjusted over the "
             f"same m = {m} comparisons; {MARK} = Holm-adjusted paired t-test p < {ALPHA}; {found}. The exact "
             f"Wilcoxon test cannot reject at n ≤ 5 pairs (its smallest two-sided p is 2/2^n = {2 / 2 ** 5:.4g} at "
             f"n = 5): such cells read 'n too small' ({len(small)} here)." if wilcoxon else f"; {found}.")
    text = (f"Δ = mean paired difference to {against} in percentage points (pp), paired by seed (common random "
            f"numbers: the same seed gives every variant the same initial weights, data split, batch order and "
            f"augmentation), with its {100 * CONFIDENCE:.0f}% t-based confidence interval, unadjusted for the m comparisons. "
            f"Test: paired two-sided t-test over seeds (scipy.stats.ttest_rel), Holm–Bonferroni over the m = {m} "
            f"comparisons {family} with a defined test at α = {ALPHA}{check} MDE = minimum detectable effect: the "
            f"true Δ the paired t-test at "
            f"the Bonferroni level α′ = α/m = {ALPHA / max(1, m):.4g} (Holm's first, strictest step) detects with "
            f"power {POWER}, from the noncentral t distribution (df = n−1, noncentrality Δ·√n/s_d; s_d = sample sd "
            f"of the n paired differences); {_mde_range(cells)}. Diverged runs stay in the pairs as failures at "
            f"chance-level accuracy (1/number of classes): {diverged} pair{'s' if diverged != 1 else ''} "
            f"counted that way. A comparison with fewer than 2 pairs has no test and no MDE")
    boot = bootstrap_text(cells)
    if equal:
        text += (f"; {len(equal)} comparison{'s' if len(equal) != 1 else ''} with all paired differences equal "
                 f"(s_d = 0) {'have' if len(equal) != 1 else 'has'} no interval, no test and no MDE and never "
                 f"count{'' if len(equal) != 1 else 's'} as significant")
    return text + "." + boot


def lr_text(data: StudyData, row: str) -> str:
    """The learning rate(s) the row's report-phase runs trained at: one value, 'mixed: a, b' when they disagree,
    '—' when no run stored it."""
    lrs = sorted({r.lr for r in data.runs if r.row == row and r.lr is not None})
    if not lrs:
        return "—"
    return fmt_param(lrs[0]) if len(lrs) == 1 else "mixed: " + ", ".join(fmt_param(v) for v in lrs)


def main_table(data: StudyData, cells: Sequence[Cell]) -> Table:
    """Wide: one line per variant with its LR; per depth the accuracy (mean ± sd) and Δ [95% CI] vs the baseline."""
    records = [rec | {"lr": lr_text(data, rec["variant"])} for rec in cell_records(cells)]
    acc_header = "depth {depth}" if data.depths else "accuracy"
    columns = [Column("variant", "variant"), Column("lr", "LR", align="r"),
               Column("mean", acc_header, render=acc_text, per_depth=True, sub="acc. (%)"),
               Column("delta", f"Δ vs {BASELINE} (pp) [{CI_LABEL}], depth {{depth}}", render=delta_text,
                      per_depth=True, sub=f"Δ vs {BASELINE} (pp) [{CI_LABEL}]")]
    csv_cols = [("variant", "variant", ""), ("depth", "depth", ""), ("lr", "lr", ""), ("n", "n", ""),
                ("n_runs", "n_runs", ""), ("mean", f"mean_{data.metric}", ".6f"), ("std", f"std_{data.metric}", ".6f"),
                ("n_diverged", "n_diverged", ""), ("n_failed_training", "n_failed_training", ""),
                ("n_failed", "n_failed", ""), ("n_pairs", "n_pairs", ""), ("delta", "delta_vs_standard", ".6f"), ("ci_low", "ci_low", ".6f"), ("ci_high", "ci_high", ".6f"),
                ("p_t_holm", "p_ttest_rel_holm", ".6g"), ("significant", "significant", ""),
                ("best", "best_in_depth", ""), ("seeds", "seeds", "")]
    caption = (f"Top-1 {'test' if data.metric.startswith('test') else 'validation'} accuracy (%) of study {data.name}: {data.metric} ({METRIC_TEXT.get(data.metric, data.metric)}"
               f" of each run), mean ± sample sd (ddof=1) over {_seeds_text(data)}, n = ok runs (completed, not "
               f"diverged). LR = the peak learning rate the variant's reported runs trained at. Bold: best mean per "
               f"depth. {_method(data, cells)} Raw and adjusted p-values of both tests and the MDE of every cell are "
               f"in table 'paired'. Diverged runs (non-finite loss) are shown as 'k/n diverged' and excluded from "
               f"mean and sd (not from the pairs); failed or pruned runs as '(k failed)' and drop their seed's pair."
               + floor_text(data))
    split = "test" if data.metric.startswith("test") else "val"
    return Table("main", f"{data.name}: top-1 {split} accuracy (%) by depth", caption, frame(records, MAIN_KEYS),
                 columns, csv_cols, status_notes(data))


def floor_text(data: StudyData) -> str:
    """The captions' sentence on the study's floor for failed trainings ('' when it declares none)."""
    if data.floor is None:
        return ""
    return (f" A run that completed with {data.floor} failed to train (the study's floor): shown as 'k/n failed to "
            "train', excluded from mean and sd, and at chance level in the pairs, like a diverged run.")


METRIC_TEXT = {"best_val_acc": "the best epoch's val accuracy", "final_val_acc": "the final epoch's val accuracy",
               "test_acc": "the test split's accuracy at the final epoch",
               "test_acc_at_best_val": "the test split's accuracy at the epoch chosen on validation"}


def wilcoxon_text(key: str) -> Callable[[Mapping[str, Any], str], str]:
    """A Wilcoxon p cell: ``n too small`` when the exact test can never reject at this n."""
    def render(rec: Mapping[str, Any], style: str) -> str:
        text = "n too small" if rec["wilcoxon_too_small"] else p_text(rec[key])
        return latex_escape(text) if style == "tex" else text
    return render


def paired_table(data: StudyData, cells: Sequence[Cell]) -> Table:
    """Long: one line per compared variant × depth with n, Δ, CI, both tests raw and Holm-adjusted, MDE."""
    records = [rec for rec, c in zip(cell_records(cells), cells, strict=True) if c.comparison is not None]
    boot = any(rec["boot_low"] is not None for rec in records)  # the column only where per-image results exist

    def p(key):
        return lambda rec, style: latex_escape(p_text(rec[key])) if style == "tex" else p_text(rec[key])

    columns = [Column("variant", "variant"), Column("depth", "depth", fmt="d"), Column("n_pairs", "pairs", fmt="d"),
               Column("delta", "Δ (pp)", render=lambda rec, style: signed(rec["delta"], style)),
               Column("ci_low", f"{CI_LABEL} (pp)", render=ci_text),
               *([Column("boot_low", "two-level 95% interval (pp)", render=boot_text)] if boot else []),
               Column("p_t", "p (t)", render=p("p_t")), Column("p_t_holm", "p (t, Holm)", render=p("p_t_holm")),
               Column("p_wilcoxon", "p (Wilcoxon)", render=wilcoxon_text("p_wilcoxon")),
               Column("p_wilcoxon_holm", "p (Wilcoxon, Holm)", render=wilcoxon_text("p_wilcoxon_holm")),
               Column("mde", "MDE (pp)", fmt=".2f", scale=100.0),
               Column("n_diverged_pairs", "at chance in pairs", fmt="d"),
               Column("significant", "significant",
                      render=lambda rec, style: {True: "yes", False: "no"}.get(rec["significant"], "—" if style == "md" else "---"),
                      align="l")]
    csv_cols = [("variant", "variant", ""), ("depth", "depth", ""), ("n_pairs", "n_pairs", ""),
                ("delta", "delta", ".6f"), ("sd", "sd_differences", ".6f"), ("ci_low", "ci_low", ".6f"),
                ("ci_high", "ci_high", ".6f"),
                *([("boot_low", "boot_low", ".6f"), ("boot_high", "boot_high", ".6f")] if boot else []),
                ("p_t", "p_ttest_rel", ".6g"), ("p_t_holm", "p_ttest_rel_holm", ".6g"),
                ("p_wilcoxon", "p_wilcoxon", ".6g"), ("p_wilcoxon_holm", "p_wilcoxon_holm", ".6g"),
                ("wilcoxon_too_small", "wilcoxon_n_too_small", ""), ("mde", "mde", ".6f"),
                ("n_diverged_pairs", "n_diverged_pairs", ""), ("significant", "significant", ""),
                ("pair_seeds", "pair_seeds", "")]
    caption = (f"Paired comparisons with {BASELINE} in study {data.name} ({data.metric}; differences in percentage "
               f"points, CSV in fractions), over {_seeds_text(data)}; pairs = seeds where both runs have a result "
               f"(a run that diverged or failed to train counts at chance level: 'at chance in pairs'; failed or "
               f"missing runs drop their seed). "
               f"{_method(data, cells)}")
    return Table("paired", f"{data.name}: paired differences vs {BASELINE}", caption,
                 frame(records, MAIN_KEYS), columns, csv_cols, status_notes(data))


# --- convergence ----------------------------------------------------------------------------------------------------
def convergence_table(data: StudyData) -> Table:
    records = []
    for row in data.rows:
        for depth in data.depths or [None]:
            runs = data.by_row_depth(row, depth)
            if not runs:
                continue
            ok = [r for r in runs if r.ok]
            done = [r for r in runs if r.ok or r.at_chance]  # every completed run, whether it trained or not
            rec = {"variant": row, "depth": depth, "n": len(done), "n_trained": len(ok),
                   "n_failed_training": sum(1 for r in runs if r.failed_training),
                   "n_diverged": sum(1 for r in runs if r.diverged)}
            for key in FRACTION_KEYS:
                rec[key] = mean_of(r.summary.get(key) for r in ok)
            rec[AUC_KEY] = mean_of(r.summary.get(AUC_KEY) if r.summary.get(AUC_KEY) is not None else
                                   (0.0 if r.diverged else None) for r in done)
            for key in (EPOCH_TIME_KEY, WALL_TIME_KEY):  # a stacked run: its share of the stack's time
                rec[key] = median_of(own_share(r.summary, key) for r in ok)
            records.append(rec)
    columns = [Column("variant", "variant"), Column("depth", "depth", fmt="d", align="l"), Column("n", "n", fmt="d"),
               Column("n_trained", "trained", fmt="d"), Column("n_failed_training", "failed to train", fmt="d"),
               Column("n_diverged", "diverged", fmt="d"),
               *(Column(k, f"epochs to {p}%", fmt=".1f") for k, p in zip(FRACTION_KEYS, (90, 95, 99), strict=True)),
               Column(AUC_KEY, "val-acc AUC (%)", fmt=".2f", scale=100.0),
               Column(EPOCH_TIME_KEY, "s / epoch", fmt=".2f"), Column(WALL_TIME_KEY, "wall time (s)", fmt=".1f")]
    csv_cols = [("variant", "variant", ""), ("depth", "depth", ""), ("n", "n", ""), ("n_trained", "n_trained", ""),
                ("n_failed_training", "n_failed_training", ""), ("n_diverged", "n_diverged", ""),
                *((k, k, ".4f") for k in FRACTION_KEYS), (AUC_KEY, AUC_KEY, ".6f"),
                (EPOCH_TIME_KEY, EPOCH_TIME_KEY, ".6f"), (WALL_TIME_KEY, WALL_TIME_KEY, ".6f")]
    caption = ("Convergence per variant and depth over every completed run (n): trained = above the floor with a "
               "finite loss; failed to train = completed below the study's floor; diverged = a non-finite loss. The "
               "val-acc AUC (mean val accuracy over the planned epochs, unmeasured epochs counting 0) is a mean over "
               "all n runs, so a row whose runs fail is not judged on its survivors alone; the epochs to 90/95/99% "
               "of a run's own best val accuracy (1-based) are means over the runs that trained (a run that did not "
               "has no best worth reaching); medians of the wall time per epoch (train + val) and per run, over the "
               "runs that trained, a run trained in a stack of K counting 1/K of the stack's time (medians: a run "
               "whose worker was paused or whose machine was suspended mid-training counts the pause in its wall "
               "clock).")
    keys = ["variant", "depth", "n", "n_trained", "n_failed_training", "n_diverged", *FRACTION_KEYS, AUC_KEY,
            EPOCH_TIME_KEY, WALL_TIME_KEY]
    return Table("convergence", f"{data.name}: convergence", caption, frame(records, keys), columns, csv_cols)


# --- search studies ------------------------------------------------------------------------------------------------
def search_table(data: StudyData) -> Table:
    best = best_per_row(data)
    records = []
    for row in data.rows:
        runs = [r for r in data.runs if r.row == row]
        b = best.get(row)
        records.append({"variant": row, **{s: sum(1 for r in runs if r.state == s)
                                            for s in ("complete", "pruned", "failed")},
                        data.metric: b.acc if b else None, "trial": b.number if b else None,
                        "searched_values": ", ".join(f"{k}={fmt_param(v)}" for k, v in sorted(b.searched.items()))
                        if b else ""})
    columns = [Column("variant", "variant"), *(Column(s, s, fmt="d") for s in ("complete", "pruned", "failed")),
               Column(data.metric, "best top-1 (%)", fmt=".2f", scale=100.0), Column("trial", "trial", fmt="d"),
               Column("searched_values", "searched values")]
    keys = ["variant", "complete", "pruned", "failed", data.metric, "trial", "searched_values"]
    caption = (f"Search study {data.name}: best trial per variant by {data.metric} "
               f"({METRIC_TEXT.get(data.metric, data.metric)}), its searched values, and trial counts (pruned "
               "trials stopped early by the pruner).")
    return Table("search_best", f"{data.name}: best trial per variant", caption, frame(records, keys), columns,
                 [(k, k, ".6f" if k == data.metric else "") for k in keys], status_notes(data))


def importance_table(study, data: StudyData) -> Table:
    """Parameter importances with PED-ANOVA (named in the caption): over all completed trials for the
    parameters every trial has, then per variant for its own (conditional) searched parameters."""
    import optuna
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    evaluator_name = "PedAnovaImportanceEvaluator"
    numbers = {r.number for r in data.runs if r.state == "complete"}
    complete = [t for t in study.get_trials(deepcopy=False) if t.number in numbers and t.value is not None]
    scopes: list[tuple[str, list, list[str]]] = []
    common = sorted(set.intersection(*(set(t.params) for t in complete))) if complete else []
    scopes.append(("all variants", complete, common))
    for row in data.rows:
        label = data.row_variant[row]
        trials = [t for t in complete if t.params.get("variant") == label]
        names = sorted({k for t in trials for k in t.params if k.startswith(f"{label}.")})
        if names:
            scopes.append((row, trials, names))
    records, notes = [], []
    for scope, trials, names in scopes:
        names = [n for n in names if all(n in t.params for t in trials)]
        if not names:
            continue
        if len(trials) < MIN_IMPORTANCE_TRIALS:
            notes.append(f"{scope}: too few completed trials ({len(trials)} < {MIN_IMPORTANCE_TRIALS}) for "
                         f"importances of {', '.join(names)}.")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sub = optuna.create_study(direction=study.direction)  # in memory: never touches the storage
                sub.add_trials(trials)
                result = get_param_importances(sub, evaluator=PedAnovaImportanceEvaluator(), params=names,
                                               normalize=True)
        except Exception as exc:  # noqa: BLE001 - importance is a best-effort summary
            notes.append(f"{scope}: importances not computed ({first_line(exc)}).")
            continue
        if len(names) == 1:
            notes.append(f"{scope}: one parameter ({names[0]}), so its normalised importance is 1 by definition.")
        for name in sorted(result, key=lambda n: (-round(float(result[n]), 12), n)):
            records.append({"scope": scope, "parameter": name, "trials": len(trials),
                            "importance": float(result[name])})
    if not records:
        records.append({"scope": "—", "parameter": "—", "trials": 0, "importance": None})
    columns = [Column("scope", "scope"), Column("parameter", "parameter"), Column("trials", "trials", fmt="d"),
               Column("importance", f"importance ({evaluator_name})", fmt=".4f")]
    keys = ["scope", "parameter", "trials", "importance"]
    caption = (f"Parameter importances of study {data.name} for {data.metric}, from optuna.importance."
               f"get_param_importances with evaluator {evaluator_name} (default settings, normalised to sum 1 "
               "per scope), over completed trials: 'all variants' for the parameters every trial has, then each "
               "variant over its own conditional search space.")
    return Table("importance", f"{data.name}: parameter importances", caption, frame(records, keys), columns,
                 [(k, k, ".6f" if k == "importance" else "") for k in keys], notes)
