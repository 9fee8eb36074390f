"""``python -m ablations.report``: tables and figures from a real (tiny) study's storage and event files.

The module builds one tiny grid study with the real CLI (2 variants × 2 depths × 2 seeds, 2 epochs, synthetic
data, diagnostics every epoch) and reports it twice; the numbers in the tables are recomputed here from the storage
with numpy/scipy. Error paths and the table logic on hand-made data run without training.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import EXAMPLE_SEARCH
from pg import free_port
from polling import HANG_LIMIT_S, serving, study_experiment_loaded, wait_until_answers

from ablations import report

REPO = Path(__file__).resolve().parents[1]
STUDY = "report_tiny"
TINY_YAML = """\
name: report_tiny
description: tiny grid for tests/test_report.py
kind: grid
metric: best_val_acc
direction: maximize
base: {dataset: synthetic, dataset_options: {num_samples: 320, img_size: 8, in_chans: 1, num_classes: 4},
       patch_size: 4, embed_dim: 8, num_heads: 2, mlp_ratio: 1.0, max_epochs: 2, batch_size: 16, lr: 0.005,
       warmup_epochs: 0, diagnostics_every: 1, diagnostics_batch_size: 8}
variants:
  - {label: standard, residual: standard}
  - {label: layerscale, residual: layerscale, options: {init_value: 0.1}}
axes: {depth: [1, 2], seed: [0, 1]}
"""
TABLES = ("main", "paired", "convergence", "cost", "collapse")  # collapse: the trials logged diag/similar_blocks
FIGURES = ("acc_vs_depth", "val_curves", "branch_ratio", "attn_similarity", "attn_similarity_curves", "param_evolution",
           "similar_blocks_vs_depth")


def _run_report(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = report.main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    spec = root / f"{STUDY}.yaml"
    spec.write_text(TINY_YAML)
    storage = f"sqlite:///{root / 'o.db'}"
    results = root / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "ablations.run", "--study", str(spec), "--storage", storage, "--results-dir",
         str(results), "--no-progress", "--threads", "1", "--workers", "1"],
        cwd=root, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    base = ["--study", str(spec), "--storage", storage, "--results-dir", str(results)]
    started = time.perf_counter()
    first = _run_report(base)
    seconds = time.perf_counter() - started
    second = _run_report([*base, "--out", str(root / "again")])
    return SimpleNamespace(root=root, spec=spec, storage=storage, results=results, out=results / STUDY,
                           again=root / "again", first=first, second=second, seconds=seconds)


def _results_from_storage(storage: str) -> dict[tuple[str, int], list[tuple[int, float]]]:
    """(variant, depth) -> [(seed, best_val_acc)] of the completed, non-diverged result trials."""
    import optuna

    trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
    out: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for t in trials:
        if t.state != optuna.trial.TrialState.COMPLETE or "surplus" in t.user_attrs or "duplicate_of" in t.user_attrs:
            continue
        assert not t.user_attrs["diverged"]
        out.setdefault((t.params["variant"], t.params["depth"]), []).append(
            (t.params["seed"], t.user_attrs["best_val_acc"]))
    return out


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _md_cells(path: Path) -> dict[tuple[str, str], str]:
    return _md_cells_from_text(path.read_text())


def _md_cells_from_text(text: str) -> dict[tuple[str, str], str]:
    """{(first column, column header): cell} of the first Markdown table in a text."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = {}
    for ln in lines[2:]:
        values = [c.strip() for c in ln.strip("|").split("|")]
        for name, value in zip(header[1:], values[1:], strict=True):
            cells[values[0], name] = value
    return cells


# --- the real study -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_report_writes_every_file(study):
    code, out, err = study.first
    assert code == 0, err
    for name in TABLES:
        for ext in ("md", "tex", "csv"):
            path = study.out / f"{name}.{ext}"
            assert path.is_file() and path.stat().st_size > 0, path
            assert str(path) in out
    for name in FIGURES:
        for ext in ("png", "pdf"):
            path = study.out / f"{name}.{ext}"
            assert path.is_file() and path.stat().st_size > 1000, path
    tex = (study.out / "main.tex").read_text()
    assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex and "\\caption{" in tex
    assert "best\\_val\\_acc" in tex and "paired two-sided t-test" in tex and "Holm--Bonferroni" in tex
    assert "Welch" not in tex and "\\cmidrule" in tex
    assert "| variant" in out and "files written" in out  # main table printed
    collapse = {(r["variant"], int(r["depth"])): r for r in _csv_rows(study.out / "collapse.csv")}
    assert sorted(collapse) == [(v, d) for v in ("layerscale", "standard") for d in (1, 2)]
    for variant in ("standard", "layerscale"):
        assert collapse[variant, 1]["n"] == "0" and collapse[variant, 1]["similar_blocks_mean"] == ""  # no pair
        depth2 = collapse[variant, 2]
        assert depth2["n"] == "2" and depth2["epochs"] == "2" and 0.0 <= float(depth2["similar_blocks_mean"]) <= 1.0
    assert "K = 3" in (study.out / "collapse.md").read_text()
    assert "note: diagnostic figures use all seeds at depth 2, last logged epoch." in out.splitlines()
    tb = study.results / "runs" / STUDY / report.REPORT_RUN
    assert list(tb.glob("events.out.tfevents.*"))
    import optuna  # runs.csv: every result trial with its TensorBoard run name, as the trial's user attribute

    trials = {t.number: t for t in optuna.load_study(study_name=STUDY, storage=study.storage).trials}
    runs = _csv_rows(study.out / "runs.csv")
    assert len(runs) == len(trials) == 8
    for row in runs:
        params = trials[int(row["number"])].params
        assert row["run_name"] == trials[int(row["number"])].user_attrs["run_name"] \
            == f"{params['variant']}/depth={params['depth']}/seed={params['seed']}"
        assert (study.results / "runs" / STUDY / row["run_name"]).is_dir()
    print(f"\nreport of the tiny study: {study.seconds:.1f} s (first, in-process)")


