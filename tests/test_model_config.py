"""The backbone's fields and defaults are declared once (``lit_modules.config.ViTConfig``), the optimiser's too
(``OptimConfig``): every consumer's view of them is compared with that declaration here, so a default restated
anywhere (the module signatures, ``RunConfig``, the recipes, costs, the GPU-hours estimate, the bench, the report)
fails this file when it drifts."""

from __future__ import annotations

import inspect

import pytest
import torch

from ablations.bench.harness import FULL
from ablations.bench.precision import AUTO_SIZES
from ablations.config import RunConfig
from ablations.costs import cost_table, measure
from ablations.machine.modes import model_size
from ablations.pricing.gpu_hours import forward_flops
from ablations.recipes import RECIPES
from ablations.report.load import Run
from ablations.report.model_tables import _backbone
from ablations.training import build_datamodule, build_model, datamodule_shape
from data import dataset_shape
from lit_modules import VisionTransformer
from lit_modules.classifier import ViTClassifier
from lit_modules.config import FIELDS, GEOMETRY, OPTIM_FIELDS, PRESETS, SIZE_FIELDS, OptimConfig, ViTConfig, preset

TINY = dict(img_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2)


def test_the_modules_take_their_defaults_from_the_one_declaration():
    """No backbone field has a default in ``VisionTransformer``'s or ``ViTClassifier``'s signature, and no
    optimiser field in ``ViTClassifier``'s: what they build with nothing given is ``ViTConfig()`` / ``OptimConfig()``."""
    for cls in (VisionTransformer, ViTClassifier):
        params = inspect.signature(cls.__init__).parameters
        assert not (set(params) & (set(FIELDS) | set(OPTIM_FIELDS)) - {"residual", "residual_options"}), cls
    torch.manual_seed(0)
    assert VisionTransformer().cfg == ViTConfig()
    module = ViTClassifier()
    assert module.model.cfg == ViTConfig()
    assert {k: module.hparams[k] for k in OPTIM_FIELDS} == OptimConfig().to_dict()
    # ViT-Tiny at 32 px, timm's sizes; an edit to the declaration shows up here and in docs/training.md's example
    assert (ViTConfig().embed_dim, ViTConfig().depth, ViTConfig().num_heads, ViTConfig().mlp_ratio) == (192, 12, 3, 4.0)
    assert OptimConfig().lr == 1e-3


def test_run_config_defaults_are_the_study_preset_and_the_basic_recipe_the_optimiser_defaults():
    run = RunConfig()
    study = PRESETS["study"]
    # the run's backbone is the study preset itself, its geometry left to the dataset
    assert isinstance(run.model, ViTConfig) and run.model == study.replace(**dict.fromkeys(GEOMETRY))
    assert (run.embed_dim, run.depth, run.num_heads, run.mlp_ratio) == (64, 4, 4, 2.0)
    assert RECIPES["basic"] == {} and run.optim == OptimConfig() and run.optim.to_dict()["lr"] == 1e-3


def test_the_geometry_is_resolved_once_and_every_consumer_prices_the_model_that_trains():
    """``RunConfig.model_config`` from the DataModule (training) and from ``data.dataset_shape`` (the trial's
    stored model, the GPU-hours estimate, the precision probe) is the same config, and it is the model
    ``build_model`` trains."""
    config = RunConfig(residual="layerscale", residual_options={"init_value": 0.1}, depth=2, embed_dim=16,
                       num_heads=2, patch_size=4, attention="re_attention", max_epochs=1)
    dm = build_datamodule(config)
    resolved = config.model_config(datamodule_shape(dm))
    assert resolved == config.model_config(dataset_shape(config))
    assert (resolved.img_size, resolved.in_chans, resolved.num_classes, resolved.patch_size) == (8, 1, 10, 4)
    torch.manual_seed(0)
    assert build_model(config, dm).model.cfg == resolved
    assert forward_flops(config) == measure(resolved)["flops"]
    assert model_size(config, 8, 4, 1, 10) == resolved.size()


