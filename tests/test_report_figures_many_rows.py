"""A study of many rows (frontier has 21) gets readable figures: a colour of its own per row, legends outside the
data at the figure's right, and no label cut off or panel squeezed to nothing."""

from __future__ import annotations

import warnings

import matplotlib
import pytest
import yaml
from matplotlib.colors import to_hex
from PIL import Image

from ablations import report
from ablations.report.figures import accuracy_vs_depth, val_curves
from ablations.report.plot import LEGEND_INSIDE, RC, colors
from ablations.studies.spec import _build

ROWS = ["standard", *(f"standard_params_matched_variant_{i:02d}" for i in range(1, 21))]  # 21 rows, long labels


@pytest.mark.parametrize("n", [10, 20, 21, 40])
def test_each_row_has_a_colour_of_its_own(n):
    palette = colors([f"row{i}" for i in range(n)])
    assert len(set(palette.values())) == n


def test_val_curves_of_many_rows_keep_the_legend_outside_the_panel_and_the_panel_its_size():
    curves = {4: {row: [{e: 50.0 + i + e for e in range(1, 31)} for _ in range(2)] for i, row in enumerate(ROWS)}}
    with warnings.catch_warnings(), matplotlib.rc_context(RC):  # the report's style, as its figures are saved in
        warnings.simplefilter("error")  # matplotlib warns when constrained layout collapses a panel to nothing
        fig = val_curves(curves, ROWS)
        fig.canvas.draw()
    (ax,) = fig.axes
    assert ax.get_legend() is None and len(fig.legends) == 1
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [f"{row} (n=2)" for row in ROWS]
    panel, box = ax.get_window_extent(), legend.get_window_extent()
    assert box.x0 >= panel.x1  # at the right of the panel, covering none of its curves
    assert panel.width > 0.4 * fig.bbox.width and panel.height > 0.5 * fig.bbox.height
    few = val_curves({4: {row: curves[4][row] for row in ROWS[:LEGEND_INSIDE]}}, ROWS[:LEGEND_INSIDE])
    assert few.axes[0].get_legend() is not None and not few.legends  # a few rows: the legend stays in the panel


@pytest.mark.parametrize("rows", [len(ROWS), LEGEND_INSIDE])
def test_accuracy_vs_depth_puts_the_legend_of_many_rows_beside_the_panel(rows):
    cells = [{"variant": row, "depth": d, "mean": 90.0 + i / 10 + d, "std": 0.5, "n": 3}
             for i, row in enumerate(ROWS[:rows]) for d in (4, 8)]
    with warnings.catch_warnings(), matplotlib.rc_context(RC):
        warnings.simplefilter("error")
        fig = accuracy_vs_depth(cells, ROWS[:rows], ylabel="top-1 accuracy (%)")
        fig.canvas.draw()
    (ax,) = fig.axes
    if rows > LEGEND_INSIDE:
        assert ax.get_legend() is None and len(fig.legends[0].get_texts()) == rows
        assert fig.legends[0].get_window_extent().x0 >= ax.get_window_extent().x1
        assert ax.get_window_extent().width > 0.4 * fig.bbox.width
    else:
        assert len(ax.get_legend().get_texts()) == rows and not fig.legends


def _many_rows_study(report_seeds=(0, 1, 2)):
    """21 rows of 'standard' (a spec the report accepts), tuning runs at three rates on two seeds, reported runs at
    the middle rate on ``report_seeds``."""
    from ablations.report.load import assemble

    spec = _build(yaml.safe_load(
        "name: many\nkind: grid\nmetric: test_acc\nbase: {dataset: synthetic}\n"
        "variants: [" + ", ".join(f"{{label: {row}, residual: standard}}" for row in ROWS) + "]\n"
        "axes: {depth: [4], seed: [0, 1, 2]}\n"), "default", "many.yaml")
    runs, number = [], 0
    for i, row in enumerate(ROWS):
        for seed in (100, 101):
            for lr, acc in ((0.001, 0.90), (0.002, 0.92 + 0.001 * i + 0.002 * (seed - 100)), (0.004, 0.91)):
                runs.append(report.Run(number=number, state="complete", variant=row, depth=4, seed=seed, row="",
                                       acc=acc, phase="tune", config={"lr": lr}, summary={"best_val_acc": acc}))
                number += 1
        for seed in report_seeds:
            acc = 0.93 + 0.001 * i + 0.002 * seed
            runs.append(report.Run(number=number, state="complete", variant=row, depth=4, seed=seed, row="",
                                   acc=acc, config={"lr": 0.002}, summary={"best_val_acc": acc, "test_acc": acc}))
            number += 1
    return assemble("many", spec, runs)


