"""Parameter-matched controls resolved per study point (``params_of``, :mod:`ablations.studies.matched`)."""

from __future__ import annotations

import pytest
from helpers import write_study

from ablations.studies.matched import param_count, ratio_for
from ablations.studies.spec import load_spec

HIGHWAY_AND_CONTROL = ({"label": "standard", "residual": "standard"}, {"label": "highway", "residual": "highway"},
                       {"label": "standard_params_matched_highway", "residual": "standard", "params_of": "highway"})


@pytest.mark.parametrize("dim", [8, 64, 100, 192, 384, 768])
def test_the_ratio_gives_exactly_the_hidden_width_the_blocks_build(dim):
    """Blocks build ``int(dim * mlp_ratio)`` hidden units: a ratio that rounds down would lose one."""
    for hidden in range(1, 8 * dim + 1):
        assert int(dim * ratio_for(hidden, dim)) == hidden


def test_the_control_matches_its_row_at_every_depth_and_width(tmp_path):
    """Highway's gates add parameters per block: the control's MLP width is solved at each point, so it stays the
    nearest whole hidden width to highway's count at depth 1 and 3 and at width 8 and 16 (one unit more or less is
    farther), while one fixed ratio would match one point only."""
    ratios = {}
    for dim in (8, 16):
        spec = load_spec(str(write_study(tmp_path / f"width{dim}.yaml", variants=HIGHWAY_AND_CONTROL,
                                         axes={"depth": [1, 3]}, base={"embed_dim": dim})))
        for depth in (1, 3):
            point = {"seed": 0, "depth": depth}
            config = spec.config_for(point | {"variant": "standard_params_matched_highway"})
            target = param_count(spec.config_for(point | {"variant": "highway"}))
            hidden = int(dim * config["mlp_ratio"])
            counts = {h: param_count(config | {"mlp_ratio": ratio_for(h, dim)}) for h in (hidden - 1, hidden, hidden + 1)}
            assert counts[hidden] == param_count(spec.config_for(point | {"variant": "standard_params_matched_highway"}))
            assert abs(counts[hidden] - target) <= min(abs(counts[h] - target) for h in counts)
            assert abs(counts[hidden] / target - 1) <= 0.01
            assert counts[hidden] > param_count(spec.config_for(point | {"variant": "standard"}))
            ratios[dim, depth] = config["mlp_ratio"]
    # the run config carries the resolved ratio (what a trial stores and trains)
    assert spec.run_config({"seed": 0, "depth": 3, "variant": "standard_params_matched_highway"}).mlp_ratio == \
        ratios[16, 3]


@pytest.mark.parametrize("control, fault", [
    ({"label": "c", "residual": "standard", "params_of": "nope"}, "params_of 'nope'"),
    ({"label": "c", "residual": "standard", "params_of": "c"}, "params_of 'c'"),
    ({"label": "c", "residual": "standard", "params_of": "highway", "overrides": {"mlp_ratio": 3.0}}, "sets no mlp_ratio"),
    ({"label": "c", "residual": "standard", "params_of": ["highway"]}, "params_of names the label"),
])
def test_a_bad_params_of_is_a_one_line_error_naming_the_valid_labels(tmp_path, control, fault):
    variants = (*HIGHWAY_AND_CONTROL[:2], control)
    with pytest.raises(ValueError) as err:
        load_spec(str(write_study(tmp_path / "bad.yaml", variants=variants)))
    message = str(err.value)
    assert fault in message and "\n" not in message
    if "valid labels" in message:
        assert "standard, highway" in message


def test_a_control_cannot_match_another_control(tmp_path):
    variants = (*HIGHWAY_AND_CONTROL, {"label": "c2", "residual": "standard", "params_of": HIGHWAY_AND_CONTROL[2]["label"]})
    with pytest.raises(ValueError, match="not itself matched; valid labels: standard, highway"):
        load_spec(str(write_study(tmp_path / "chain.yaml", variants=variants)))


def test_a_row_no_mlp_width_can_match_is_refused(tmp_path):
    """A target far beyond anything the MLP width can reach within 1% (here: fewer parameters than the control has
    with a one-unit MLP) is a one-line error naming both rows, not a silently unmatched control."""
    variants = ({"label": "big", "residual": "standard", "overrides": {"embed_dim": 4, "num_heads": 1}},
                {"label": "c", "residual": "standard", "params_of": "big"})
    spec = load_spec(str(write_study(tmp_path / "far.yaml", variants=variants)))
    with pytest.raises(ValueError, match="variant 'c' cannot match the parameter count of 'big'"):
        spec.config_for({"seed": 0, "variant": "c"})
