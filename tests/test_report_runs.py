"""The report without training: claims as data (spec + verdicts), runs.csv as the tables' one
input (byte-identical to the report from the storage, under two PYTHONHASHSEEDs), the tuning table, and the
statistics fixes pinned against scipy on hand-made data."""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from committed import committed

from ablations import report
from ablations.report import claims as claims_mod
from ablations.report import runs as runs_mod
from ablations.report.stats import chance_level, t_power
from ablations.studies.spec import _build, load_spec
from ablations.training import HP_SUMMARY_KEYS

REPO = Path(__file__).resolve().parents[1]
SEEDS = [0, 1, 2, 3, 4, 5]
TUNE_SEEDS = [100, 101]
LRS = [0.001, 0.002, 0.004]
CHOSEN = {"standard": 0.002, "layerscale": 0.004, "rezero": 0.001}
# test_acc per seed: layerscale clearly above standard, rezero clearly below (one diverged run), flat = standard
# plus exactly 1 pp everywhere (all paired differences equal)
STANDARD = [0.800, 0.810, 0.790, 0.805, 0.795, 0.802]
ACC = {"standard": STANDARD, "layerscale": [v + d for v, d in zip(STANDARD, [0.03, 0.025, 0.035, 0.028, 0.031, 0.027],
                                                                   strict=True)],
       "rezero": [v - d for v, d in zip(STANDARD, [0.05, 0.04, 0.06, 0.045, 0.055, 0.05], strict=True)],
       "flat": [v + 0.01 for v in STANDARD]}
DIVERGED = {("rezero", 3)}
YAML = """\
name: claims_tiny
description: hand-made trials for tests/test_report_runs.py
kind: grid
metric: test_acc
direction: maximize
base: {dataset: synthetic, dataset_options: {num_classes: 4}, max_epochs: 2}
variants:
  - {label: standard, residual: standard}
  - {label: layerscale, residual: layerscale, options: {init_value: 0.1}}
  - {label: rezero, residual: rezero}
  - {label: flat, residual: standard}
axes: {depth: [2], seed: [0, 1, 2, 3, 4, 5]}
budgets:
  quick: {description: "a first look at the same trials (labelled so)"}
claims:
  - {id: layerscale_better, claim: "LayerScale improves accuracy", variant: layerscale, baseline: standard,
     depth: 2, direction: higher, source: "Touvron et al. 2021 (CaiT), Table 1",
     counts: "Holm-significant paired difference in test_acc in the paper's direction"}
  - {id: rezero_better, claim: "ReZero improves accuracy", variant: rezero, baseline: standard,
     direction: higher, source: "Bachlechner et al. 2020"}
  - {id: flat_better, claim: "Flat is better", variant: flat, baseline: standard, direction: higher, source: "none"}
  - {id: auc_claim, claim: "LayerScale converges faster", variant: layerscale, baseline: standard,
     direction: higher, source: "CaiT", metric: val_acc_auc}
  - {id: layerscale_worse, claim: "LayerScale costs accuracy", variant: layerscale, baseline: standard,
     depth: 2, direction: lower, source: "a made-up claim"}
  - {id: reattn_similarity, claim: "Re-attention removes similar blocks", source: "Zhou et al. 2021 (DeepViT)",
     testable: false, reason: "similarity ≈ 0 by construction on BatchNorm-normalised maps"}
"""


def _summary(acc: float, diverged: bool, seed: int) -> dict:
    summary = {k: float(0.5 + 0.01 * i + 0.001 * seed) for i, k in enumerate(HP_SUMMARY_KEYS)}
    summary |= {"best_epoch": 2, "epochs_completed": 2, "param_count": 1234, "diverged": diverged,
                "best_val_acc": acc + 0.01, "val_acc_auc": acc - 0.1, "test_acc": acc, "test_acc_at_best_val": acc}
    return summary


