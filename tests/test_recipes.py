"""Training recipes: the fields a recipe sets, how explicit values and study budgets layer over it, and that a run
trained with ``recipe: paper`` really has the recipe's pieces switched on (Mixup/CutMix with soft targets and
hard-label accuracy, RandAugment, colour jitter, random erasing, reflect padding, Adam)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import yaml

from ablations.config import RunConfig, layer
from ablations.recipes import RECIPE_FIELDS, RECIPES, AugmentConfig, describe
from ablations.studies.spec import available_studies, load_spec
from lit_modules.config import OptimConfig

# The settings every run had before recipes existed: ``basic`` must keep them, so stored studies reproduce.
PRE_RECIPE_DEFAULTS = {"label_smoothing": 0.1, "lr": 1e-3, "weight_decay": 0.05, "betas": (0.9, 0.999),
                       "warmup_epochs": 2.0, "min_lr": 0.0, "optimizer": "adamw", "crop_padding_mode": "constant",
                       "rand_augment_ops": 0, "color_jitter": (), "random_erasing": 0.0, "mixup_alpha": 0.0,
                       "cutmix_alpha": 0.0}
# The orthogonal-residual paper's ViT-S CIFAR-10 recipe, transcribed from its reference code as written there
# (github.com/BootsofLagrangian/ortho-residual at commit 511805e), not from ablations/recipes.py:
# - recipes/vit_s_cifar10.yaml, its keys and values verbatim:
REFERENCE_YAML = {"optimizer": "adam", "lr": 1.0e-3, "weight_decay": 0.0001, "warmup_epoch": 10,
                  "lr_scheduler_type": "cos", "use_mixup": True, "mixup_alpha": 0.8, "cutmix_alpha": 1.0,
                  "mixup_prob": 1.0, "label_smoothing": 0.1, "random_erase": 0.25, "randaugment_N": 9,
                  "randaugment_M": 5}
# - train_classifier.py's argparse defaults for what the YAML leaves unset (--cutmix_switch_prob, --adam_beta1/2);
#   its "cos" schedule is 0.5 * (1 + cos(pi * pct)) after warm-up, which ends at 0:
REFERENCE_ARG_DEFAULTS = {"cutmix_switch_prob": 0.5, "adam_beta1": 0.9, "adam_beta2": 0.999}
REFERENCE_FINAL_LR = 0.0
# - data_utils.py, cifar10 with a ViT: RandomCrop(32, padding=4, padding_mode="reflect"), RandomHorizontalFlip(),
#   RandAugment(num_ops=randaugment_N, magnitude=randaugment_M), ColorJitter(0.4, 0.4, 0.4, 0.1), ToTensor(),
#   RandomErasing(p=random_erase, ...):
REFERENCE_TRANSFORMS = {"padding_mode": "reflect", "color_jitter": (0.4, 0.4, 0.4, 0.1)}
# Our field for each of them (the names differ; the numbers must not):
PAPER = {"crop_padding_mode": REFERENCE_TRANSFORMS["padding_mode"],
         "rand_augment_ops": REFERENCE_YAML["randaugment_N"], "rand_augment_magnitude": REFERENCE_YAML["randaugment_M"],
         "color_jitter": REFERENCE_TRANSFORMS["color_jitter"], "random_erasing": REFERENCE_YAML["random_erase"],
         "mixup_alpha": REFERENCE_YAML["mixup_alpha"], "cutmix_alpha": REFERENCE_YAML["cutmix_alpha"],
         "mixup_prob": REFERENCE_YAML["mixup_prob"], "mixup_switch_prob": REFERENCE_ARG_DEFAULTS["cutmix_switch_prob"],
         "label_smoothing": REFERENCE_YAML["label_smoothing"], "optimizer": REFERENCE_YAML["optimizer"],
         "lr": REFERENCE_YAML["lr"], "weight_decay": REFERENCE_YAML["weight_decay"],
         "betas": (REFERENCE_ARG_DEFAULTS["adam_beta1"], REFERENCE_ARG_DEFAULTS["adam_beta2"]),
         "warmup_epochs": float(REFERENCE_YAML["warmup_epoch"]), "min_lr": REFERENCE_FINAL_LR}


def test_basic_recipe_is_the_pre_recipe_default_and_paper_is_the_published_recipe():
    basic = RunConfig()
    assert basic.recipe == "basic" and not basic.mixes
    assert {k: getattr(basic, k) for k in PRE_RECIPE_DEFAULTS} == PRE_RECIPE_DEFAULTS
    paper = RunConfig(recipe="paper")
    assert paper.recipe_values() == PAPER and paper.mixes
    # basic is the augmentation's and the optimiser's own defaults, stated there only; paper states every value
    assert RECIPES["basic"] == {} and basic.augmentation == AugmentConfig() and basic.optim == OptimConfig()
    assert set(RECIPES["paper"]) == set(RECIPE_FIELDS) == {*AugmentConfig.__dataclass_fields__,
                                                           *OptimConfig.__dataclass_fields__}


def test_explicit_fields_win_over_the_recipe_and_replace_resets_to_a_new_recipe():
    c = RunConfig(recipe="paper", lr=2e-3, mixup_alpha=0.0)
    assert (c.lr, c.mixup_alpha, c.cutmix_alpha, c.weight_decay) == (2e-3, 0.0, 1.0, 1e-4)
    assert c.mixes  # CutMix alone still mixes
    assert not RunConfig(recipe="paper", mixup_alpha=0.0, cutmix_alpha=0.0).mixes
    assert not RunConfig(recipe="paper", augment=False).mixes  # augment off: no input changes at all
    back = c.replace(recipe="basic")
    assert back.recipe_values() == RunConfig().recipe_values()  # every recipe field follows the new recipe
    assert c.replace(recipe="basic", lr=5e-4).lr == 5e-4
    assert c.replace(depth=8).lr == 2e-3  # other changes keep the resolved values
    assert RunConfig.from_dict(c.to_dict()) == c  # the stored config (resolved values) round-trips


@pytest.mark.parametrize("fields, message", [
    ({"recipe": "deit"}, "unknown recipe 'deit'; valid choices: basic, paper"),
    ({"optimizer": "sgd"}, "unknown optimizer 'sgd'; valid choices: adamw, adam"),
    ({"crop_padding_mode": "edge"}, "unknown crop_padding_mode 'edge'; valid choices: constant, reflect"),
    ({"color_jitter": (0.4, 0.4)}, "color_jitter must be empty, one or four non-negative numbers"),
    ({"color_jitter": (0.4, 0.4, 0.4, 0.7)}, "color_jitter's hue must be in [0, 0.5]"),
    ({"random_erasing": 1.5}, "random_erasing must be in [0, 1]"),
    ({"mixup_alpha": -1.0}, "mixup_alpha must be >= 0"),
    ({"rand_augment_magnitude": 31}, "rand_augment_magnitude must be in [0, 30]"),
])
def test_bad_recipe_values_are_one_line_errors(fields, message):
    with pytest.raises(ValueError) as info:
        RunConfig(**fields)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_color_jitter_shorthand():
    assert RunConfig(color_jitter=(0.3,)).color_jitter == (0.3, 0.3, 0.3, 0.0)
    assert RunConfig(recipe="paper", color_jitter=(0,)).color_jitter == ()  # zero: off


def test_a_budget_recipe_replaces_the_study_base_recipe_fields():
    default = load_spec("residual_variants")
    paper = load_spec("residual_variants", "paper")
    point = paper.grid()[0]
    config = paper.run_config(point)
    base_lr = default.base["lr"]  # the protocol's (ablations/studies/protocol/mnist5k.yaml)
    assert base_lr != PAPER["lr"] and default.run_config(default.grid()[0]).lr == base_lr  # its base's own lr ...
    assert config.recipe_values() == PAPER  # ... which the paper budget's recipe replaces
    assert (config.embed_dim, config.num_heads, config.max_epochs, config.batch_size) == (384, 6, 300, 1024)
    assert 6 in paper.axes["depth"]  # the published ViT-S depth: the baseline can be checked against 89.82
    # layering rule on its own: a later recipe drops earlier recipe fields, keeps the rest and its own values
    assert layer({"lr": 0.5, "depth": 3}, {"recipe": "paper"}) == {"depth": 3, "recipe": "paper"}
    assert layer({"lr": 0.5}, {"recipe": "paper", "lr": 0.1}) == {"lr": 0.1, "recipe": "paper"}
    assert layer({"lr": 0.5}, {"depth": 3}) == {"lr": 0.5, "depth": 3}
    # by the options' flat names, whichever way they are written; an options mapping merges key by key
    assert layer({"optim": {"lr": 0.5}}, {"optim.weight_decay": 0.1}) == {"lr": 0.5, "weight_decay": 0.1}
    assert layer({"dataset_options": {"num_samples": 64, "noise": 1}}, {"data": {"dataset_options": {"noise": 2}}}) \
        == {"dataset_options": {"num_samples": 64, "noise": 2}}


def test_every_study_paper_budget_uses_the_paper_recipe():

    for name in available_studies():
        spec = load_spec(name, "paper")
        point = spec.grid()[0] if spec.kind == "grid" else {"variant": spec.variants[0].label}
        assert spec.run_config(point).recipe == "paper", name


def test_describe_names_the_pieces_switched_on():
    text = describe(RunConfig(recipe="paper").recipe_values())
    for piece in ("RandAugment 9/5", "colour jitter 0.4/0.4/0.4/0.1", "random erasing 0.25", "Mixup 0.8 / CutMix 1",
                  "label smoothing 0.1", "adam lr 0.001 wd 0.0001"):
        assert piece in text
    assert "Mixup" not in describe(RunConfig().recipe_values())


def test_cli_recipe_overrides_a_config_file_recipe_fields(tmp_path):
    from ablations.train import build_parser, config_from_args

    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump({"lr": 0.01, "weight_decay": 0.3, "depth": 2}))
    args = build_parser().parse_args(["--config", str(saved), "--recipe", "paper", "--weight-decay", "0.2"])
    config = config_from_args(args)
    assert (config.lr, config.weight_decay, config.depth, config.mixup_alpha) == (1e-3, 0.2, 2, 0.8)


# --- the pieces, switched on in a real run --------------------------------------------------------------------------
TINY = dict(dataset="synthetic", dataset_options={"num_samples": 96, "img_size": 8, "num_classes": 4},
            embed_dim=16, num_heads=2, depth=1, batch_size=16, max_epochs=1, threads=1)


def test_paper_recipe_switches_on_every_piece_of_a_real_run(tmp_path):
    """Train one epoch with ``recipe: paper`` and read the run's recorded config back; the data module and the
    model of that config carry the recipe's augmentation, Mixup and optimizer."""
    from ablations.training import build_datamodule, build_model, run_training

    config = RunConfig(recipe="paper", **TINY)
    summary = run_training(config, log_dir=tmp_path, run_name="paper", enable_progress_bar=False)
    recorded = yaml.unsafe_load((tmp_path / "paper" / "hparams.yaml").read_text())  # Lightning writes tuples
    for name, value in PAPER.items():
        got = recorded[name]
        if isinstance(value, tuple):  # the flat config writes "0.4,0.4,0.4,0.1", the model's hparams a tuple
            got = tuple(float(v) for v in (got.split(",") if isinstance(got, str) else got) if v != "")
        assert got == value, name
    assert recorded["recipe"] == "paper"
    assert math.isfinite(summary["final_train_loss"]) and summary["epochs_completed"] == 1

    dm = build_datamodule(config)
    transform = dm.transform
    assert transform.padding_mode == "reflect" and transform.erasing is not None
    assert [type(op).__name__ for op in transform.pixel_ops] == ["BatchRandAugment", "BatchColorJitter"]
    model = build_model(config, dm)
    assert model.mixup is not None
    model.hparams.steps_per_epoch = 4  # the schedule without a Trainer
    assert type(model.configure_optimizers()["optimizer"]) is torch.optim.Adam

    basic = RunConfig(**TINY)
    dm_basic = build_datamodule(basic)
    assert dm_basic.transform.pixel_ops == [] and dm_basic.transform.erasing is None
    assert build_model(basic, dm_basic).mixup is None