@pytest.mark.slow  # 21 rows' paired statistics and plotly: about 10 s
def test_the_html_charts_of_many_rows_name_every_row_in_the_figures_colours():
    from ablations.report.charts import accuracy_figure, colour, delta_figure

    data = _many_rows_study()
    palette = colour(data.rows)
    assert len(set(palette.values())) == len(ROWS)
    assert palette == {row: to_hex(c) for row, c in colors(data.rows).items()}  # as the PNGs
    acc = accuracy_figure(data)
    assert acc.layout.showlegend is False  # the x axis names every row; a legend of 21 would cover them
    assert acc.layout.margin.b >= 5 * max(len(row) for row in ROWS)  # room for the slanted names
    delta = delta_figure(data, report.main_cells(data))
    assert {t.y[0] for t in delta.data} == set(ROWS[1:])
    assert delta.layout.height >= 24 * len(ROWS[1:])  # a tick label per row: plotly drops labels that would overlap


@pytest.mark.slow  # two figures of 21 rows, PNG and PDF each: about 6 s
def test_tuning_figures_of_many_rows_draw_without_a_collapsed_panel_or_a_cut_label(tmp_path):
    from ablations.report.tuning import tuning_figure, tuning_records

    data = _many_rows_study(report_seeds=(0,))
    records = tuning_records(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = tuning_figure(data, records, tmp_path)
    assert sorted(p.name for p in paths) == ["tuning.pdf", "tuning.png", "tuning_stability.pdf",
                                             "tuning_stability.png"]
    with Image.open(tmp_path / "tuning_stability.png") as img:  # the long row labels are drawn, not cut at the edge
        left = img.convert("L").crop((0, 0, 3, img.height))
        assert min(left.getdata()) == 255  # a blank margin at the left: no label runs off the figure


def test_a_rows_depths_share_its_colour_and_differ_in_line_and_marker_in_the_tuning_figure(tmp_path, monkeypatch):
    from ablations.report import plot
    from ablations.report.load import assemble
    from ablations.report.tuning import tuning_figure, tuning_records

    spec = _build(yaml.safe_load(
        "name: deep\nkind: grid\nmetric: test_acc\nbase: {dataset: synthetic}\n"
        "variants: [{label: standard, residual: standard}, {label: rezero, residual: rezero}]\n"
        "axes: {depth: [4, 12], seed: [0]}\n"), "default", "deep.yaml")
    runs = [report.Run(number=n, state="complete", variant=row, depth=depth, seed=100, row="", acc=acc, phase="tune",
                       config={"lr": lr}, summary={"best_val_acc": acc})
            for n, (row, depth, lr, acc) in enumerate((row, depth, lr, 0.9 + lr) for row in ("standard", "rezero")
                                                      for depth in (4, 12) for lr in (0.001, 0.002))]
    drawn = []
    monkeypatch.setattr(plot, "save", lambda fig, out, name, **kw: drawn.append((name, fig)) or [])
    tuning_figure(assemble("deep", spec, runs), tuning_records(assemble("deep", spec, runs)), tmp_path)
    fig = dict(drawn)["tuning"]
    lines = {bars.get_label(): bars.lines[0] for bars in fig.axes[0].containers}  # errorbar: (data line, caps, bars)
    assert sorted(lines) == ["rezero, depth 12", "rezero, depth 4", "standard, depth 12", "standard, depth 4"]
    for row in ("standard", "rezero"):
        shallow, deep = lines[f"{row}, depth 4"], lines[f"{row}, depth 12"]
        assert shallow.get_color() == deep.get_color()
        assert (shallow.get_linestyle(), shallow.get_marker()) != (deep.get_linestyle(), deep.get_marker())
    assert lines["standard, depth 4"].get_color() != lines["rezero, depth 4"].get_color()
