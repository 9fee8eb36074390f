"""``create_model``: every registered variant in one line, every one of its options routed to it, the backbone's
fields beside them, and a wrong name a one-line error naming the valid ones."""

from __future__ import annotations

import inspect

import pytest
import torch

from lit_modules import RESIDUALS, VisionTransformer, create_model
from lit_modules.config import FIELDS

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = {"preset": "study", "depth": 2, "img_size": 8, "patch_size": 4, "num_classes": 3}


@pytest.mark.parametrize("name", list(RESIDUALS))
def test_every_variant_builds_in_one_line_and_takes_every_option_of_its_own(name):
    torch.manual_seed(0)
    model = create_model(name, **SMALL)
    assert isinstance(model, VisionTransformer) and model.cfg.residual == name
    assert (model.cfg.embed_dim, model.cfg.depth, model.cfg.img_size, model.cfg.num_classes) == (64, 2, 8, 3)
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 3)
    for option, parameter in RESIDUALS[name].options().items():  # each option reaches the variant's own checks
        assert option not in FIELDS
        try:
            built = create_model(name, **SMALL, **{option: parameter.default})
        except ValueError as exc:  # an option another form of the variant uses: refused by the variant itself
            assert f"option '{option}' does not apply to residual '{name}'" in str(exc)
            continue
        assert built.cfg.residual_options == {option: parameter.default}


def test_options_fields_and_presets_combine_as_timm_s_create_model_does():
    torch.manual_seed(0)
    model = create_model("layerscale", init_value=1e-4, preset="vit_small", depth=3, in_chans=1, img_size=16)
    assert (model.cfg.embed_dim, model.cfg.num_heads, model.cfg.depth, model.cfg.in_chans) == (384, 6, 3, 1)
    assert model.cfg.residual_options == {"init_value": 1e-4}
    default = create_model()
    assert default.cfg.residual == "standard" and (default.cfg.embed_dim, default.cfg.depth) == (192, 12)  # ViT-Tiny
    assert inspect.signature(create_model).parameters["pretrained"].default is False


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: create_model("layerscal"), ValueError, "unknown residual 'layerscal'; valid choices: standard, layerscale"),
    (lambda: create_model("standard", preset="vit_huge"), ValueError, "unknown preset 'vit_huge'; valid choices:"),
    (lambda: create_model("rezero", gate_bias=1.0), TypeError,
     "create_model('rezero') got an unknown argument 'gate_bias'; valid: the backbone's fields (residual,"),
    (lambda: create_model("standard", pretrained=True), ValueError, "no weights are downloaded; build the model, then "
     "model.load_pretrained(path)"),
    (lambda: create_model("layerscale", embed_dim=64, num_heads=5), ValueError, "embed_dim=64 is not divisible"),
])
def test_a_wrong_name_or_value_is_one_line(call, error, message):
    with pytest.raises(error) as caught:
        call()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_every_console_command_is_its_module_s_cli():
    """``pip install`` puts ``ablations-run``, ``-report``, ``-train`` and ``-bench`` on the PATH (pyproject's
    [project.scripts]); each names its module's ``main``, which answers ``--help`` under the command's own name."""
    import contextlib
    import importlib
    import io
    import sys
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    scripts = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"ablations-run": "ablations.run.cli:main", "ablations-report": "ablations.report.cli:main",
                       "ablations-train": "ablations.train:main", "ablations-bench": "ablations.bench.cli:main"}
    for command, target in scripts.items():
        module, function = target.split(":")
        out = io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
            mp.setattr(sys, "argv", [f"/venv/bin/{command}", "--help"])
            getattr(importlib.import_module(module), function)(["--help"])
        assert done.value.code == 0 and out.getvalue().startswith(f"usage: {command} "), command