def test_mixup_trains_on_soft_targets_and_measures_accuracy_on_hard_labels():
    from lit_modules.classifier import ViTClassifier

    mixup = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "prob": 1.0, "switch_prob": 0.5}
    model = ViTClassifier(img_size=8, patch_size=4, in_chans=3, num_classes=4, embed_dim=16, depth=1, num_heads=2,
                          label_smoothing=0.1, mixup=mixup, seed=3, steps_per_epoch=1)
    x = torch.randn(6, 3, 8, 8)
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    loss = model.training_step((x, y), batch_idx=5)
    # the same batch generator gives the same mixed images and soft targets: recompute the loss by hand
    mixed, targets = model.mixup(x, y, model.batch_generator(5))
    assert torch.allclose(targets.sum(1), torch.ones(6), atol=1e-6)
    assert targets.min() > 0  # label smoothing folded into the soft targets
    expected = -(targets * F.log_softmax(model(mixed), dim=-1)).sum(1).mean()
    assert torch.allclose(loss, expected, atol=1e-6)
    logits, labels, _ = model._train_batches[-1]
    assert labels.dtype == torch.int64 and torch.equal(labels, y)  # accuracy's targets: the hard labels
    model._update_train_metrics()
    assert model.train_acc.compute() == (logits.argmax(1) == y).float().mean()
    # a different batch index draws a different mix, the same one the same mix
    assert not torch.equal(model.mixup(x, y, model.batch_generator(6))[1], targets)
    assert torch.equal(model.mixup(x, y, model.batch_generator(5))[1], targets)


def test_the_default_learning_rate_is_the_basic_recipes_everywhere():
    """One default LR, declared in ``lit_modules.config.OptimConfig``: the basic recipe's, RunConfig's, the bench's
    timed step and ViTClassifier's own default (which has no ``lr`` argument of its own)."""
    import inspect

    from ablations.machine import timing
    from lit_modules.classifier import ViTClassifier
    from lit_modules.config import OptimConfig

    lr = OptimConfig().lr
    assert RunConfig().lr == RunConfig().optim.lr == lr
    assert (timing.LR, timing.WEIGHT_DECAY) == (lr, OptimConfig().weight_decay)
    assert "lr" not in inspect.signature(ViTClassifier).parameters
    assert ViTClassifier(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2).hparams.lr == lr