@pytest.mark.slow
def test_the_diagnostics_note_counts_the_runs_whose_event_files_are_here(study, tmp_path):
    """A run whose event files are not here and whose trial carries no diagnostics cell (its folder removed)
    drops out of the diagnostic figures, and the note says how many runs they stand on instead of "all"."""
    gone = study.results / "runs" / STUDY / "layerscale" / "depth=2" / "seed=1"
    aside = tmp_path / "aside"
    gone.rename(aside)
    try:
        code, out, err = _run_report(["--study", str(study.spec), "--storage", study.storage, "--results-dir",
                                      str(study.results), "--out", str(tmp_path / "out"), "--no-tensorboard",
                                      "--no-note"])
    finally:
        aside.rename(gone)
    assert code == 0, err
    assert ("note: diagnostic figures use 3 of the 4 runs (all seeds) at depth 2, the ones whose event files or "
            "runs.csv rows hold diagnostics (the others ran with diagnostics_every 0, were imported from a runs.csv "
            "without them or had their folders removed), last logged epoch.") in out.splitlines(), out[-2000:]


@pytest.mark.slow
def test_main_table_matches_storage(study):
    expected = _results_from_storage(study.storage)
    assert sorted(expected) == [(v, d) for v in ("layerscale", "standard") for d in (1, 2)]
    rows = {(r["variant"], int(r["depth"])): r for r in _csv_rows(study.out / "main.csv")}
    cells = _md_cells(study.out / "main.md")
    for (variant, depth), pairs in expected.items():
        values = np.array([v for _, v in sorted(pairs)])
        mean, std = values.mean(), values.std(ddof=1)
        row = rows[variant, depth]
        assert int(row["n"]) == len(values) == 2
        assert float(row["mean_best_val_acc"]) == pytest.approx(mean, abs=1e-6)
        assert float(row["std_best_val_acc"]) == pytest.approx(std, abs=1e-6)
        cell = cells[variant, f"depth {depth}"]
        assert f"{100 * mean:.2f} ± {100 * std:.2f}" in cell and cell.endswith("(n=2)")
    for depth in (1, 2):
        top = max(np.mean([v for _, v in expected[v, depth]]) for v in ("standard", "layerscale"))
        for variant in ("standard", "layerscale"):
            is_best = math.isclose(np.mean([v for _, v in expected[variant, depth]]), top, abs_tol=1e-12)
            assert cells[variant, f"depth {depth}"].startswith("**") == is_best
            assert rows[variant, depth]["best_in_depth"] == str(int(is_best))
    # the convergence table's means come from the same trials
    conv = {(r["variant"], int(r["depth"])): r for r in _csv_rows(study.out / "convergence.csv")}
    import optuna

    trials = optuna.load_study(study_name=STUDY, storage=study.storage).trials
    for (variant, depth), row in conv.items():
        aucs = [t.user_attrs["val_acc_auc"] for t in trials
                if t.params["variant"] == variant and t.params["depth"] == depth]
        assert float(row["val_acc_auc"]) == pytest.approx(np.mean(aucs), abs=1e-6)


