"""A reported run's diagnostics travel in its runs.csv row (``diagnostics``): a study continued elsewhere with
``--import-runs`` keeps the collapse table and the diagnostic figures of the runs it did not train, and a report made
from a runs.csv regenerates the collapse table; hand-built events pin the packing, a trained study the whole path."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math

import pytest
from helpers import run_in_process, url_of, write_study

from ablations.report import collapse_records
from ablations.report.cli import main as report_main
from ablations.report.events import (
    ATTN_ENTROPY_MEAN,
    ATTN_SIM_ADJ_MEAN,
    DIAGNOSTICS_KEY,
    SIMILAR_BLOCKS,
    RunEvents,
    carried_text,
    from_carried,
    run_events,
)
from ablations.report.load import Run, StudyData

ADJ, RATIO, GRAD = "diag/attn_sim_adj/{:02d}", "diag/ratio_mean/{}/{:02d}", "diag/grad_norm/{:02d}"


def _events() -> RunEvents:
    """Two logged epochs (steps 9 and 29) of a three-block run; layer 1's adjacent similarity never logged."""
    scalars = {SIMILAR_BLOCKS: {9: 99.0, 29: 2.0}, ATTN_SIM_ADJ_MEAN: {9: 0.1, 29: 0.6123456789012345},
               ATTN_ENTROPY_MEAN: {29: math.nan},
               ADJ.format(0): {9: 0.5, 29: 0.912345678}, ADJ.format(2): {29: 0.25},
               RATIO.format("attn", 0): {29: 0.031}, RATIO.format("attn", 1): {29: 0.0420000001},
               RATIO.format("mlp", 0): {29: 1.5}, GRAD.format(0): {29: 7.0}}
    return RunEvents(scalars=scalars)


def test_a_run_s_last_epoch_diagnostics_pack_into_one_cell_and_back():
    text = carried_text(_events())
    packed = json.loads(text)
    # the last logged epoch of each family; a value exactly, a per-layer one to 6 significant digits, a gap as null,
    # a non-finite value as null; what no table or figure reads (grad_norm) does not travel
    assert packed == {"step": 29, "similar_blocks": 2.0, "attn_sim_adj_mean": 0.6123456789012345,
                      "attn_entropy_mean": None, "attn_sim_adj": [0.912346, None, 0.25],
                      "ratio_mean": {"attn": [0.031, 0.042], "mlp": [1.5]}}
    back = from_carried(text)
    assert back.last_value(SIMILAR_BLOCKS) == (29, 2.0) and back.last_value(ATTN_SIM_ADJ_MEAN)[1] == 0.6123456789012345
    assert back.last_value(ATTN_ENTROPY_MEAN) is None and not back.per_layer("grad_norm")
    assert back.per_layer("attn_sim_adj") == {0: 0.912346, 2: 0.25}
    assert back.per_site("ratio_mean") == {"attn": {0: 0.031, 1: 0.042}, "mlp": {0: 1.5}}
    assert carried_text(RunEvents()) is None
    for cell in ("", None, "not json", '{"similar_blocks": 1}', '["step", 3]'):
        assert from_carried(cell).empty, cell


def _study(runs: list[Run]) -> StudyData:
    return StudyData(name="hand", kind="grid", runs=runs, rows=["standard"], row_variant={"standard": "standard"},
                     row_extras={"standard": ()}, depths=[3])


