"""RunConfig: defaults, validation messages, conversions, the torch-free name tables, and CLI parsing into it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from ablations.cli import parse_value
from ablations.config import (
    ATTENTION_NAMES,
    DATASET_NAMES,
    INIT_VALUE_OPTIONS,
    NORM_LAYER_NAMES,
    OPTIONS,
    RESIDUAL_NAMES,
    RunConfig,
    option_name,
)
from ablations.train import build_parser, config_from_args
from lit_modules.config import OptimConfig

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_small_cpu_settings():
    c = RunConfig()
    assert (c.embed_dim, c.num_heads, c.mlp_ratio, c.lr, c.weight_decay, c.batch_size) == (64, 4, 2.0, 1e-3, 0.05, 128)
    assert (c.precision, c.devices, c.strategy, c.compile, c.diagnostics_every) == ("auto", 1, "auto", False, 0)
    assert c.patch_size is None and c.threads is None and c.label_smoothing == 0.1
    assert c.accuracy_thresholds == (0.5, 0.8, 0.9, 0.95)


@pytest.mark.parametrize(("changes", "message"), [
    ({"depth": 0}, "depth must be a positive integer, got 0"),
    ({"residual": "foo"}, "unknown residual 'foo'; valid choices: standard, layerscale"),
    ({"dataset": "foo"}, "unknown dataset 'foo'; valid choices: digits"),
    ({"lr": 0.0}, "lr must be > 0"),
    ({"lr": float("nan")}, "lr must be > 0"),
    ({"embed_dim": 30, "num_heads": 4}, "embed_dim=30 is not divisible by num_heads=4"),
    ({"drop_path_rate": 1.5}, "drop_path_rate must be in [0, 1]"),
    ({"val_fraction": 1.0}, "val_fraction must be in (0, 1)"),
    ({"label_smoothing": 1.0}, "label_smoothing must be in [0, 1)"),
    ({"betas": (0.9,)}, "betas must be two floats"),
    ({"accuracy_thresholds": (0.5, 1.5)}, "accuracy_thresholds must be in (0, 1]"),
    ({"precision": "8-bit"}, "unknown precision '8-bit'; valid choices: auto, 32-true"),
    ({"global_pool": "max"}, "unknown global_pool 'max'"),
    ({"depth": 2.5}, "depth must be an integer, got 2.5"),
    ({"depth": True}, "depth must be an integer, got True"),
    ({"max_epochs": 0}, "max_epochs must be a positive integer"),
    ({"threads": 0}, "threads must be a positive integer"),
    ({"devices": "many"}, "devices must be an integer or 'auto'"),
    ({"residual_options": {"bad key": 1}}, "residual_options key 'bad key' is not a valid option name"),
    ({"min_lr": 1.0}, "min_lr must be in [0, 0.001]"),
    ({"attention": "foo"}, "unknown attention 'foo'; valid choices: self, re_attention"),
    ({"norm_layer": "batchnorm"}, "unknown norm_layer 'batchnorm'; valid choices: layernorm, rmsnorm"),
    ({"norm_eps": 0.0}, "norm_eps must be > 0"),
    ({"class_attention_blocks": -1}, "class_attention_blocks must be an integer >= 0, got -1"),
    ({"class_attention_blocks": 2, "global_pool": "avg"},
     "class_attention_blocks > 0 needs class_token=True and global_pool='token'"),
    ({"mlp_ratio": 0.0}, "mlp_ratio must be > 0, got 0"),
    ({"attention_options": {"bad key": 1}}, "attention_options key 'bad key' is not a valid option name"),
    ({"value_residual": "on"}, "unknown value_residual 'on'; valid choices: none, fixed, learned"),
])
def test_invalid_values_raise_one_line_value_errors(changes, message):
    with pytest.raises(ValueError) as info:
        RunConfig(**changes)
    text = str(info.value)
    assert message in text and "\n" not in text


def test_coercion_and_immutability():
    c = RunConfig(lr=1, betas=[0.8, 0.99], residual_options=None, warmup_epochs="0.5")
    assert isinstance(c.lr, float) and c.betas == (0.8, 0.99) and c.residual_options == {}
    assert c.warmup_epochs == 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.depth = 3
    options = {"init_value": 1e-5}
    c = RunConfig(residual="layerscale", residual_options=options)
    options["init_value"] = 1.0  # the config holds its own copy
    assert c.residual_options == {"init_value": 1e-5}
    assert hash(c) == hash(RunConfig(residual="layerscale", residual_options={"init_value": 1e-5}))


def test_from_dict_to_dict_replace():
    c = RunConfig(residual="layerscale", residual_options={"init_value": "auto"}, depth=8, dataset="synthetic",
                  dataset_options={"num_samples": 64})
    assert RunConfig.from_dict(c.to_dict()) == c
    assert c.replace(depth=2).depth == 2 and c.depth == 8
    with pytest.raises(ValueError, match="depth must be a positive integer"):
        c.replace(depth=-1)
    with pytest.raises(ValueError, match="unknown config key 'dept'; valid keys: residual"):
        RunConfig.from_dict({"dept": 3})


def test_one_tree_read_by_flat_names_paths_and_subtrees():
    """The optimiser, model, data and trainer settings are the run's own subtrees: ``lr`` is ``optim.lr``, given by
    its flat name, its path, a nested mapping or a whole ``OptimConfig``, and ``to_dict`` (what a study stores) keeps
    the flat names while ``to_tree`` nests them."""
    c = RunConfig(lr=2e-3, **{"model.depth": 6}, trainer={"max_epochs": 3})
    assert c.optim.lr == c.lr == 2e-3 and c.model.depth == c.depth == 6 and c.trainer.max_epochs == 3
    assert isinstance(c.optim, OptimConfig) and c.optim == OptimConfig(lr=2e-3)
    assert RunConfig(optim=OptimConfig(lr=5e-4)).lr == 5e-4
    assert RunConfig(optim=OptimConfig(lr=5e-4), lr=1e-4).lr == 1e-4  # a leaf named on its own wins
    tree = c.to_tree()
    assert tree["optim"]["lr"] == 2e-3 and tree["model"]["depth"] == 6 and tree["recipe"] == "basic"
    assert RunConfig.from_dict(tree) == c and RunConfig.from_dict(c.to_dict()) == c
    assert len(c.to_dict()) == len(OPTIONS) == 59 and "optim" not in c.to_dict()
    assert c.replace(depth=8).optim is c.optim  # an unchanged subtree is passed on whole
    assert c.model.img_size is None and c.model_config(
        {"img_size": 8, "in_chans": 1, "num_classes": 10, "patch_size": 2}).img_size == 8  # the dataset's geometry
    with pytest.raises(ValueError, match="unknown config key 'optim.depth'"):
        RunConfig(optim={"depth": 3})


def test_every_default_is_declared_once():
    """A run's defaults are its subtrees' declarations: the backbone's the study preset's, the optimiser's
    ``OptimConfig()`` (the basic recipe), the data's ``data.DataConfig()``, whose defaults the DataModules take too,
    and the per-image augmentation's ``data.TrainAugment()``."""
    import inspect

    from data import DataConfig, TrainAugment
    from data.base import DataModuleBase
    from lit_modules.config import PRESETS

    c = RunConfig()
    assert c.optim == OptimConfig() and c.model.replace(**{k: getattr(PRESETS["study"], k) for k in (
        "img_size", "in_chans", "num_classes", "patch_size")}) == PRESETS["study"]
    assert c.data == DataConfig() and isinstance(c.augmentation, TrainAugment)
    assert {k: getattr(c.augmentation, k) for k in TrainAugment.__dataclass_fields__} == vars(TrainAugment())
    params = inspect.signature(DataModuleBase.__init__).parameters
    shared = [name for name in params if name in DataConfig.__dataclass_fields__]
    assert len(shared) == 6 and {name: params[name].default for name in shared} == {
        name: getattr(c.data, name) for name in shared}