def _trial(variant: str, seed: int, acc: float, lr: float, phase: str | None, diverged: bool = False,
           lr_axis: bool = False):
    import optuna
    from optuna.distributions import CategoricalDistribution

    labels = list(ACC)
    attrs = _summary(acc, diverged, seed) | {
        "config": {"residual": "standard" if variant == "flat" else variant, "lr": lr, "depth": 2, "seed": seed,
                   "dataset": "synthetic", "dataset_options": {"num_classes": 4},
                   "residual_options": {"init_value": 0.1} if variant == "layerscale" else {}},
        "run_name": f"{variant}/depth=2/seed={seed}"}
    if phase is not None:
        attrs["phase"] = phase
    lr_param = {"lr": lr} if lr_axis else {}  # the tuning stage's grid has the LR as an axis
    return optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE, value=0.0 if math.isnan(acc) else acc,
        params={"variant": variant, "depth": 2, "seed": seed, **lr_param},
        distributions={"variant": CategoricalDistribution(labels), "depth": CategoricalDistribution([2]),
                       "seed": CategoricalDistribution(SEEDS + TUNE_SEEDS),
                       **({"lr": CategoricalDistribution(LRS)} if lr_axis else {})},
        user_attrs=attrs, intermediate_values={0: acc - 0.05, 1: acc})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A storage with hand-made trials: the study (report phase, every variant × seed) and its tuning stage as the
    study '<name>-tune' (LR × two other seeds), as ablations.run stores them."""
    import optuna

    root = tmp_path_factory.mktemp("claims")
    (root / "claims_tiny.yaml").write_text(YAML)
    storage = f"sqlite:///{root / 'o.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tune = optuna.create_study(study_name="claims_tiny-tune", storage=storage, direction="maximize")
    for seed in TUNE_SEEDS:
        for variant in ("standard", "layerscale", "rezero"):
            for lr in LRS:
                tune.add_trial(_trial(variant, seed, 0.7 + 0.01 * LRS.index(lr) + 0.001 * seed / 100
                                      + (0.05 if lr == CHOSEN[variant] else 0.0), lr, "tune", lr_axis=True))
    study = optuna.create_study(study_name="claims_tiny", storage=storage, direction="maximize")
    for variant, accs in ACC.items():
        for seed, acc in zip(SEEDS, accs, strict=True):
            div = (variant, seed) in DIVERGED
            study.add_trial(_trial(variant, seed, math.nan if div else acc, CHOSEN.get(variant, 0.002),
                                   "report" if variant != "flat" else None, diverged=div))
    return root, storage


def _report(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = report.main(list(argv))
    return code, out.getvalue(), err.getvalue()


REGENERATED = ("main", "paired", "claims", "power", "tuning", "convergence")


def _report_process(*args, hash_seed: str | None = None) -> subprocess.CompletedProcess:
    """``python -m ablations.report ARGS`` as its own process (under ``PYTHONHASHSEED=hash_seed`` when given)."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed} if hash_seed is not None else None
    return subprocess.run([sys.executable, "-m", "ablations.report", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _files(folder: Path) -> dict[str, bytes]:
    names = [f"{t}.{e}" for t in REGENERATED for e in ("md", "tex", "csv")] + ["runs.csv"]
    return {n: (folder / n).read_bytes() for n in names}


@pytest.fixture(scope="module")
def reports(tiny):
    root, storage = tiny
    spec = str(root / "claims_tiny.yaml")
    code, out, err = _report("--study", spec, "--storage", storage, "--out", str(root / "storage"), "--no-figures",
                             "--no-tensorboard", "--no-note")
    assert code == 0, err
    code, out2, err = _report("--study", spec, "--runs", str(root / "storage" / "runs.csv"), "--out",
                              str(root / "from_runs"))
    assert code == 0, err
    return root, out, out2


def test_runs_csv_regenerates_every_table_byte_identical(reports):
    root, _, printed = reports
    assert _files(root / "storage") == _files(root / "from_runs")
    assert "were not regenerated" in printed  # collapse and diagnostics without a diagnostics column: said
    assert (root / "from_runs" / "tuning.png").is_file()  # the tuning figure is drawn from runs.csv alone


def test_a_grid_report_from_runs_csv_prices_each_row_at_the_study_file_s_model_and_draws_its_figures(reports):
    """runs.csv holds no model size: the cost table prices each row at the model the study file builds at its
    point. LayerScale adds one gain vector of width D per branch (2 per block); ReZero drops a block's two
    LayerNorms (2·2·D) for one scalar shared by its branches; the row ``flat`` is the standard residual: at depth 2,
    +4·D, −8·D + 2 and +0 parameters over ``standard``. The validation curves are drawn from the curves runs.csv
    carries."""
    import pandas as pd

    root, _, _ = reports
    cost = pd.read_csv(root / "from_runs" / "cost.csv").set_index("variant")
    point = {"variant": "standard", "depth": 2, "seed": 0}
    width = load_spec(str(root / "claims_tiny.yaml")).run_config(point).embed_dim
    base = cost.loc["standard", "params"]
    assert base > 0 and cost.loc["layerscale", "params"] - base == 4 * width
    assert cost.loc["rezero", "params"] - base == -8 * width + 2 and cost.loc["flat", "params"] == base
    assert (root / "from_runs" / "val_curves.png").stat().st_size > 0
    # the caption says where each table's models come from
    assert "as the study file builds it at the trial's point" in (root / "from_runs" / "cost.md").read_text()
    assert "as its trial stored it" in (root / "storage" / "cost.md").read_text()
    # a row the study file no longer has keeps its runs in the tables, unpriced, and the report still completes
    text = YAML.replace("  - {label: flat, residual: standard}\n", "").replace("name: claims_tiny", "name: without_flat")
    text = text.replace('  - {id: flat_better, claim: "Flat is better", variant: flat, baseline: standard, direction: higher, '
                        'source: "none"}\n', "")
    (root / "without_flat.yaml").write_text(text)
    code, out, err = _report("--study", str(root / "without_flat.yaml"), "--runs", str(root / "storage" / "runs.csv"),
                             "--out", str(root / "without_flat"), "--no-figures", "--study-name", "claims_tiny")
    assert code == 0, err
    cost = pd.read_csv(root / "without_flat" / "cost.csv").set_index("variant")
    assert cost.loc["layerscale", "params"] - cost.loc["standard", "params"] == 4 * width
    assert pd.isna(cost.loc["flat", "params"]) and "flat: not measured" in out


@pytest.mark.slow
def test_runs_csv_is_identical_under_two_hash_seeds(reports):
    root, _, _ = reports
    outs = []
    for seed in ("0", "1"):
        out = root / f"hash{seed}"
        proc = _report_process("--study", root / "claims_tiny.yaml", "--runs", root / "storage" / "runs.csv", "--out",
                               out, "--no-figures", hash_seed=seed)
        assert proc.returncode == 0, proc.stderr
        outs.append(_files(out))
    assert outs[0] == outs[1] == _files(root / "storage")


@pytest.mark.slow  # a PostgreSQL server and a report process
def test_a_report_from_postgresql_under_another_hash_seed_is_byte_identical(reports, postgres):
    """The same trials copied into PostgreSQL (Optuna's copy_study: same order, numbers and attributes) give every
    table and runs.csv byte for byte, from a process with another PYTHONHASHSEED than the SQLite report's."""
    import optuna

    from ablations.studies.storage import open_storage

    root, _, _ = reports
    url = postgres.create_database("report_copy")
    for name in ("claims_tiny-tune", "claims_tiny"):
        optuna.copy_study(from_study_name=name, from_storage=f"sqlite:///{root / 'o.db'}", to_storage=open_storage(url))
    out = root / "postgresql"
    proc = _report_process("--study", root / "claims_tiny.yaml", "--storage", url, "--out", out, "--no-figures",
                           "--no-tensorboard", "--no-note", hash_seed="1")
    assert proc.returncode == 0, proc.stderr
    assert _files(out) == _files(root / "storage")


def test_runs_csv_columns_and_phases(reports):
    root, _, _ = reports
    with open(root / "storage" / "runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    header = list(rows[0])
    assert header[:8] == ["number", "run_name", "state", "phase", "variant", "row", "depth", "seed"]
    for key in ("residual", "residual_options", "lr", "num_classes", "acc", *HP_SUMMARY_KEYS, "test_acc",
                "test_acc_at_best_val", "ok", "mode"):
        assert key in header
    assert [int(r["number"]) for r in rows] == list(range(2 * 3 * 3)) + list(range(4 * 6))  # tune study first
    assert {r["phase"] for r in rows[:18]} == {"tune"} and {r["phase"] for r in rows[18:]} == {"report"}
    flat = [r for r in rows if r["variant"] == "flat"]
    assert flat[0]["residual"] == "standard" and flat[0]["phase"] == "report"  # no phase attr: report
    ls = next(r for r in rows if r["variant"] == "layerscale" and r["phase"] == "report")
    assert ls["residual_options"] == '{"init_value": 0.1}' and ls["lr"] == "0.004" and ls["num_classes"] == "4"
    assert float(ls["acc"]) == ACC["layerscale"][0] == float(ls["test_acc"])  # metric test_acc: acc follows it
    div = next(r for r in rows if r["variant"] == "rezero" and r["seed"] == "3" and r["phase"] == "report")
    assert div["diverged"] == "True" and div["ok"] == "False"


def _write_rows(path: Path, header: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def test_a_study_trained_on_two_machines_says_so_and_runs_csv_keeps_each_run_s_machine(reports, tmp_path):
    """runs.csv's ``machine`` (what each run trained on) round-trips, and a study whose runs trained on two machines
    says so with each machine's count of result runs; one machine (with or without runs that recorded none) says
    nothing."""
    root, _, _ = reports
    rows = list(csv.DictReader(io.StringIO((root / "storage" / "runs.csv").read_text())))
    assert "machine" not in rows[0]  # no trial recorded one: no column
    a, b = "Machine A (avx2), torch 2.14.1", "Machine B (avx2, avx512f, avx512_bf16), torch 2.14.1"
    for row in rows:
        row["machine"] = a if row["phase"] == "tune" or int(row["seed"]) < 2 else b
    header = [*list(rows[0])[:-1]]  # machine first put last; runs.csv's own order is checked on the way back
    header.insert(header.index("diverged"), "machine")
    _write_rows(tmp_path / "runs.csv", header, rows)
    code, out, err = _report("--study", str(root / "claims_tiny.yaml"), "--runs", str(tmp_path / "runs.csv"), "--out",
                             str(tmp_path / "two"), "--no-figures")
    assert code == 0, err
    assert (f"runs trained on different machines ({a}: 8; {b}: 16): a seed gives the same weights, data and batch "
            "order on each") in out
    back = list(csv.DictReader(io.StringIO((tmp_path / "two" / "runs.csv").read_text())))
    assert [r["machine"] for r in back] == [r["machine"] for r in rows]
    for row in rows:
        row["machine"] = a if row["seed"] != "0" else ""  # one machine, and runs that did not record theirs
    _write_rows(tmp_path / "one.csv", header, rows)
    code, out, err = _report("--study", str(root / "claims_tiny.yaml"), "--runs", str(tmp_path / "one.csv"), "--out",
                             str(tmp_path / "one"), "--no-figures")
    assert code == 0, err
    assert "different machines" not in out
    assert "different machines" not in _report("--study", str(root / "claims_tiny.yaml"), "--runs",
                                               str(root / "storage" / "runs.csv"), "--out", str(tmp_path / "none"),
                                               "--no-figures")[1]


def test_main_table_uses_report_phase_metric_and_lr(reports):
    root, _, _ = reports
    main = (root / "storage" / "main.md").read_text()
    assert "test_acc (the test split's accuracy at the final epoch" in main
    line = next(ln for ln in main.splitlines() if ln.startswith("| layerscale"))
    assert "| 0.004 |" in line and "(n=6)" in line  # the chosen LR; 6 report seeds, the tuning runs are not in it
    mean = np.mean(ACC["layerscale"])
    assert f"{100 * mean:.2f}" in line
    text = (root / "storage" / "tuning.csv").read_text()
    assert text.splitlines()[0] == ("variant,depth,lr,added,n,mean,std,n_diverged,n_failed_training,n_failed,seeds,"
                                    "chosen,margin,stability")
    tuning = list(csv.DictReader(io.StringIO(text)))
    chosen = [row for row in tuning if row["chosen"] == "1"]
    assert [(c["variant"], c["lr"]) for c in chosen] == [("standard", "0.002"), ("layerscale", "0.004"),
                                                          ("rezero", "0.001")]
    std = next(row for row in tuning if (row["variant"], row["lr"]) == ("standard", "0.002"))
    vals = [0.7 + 0.01 + 0.001 * s / 100 + 0.05 for s in TUNE_SEEDS]
    assert float(std["mean"]) == pytest.approx(np.mean(vals) + 0.01, abs=1e-6)  # best_val_acc = acc + 0.01
    assert std["n"] == "2" and std["seeds"] == "100 101"
    # the chosen rate's margin over the next-best: 0.002 has +0.05 over the grid's ramp, 0.004 is 0.01 up the ramp
    assert float(std["margin"]) == pytest.approx(0.05 - 0.01, abs=1e-6)
    assert float(std["stability"]) == 1.0 and all(not row["margin"] for row in tuning if row["chosen"] != "1")


def test_claim_verdicts_are_computed(reports):
    """held / not held / not resolved (all differences equal: no test) / untestable, decided by the bootstrap's Holm p
    (m = 4 lines with a test); the paired t-test's p is scipy's; the diverged rezero run counts at chance level 1/4
    in the pairs; the interval covers the mean difference and lies within the paired differences' range."""
    from scipy import stats

    root, _, _ = reports
    lines = [ln for ln in (root / "storage" / "claims.md").read_text().splitlines() if ln.startswith("- **")]
    assert len(lines) == 6
    verdicts = {ln.split("**")[1]: ln.rsplit("**", 2)[1] for ln in lines}
    assert verdicts == {"layerscale_better": "held", "rezero_better": "not resolved", "flat_better": "not resolved",
                        "auc_claim": "held", "layerscale_worse": "not held", "reattn_similarity": "untestable"}
    assert lines[5] == ("- **reattn_similarity**: Re-attention removes similar blocks (Zhou et al. 2021 (DeepViT)). "
                        "**untestable**: similarity ≈ 0 by construction on BatchNorm-normalised maps")
    assert "all 6 differences equal: Δ = +1.00 pp, no interval" in lines[2] and "no interval, no test" in lines[2]
    rows = {r["id"]: r for r in csv.DictReader(open(root / "storage" / "claims.csv", newline=""))}
    own = np.array(ACC["rezero"])
    own[3] = 0.25  # diverged: chance level of 4 classes
    d = own - np.array(STANDARD)
    assert float(rows["rezero_better"]["delta"]) == pytest.approx(d.mean(), abs=1e-6)
    assert float(rows["rezero_better"]["p_t"]) == pytest.approx(stats.ttest_rel(own, STANDARD).pvalue, rel=1e-5)
    assert float(rows["layerscale_better"]["p_t"]) == pytest.approx(
        stats.ttest_rel(ACC["layerscale"], STANDARD).pvalue, rel=1e-5)
    assert rows["rezero_better"]["n_chance_pairs"] == "1" and rows["layerscale_better"]["m"] == "4"
    assert float(rows["layerscale_better"]["p_holm"]) < 0.05 < float(rows["rezero_better"]["p_holm"])
    low, high = float(rows["rezero_better"]["ci_low"]), float(rows["rezero_better"]["ci_high"])
    t_half = stats.t.ppf(0.975, 5) * d.std(ddof=1) / math.sqrt(6)  # the seeds' t-interval: the bootstrap SE is close
    assert low < d.mean() < high and (high - low) / 2 == pytest.approx(t_half, rel=0.15)
    assert "1 pair with a run at chance level (diverged or failed to train)" in lines[1]
    assert lines[0].startswith(
        "- **layerscale_better**: LayerScale improves accuracy (Touvron et al. 2021 (CaiT), Table 1). Counts as held: "
        "Holm-significant paired difference in test_acc in the paper's direction. layerscale vs standard (synthetic, "
        "width 64, depth 2), test_acc (paper: higher, superior, margin 1.0 pp): Δ = +2.93 pp [")
    assert "rate-aware Holm p" in lines[0] and "(m = 4)" in lines[0] and lines[0].endswith(
        ": **held** (significant on the paper's side; old evidence: rate tuned on 2 seeds: the choice's uncertainty "
        "is not in the interval (re-tune on at least 3)).")


def test_claims_from_runs_csv_equal_the_storage_lines(reports):
    root, _, _ = reports
    assert (root / "storage" / "claims.md").read_text() == (root / "from_runs" / "claims.md").read_text()


# --- claims: the YAML format -------------------------------------------------------------------------------------
def _spec(claims: str):
    import yaml

    raw = yaml.safe_load(YAML.split("claims:")[0] + "claims:\n" + claims)
    return _build(raw, "default", "x.yaml")


def test_claims_parse_into_the_spec():
    spec = load_spec_from_text(YAML)
    assert [c.id for c in spec.claims] == ["layerscale_better", "rezero_better", "flat_better", "auc_claim",
                                          "layerscale_worse", "reattn_similarity"]
    c = spec.claims[0]
    assert (c.variant, c.baseline, c.depth, c.direction, c.metric, c.testable) == \
        ("layerscale", "standard", 2, "higher", None, True)
    assert spec.claims[3].metric == "val_acc_auc" and spec.claims[1].depth is None
    assert spec.claims[4].direction == "lower"
    assert not spec.claims[5].testable and spec.claims[5].reason.startswith("similarity")


def load_spec_from_text(text: str):
    import yaml

    return _build(yaml.safe_load(text), "default", "x.yaml")


@pytest.mark.parametrize(("claims", "message"), [
    ("  - {id: a, claim: c, source: s, variant: nope, baseline: standard, direction: higher}",
     "claim 'a': variant 'nope' is not a variant label of the study; valid labels: standard, layerscale, rezero, flat"),
    ("  - {id: a, claim: c, source: s, variant: rezero, baseline: standard, direction: up}",
     "claim 'a': direction 'up' is not valid; valid choices: higher, lower"),
    ("  - {id: a, claim: c, source: s, variant: rezero, baseline: standard, direction: higher, color: red}",
     "claims[0]: unknown key 'color'; valid keys: id, claim, source, variant, baseline, depth, baseline_depth, "
     "direction, counts, metric, testable, reason"),
    ("  - {id: a, claim: c, source: s, variant: rezero, baseline: standard, direction: higher, baseline_depth: x}",
     "claim 'a': baseline_depth must be a positive integer (or left out: the variant's depth), got 'x'"),
    ("  - {id: a, claim: c, source: s, testable: false}",
     "claim 'a': an untestable claim ('testable: false') needs a 'reason'"),
    ("  - {id: a, claim: c, source: s, variant: rezero, baseline: standard, direction: higher, metric: loss}",
     "claim 'a': metric 'loss' is not valid; valid choices: best_val_acc, final_val_acc, test_acc, "
     "test_acc_at_best_val, val_acc_auc"),
    ("  - {id: a, claim: c, source: s, variant: rezero, baseline: standard, direction: higher, depth: 0}",
     "claim 'a': depth must be a positive integer (or left out: every depth), got '0'"),
    ("  - {id: a, claim: c, variant: rezero, baseline: standard, direction: higher}",
     "claims[0]: 'source' must be a non-empty string"),
    ("  - {id: a, claim: c, source: s, testable: false, reason: r}\n  - {id: a, claim: d, source: s, testable: false,"
     " reason: r}", "claim ids must be unique, got a, a"),
    ("  {id: a}", "'claims' must be a list of mappings"),
])
def test_bad_claims_are_one_line_errors(claims, message):
    with pytest.raises(ValueError) as info:
        _spec(claims)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unknown_claim_variant_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(YAML.replace("variant: layerscale, baseline: standard,\n     depth: 2",
                                "variant: layerscal, baseline: standard,\n     depth: 2"))
    proc = _report_process("--study", bad, "--runs", tmp_path / "runs.csv")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "variant 'layerscal' is not a variant label" in proc.stderr


@pytest.mark.parametrize(("content", "message"), [
    (None, "does not exist"),
    ("number,run_name\n0,x\n", "lacks column(s) state, variant, depth, seed, acc, diverged; a runs.csv written"),
    ("", "lacks column(s) number"),
])
def test_missing_or_malformed_runs_csv_exits_2_with_one_line(tmp_path, content, message):
    path = tmp_path / "runs.csv"
    if content is not None:
        path.write_text(content)
    proc = _report_process("--study", "residual_variants", "--runs", path, "--out", tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr and not (tmp_path / "out").exists()


def test_bad_cell_in_runs_csv_names_line_and_column(reports, tmp_path):
    root, _, _ = reports
    text = (root / "storage" / "runs.csv").read_text().splitlines()
    cells = text[3].split(",")
    cells[6] = "deep"  # depth
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([*text[:3], ",".join(cells), *text[4:]]) + "\n")
    code, _, err = _report("--study", str(root / "claims_tiny.yaml"), "--runs", str(path), "--out", str(tmp_path))
    assert code == 2 and err == f"error: runs file '{path}' line 4: column 'depth' must be an integer, got 'deep'\n"


# --- statistics fixes against scipy on hand-made data ------------------------------------------------------------
def _data(values: dict, diverged: set = frozenset(), config: dict | None = None) -> report.StudyData:
    runs, number = [], 0
    for (variant, depth), accs in values.items():
        for seed, acc in enumerate(accs):
            runs.append(report.Run(number=number, state="complete", variant=variant, depth=depth, seed=seed,
                                   row=variant, acc=acc, diverged=(variant, seed) in diverged,
                                   config=dict(config or {})))
            number += 1
    rows = list(dict.fromkeys(v for v, _ in values))
    return report.StudyData(name="hand", kind="grid", runs=runs, rows=rows, row_variant={r: r for r in rows},
                            row_extras={r: () for r in rows}, depths=sorted({d for _, d in values}))


def test_zero_variance_differences_have_no_interval_and_are_never_significant():
    """depth_scaling's ReZero at depth 24: three differences of exactly −40/360 were printed as [−11.11, −11.11]*."""
    base = [0.90, 0.85, 0.88]
    data = _data({("standard", 24): base, ("rezero", 24): [b - 40 / 360 for b in base],
                  ("layerscale", 24): [0.91, 0.86, 0.90]})
    cells = {c.row: c for c in report.main_cells(data)}
    c = cells["rezero"]
    assert c.comparison.all_equal and c.comparison.ci_low is None and c.comparison.p_t is None
    assert c.comparison.p_wilcoxon is None and c.mde is None and not c.significant and c.p_t_holm is None
    assert report.family_size(list(cells.values())) == 1  # only layerscale has a test
    main = report.main_table(data, list(cells.values())).markdown()
    assert "all 3 differences equal: Δ = −11.11 pp, no interval" in main
    assert "1 comparison with all paired differences equal (s_d = 0) has no interval" in main
    paired = report.paired_table(data, list(cells.values()))
    row = next(r for r in csv.DictReader(io.StringIO(paired.to_csv())) if r["variant"] == "rezero")
    assert row["ci_low"] == row["ci_high"] == "" and row["significant"] == ""


def test_one_holm_family_for_both_tests_and_wilcoxon_n_too_small():
    from scipy import stats

    base = [0.50, 0.52, 0.51, 0.55, 0.48, 0.53, 0.50]
    values = {("standard", 2): base, ("a", 2): [0.56, 0.55, 0.58, 0.57, 0.53, 0.60, 0.57],
              ("b", 2): [0.49, 0.55, 0.60, 0.50, 0.47, 0.52, 0.55], ("c", 2): [0.52, 0.50, 0.50, 0.58, 0.50]}
    cells = {c.row: c for c in report.main_cells(_data(values))}
    rows = ("a", "b", "c")
    p_t = [stats.ttest_rel(values[r, 2], base[:len(values[r, 2])]).pvalue for r in rows]
    p_w = [stats.wilcoxon(np.subtract(values[r, 2], base[:len(values[r, 2])])).pvalue for r in rows]
    for r, pt, pw in zip(rows, report.holm(p_t), report.holm(p_w), strict=True):
        assert cells[r].p_t_holm == pytest.approx(pt) and cells[r].p_wilcoxon_holm == pytest.approx(pw)
    assert cells["c"].comparison.n == 5 and cells["c"].comparison.wilcoxon_too_small
    assert cells["c"].comparison.wilcoxon_min_p == pytest.approx(2 / 2 ** 5)  # 0.0625 > 0.05: can never reject
    assert not cells["a"].comparison.wilcoxon_too_small  # n = 7: 2/128 < 0.05
    table = report.paired_table(_data(values), list(cells.values()))
    md = table.markdown()
    c_line = next(ln for ln in md.splitlines() if ln.startswith("| c "))
    assert c_line.count("n too small") == 2
    assert "Holm–Bonferroni over the m = 3 comparisons" in md and "over the same m = 3 comparisons" in md
    assert "95% CI, unadjusted" in md


def test_mde_from_the_noncentral_t():
    """The MDE δ solves power(δ) = 0.8 for the two-sided paired t-test; G*Power's reference: a paired t-test with
    n = 10, α = 0.05 has power 0.80 at d_z ≈ 0.996 (power 0.8031 at d_z = 1)."""
    from scipy import stats

    assert t_power(1.0, 1.0, 10, 0.05) == pytest.approx(0.8031, abs=1e-4)
    assert report.mde(1.0, 10, 0.05) == pytest.approx(0.996, abs=5e-4)
    sd, n, alpha = 0.02, 4, 0.025
    delta = report.mde(sd, n, alpha)
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = delta * math.sqrt(n) / sd
    assert stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc) == pytest.approx(0.8, abs=1e-9)
    central = (crit + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
    assert delta > central * 1.04  # the central-t formula understates it
    assert report.mde(sd, 1, alpha) is None and report.mde(0.0, 5, alpha) is None


def test_diverged_run_counts_at_chance_level_in_the_pairs():
    from scipy import stats

    base = [0.80, 0.82, 0.81, 0.79]
    own = [0.85, 0.86, None, 0.84]
    data = _data({("standard", 4): base, ("highway", 4): own}, diverged={("highway", 2)},
                 config={"dataset_options": {"num_classes": 4}})
    cells = {c.row: c for c in report.main_cells(data)}
    c = cells["highway"]
    filled = [0.85, 0.86, 0.25, 0.84]
    assert c.pair_seeds == [0, 1, 2, 3] and c.n_diverged_pairs == 1 and c.n == 3  # mean/sd over ok runs only
    assert c.comparison.delta == pytest.approx(np.mean(np.subtract(filled, base)))
    assert c.comparison.p_t == pytest.approx(stats.ttest_rel(filled, base).pvalue)
    text = report.paired_table(data, list(cells.values())).markdown()
    assert "1 pair counted that way" in text
    assert chance_level(data.runs[0]) == 0.25
    assert chance_level(report.Run(number=0, state="complete", variant="x", depth=1, seed=0, row="x")) == 0.1


def test_claims_table_without_runs_is_not_resolved():
    spec = load_spec_from_text(YAML)
    data = _data({("standard", 2): [0.5, 0.6], ("layerscale", 2): [0.6]})
    records, _ = claims_mod.claim_records(data, spec.claims[:1], spec=spec)
    assert records[0]["verdict"] == "not resolved" and records[0]["detail"] == "1 pair: no test"


def test_a_claim_against_a_control_of_another_depth_pairs_across_depths():
    """``baseline_depth``: the variant at its depth against the baseline at the control's depth, paired by seed
    (class_attention's depth-8 parameter-matched control); without it a row is compared only at the depths it ran."""
    spec = load_spec_from_text(YAML.replace("direction: higher", "direction: higher, baseline_depth: 4", 1))
    assert spec.claims[0].baseline_depth == 4
    own, base = [0.70, 0.72, 0.71], [0.60, 0.63, 0.60]
    data = _data({("layerscale", 2): own, ("standard", 4): base, ("standard", 2): [0.5, 0.5, 0.5]})
    records, _ = claims_mod.claim_records(data, spec.claims[:1], spec=spec)
    assert [(r["depth"], r["baseline_depth"], r["n_pairs"]) for r in records] == [(2, 4, 3)]  # not at depth 4
    assert records[0]["delta"] == pytest.approx(np.mean(np.subtract(own, base)))
    assert records[0]["p_t"] == pytest.approx(scipy.stats.ttest_rel(own, base).pvalue)
    assert "layerscale vs standard (synthetic, width 64, depth 2 vs depth 4)," in claims_mod.line_text(records[0])


def test_a_row_against_itself_at_another_depth_is_a_claim_of_its_own():
    """"Pre-LN's accuracy falls with depth": a row at one depth against the same row at another, paired by seed,
    each depth at its own rate; the same row at one depth (or with no depth named) is a one-line error."""
    claim = ("  - {id: falls, claim: c, source: s, variant: standard, baseline: standard, depth: 4, "
             "baseline_depth: 2, direction: lower}")
    spec = _spec(claim)
    deep, shallow = [0.61, 0.64, 0.60], [0.70, 0.72, 0.71]
    data = _data({("standard", 4): deep, ("standard", 2): shallow})
    records, _ = claims_mod.claim_records(data, spec.claims, spec=spec)
    assert [(r["variant"], r["baseline"], r["depth"], r["baseline_depth"], r["n_pairs"]) for r in records] == \
        [("standard", "standard", 4, 2, 3)]
    assert records[0]["delta"] == pytest.approx(np.mean(np.subtract(deep, shallow)))  # -0.0933: lower, as claimed
    assert records[0]["p_t"] == pytest.approx(scipy.stats.ttest_rel(deep, shallow).pvalue)
    for bad in (claim.replace("baseline_depth: 2", "baseline_depth: 4"), claim.replace("depth: 4, ", "")):
        with pytest.raises(ValueError, match="variant and baseline are both 'standard': a row against itself needs"):
            _spec(bad)


def test_value_round_trip():
    for v in (0.1, 1e-05, 3, True, False, None, "rw", 0.30000000000000004):
        assert runs_mod.value(runs_mod.text(v)) == v and type(runs_mod.value(runs_mod.text(v))) is type(v)
    assert runs_mod.text(np.float64(0.25)) == "0.25"


def test_tune_phase_trials_are_set_apart_and_a_diverged_tuning_run_counts_zero():
    """Tune-phase trials (the '<study>-tune' stage, or a 'phase: tune' attribute) never enter main/paired; the
    tuning table averages the tuning metric with a diverged run as 0, the stage's choice rule."""
    from ablations.report.load import assemble
    from ablations.report.tuning import edge_note, grid_edge, tuning_records

    spec = load_spec_from_text(YAML)

    def run(number, variant, seed, acc, lr, phase, diverged=False):
        return report.Run(number=number, state="complete", variant=variant, depth=2, seed=seed, row="", acc=acc,
                          diverged=diverged, phase=phase, config={"lr": lr},
                          summary={"best_val_acc": acc, "diverged": diverged})

    runs = [run(0, "standard", 100, 0.6, 0.001, "tune"), run(1, "standard", 101, None, 0.001, "tune", True),
            run(2, "standard", 100, 0.5, 0.002, "tune"), run(3, "standard", 101, 0.5, 0.002, "tune"),
            run(0, "standard", 0, 0.8, 0.002, "report"), run(1, "standard", 1, 0.7, 0.002, "report")]
    data = assemble("t", spec, runs)
    assert [r.seed for r in data.runs] == [0, 1] and [r.seed for r in data.tune_runs] == [100, 100, 101, 101]
    records = tuning_records(data)
    assert [(r["lr"], r["mean"], r["n_diverged"], r["chosen"]) for r in records] == \
        [(0.001, pytest.approx(0.3), 1, False), (0.002, pytest.approx(0.5), 0, True)]
    # 0.002 is the grid's largest LR: the caption warns that the row's best LR may lie beyond it
    assert grid_edge(records) == [("standard", 2, 0.002)]
    assert "At the edge of the tuning grid: standard (depth 2) at 0.002" in edge_note(records)
    # with declared bounds: at a bound is named as such; an edge inside the bounds says the runs did not extend there
    assert "At a bound of the tuning grid (0.0005–0.002" in edge_note(records, (0.0005, 0.002))
    assert "did not extend the grid): standard (depth 2) at 0.002" in edge_note(records, (0.0005, 0.032))
    assert "At a bound" not in edge_note(records, (0.0005, 0.032))
    inside = [r | {"lr": lr} for r, lr in zip(records + records[:1], (0.001, 0.002, 0.004), strict=True)]
    inside[2]["chosen"] = False
    assert grid_edge(inside) == [] and edge_note(inside) == ""
    cells = report.main_cells(data)
    assert next(c for c in cells if c.row == "standard").n == 2  # the tuning runs are not in the main table


def test_a_depth_whose_reported_runs_are_not_in_yet_has_no_chosen_rate():
    """A row tuned at every depth takes each depth's chosen rate from its reported runs at that depth: while a
    running study has reported depth 2 only, none of depth 4's rates is marked chosen (depth 2's rate is not depth
    4's choice); a row tuned at one depth, its rate used at every depth, takes it from its reported runs anywhere."""
    from ablations.report.load import assemble
    from ablations.report.tuning import tuning_records

    spec = load_spec_from_text(YAML)

    def run(number, depth, seed, acc, lr, phase):
        return report.Run(number=number, state="complete", variant="standard", depth=depth, seed=seed, row="",
                          acc=acc, diverged=False, phase=phase, config={"lr": lr},
                          summary={"best_val_acc": acc, "diverged": False})

    tune = [run(i, depth, 100, acc, lr, "tune")
            for i, (depth, lr, acc) in enumerate([(2, 0.001, 0.5), (2, 0.002, 0.6), (4, 0.001, 0.7), (4, 0.002, 0.4)])]
    running = assemble("t", spec, [*tune, run(0, 2, 0, 0.8, 0.002, "report")])
    assert {(r["depth"], r["lr"]): r["chosen"] for r in tuning_records(running)} == {
        (2, 0.001): False, (2, 0.002): True, (4, 0.001): False, (4, 0.002): False}
    once = assemble("t", spec, [*tune[:2], run(0, 4, 0, 0.8, 0.002, "report")])
    assert {(r["depth"], r["lr"]): r["chosen"] for r in tuning_records(once)} == {(2, 0.001): False, (2, 0.002): True}


def test_every_study_file_lists_claims_that_load_under_every_budget():
    from ablations.studies.spec import BUDGETS, available_studies

    for name in available_studies():
        specs = [load_spec(name)]
        for budget in BUDGETS:  # every budget the file defines
            with contextlib.suppress(ValueError):
                specs.append(load_spec(name, budget))
        assert len(specs) >= 3, name  # default twice, smoke and paper at least
        labels = {v.label for v in specs[0].variants}
        for claim in specs[0].claims:
            assert not claim.testable or {claim.variant, claim.baseline} <= labels
        if specs[0].kind == "grid":
            assert specs[0].claims, name
    untestable = [c for c in load_spec("attention_collapse").claims if not c.testable]
    assert [c.id for c in untestable] == ["reattention_similar_blocks"] and "BatchNorm" in untestable[0].reason


EARLIER = Path(__file__).parent / "data" / "earlier_format"  # modern_residuals' pilot report, before its re-run


def test_an_earlier_runs_csv_gives_its_committed_differences(tmp_path):
    """A runs.csv of the format before the fair protocol (no phase, LR or summary columns; the pilot
    ``modern_residuals`` report's, kept as test data when the re-run replaced it) still loads: the paired Δ, CI and
    raw t p recomputed from it equal that report's paired.csv (no run diverged there); the new statistics change only
    the MDE (noncentral t, larger) and the Wilcoxon columns (n ≤ 5: 'n too small'). Without curves in the file, no
    validation-curve figure is drawn (an empty one would replace a report folder's earlier figure)."""
    code, out, err = _report("--study", "modern_residuals", "--runs", str(EARLIER / "modern_residuals_runs.csv"),
                             "--out", str(tmp_path))
    assert code == 0, err
    assert "convergence: no run has the summary metrics" in out
    assert "figure val_curves skipped: no run has a validation curve" in out  # not an empty figure over a good one
    assert not (tmp_path / "val_curves.png").exists() and (tmp_path / "acc_vs_depth.png").is_file()
    old = {(r["variant"], r["depth"]): r for r in csv.DictReader(open(EARLIER / "modern_residuals_paired.csv"))}
    new = {(r["variant"], r["depth"]): r for r in csv.DictReader(open(tmp_path / "paired.csv"))}
    # the study files' later rows (parameter-matched controls) have no runs in these files: no pairs, no test
    added = {key: row for key, row in new.items() if key not in old}
    assert set(old) <= set(new) and all("params_matched" in variant for variant, _ in added)
    assert all(row["n_pairs"] in ("", "0") and row["p_ttest_rel"] == "" for row in added.values()), added
    for key, row in new.items():
        if key in added:
            continue
        for col in ("n_pairs", "delta", "ci_low", "ci_high", "p_ttest_rel", "pair_seeds"):
            assert row[col] == old[key][col], (key, col)
        assert row["n_diverged_pairs"] == "0" and row["wilcoxon_n_too_small"] == "1"  # 3 or 5 seeds
        assert float(row["mde"]) > float(old[key]["mde"])  # the central-t formula understated it
    assert "n too small" in (tmp_path / "paired.md").read_text()


def test_extra_grid_axes_round_trip_through_runs_csv(tmp_path):
    """Rows labelled by an extra axis (floats, strings) come back from runs.csv as the same rows and
    the same tables."""
    from ablations.report.load import assemble
    from ablations.report.tables import main_table, paired_table

    text = YAML.replace("axes: {depth: [2], seed: [0, 1, 2, 3, 4, 5]}",
                        "axes: {depth: [2], seed: [0, 1, 2], drop_path_rate: [0.0, 0.1], global_pool: [token, avg]}")
    spec = load_spec_from_text(text)
    runs, number = [], 0
    for variant in ("standard", "layerscale"):
        for dpr in (0.0, 0.1):
            for bias in ("token", "avg"):
                for seed in (0, 1, 2):
                    acc = 0.8 + 0.01 * seed + (0.02 if variant == "layerscale" else 0.0) + 0.003 * seed * dpr
                    runs.append(report.Run(number=number, state="complete", variant=variant, depth=2, seed=seed,
                                           row="", extras=(("drop_path_rate", dpr), ("global_pool", bias)), acc=acc,
                                           config={"lr": 0.002}, summary={"diverged": False}))
                    number += 1
    data = assemble("x", spec, runs)
    path = runs_mod.write(data, tmp_path / "runs.csv")
    back = runs_mod.read(path, spec, "x")
    assert back.rows == data.rows and "layerscale [drop_path_rate=0.1, global_pool=avg]" in back.rows
    for build in (main_table, paired_table):
        assert build(back, report.main_cells(back)).markdown() == build(data, report.main_cells(data)).markdown()
    assert runs_mod.to_csv(back) == path.read_text()


def test_the_docs_quote_claim_verdicts_verbatim():
    """Any line of the README or of docs/ that quotes a claim of a committed results/<study>/claims.md is that
    file's line, verbatim (the verdicts are computed; a hand edit of a quoted verdict fails here)."""
    files = {str(p): p.read_text() for p in [*committed("results/*/claims.md"),
                                            REPO / "results" / "claims.md"]}
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        assert claims_mod.misquoted(doc.read_text(), files) == [], doc
    line = ("- **dca_accuracy**: DCA improves accuracy (x). dca vs standard, test_acc (paper: higher): Δ = +1.00 pp "
            "[+0.10, +1.90] (95% CI, unadjusted), n = 10 pairs, Holm p = 0.030 (m = 6), MDE 0.90 pp: **held** "
            "(significant in the paper's direction).")
    made = {"claims.md": f"### x\n\n{line}\n"}
    assert claims_mod.misquoted(f"intro\n{line}\n", made) == []
    edited = line.replace("**held**", "**held, strongly**")
    assert claims_mod.misquoted(f"intro\n{edited}\n- **other**: text\n", made) == [edited]


def test_the_studies_page_quotes_every_verdict_of_the_headline_and_links_every_claims_file():
    """docs/studies.md's findings are the computed verdicts: every verdict line of
    results/residual_variants/claims.md appears in it verbatim, and every committed claims.md is linked."""
    studies = (REPO / "docs" / "studies.md").read_text()
    headline = REPO / "results" / "residual_variants" / "claims.md"
    verdicts = [line for line in headline.read_text().splitlines() if line.startswith("- **")]
    assert verdicts and [line for line in verdicts if line not in studies.splitlines()] == []
    for path in committed("results/*/claims.md"):
        assert f"(../results/{path.parent.name}/claims.md)" in studies, path


def test_a_first_look_budget_labels_every_table_and_the_default_none(reports, tmp_path):
    """``--budget quick`` (or smoke): every table's title and caption says it is a first look, not evidence, also
    while the study is in its tuning stage; the default budget's tables (the ``reports`` fixture) say nothing of
    the kind; a budget the study file does not define is refused, not run at the default's settings."""
    root, printed, _ = reports
    spec = str(root / "claims_tiny.yaml")
    runs = root / "storage" / "runs.csv"
    code, out, err = _report("--study", spec, "--budget", "quick", "--runs", str(runs), "--out", str(tmp_path / "q"))
    assert code == 0, err
    label = ("Budget 'quick' is a first look, underpowered by design: its numbers and verdicts are not evidence (the "
             "default budget is the study's evidence)")
    assert f"note: {label}" in out
    for name in REGENERATED:
        text = (tmp_path / "q" / f"{name}.md").read_text()
        assert text.splitlines()[0].endswith("(first look: budget quick, underpowered)"), (name, text.splitlines()[0])
        assert f"{label}. " in text, name
        assert "first look" in (tmp_path / "q" / f"{name}.tex").read_text(), name
        assert "first look" not in (root / "storage" / f"{name}.md").read_text(), name
    assert "first look" not in printed
    # in the tuning stage: runs.csv and the tuning table only, labelled as well
    lines = runs.read_text().splitlines()
    phase = lines[0].split(",").index("phase")
    (tmp_path / "tune.csv").write_text("\n".join([lines[0], *(x for x in lines[1:] if x.split(",")[phase] == "tune")])
                                       + "\n")
    code, out, err = _report("--study", spec, "--budget", "quick", "--runs", str(tmp_path / "tune.csv"), "--out",
                             str(tmp_path / "t"))
    assert code == 0 and "wrote runs.csv and the tuning table only" in out, err
    assert (tmp_path / "t" / "tuning.md").read_text().splitlines()[0].endswith("(first look: budget quick, underpowered)")
    assert load_spec("residual_variants", "smoke").first_look() and load_spec("residual_variants", "quick").first_look()
    assert load_spec("residual_variants").first_look() is None and load_spec("residual_variants", "paper").first_look() is None
    (tmp_path / "no_quick.yaml").write_text("name: no_quick\nkind: grid\nbudgets: {smoke: {axes: {seed: [0]}}}\n"
                                            "variants: [{label: standard, residual: standard}]\n")
    with pytest.raises(ValueError, match="defines no 'quick' budget; valid choices: smoke, default"):
        load_spec(str(tmp_path / "no_quick.yaml"), "quick")  # never the default's settings under the quick budget's name


def test_every_committed_latex_table_is_ascii():
    """pdflatex without inputenc tricks rejects a raw χ or ⋯: the formatter maps every symbol a caption uses."""
    bad = {path.relative_to(REPO).as_posix(): sorted({ch for ch in path.read_text() if ord(ch) > 127})
           for path in committed("results/**/*.tex")}
    assert bad and {k: v for k, v in bad.items() if v} == {}


def test_a_rendered_cell_s_percent_sign_is_escaped_in_latex_and_no_committed_table_has_a_bare_one():
    """A cell a column renders itself ("70%", a stability) keeps its % in Markdown and escapes it in LaTeX, where a
    bare % comments out the rest of the row (its ``\\\\`` too); an already escaped one stays as it is."""
    import re

    import pandas as pd

    from ablations.report.format import Column, Table

    recs = [{"variant": "a", "share": 0.7}]
    table = Table("t", "t", "caption", pd.DataFrame(recs, dtype=object),
                  [Column("variant", "variant"),
                   Column("share", "share", render=lambda rec, style: f"{100 * rec['share']:.0f}%"),
                   Column("done", "done", render=lambda rec, style: r"7\%" if style == "tex" else "7%")],
                  [("variant", "variant", ""), ("share", "share", "")])
    assert "70%" in table.markdown() and "70\\%" not in table.markdown()
    assert r"a & 70\% & 7\% \\" in table.latex("tab:t")
    bare = re.compile(r"(?<!\\)%")
    rows = {path.relative_to(REPO).as_posix(): [line for line in path.read_text().splitlines()
                                                if line.endswith(r"\\") and bare.search(line)]
            for path in committed("results/**/*.tex")}
    assert rows and {k: v for k, v in rows.items() if v} == {}


def test_a_stacked_trial_costs_its_share_of_the_stack():
    """``own_seconds``: a trial's wall time, divided among the K trials the engine trained in one stack (what pricing,
    worker-hours and the power table's cost add up); None where no positive, finite wall time is recorded."""
    from ablations.report.load import own_seconds

    assert own_seconds({"wall_time_s": 400.0, "stack_size": 4}) == 100.0
    assert own_seconds({"wall_time_s": 400.0}) == 400.0 == own_seconds({"wall_time_s": 400, "stack_size": 1})
    assert own_seconds({"wall_time_s": 400.0, "stack_size": 0}) == 400.0  # not a stack: the run's own time
    for bad in (0.0, -1.0, float("nan"), True, None, "400"):
        assert own_seconds({"wall_time_s": bad, "stack_size": 4}) is None


def test_the_convergence_table_counts_a_stacked_runs_share_of_the_stacks_time_and_a_paused_run_moves_no_median():
    """The convergence table's s/epoch and wall-time columns: a run trained in a stack of K counts 1/K of the
    stack's times (as pricing does), a plain run its own; they are medians over the runs, so one run whose worker
    was paused mid-training (its wall clock counting the pause) does not set its row's cost; the epochs-to and AUC
    columns are the runs' means."""
    from ablations.report.load import assemble
    from ablations.report.tables import convergence_table

    spec = load_spec_from_text(YAML)

    def run(number, variant, seed, stack, wall, epoch):
        summary = {"best_val_acc": 0.8, "wall_time_s": wall, "time_per_epoch_s": epoch, "val_acc_auc": 0.5,
                   "epochs_to_90pct_of_best": 3}
        return report.Run(number=number, state="complete", variant=variant, depth=2, seed=seed, row="", acc=0.8,
                          diverged=False, config={}, summary=summary | ({"stack_size": stack} if stack else {}))

    runs = [run(0, "standard", 0, None, 100.0, 10.0), run(1, "standard", 1, None, 120.0, 12.0),
            run(4, "standard", 2, None, 2000.0, 200.0),  # paused for half an hour mid-training: its mean would be 740
            run(2, "rezero", 0, 4, 400.0, 40.0), run(3, "rezero", 1, 4, 480.0, 48.0)]
    table = convergence_table(assemble("t", spec, runs))
    frame = table.frame.set_index("variant")
    assert frame.loc["standard", "wall_time_s"] == pytest.approx(120.0)
    assert frame.loc["standard", "time_per_epoch_s"] == pytest.approx(12.0)
    assert "medians of the wall time per epoch" in table.caption
    assert frame.loc["rezero", "wall_time_s"] == pytest.approx(110.0)  # (400 / 4 + 480 / 4) / 2
    assert frame.loc["rezero", "time_per_epoch_s"] == pytest.approx(11.0)
    assert frame.loc["rezero", "val_acc_auc"] == pytest.approx(0.5)
    assert frame.loc["rezero", "epochs_to_90pct_of_best"] == pytest.approx(3.0)


def test_a_report_run_elsewhere_finds_each_trials_nested_run_folder_under_its_results_dir(tmp_path, monkeypatch):
    """A trial stores its TensorBoard folder as its run saw it (relative, nested by variant/depth/seed/rate); a
    report run from another directory with --results-dir must find it there, not only a flat name below runs/."""
    import optuna

    from ablations.report.load import collect

    spec = load_spec("residual_variants", "smoke")
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(study_name="residual_variants-smoke", storage=storage, direction="maximize")
    stored = {"standard": "results/runs/residual_variants-smoke-tune/standard/depth=1/seed=0/lr=0.001",
              "rezero": "results/runs/residual_variants-smoke/rezero/depth=1/seed=0",
              "layerscale": "results/runs/residual_variants-smoke/layerscale-depth=1-seed=0",  # a flat, older name
              "skipinit": "results/runs/residual_variants-smoke/skipinit/depth=1/seed=9"}  # no such folder
    for number, (variant, log_dir) in enumerate(stored.items()):
        study.add_trial(optuna.trial.create_trial(
            params={"variant": variant, "depth": 1, "seed": 0},
            distributions={"variant": optuna.distributions.CategoricalDistribution(list(stored)),
                           "depth": optuna.distributions.IntDistribution(1, 1),
                           "seed": optuna.distributions.IntDistribution(0, 9)},
            value=0.5 + number / 10, user_attrs={"log_dir": log_dir, "best_val_acc": 0.5 + number / 10}))
    elsewhere = tmp_path / "worktree" / "results"
    for log_dir in list(stored.values())[:3]:
        (elsewhere.parent / log_dir).mkdir(parents=True)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")  # the stored relative paths do not exist from here

    found = {r.variant: r.log_dir for r in collect(study, spec, results_dir=elsewhere).runs}
    assert found["standard"] == elsewhere / "runs/residual_variants-smoke-tune/standard/depth=1/seed=0/lr=0.001"
    assert found["rezero"] == elsewhere / "runs/residual_variants-smoke/rezero/depth=1/seed=0"
    assert found["layerscale"] == elsewhere / "runs/residual_variants-smoke/layerscale-depth=1-seed=0"
    assert found["skipinit"] is None
    assert {r.variant: r.log_dir for r in collect(study, spec).runs} == dict.fromkeys(stored)  # no results_dir