def test_a_run_without_its_event_files_reads_the_cell_it_carries(tmp_path):
    """The collapse record of runs whose folders are gone equals the one their event files gave."""
    events = [_events(), dataclasses.replace(_events(), scalars=_events().scalars | {SIMILAR_BLOCKS: {29: 0.0}})]
    runs = [Run(number=i, state="complete", variant="standard", depth=3, seed=i, row="standard", acc=0.5,
                diverged=False, log_dir=tmp_path / f"gone{i}") for i in range(2)]
    from_files = collapse_records(_study(runs), {r.number: e for r, e in zip(runs, events, strict=True)})
    carried = [dataclasses.replace(r, summary={DIAGNOSTICS_KEY: carried_text(e)})
               for r, e in zip(runs, events, strict=True)]
    assert [run_events(r).last_value(SIMILAR_BLOCKS) for r in carried] == [(29, 2.0), (29, 0.0)]
    assert collapse_records(_study(carried)) == from_files
    assert from_files[0]["n"] == 2 and from_files[0]["similar_blocks"] == pytest.approx(1.0)
    assert collapse_records(_study(runs)) == []  # neither event files nor a cell: no table


# --- the whole path: train, report, cut, continue elsewhere, report again ------------------------------------------
BASE = {"dataset_options": {"num_samples": 128, "img_size": 8, "in_chans": 1, "num_classes": 4}, "depth": 3,
        "max_epochs": 2, "batch_size": 16, "diagnostics_every": 1, "diagnostics_batch_size": 8}
VARIANTS = [{"label": "standard", "residual": "standard"}, {"label": "layerscale", "residual": "layerscale"}]


def _report(study, db, out, cwd, *more):
    result = run_in_process("--study", study, "--storage", url_of(db), "--out", out, "--no-figures",
                            "--no-tensorboard", "--no-note", *more, cwd=cwd, main=report_main)
    assert result.returncode == 0, result.stderr
    return result


def _csv(path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


@pytest.mark.slow
def test_a_study_continued_from_its_runs_csv_keeps_the_collapse_table_of_the_runs_it_did_not_train(tmp_path):
    study = write_study(tmp_path / "carried_diag.yaml", variants=VARIANTS, base=BASE, axes={"seed": [0, 1, 2]})
    first = tmp_path / "first"
    first.mkdir()
    result = run_in_process("--study", study, "--storage", url_of(first / "a.db"), "--no-progress", cwd=first)
    assert result.returncode == 0, result.stderr
    _report(study, first / "a.db", first / "report", first)
    rows = _csv(first / "report" / "runs.csv")
    collapse = (first / "report" / "collapse.csv").read_text()
    assert all(json.loads(r[DIAGNOSTICS_KEY])["step"] == 1 for r in rows)  # epoch 2, the last, of every run
    assert [r["n"] for r in _csv(first / "report" / "collapse.csv")] == ["3", "3"]
    # another machine: the folders stay behind, seed 2's rows are cut, the study continues from the file
    second = tmp_path / "second"
    second.mkdir()
    kept = [r for r in rows if r["seed"] != "2"]
    with open(second / "runs.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
    result = run_in_process("--study", study, "--storage", url_of(second / "b.db"), "--no-progress",
                            "--import-runs", second / "runs.csv", cwd=second)
    assert result.returncode == 0, result.stderr
    assert "4 completed reported trial(s) joined" in result.stderr
    _report(study, second / "b.db", second / "report", second)
    # four runs from their cells, two from their event files here: the same table, every run in it
    assert (second / "report" / "collapse.csv").read_text() == collapse
    again = {(r["variant"], r["seed"]): r[DIAGNOSTICS_KEY] for r in _csv(second / "report" / "runs.csv")}
    assert again == {(r["variant"], r["seed"]): r[DIAGNOSTICS_KEY] for r in rows}
    # a report from the runs.csv alone regenerates the collapse table and the diagnostic figures too, and says
    # nothing is missing but what only event files hold
    out = run_in_process("--study", study, "--runs", second / "report" / "runs.csv", "--out", second / "from_runs",
                         cwd=second, main=report_main)
    assert out.returncode == 0, out.stderr
    assert (second / "from_runs" / "collapse.csv").read_text() == collapse
    assert (second / "from_runs" / "attn_similarity_curves.png").is_file()
    assert "need the runs' event files or their carried diagnostics" not in out.stdout