def test_to_hparams_is_flat_scalars():
    c = RunConfig(residual="layerscale", residual_options={"init_value": None}, dataset="synthetic",
                  dataset_options={"num_samples": 64})
    hp = c.to_hparams()
    assert hp["residual"] == "layerscale" and hp["residual.init_value"] == "None"
    assert hp["dataset.num_samples"] == 64 and hp["patch_size"] == "None" and hp["data_dir"] == "None"
    assert hp["betas"] == "0.9,0.999" and hp["accuracy_thresholds"] == "0.5,0.8,0.9,0.95"
    assert "residual_options" not in hp and "dataset_options" not in hp
    assert all(isinstance(v, (int, float, str, bool)) for v in hp.values())
    assert c.run_name() == "layerscale-init_value=None_d4_w64_synthetic_s0"
    c = RunConfig(attention="re_attention", attention_options={"head_norm": "layer"}, class_attention_blocks=2,
                  norm_layer="rmsnorm")
    assert c.to_hparams()["attention.head_norm"] == "layer" and c.to_hparams()["class_attention_blocks"] == 2
    assert c.run_name() == "standard+re_attention-head_norm=layer+ca2+rmsnorm_d4_w64_digits_s0"


def test_backbone_defaults_are_todays_model():
    c = RunConfig()
    assert (c.attention, c.attention_options, c.class_attention_blocks) == ("self", {}, 0)
    assert (c.norm_layer, c.norm_eps, c.value_residual) == ("layernorm", 1e-6, "none")
    assert c.run_name() == "standard_d4_w64_digits_s0"