@pytest.mark.slow
def test_paired_table_matches_storage(study):
    """Δ, CI, both tests and their Holm adjustment recomputed from the storage with scipy, pairs by seed."""
    from scipy import stats

    expected = _results_from_storage(study.storage)
    paired = {(r["variant"], int(r["depth"])): r for r in _csv_rows(study.out / "paired.csv")}
    assert sorted(paired) == [("layerscale", 1), ("layerscale", 2)]  # the baseline is not compared with itself
    main = _md_cells(study.out / "main.md")
    raw_t, raw_w = {}, {}
    for depth in (1, 2):
        own, base = dict(expected["layerscale", depth]), dict(expected["standard", depth])
        seeds = sorted(set(own) & set(base))
        d = np.array([own[s] - base[s] for s in seeds])
        row = paired["layerscale", depth]
        assert int(row["n_pairs"]) == len(seeds) == 2 and row["pair_seeds"] == "0 1"
        assert float(row["delta"]) == pytest.approx(d.mean(), abs=1e-6)
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
        if d.std(ddof=1) > report.stats.ZERO_SD:
            assert float(row["ci_low"]) == pytest.approx(d.mean() - half, abs=1e-6)
            assert float(row["ci_high"]) == pytest.approx(d.mean() + half, abs=1e-6)
            raw_t[depth] = stats.ttest_rel([own[s] for s in seeds], [base[s] for s in seeds]).pvalue
            assert float(row["p_ttest_rel"]) == pytest.approx(raw_t[depth], rel=1e-5)
            raw_w[depth] = stats.wilcoxon(d).pvalue  # the same family as the t-test's
        else:  # all paired differences equal: no interval, no test (t = ±inf), never significant
            assert row["p_ttest_rel"] == row["p_wilcoxon"] == row["ci_low"] == row["significant"] == ""
        if depth in raw_w:
            assert float(row["p_wilcoxon"]) == pytest.approx(raw_w[depth], rel=1e-5)
        assert main["standard", f"Δ vs standard (pp) [95% CI, unadjusted], depth {depth}"] == "baseline"
    holm_t, holm_w = report.holm(list(raw_t.values())), report.holm(list(raw_w.values()))
    for depth, p in zip(raw_t, holm_t, strict=True):
        row = paired["layerscale", depth]
        assert float(row["p_ttest_rel_holm"]) == pytest.approx(p, rel=1e-5)
        assert row["significant"] == str(int(p < 0.05))
        assert main["layerscale", f"Δ vs standard (pp) [95% CI, unadjusted], depth {depth}"].endswith("*") == (p < 0.05)
    for depth, p in zip(raw_w, holm_w, strict=True):
        assert float(paired["layerscale", depth]["p_wilcoxon_holm"]) == pytest.approx(p, rel=1e-5)
    text = (study.out / "paired.md").read_text()
    assert f"m = {len(raw_t)} comparisons" in text and "power 0.8" in text and "2 seeds (0, 1)" in text


@pytest.mark.slow
def test_second_report_is_byte_identical(study):
    assert study.second[0] == 0, study.second[2]
    for name in TABLES:
        for ext in ("md", "tex", "csv"):
            assert (study.out / f"{name}.{ext}").read_bytes() == (study.again / f"{name}.{ext}").read_bytes(), name
    assert (study.out / "runs.csv").read_bytes() == (study.again / "runs.csv").read_bytes()
    for name in FIGURES:
        for ext in ("png", "pdf"):
            assert (study.out / f"{name}.{ext}").read_bytes() == (study.again / f"{name}.{ext}").read_bytes(), name
    assert b"CreationDate" not in (study.out / "acc_vs_depth.pdf").read_bytes()


@pytest.mark.slow
def test_dashboard_note_saved(study):
    import optuna

    s = optuna.load_study(study_name=STUDY, storage=study.storage)
    note = "".join(v for k, v in sorted(s._storage.get_study_system_attrs(s._study_id).items())
                   if k.startswith("dashboard:note_str:"))
    assert "top-1 val accuracy" in note and "| layerscale" in note
    # a grid's note opens on what the dashboard's best trial and importance are there, and where the verdict is
    assert note.index("the *best trial* is one seed of one row") < note.index("| layerscale")
    assert "seed among them" in note and "The seed-aggregated verdict is below" in note
    assert s.user_attrs["0_how_to_read"].startswith("a grid: 'Best Trial' is one seed of one row")  # its first page


def test_a_grid_study_s_note_says_its_best_trial_is_one_seed():
    from ablations.report.notes import GRID_CAVEAT, study_note

    grid = study_note("s", [], Path("nowhere/report.html"))
    search = study_note("s", [], Path("nowhere/report.html"), grid=False)
    assert grid.splitlines()[2] == GRID_CAVEAT and GRID_CAVEAT not in search
    assert "parameter importance" in GRID_CAVEAT and "not a test of any row against another" in GRID_CAVEAT
    from ablations.report.notes import READING_ATTR, reading_line

    line = reading_line(Path("r/report.html"))
    assert READING_ATTR < "budget" and "Note tab and the HTML report" in line and line.endswith("r/report.html")


def _finite_metrics(run: dict) -> bool:
    values = [m["value"] for m in run["metricValues"]]
    return bool(values) and all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


