"""The report page read top to bottom: what the tables' captions say alike is said once, each table has a one-line
caption of its own; a curve chart of many rows gives each row its own panel; a figure over depth of a one-depth
study is skipped with a note. (The page in a real browser: tests/test_report_html.py.)"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from ablations import report
from ablations.report.markup import sentences, shared_sentences, split_caption
from ablations.studies.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
STUDY = "modern_residuals"  # 11 rows, one depth, per-epoch curves in its runs.csv


def test_shared_sentences_are_said_once_and_each_caption_keeps_a_line_of_its_own():
    a = "Top-1 accuracy of study s, mean over 3 seeds. Δ = paired difference (p. 3 of the paper). Holm over m = 4."
    b = "Paired comparisons with standard in study s. Δ = paired difference (p. 3 of the paper). Holm over m = 4."
    c = "Δ = paired difference (p. 3 of the paper). The claims, one per line."
    assert sentences(a) == ["Top-1 accuracy of study s, mean over 3 seeds.", "Δ = paired difference (p. 3 of the "
                            "paper).", "Holm over m = 4."]  # "p. 3" and "m = 4." are not sentence breaks
    shared = shared_sentences([a, b, c])
    assert shared == ["Δ = paired difference (p. 3 of the paper).", "Holm over m = 4."]
    assert split_caption(a, shared) == ("Top-1 accuracy of study s, mean over 3 seeds.", [])
    assert split_caption(c, shared) == ("The claims, one per line.", [])
    assert split_caption("Δ = paired difference (p. 3 of the paper).", shared) == (
        "Δ = paired difference (p. 3 of the paper).", [])  # nothing of its own: its first sentence


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    results = tmp_path_factory.mktemp("page") / "results"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = report.main(["--study", STUDY, "--runs", str(REPO / "results" / STUDY / "runs.csv"), "--results-dir",
                            str(results), "--html", "--no-tensorboard"])
    assert code == 0, err.getvalue()
    return SimpleNamespace(html=(results / STUDY / "report.html").read_text(), folder=results / STUDY)


def test_the_page_explains_the_tables_once_and_gives_each_a_one_line_caption(page):
    html = page.html
    assert html.count('<section id="reading"><h3>Reading the tables</h3>') == 1
    shared = "Test: paired two-sided t-test over seeds (scipy.stats.ttest_rel)"
    assert html.count(shared) == 1 and html.index(shared) < html.index('<section id="main">')
    main_md = (page.folder / "main.md").read_text()
    paired_md = (page.folder / "paired.md").read_text()
    assert shared in main_md and shared in paired_md  # the files keep their full captions
    for name in ("main", "paired", "power", "tuning", "convergence"):
        section = re.search(rf'<section id="{name}">.*?</section>', html, flags=re.S).group(0)
        caption = re.search(r'</table><p class="caption">(.*?)</p>', section, flags=re.S).group(0)
        text = re.sub(r"<[^>]+>", "", caption)
        assert len(sentences(text)) == 1, (name, text)
    main = re.search(r'<section id="main">.*?</section>', html, flags=re.S).group(0)
    assert main.count("<details><summary>more on this table</summary>") <= 1


def test_a_curve_chart_of_many_rows_gives_each_row_its_own_panel(page):
    from ablations.report.aggregate import aggregate
    from ablations.report.charts import MANY_ROWS, band_figure, band_png, panel_grid
    from ablations.report.runs import read

    data = read(REPO / "results" / STUDY / "runs.csv", load_spec(STUDY), STUDY)
    rows = data.rows
    assert len(rows) > MANY_ROWS
    cells = aggregate(data)
    fig = band_figure(cells, "val/acc", delta=False, rows=rows)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == rows and panel_grid(rows) == (3, 4)  # 11 rows: three rows of four panels
    by_axis: dict[str, set[str]] = {}
    for trace in fig.data:
        by_axis.setdefault(trace.xaxis, set()).add(trace.name)
    assert len(by_axis) == len(rows)
    for axis, names in by_axis.items():  # each panel: its row, and the baseline's mean in grey beside it
        assert len(names - {"standard"}) <= 1, (axis, names)
    assert sum("standard" in names for names in by_axis.values()) == len(rows)
    assert "one panel per row; grey: standard" in fig.layout.title.text
    delta = band_figure(cells, "val/acc", delta=True, rows=rows)
    assert "one panel per row" in delta.layout.title.text and len(delta.layout.shapes) == len(rows) - 1  # zero lines
    assert band_png(cells, "val/acc", delta=False, rows=rows)
    assert f'id="figure-{"val-acc"}"' in page.html


def test_figures_over_depth_of_a_one_depth_study_are_skipped_with_a_note(tmp_path):
    """acc_vs_depth and similar_blocks_vs_depth would be one point per row: not drawn, an earlier report's copy
    removed, and a note says why."""
    from ablations.report.figures import report_figures

    (tmp_path / "acc_vs_depth.png").write_bytes(b"an earlier report's figure")
    data = SimpleNamespace(kind="grid", rows=["standard", "rezero"], depths=[4], runs=[], metric="test_acc",
                           by_row_depth=lambda row, depth: [], config_value=lambda key, default=None: default)
    cells = [SimpleNamespace(row=row, depth=4, n=3, mean=0.9, std=0.01) for row in data.rows]
    written, notes = report_figures(None, data, cells, tmp_path)
    assert not (tmp_path / "acc_vs_depth.png").exists() and not (tmp_path / "acc_vs_depth.pdf").exists()
    assert ("figure acc_vs_depth skipped: the study trained one depth, so each row would be one point (the main table "
            "has it).") in notes
    assert all("acc_vs_depth" not in p.name for p in written)