def test_name_tables_match_the_registries():
    """The CLI's names are the registries' own; every variant class in lit_modules/residual/ is registered."""
    import importlib
    import inspect

    import torch

    import data
    from data import DATASETS
    from lit_modules import RESIDUALS
    from lit_modules.attention import ATTENTIONS
    from lit_modules.residual import ResidualSite
    from lit_modules.vit import NORM_LAYERS

    assert RESIDUAL_NAMES == tuple(RESIDUALS) and ATTENTION_NAMES == tuple(ATTENTIONS)
    assert NORM_LAYER_NAMES == tuple(NORM_LAYERS)
    assert DATASET_NAMES == tuple(DATASETS) and all(cls.__name__ in data.__all__ for cls in DATASETS.values())
    assert sorted(data.__all__) == sorted(["DATASET_CLASSES", "DATASET_NAMES", *data._EXPORTS])  # the lazy exports
    from ablations.config import OPTIMIZERS
    from lit_modules.classifier import OPTIMIZER_CLASSES

    assert OPTIMIZERS == tuple(OPTIMIZER_CLASSES)
    assert OPTIMIZER_CLASSES == {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}  # the paths resolve
    for residual, option in INIT_VALUE_OPTIONS.items():
        assert option in RESIDUALS[residual].options(), (residual, option)
    for name, cls in RESIDUALS.items():  # variant ``name`` lives in residual/<name>.py
        assert cls.name == name and cls.__module__ == f"lit_modules.residual.{name}", (name, cls)
    for path in sorted((ROOT / "lit_modules" / "residual").glob("[!_]*.py")):  # discovered: new files must register
        module = importlib.import_module(f"lit_modules.residual.{path.stem}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, ResidualSite) and cls.__module__ == module.__name__ and cls.name:
                assert cls.name in RESIDUALS, (path.name, cls.__name__)
    for name, cls in ATTENTIONS.items():
        assert cls.name == name


def test_config_and_cli_modules_do_not_import_torch():
    code = ("import ablations.config, ablations.train, data, data.names, sys; "
            "print('torch' in sys.modules, 'lightning' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# --- CLI parsing (in-process; the end-to-end CLI runs are in test_training.py) -------------------------------------
def parse(*argv: str) -> RunConfig:
    return config_from_args(build_parser().parse_args(list(argv)))


@pytest.mark.parametrize(("text", "value"), [
    ("1e-5", 1e-5), ("0.1", 0.1), ("3", 3), ("None", None), ("null", None), ("true", True), ("auto", "auto"),
    ("[1, 2]", [1, 2]), ("rw_lr", "rw_lr"), ("-4", -4),
])
def test_parse_value(text, value):
    assert parse_value(text) == value and type(parse_value(text)) is type(value)


def test_cli_options_map_to_config():
    c = parse("--residual", "layerscale", "--depth", "12", "--init-value", "auto", "--dataset", "digits",
              "--max-epochs", "30", "--no-augment", "--betas", "0.9", "0.95", "--patch-size", "None",
              "--devices", "auto", "--dataset-option", "num_samples=64")
    assert c.residual_options == {"init_value": "auto"} and c.depth == 12 and c.max_epochs == 30
    assert c.augment is False and c.betas == (0.9, 0.95) and c.patch_size is None and c.devices == "auto"
    assert c.dataset_options == {"num_samples": 64}
    assert parse("--residual", "layerscale", "--init-value", "1e-5").residual_options == {"init_value": 1e-5}
    assert parse("--residual", "layerscale", "--init-value", "None").residual_options == {"init_value": None}
    assert parse("--residual", "rezero", "--init-value", "0.1").residual_options == {"init_value": 0.1}
    assert parse("--residual", "highway", "--init-value", "-2").residual_options == {"gate_bias": -2}
    c = parse("--residual", "laurel", "--residual-option", "form=lr", "--residual-option", "rank=8")
    assert c.residual_options == {"form": "lr", "rank": 8}
    c = parse("--attention", "re_attention", "--attention-option", "head_norm=layer", "--class-attention-blocks", "2",
              "--norm-layer", "rmsnorm", "--norm-eps", "1e-5")
    assert (c.attention, c.attention_options, c.class_attention_blocks) == ("re_attention", {"head_norm": "layer"}, 2)
    assert (c.norm_layer, c.norm_eps) == ("rmsnorm", 1e-5)
    assert parse() == RunConfig()  # no options: the RunConfig defaults


def test_help_lists_every_config_field_and_documents_it():
    text = build_parser().format_help()
    for leaf in OPTIONS.values():
        assert option_name(leaf) in text, leaf.name
    for flag in ("--init-value", "--residual-option", "--json", "--log-dir", "--run-name", "--resume"):
        assert flag in text
    for action in build_parser()._actions:
        assert action.help, action.option_strings


def test_config_file_then_cli_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("residual: layerscale\nresidual_options: {init_value: 1.0e-5}\ndepth: 3\nlr: 1e-3\n")
    c = parse("--config", str(path), "--depth", "5")
    assert (c.residual, c.residual_options, c.depth, c.lr) == ("layerscale", {"init_value": 1e-5}, 5, 1e-3)
    path.write_text("dept: 3\n")
    with pytest.raises(ValueError, match="unknown config key 'dept'"):
        parse("--config", str(path))


def test_a_study_files_learning_rate_reaches_adamw_through_fifteen_functions(tmp_path):
    """The path docs/architecture.md states: every project function that is handed a study file's rate (in its
    arguments, whole or inside a mapping or a config), from the file to torch's AdamW, traced call by call."""
    import torch

    import lit_modules.classifier  # noqa: F401  (imported before the trace: its import is no part of the path)
    from ablations import training
    from ablations.studies.spec import load_spec

    rate = 0.00123456
    study = tmp_path / "rate.yaml"
    study.write_text(f"name: rate\nkind: grid\nbase: {{dataset: synthetic, lr: {rate}, embed_dim: 32, depth: 2}}\n"
                     "variants: [{label: standard, residual: standard}]\naxes: {seed: [0]}\n")

    def holds(value: object, depth: int = 0) -> bool:
        if isinstance(value, float):
            return value == rate
        if depth > 4 or isinstance(value, (str, bytes)):
            return False
        if isinstance(value, dict):
            return any(holds(v, depth + 1) for v in value.values())
        if isinstance(value, (list, tuple)):
            return any(holds(v, depth + 1) for v in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return any(holds(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value))
        return False

    handed: list[tuple[str, str]] = []
    modules: dict[str, str | None] = {}  # a code object's file -> its module's path in the project (None: not ours)

    def module_of(filename: str) -> str | None:
        if filename not in modules:
            where = Path(filename).resolve()
            ours = where.is_relative_to(ROOT) and where.relative_to(ROOT).parts[0] in ("ablations", "lit_modules")
            modules[filename] = where.relative_to(ROOT).as_posix() if ours else None
        return modules[filename]

    def profile(frame, event, _arg):
        code = frame.f_code
        if event != "call":
            return
        if code.co_name == "__init__" and type(frame.f_locals.get("self")) is torch.optim.AdamW:
            handed.append(("torch", "AdamW"))
            return
        module = module_of(code.co_filename)
        if module is None:
            return
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        names += code.co_varnames[len(names):len(names) + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)]
        if any(holds(frame.f_locals.get(n)) for n in names if n not in ("self", "cls")):
            handed.append((module, code.co_qualname))

    class Shape:  # a set-up DataModule's geometry, as build_model reads it
        img_size, in_chans, num_classes, default_patch_size = 32, 3, 10, 4

    sys.setprofile(profile)
    try:
        spec = load_spec(str(study))
        model = training.build_model(spec.run_config(spec.grid()[0]), Shape())
        with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):  # the schedule wants the trainer
            model.configure_optimizers()  # the optimiser is built before it
    finally:
        sys.setprofile(None)

    calls = list(dict.fromkeys(handed))
    assert calls[-1] == ("torch", "AdamW")
    assert [c for c in calls if c[1] in ("_build", "layer", "RunConfig.__init__", "build_model",
                                         "ViTClassifier.__init__", "optimizer_groups")] == [
        ("ablations/studies/spec.py", "_build"), ("ablations/config/run_config.py", "layer"),
        ("ablations/config/run_config.py", "RunConfig.__init__"), ("ablations/training.py", "build_model"),
        ("lit_modules/classifier.py", "ViTClassifier.__init__"), ("lit_modules/classifier.py", "optimizer_groups")]
    assert len(calls) - 1 == 15, calls
    assert sorted({module for module, _ in calls[:-1]}) == [
        "ablations/config/run_config.py", "ablations/config/tree.py", "ablations/studies/spec.py",
        "ablations/training.py", "lit_modules/classifier.py", "lit_modules/config.py"]


def test_a_stored_run_names_the_same_residual_only_with_the_same_options():
    """``same_residual``: a stored config (``to_dict`` or a runs.csv row) with this run's residual and options, in any
    order, is the same residual; another option value, an option missing or another residual is not."""
    from ablations.config import RunConfig

    config = RunConfig(residual="layerscale", residual_options={"init_value": 1e-5, "learnable": True})
    assert config.same_residual(config.to_dict())
    assert config.same_residual({"residual": "layerscale", "residual_options": {"learnable": True, "init_value": 1e-5}})
    assert not config.same_residual({"residual": "layerscale", "residual_options": {"init_value": 1e-4,
                                                                                     "learnable": True}})
    assert not config.same_residual({"residual": "layerscale", "residual_options": {"init_value": 1e-5}})
    assert not config.same_residual({"residual": "rezero", "residual_options": {"init_value": 1e-5, "learnable": True}})
    assert RunConfig(residual="standard").same_residual({"residual": "standard"})  # no options stored: none given