@pytest.mark.slow
def test_tensorboard_hparams_table_lists_every_trial(study):
    """The report's ``_report`` run sits next to the trials' runs: the HParams plugin must still list every
    trial as a run (an entry of its sessionGroups) with every ``hp/*`` metric filled."""
    import optuna

    from ablations.dashboard import display_tag
    from ablations.report.aggregate import AGG_METRICS, STUDY_METRICS
    from ablations.training import HP_METRICS

    logdir = study.results / "runs" / STUDY
    assert (logdir / report.REPORT_RUN).is_dir()  # written by the report before TensorBoard starts
    trials = optuna.load_study(study_name=STUDY, storage=study.storage).trials
    seeds = {t.user_attrs["run_name"] for t in trials}  # <variant>/depth=<d>/seed=<s>: the run names
    cells = {name.rsplit("/seed=", 1)[0] for name in seeds}
    aggregates = {f"agg/{cell}" for cell in cells}  # one aggregate row per variant and depth, beside the seeds
    expected = seeds | aggregates
    port = free_port()
    tensorboard = Path(sys.executable).with_name("tensorboard")
    body = {"experimentName": "", "startIndex": 0, "sliceSize": 1000,
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]}

    def rows_of(groups: dict) -> dict:  # the HParams table's rows by run name (the API's JSON field names)
        return {s["name"]: s for g in groups.get("sessionGroups", []) for s in g["sessions"]}

    def all_loaded(groups: dict) -> bool:  # TensorBoard loads event files lazily: every run and its final values
        rows = rows_of(groups)
        return set(rows) >= expected and all(_finite_metrics(r) for r in rows.values())

    with serving([tensorboard, "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false",
                  "--reload_interval", "2"], study.root / "tensorboard.log") as proc:
        url = f"http://127.0.0.1:{port}/data/plugin/hparams"
        # the study's own HParams configuration first: until its "." run is loaded TensorBoard infers another one
        experiment = wait_until_answers(f"{url}/experiment", proc, body={"experimentName": ""},
                                        ready=study_experiment_loaded, what="TensorBoard's HParams experiment")
        groups = wait_until_answers(f"{url}/session_groups", proc, body=body, ready=all_loaded,
                                    what="a run with finite hp metrics for every trial")
        rows = rows_of(groups)
        assert set(rows) == expected, f"HParams rows {sorted(rows)} != trials {sorted(expected)}"
        shown = {display_tag(m) for m in HP_METRICS}  # the summary group's TensorBoard tags
        metric_tags = {m["name"]["tag"] for m in experiment["metricInfos"]}
        assert metric_tags == {display_tag(m) for m in STUDY_METRICS}  # the same columns for every row
        for name, run in rows.items():
            values = {m["name"]["tag"]: m["value"] for m in run["metricValues"]}
            extra = {display_tag(m) for m in AGG_METRICS} if name in aggregates else set()
            assert set(values) == shown | extra, name
            bad = {k: v for k, v in values.items() if not isinstance(v, (int, float)) or not math.isfinite(v)}
            assert not bad, f"{name}: non-finite hp metrics {bad}"


# --- error paths (no training) ------------------------------------------------------------------------------------
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablations.report", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=HANG_LIMIT_S)  # stops a hung run only


def test_missing_storage_file_exits_2_and_creates_nothing(tmp_path):
    db = tmp_path / "nope.db"
    proc = _cli("--study", "residual_variants", "--storage", f"sqlite:///{db}", "--results-dir", str(tmp_path / "r"),
                cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0] and "Traceback" not in proc.stderr
    assert not db.exists() and not (tmp_path / "r").exists()


