"""Tests for ``ablations.modes``: the fastest train-step mode (precision x attention kernel) per device and size,
read from the table ``python -m ablations.bench --sections modes`` writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ablations import modes
from ablations.modes import Mode, auto_mode, choose_mode, load_table

ROOT = Path(__file__).resolve().parents[1]


def cell(width: int, tokens: int, fastest: str) -> dict:
    times = dict.fromkeys(modes.MODE_KEYS, 2.0) | {fastest: 1.0}
    return {"embed_dim": width, "tokens": tokens, "times_s": times}


TABLE = {"device": "cpu", "machine": {"cpu": "made up"}, "cells": [
    cell(64, 5, "32-true/fused"), cell(64, 65, "32-true/explicit"),
    cell(384, 5, "bf16-mixed/fused"), cell(384, 65, "bf16-mixed/explicit")]}


@pytest.mark.parametrize(("width", "tokens", "expected"), [
    (64, 5, ("32-true", True)), (48, 4, ("32-true", True)),  # below the grid: its corner
    (64, 65, ("32-true", False)), (96, 50, ("32-true", False)),
    (384, 5, ("bf16-mixed", True)), (768, 2, ("bf16-mixed", True)),
    (384, 65, ("bf16-mixed", False)), (256, 197, ("bf16-mixed", False)),  # nearer 384 than 64 in log width
])
def test_choose_mode_takes_the_fastest_mode_of_the_nearest_cell(width, tokens, expected):
    mode = choose_mode("cpu", width, tokens, table=TABLE)
    assert (mode.precision, mode.fused_attn) == expected
    assert mode.source.startswith("measured: given table, nearest cell width")


def test_a_table_from_a_file_names_it(tmp_path):
    path = tmp_path / "modes-cpu.json"
    path.write_text(json.dumps(TABLE))
    mode = choose_mode("cpu", 64, 65, table=path)
    assert mode == Mode("32-true", False, f"measured: {path}, nearest cell width 64, 65 tokens")
    assert mode.key == "32-true/explicit"


def test_cuda_without_a_table_is_the_rule(tmp_path):
    mode = choose_mode("cuda", 192, 65, results_dir=tmp_path)
    assert (mode.precision, mode.fused_attn) == ("bf16-mixed", True) and mode.source.startswith("rule: CUDA")
    assert auto_mode("gpu", 192, 65, results_dir=tmp_path) == mode


def test_the_users_measurement_comes_before_the_packaged_table(tmp_path):
    packaged = choose_mode("cpu", 192, 17, results_dir=tmp_path)  # nothing measured here: the packaged table
    assert packaged.source.startswith(f"measured: {modes.PACKAGED['cpu']}")
    load_table(modes.PACKAGED["cpu"])  # well-formed
    own = modes.measured_path("cpu", tmp_path)
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps(TABLE))
    assert choose_mode("cpu", 384, 5, results_dir=tmp_path) == Mode(
        "bf16-mixed", True, f"measured: {own}, nearest cell width 384, 5 tokens")
    assert auto_mode("cpu", 384, 5, results_dir=tmp_path) == choose_mode("cpu", 384, 5, results_dir=tmp_path)
    cuda = modes.measured_path("cuda", tmp_path)
    cuda.write_text(json.dumps(TABLE | {"device": "cuda"}))
    assert choose_mode("cuda", 64, 65, results_dir=tmp_path).source.startswith(f"measured: {cuda}")


@pytest.mark.parametrize(("content", "fault"), [
    ("{not json", "is not JSON"),
    ("[]", "expected a JSON object"),
    (json.dumps(TABLE | {"device": "tpu"}), "'device' must be one of"),
    (json.dumps(TABLE | {"cells": []}), "'cells' must be a non-empty list"),
    (json.dumps(TABLE | {"cells": [{"tokens": 5, "times_s": {"32-true/fused": 1.0}}]}), "'embed_dim' must be"),
    (json.dumps(TABLE | {"cells": [cell(64, 5, "32-true/fused") | {"times_s": {}}]}), "'times_s' must be"),
    (json.dumps(TABLE | {"cells": [{"embed_dim": 64, "tokens": 5, "times_s": {"16-mixed/fused": 1.0}}]}),
     "unknown mode '16-mixed/fused'"),
    (json.dumps(TABLE | {"cells": [{"embed_dim": 64, "tokens": 5, "times_s": {"32-true/fused": -1}}]}),
     "must be a positive number"),
])
def test_a_malformed_table_is_a_one_line_value_error(tmp_path, content, fault):
    path = tmp_path / "modes.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=fault) as exc:
        load_table(path)
    assert "\n" not in str(exc.value) and str(path) in str(exc.value)
    with pytest.raises(ValueError, match=fault):
        choose_mode("cpu", 64, 5, table=path)


def test_bad_requests_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="measured on cpu, not cuda"):
        choose_mode("cuda", 64, 5, table=TABLE)
    with pytest.raises(ValueError, match="device_type must be one of cpu, cuda"):
        choose_mode("mps", 64, 5)
    with pytest.raises(ValueError, match="accelerator must be one of"):
        auto_mode("tpu", 64, 5)
    with pytest.raises(ValueError, match="cannot read modes table"):
        load_table(tmp_path / "missing.json")


def test_importing_modes_does_not_import_torch():
    code = "import sys, ablations.modes; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_the_mode_chosen_is_the_one_the_tiny_bench_measured_fastest(tmp_path):
    """The done-when of precision auto-selection: it picks what the bench measured."""
    cmd = [sys.executable, "-m", "ablations.bench", "--tiny", "--threads", "1", "--device", "cpu", "--sections",
           "modes", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = load_table(tmp_path / "modes-cpu.json")
    assert table["device"] == "cpu" and {"cpu", "threads", "loadavg_start", "loadavg_end"} <= set(table["machine"])
    assert table["cells"]
    for c in table["cells"]:
        assert set(c["times_s"]) == set(modes.MODE_KEYS)
        fastest = min(c["times_s"], key=c["times_s"].get)
        mode = choose_mode("cpu", c["embed_dim"], c["tokens"], table=table)
        assert mode.key == fastest
        assert c["best"] == {"precision": mode.precision, "fused_attn": mode.fused_attn}
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["sections"]["modes"]["data"]["cells"][0]["times_s"] == table["cells"][0]["times_s"]