def test_costs_bench_and_presets_derive_from_the_declaration():
    assert measure("standard", {}, **TINY) == measure(ViTConfig(**TINY))
    rows = cost_table(ViTConfig(**TINY), configs=[("standard", "standard", {}, {}),
                                                  ("ca", "standard", {}, {"class_attention_blocks": 1})])
    assert rows[0]["params"] == measure(ViTConfig(**TINY))["params"]
    assert rows[1]["params"] > rows[0]["params"]  # the backbone option is priced, not dropped
    assert FULL.vit(5) == ViTConfig(depth=5).size()
    assert set(ViTConfig().size()) == set(SIZE_FIELDS)
    assert AUTO_SIZES[0][1] == RunConfig().model_config(
        {"img_size": 28, "in_chans": 1, "num_classes": 10, "patch_size": 7}).size()  # mnist5k's study size
    assert preset("vit_small", depth=6).embed_dim == 384 and preset("vit_small", depth=6).depth == 6


def test_the_report_prices_the_model_the_trial_stored():
    stored = ViTConfig(residual="dca", class_attention_blocks=2, **TINY).to_dict()
    run = Run(number=0, state="complete", variant="dca", depth=3, seed=0, row="dca", summary={"model": stored},
              config={"embed_dim": 999})
    size = _backbone(run)
    assert size["class_attention_blocks"] == 2 and size["embed_dim"] == 16 and size["depth"] == 3  # the run's depth
    assert "residual" not in size and "residual_options" not in size


@pytest.mark.parametrize("call, message", [
    (lambda: VisionTransformer(width=3), "unknown backbone argument 'width'; valid arguments: residual, "),
    (lambda: ViTClassifier(width=3), "unknown argument 'width'; valid: the backbone's fields (residual, "),
    (lambda: preset("vit_huge"), "unknown preset 'vit_huge'; valid choices: vit_tiny, vit_small, vit_base, study"),
])
def test_unknown_fields_and_presets_name_the_valid_ones(call, message):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert str(info.value).startswith(message)


def test_a_checkpoint_of_the_earlier_flat_hyperparameters_still_builds():
    """``hparams.yaml`` of trials before the config: the classifier's flat arguments, without the four backbone
    fields it did not take (``qk_norm`` and the dropout rates): ``load_from_checkpoint`` passes them as keywords."""
    old = {"residual": "layerscale", "residual_options": {}, "img_size": 8, "patch_size": 4, "in_chans": 3,
           "num_classes": 4, "embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0, "qkv_bias": True,
           "class_token": True, "global_pool": "token", "drop_rate": 0.0, "drop_path_rate": 0.0,
           "norm_layer": "layernorm", "norm_eps": 1e-6, "attention": "self", "attention_options": {},
           "class_attention_blocks": 0, "value_residual": "none", "fused_attn": None, "lr": 2e-3,
           "weight_decay": 0.05, "betas": (0.9, 0.999), "warmup_epochs": 2.0, "min_lr": 0.0, "label_smoothing": 0.1,
           "max_epochs": 3, "steps_per_epoch": None, "optimizer": "adamw", "mixup": None, "seed": 0}
    module = ViTClassifier(**old)
    assert module.model.cfg == ViTConfig(**{k: v for k, v in old.items() if k in FIELDS})
    assert module.hparams.lr == 2e-3 and module.hparams.max_epochs == 3
    assert set(old) < set(module.hparams)  # and its own hparams.yaml lists every field


@pytest.mark.parametrize("args", ["a config", "a name and options", "keywords"])
def test_the_backbone_and_the_classifier_take_one_constructor_style(args):
    """``VisionTransformer`` and ``ViTClassifier`` are built the same three ways — from a ``ViTConfig``, from a
    residual name with its options and fields, or from keywords alone — and the same arguments give the same
    backbone (the classifier's ``model`` is the backbone those arguments build)."""
    cfg = ViTConfig(residual="layerscale", residual_options={"init_value": 0.1}, num_classes=4, **TINY)
    call = {"a config": ((cfg,), {}),
            "a name and options": (("layerscale", {"init_value": 0.1}), {"num_classes": 4, **TINY}),
            "keywords": ((), {"residual": "layerscale", "residual_options": {"init_value": 0.1}, "num_classes": 4,
                              **TINY})}[args]
    backbone = VisionTransformer(*call[0], **call[1])
    classifier = ViTClassifier(*call[0], **call[1])
    assert backbone.cfg == classifier.model.cfg == cfg
    assert backbone.residual_options == classifier.model.residual_options == {"init_value": 0.1}