def test_study_without_completed_trials_exits_2(tmp_path):
    import optuna

    db = tmp_path / "empty.db"
    study = optuna.create_study(study_name="residual_variants-smoke", storage=f"sqlite:///{db}")
    study.enqueue_trial({"variant": "standard", "depth": 1, "seed": 0})  # WAITING only
    proc = _cli("--study", "residual_variants", "--budget", "smoke", "--storage", f"sqlite:///{db}",
                "--results-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no completed trials" in lines[0] and "1 waiting" in lines[0]
    assert not (tmp_path / "r").exists()


def test_unknown_study_names_exit_2_listing_valid_ones(tmp_path):
    import optuna

    db = tmp_path / "o.db"
    optuna.create_study(study_name="residual_variants-smoke", storage=f"sqlite:///{db}")
    size = db.stat().st_size
    code, out, err = _run_report(["--study", "no_such_study", "--storage", f"sqlite:///{db}"])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "unknown study 'no_such_study'" in err and "residual_variants" in err and "init_values" in err
    code, out, err = _run_report(["--study", "residual_variants", "--storage", f"sqlite:///{db}"])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "study 'residual_variants' not found" in err and "residual_variants-smoke" in err
    assert "--budget smoke" in err
    code, out, err = _run_report(["--study", "residual_variants", "--study-name", "other",
                                  "--storage", f"sqlite:///{db}"])
    assert code == 2 and "studies there: residual_variants-smoke" in err
    assert [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{db}")] == ["residual_variants-smoke"]
    assert db.stat().st_size == size and out == ""


def test_not_an_optuna_file_exits_2(tmp_path):
    db = tmp_path / "plain.db"
    db.write_bytes(b"")
    code, _, err = _run_report(["--study", "residual_variants", "--storage", f"sqlite:///{db}"])
    assert code == 2 and "not an Optuna storage" in err and db.read_bytes() == b""


# --- table logic on hand-made results (no training) ---------------------------------------------------------------
def _data(values: dict[tuple[str, int], list], diverged: dict | None = None) -> report.StudyData:
    runs, number = [], 0
    for (variant, depth), accs in values.items():
        for seed, acc in enumerate(accs):
            div = (diverged or {}).get((variant, depth, seed), False)
            runs.append(report.Run(number=number, state="complete", variant=variant, depth=depth, seed=seed,
                                   row=variant, acc=acc, diverged=div))
            number += 1
    rows = list(dict.fromkeys(v for v, _ in values))
    return report.StudyData(name="hand", kind="grid", runs=runs, rows=rows, row_variant={r: r for r in rows},
                            row_extras={r: () for r in rows}, depths=sorted({d for _, d in values}))


def test_cells_bold_divergence_and_small_n():
    data = _data({("standard", 2): [0.50, 0.52, 0.51], ("layerscale", 2): [0.70, 0.73, 0.71],
                  ("rezero", 2): [0.49, 0.55, 0.60], ("dca", 2): [0.90, None]},
                 diverged={("dca", 2, 1): True})
    cells = {c.row: c for c in report.main_cells(data)}
    md = {row: report.cell_text(c, "md") for row, c in cells.items()}
    assert md["layerscale"] == "71.33 ± 1.53 (n=3)"
    assert md["standard"] == "51.00 ± 1.00 (n=3)"
    assert md["dca"] == "**90.00** (n=1) (1/2 diverged)"  # n < 2: no sd; the diverged run is not in the mean
    # ... but it stays in the pairs at chance level (0.1 without a recorded number of classes): 0.40, 0.1 − 0.52
    assert cells["dca"].comparison.n == 2 and cells["dca"].n_diverged_pairs == 1 and cells["dca"].best
    assert cells["dca"].comparison.delta == pytest.approx((0.40 + 0.1 - 0.52) / 2) and not cells["dca"].significant
    assert cells["standard"].baseline and cells["standard"].comparison is None
    assert report.cell_text(cells["layerscale"], "tex") == r"71.33 $\pm$ 1.53 (n=3)"
    table = report.main_table(data, list(cells.values()))
    assert "\\textbf{90.00}" in table.latex("tab:x") and "(1/2 diverged)" in table.markdown()


def test_paired_statistics_agree_with_scipy():
    """Δ, CI, t and Wilcoxon p of every cell against direct scipy calls; Holm over the table's family."""
    from scipy import stats

    values = {("standard", 2): [0.50, 0.52, 0.51, 0.55, 0.48], ("layerscale", 2): [0.56, 0.55, 0.58, 0.57, 0.53],
              ("rezero", 2): [0.49, 0.55, 0.60, 0.50, 0.47], ("skipinit", 2): [0.52, 0.50, 0.50, 0.58, 0.50]}
    cells = {c.row: c for c in report.main_cells(_data(values))}
    base = np.array(values["standard", 2])
    raw = {}
    for row in ("layerscale", "rezero", "skipinit"):
        own = np.array(values[row, 2])
        d = own - base
        c = cells[row]
        assert c.comparison.n == 5 and c.pair_seeds == [0, 1, 2, 3, 4]
        assert c.comparison.delta == pytest.approx(d.mean())
        half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / np.sqrt(5)
        assert (c.comparison.ci_low, c.comparison.ci_high) == pytest.approx((d.mean() - half, d.mean() + half))
        raw[row] = stats.ttest_rel(own, base).pvalue
        assert c.comparison.p_t == pytest.approx(raw[row])
        assert c.comparison.p_wilcoxon == pytest.approx(stats.wilcoxon(own, base).pvalue)
        crit, nc = stats.t.ppf(1 - 0.05 / 3 / 2, 4), c.mde * np.sqrt(5) / d.std(ddof=1)  # noncentral t at α/m
        assert stats.nct.sf(crit, 4, nc) + stats.nct.cdf(-crit, 4, nc) == pytest.approx(0.8, abs=1e-9)
    order = sorted(raw, key=raw.get)  # Holm by hand: m = 3
    adjusted, running = {}, 0.0
    for k, row in enumerate(order):
        running = max(running, min(1.0, (3 - k) * raw[row]))
        adjusted[row] = running
    for row, p in adjusted.items():
        assert cells[row].p_t_holm == pytest.approx(p)
        assert cells[row].significant == (p < 0.05)
    assert cells["layerscale"].significant and not cells["rezero"].significant
    assert report.family_size(list(cells.values())) == 3


def test_holm_hand_example():
    assert report.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert report.holm([0.02, None, 0.5]) == [pytest.approx(0.04), None, pytest.approx(0.5)]
    assert report.holm([0.6, 0.4]) == pytest.approx([0.8, 0.8])  # monotone, capped at 1
    assert report.holm([]) == []


def test_mde_hand_computation():
    from scipy import stats

    # n = 4, s_d = 0.02, alpha' = 0.05 / 2: the central-t formula (t_{0.9875, 3} + t_{0.8, 3}) * 0.02 / 2 = 5.155 *
    # 0.01 understates the effect the test detects with power 0.8; the noncentral t gives 5.43 pp
    central = (stats.t.ppf(1 - 0.025 / 2, 3) + stats.t.ppf(0.8, 3)) * 0.02 / 2
    assert central == pytest.approx(0.05155, abs=1e-5)
    assert report.mde(0.02, 4, 0.025) == pytest.approx(0.054321, abs=1e-6)
    assert report.mde(0.02, 1, 0.05) is None and report.mde(0.0, 5, 0.05) is None


def test_pairs_drop_seeds_missing_on_either_side_and_keep_diverged_runs_at_chance():
    from scipy import stats

    data = _data({("standard", 1): [0.50, 0.60, None, 0.55, 0.52], ("layerscale", 1): [0.58, None, 0.7, 0.61, 0.60]},
                 diverged={("layerscale", 1, 1): True})
    data.runs = [r for r in data.runs if r.acc is not None or r.diverged]  # seed 2 of standard: never ran
    cells = {c.row: c for c in report.main_cells(data)}
    c = cells["layerscale"]
    # seed 1 diverged: kept as a failure at chance level (0.1); seed 2 has no baseline: dropped
    assert c.pair_seeds == [0, 1, 3, 4] and c.comparison.n == 4 and c.n_diverged_pairs == 1
    own, base = [0.58, 0.1, 0.61, 0.60], [0.50, 0.60, 0.55, 0.52]
    assert c.comparison.delta == pytest.approx(np.mean(np.subtract(own, base)))
    assert c.comparison.p_t == pytest.approx(stats.ttest_rel(own, base).pvalue)
    assert c.n == 4 and c.n_diverged == 1 and c.n_runs == 5
    paired = report.paired_table(data, list(cells.values()))
    row = next(iter(csv.DictReader(io.StringIO(paired.to_csv()))))
    assert row["variant"] == "layerscale" and row["n_pairs"] == "4" and row["pair_seeds"] == "0 1 3 4"
    assert row["n_diverged_pairs"] == "1"
    md = _md_cells_from_text(report.main_table(data, list(cells.values())).markdown())
    assert md["layerscale", "depth 1"].endswith("(1/5 diverged)")
    data.runs = [r for r in data.runs if not (r.variant == "standard" and r.seed == 4)]  # seed 4: no baseline
    cells = {c.row: c for c in report.main_cells(data)}
    md = _md_cells_from_text(report.main_table(data, list(cells.values())).markdown())
    assert md["layerscale", "Δ vs standard (pp) [95% CI, unadjusted], depth 1"].endswith("(3 pairs)")


def test_undefined_tests_are_none():
    data = _data({("standard", 1): [0.50, 0.60], ("same", 1): [0.50, 0.60], ("shift", 1): [0.51, 0.61],
                  ("one", 1): [0.7]})
    cells = {c.row: c for c in report.main_cells(data)}
    for row in ("same", "shift"):  # all paired differences equal: t = ±inf, no test, no MDE
        assert cells[row].comparison.p_t is None and cells[row].mde is None and cells[row].p_t_holm is None
    assert cells["same"].comparison.p_wilcoxon is None  # all differences zero
    assert cells["one"].comparison.n == 1 and cells["one"].comparison.ci_low is None
    assert report.family_size(list(cells.values())) == 0
    text = report.paired_table(data, list(cells.values())).markdown()
    assert "no comparison has a test" in text and "no cell has an MDE" in text


def test_the_diagnostics_note_says_how_many_runs_the_figures_stand_on():
    from ablations.report.diagnostic_figures import diagnostics_note

    assert diagnostics_note("all seeds", 16, found=50, total=50) == \
        "diagnostic figures use all seeds at depth 16, last logged epoch."
    assert diagnostics_note("all seeds", 16, found=7, total=50).startswith(
        "diagnostic figures use 7 of the 50 runs (all seeds) at depth 16, the ones whose event files or runs.csv rows hold "
        "diagnostics")
    assert diagnostics_note("best trial per variant", 4, found=0, total=3) == (
        "no diagnostic figures at depth 4: none of its 3 runs has diagnostics in its event files or runs.csv row "
        "(diagnostics_every 0, runs imported from a runs.csv without them, or their folders removed).")


def test_collapse_table_from_hand_made_events():
    """The collapse table's numbers from hand-made event values: each run's last logged epoch, mean ± sd, n."""
    from ablations.report.events import ATTN_ENTROPY_MEAN, ATTN_SIM_ADJ_MEAN, SIMILAR_BLOCKS, RunEvents
    from lit_modules.diagnostics import TAGS

    assert (SIMILAR_BLOCKS, ATTN_SIM_ADJ_MEAN, ATTN_ENTROPY_MEAN) == (
        TAGS["similar_blocks"], TAGS["attn_sim_adj_mean"], TAGS["attn_entropy_mean"])
    data = _data({("standard", 1): [0.5, 0.6], ("standard", 16): [0.7, 0.8, 0.9],
                  ("re_attention", 16): [0.8, 0.9, None]}, diverged={("re_attention", 16, 2): True})
    counts = {("standard", 16): [5.0, 7.0, 9.0], ("re_attention", 16): [0.0, 1.0, 12.0]}  # the diverged run: 12
    events = {}
    for run in data.runs:
        if run.depth == 1:  # one block: nothing logged
            events[run.number] = RunEvents(scalars={ATTN_ENTROPY_MEAN: {29: 0.5}})
            continue
        count = counts[run.variant, run.depth][run.seed]
        events[run.number] = RunEvents(scalars={
            SIMILAR_BLOCKS: {9: 99.0, 29: count},  # the last logged epoch (step 29 = epoch 30) counts
            ATTN_SIM_ADJ_MEAN: {9: 0.1, 29: 0.5 + 0.1 * run.seed}, ATTN_ENTROPY_MEAN: {29: 0.25}})
    records = report.collapse_records(data, events)
    at = {(r["variant"], r["depth"]): r for r in records}
    assert sorted(at) == [(v, d) for v in ("re_attention", "standard") for d in (1, 16)]
    std = at["standard", 16]
    assert std["n"] == 3 and std["similar_blocks"] == pytest.approx(7.0) and std["similar_blocks_std"] == 2.0
    assert std["similar_blocks_fraction"] == pytest.approx(7.0 / 15) and std["epochs"] == [30]
    assert std["attn_sim_adj_mean"] == pytest.approx(0.6) and std["attn_entropy_mean"] == pytest.approx(0.25)
    reat = at["re_attention", 16]  # the diverged run is left out
    assert reat["n"] == 2 and reat["similar_blocks"] == pytest.approx(0.5)
    assert reat["similar_blocks_std"] == pytest.approx(np.std([0.0, 1.0], ddof=1))
    assert at["standard", 1]["n"] == 0 and at["standard", 1]["similar_blocks"] is None

    table = report.collapse_table(data, records)
    md = _md_cells_from_text(table.markdown())
    assert md["standard", "similar blocks, depth 16"] == "7.00 ± 2.00 (n=3)"
    assert md["re_attention", "similar blocks, depth 16"] == "0.50 ± 0.71 (n=2)"
    assert md["standard", "similar blocks, depth 1"] == "—" and md["standard", "adj. sim., depth 16"] == "0.600"
    caption = table.caption
    assert "K = 3" in caption and "τ = 0.9" in caption and "more than 0.5" in caption and "epoch 30" in caption
    assert "project's" in caption and "not retrieved" in caption
    rows = list(csv.DictReader(io.StringIO(table.to_csv())))
    assert rows[1] == {"variant": "standard", "depth": "16", "n": "3", "similar_blocks_mean": "7.0000",
                       "similar_blocks_std": "2.0000", "similar_blocks_fraction_mean": "0.4667",
                       "attn_sim_adj_mean": "0.600000", "attn_entropy_mean": "0.250000", "epochs": "30"}
    tex = table.latex("tab:c")
    assert r"\multicolumn{2}{c}{depth 16}" in tex and r"7.00 $\pm$ 2.00 (n=3)" in tex and r"$\tau$ = 0.9" in tex
    # no run logged the count (diagnostics off): no table
    assert report.collapse_records(data, {r.number: RunEvents() for r in data.runs}) == []


def test_mixing_gain_table_from_hand_made_events():
    """The composite-gain table: each ok run's last logged gains, mean ± sd (max), n; none without the tags."""
    from ablations.report.events import RunEvents
    from ablations.report.model_tables import GAIN_TAGS
    from lit_modules.diagnostics import TAGS

    assert GAIN_TAGS == {"forward": TAGS["composite_gain_forward"], "backward": TAGS["composite_gain_backward"]}
    data = _data({("standard", 4): [0.5, 0.6], ("hc", 4): [0.7, 0.8, 0.9]}, diverged={("hc", 4, 2): True})
    events = {}
    for run in data.runs:
        if run.variant == "hc":  # the diverged run (seed 2) logged a huge gain: left out
            events[run.number] = RunEvents(scalars={
                GAIN_TAGS["forward"]: {4: 99.0, 9: [2.0, 4.0, 1e6][run.seed]},
                GAIN_TAGS["backward"]: {4: 99.0, 9: [1.0, 3.0, 1e6][run.seed]}})
        else:
            events[run.number] = RunEvents()
    at = {(r["variant"], r["depth"]): r for r in report.gain_records(data, events)}
    hc = at["hc", 4]
    assert hc["n"] == 2 and hc["forward"] == pytest.approx(3.0) and hc["forward_max"] == 4.0
    assert hc["backward"] == pytest.approx(2.0) and hc["backward_std"] == pytest.approx(np.std([1.0, 3.0], ddof=1))
    assert hc["epochs"] == [10] and at["standard", 4]["n"] == 0 and at["standard", 4]["forward"] is None
    md = _md_cells_from_text(report.gain_table(data, list(at.values())).markdown())
    assert md["hc", "forward gain, depth 4"] == "3 ± 1.41 (max 4)" and md["standard", "backward gain, depth 4"] == "—"
    assert report.gain_records(data, {r.number: RunEvents() for r in data.runs}) == []


def test_one_formatter_renders_every_form():
    import pandas as pd

    table = report.Table("t", "title", "A caption with 5% and α.", pd.DataFrame(
        [["a_b", 1, 0.5, None]], columns=["name", "k", "x", "y"], dtype=object),
        [report.Column("name", "name"), report.Column("k", "k", fmt="d"),
         report.Column("x", "x (%)", fmt=".1f", scale=100.0), report.Column("y", "y", fmt=".2f")],
        [("name", "name", ""), ("k", "k", ""), ("x", "x", ".3f"), ("y", "y", ".3f")])
    assert table.to_csv() == "name,k,x,y\na_b,1,0.500,\n"
    assert "| a_b    |   1 |    50.0 |   — |" in table.markdown() and table.markdown().endswith("A caption with 5% and α.\n")
    tex = table.latex("tab:t")
    assert r"a\_b & 1 & 50.0 & --- \\" in tex and r"\caption{A caption with 5\% and $\alpha$.}" in tex
    assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule")


def test_layout_names_the_paths_other_tools_use():
    from ablations import layout, train
    from ablations.studies import storage

    assert layout.DEFAULT_STORAGE == storage.DEFAULT_STORAGE == "sqlite:///outputs/optuna.db"
    assert Path(train.DEFAULT_LOG_DIR) == layout.runs_dir(layout.OUTPUT_DIR, "train") == Path("outputs/runs/train")
    # a user's outputs go where git ignores them; device records stay the repository's for the default folder
    assert layout.device_dir(layout.OUTPUT_DIR) == Path("results/device") == layout.device_dir("results")
    assert layout.device_dir("elsewhere") == Path("elsewhere/device")
    assert layout.report_run_dir("r", "s") == Path("r/runs/s/_report") and report.REPORT_RUN == "_report"


def test_search_tables_handle_few_trials():
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from ablations.studies.spec import load_spec

    spec = load_spec(EXAMPLE_SEARCH, "smoke")
    study = optuna.create_study(direction="maximize")
    variant = CategoricalDistribution([v.label for v in spec.variants])
    rng = np.random.default_rng(0)
    for i in range(12):
        label = "layerscale" if i < 9 else "highway"
        name, dist = (("layerscale.init_value", FloatDistribution(1e-6, 1.0, log=True)) if label == "layerscale"
                      else ("highway.gate_bias", FloatDistribution(-8.0, 0.0)))
        value = float(rng.uniform(dist.low, dist.high))
        acc = 0.5 + 0.01 * i
        study.add_trial(optuna.trial.create_trial(
            params={"variant": label, name: value}, distributions={"variant": variant, name: dist}, value=acc,
            user_attrs={"best_val_acc": acc, "diverged": False}))
    data = report.collect(study, spec)
    best = report.search_table(data)
    cells = _md_cells_from_text(best.markdown())
    assert cells["layerscale", "best top-1 (%)"] == "58.00" and cells["layerscale", "trial"] == "8"
    assert cells["highway", "complete"] == "3" and cells["rezero", "complete"] == "0"
    imp = report.importance_table(study, data)
    text = imp.markdown()
    assert "PedAnovaImportanceEvaluator" in text
    assert "| layerscale" in text and "layerscale.init_value" in text  # 9 trials: computed
    assert any("highway: too few completed trials (3" in n for n in imp.notes)



def test_each_run_reports_the_mode_it_trained_in_and_mixed_modes_are_counted():
    """Runs from before ``precision: auto`` recorded only their config; later runs record the mode they resolved."""
    from ablations.report.load import Run, StudyData, run_mode
    from ablations.report.runs import frame

    def make(number: int, **kw) -> Run:
        return Run(number=number, state="complete", variant="standard", depth=4, seed=number, row="standard", **kw)

    old = make(0, config={"precision": "32-true", "fused_attn": None})
    new = make(1, summary={"precision": "bf16-mixed", "fused_attn": False}, config={"precision": "auto"})
    forced = make(2, summary={"precision": "32-true", "fused_attn": True}, config={"precision": "auto"})
    assert run_mode(old) == "32-true + fused attention"
    assert run_mode(new) == "bf16-mixed + explicit attention"
    data = StudyData(name="s", kind="grid", runs=[old, new, forced], rows=["standard"],
                     row_variant={"standard": "standard"}, row_extras={"standard": ()}, depths=[4])
    assert data.modes() == {"32-true + fused attention": 2, "bf16-mixed + explicit attention": 1}
    assert list(frame(data)["mode"]) == [run_mode(r) for r in (old, new, forced)]


def test_a_postgresql_url_is_read_with_the_installed_driver():
    """``postgresql://`` without a driver name reaches the server through psycopg2 (the project's dependency), as
    ablations.run's storage does: the error is the refused connection, not SQLAlchemy's missing psycopg 3."""
    from ablations.report.load import ReportError, open_study

    with pytest.raises(ReportError) as err:
        open_study(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere", "some_study")
    message = str(err.value)
    assert "cannot read storage" in message and "refused" in message.lower(), message
    assert "DB access module" not in message
