"""The training engine (ablations.engine): K runs trained as one stack equal the same runs trained alone.

Every registered residual variant (and every option set that changes the parameter layout: ``costs.all_configs``)
either stacks — and then each slice's weights after N steps equal its run trained alone, step for step — or says in
one line why it trains as plain runs. The arithmetic is checked in float64, where the two differ only by the order
of floating-point sums; float32 adds rounding that Adam's normalisation can amplify (a gradient of ~1e-9 divided by
its own root mean square is ±1 either way), so the float64 check is the strict one.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from ablations.costs import all_configs
from ablations.engine.stack import StackedModel, custom_functions, has_vmap_rule, stack_reason
from ablations.engine.step import build_step, per_run_loss
from lit_modules import VisionTransformer
from lit_modules.classifier import ADAM_EPS, OPTIMIZER_CLASSES, WarmupCosine

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:.*gradient layout contract.*"),
              pytest.mark.filterwarnings("ignore:.*batching rule.*")]

SIZE = dict(img_size=8, patch_size=4, in_chans=3, num_classes=10, embed_dim=16, depth=4, num_heads=2, mlp_ratio=2.0)
#: three runs of one cell: two seeds, three learning rates (the largest makes Adam's steps big)
SEEDS, LRS, WEIGHT_DECAYS = (0, 1, 0), (1e-3, 4e-3, 2e-2), (0.05, 0.05, 0.0)
BATCH, STEPS, WARMUP, SMOOTHING = 6, 3, 2, 0.1
#: float64 agreement of a slice with its run alone. ATOL: a weight whose exact gradient is 0 (the attention's key
#: bias, which softmax cancels; an entry of mHC-lite's b_res at its init) gets a rounding-noise gradient g of ~1e-17
#: either way, which Adam turns into a step of ~lr·g/ε (~1e-11 at these rates) in either direction
RTOL, ATOL = 1e-9, 1e-10
#: the runs that cannot stack, and the Functions their one line must name
NO_VMAP_RULE = {"hyper_connections": ("StreamRead", "StreamWrite"), "mhc": ("SinkhornKnopp",),
                "attn_res": ("DepthAttention",), "mhc_lite": ("StreamProjection", "StreamRead", "StreamWrite"),
                "kromhc": ("StreamProjection", "StreamRead", "StreamWrite")}
BATCH_NORM = "re_attention (head_norm=batch)"  # its batch statistics would count the padding of a last batch
#: the backbone's options beyond those ``costs.all_configs`` prices: each other choice of a registered option on
#: the standard residual, and every dropout (their masks come from the global random stream: they fall back)
ENGINE_FORMS = (
    ("qk_norm=layernorm", "standard", {}, {"qk_norm": "layernorm"}),
    ("re_attention head_norm=layer theta_init=official blocks=top:2", "standard", {}, {
        "attention": "re_attention",
        "attention_options": {"head_norm": "layer", "theta_init": "official", "blocks": "top:2"}}),
    ("re_attention head_norm=none theta_init=randn", "standard", {}, {
        "attention": "re_attention", "attention_options": {"head_norm": "none", "theta_init": "randn"}}),
    ("global_pool=avg without a class token", "standard", {}, {"global_pool": "avg", "class_token": False}),
    ("qkv_bias=False", "standard", {}, {"qkv_bias": False}),
    ("completep with qk_norm and a headwise gate", "standard", {}, {
        "parametrization": "completep", "qk_norm": "rmsnorm", "attention_gate": "headwise"}),
    *((f"{field}=0.1", "standard", {}, {field: 0.1})
      for field in ("drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate")),
)
DROPOUT = "dropout / stochastic depth ("


def backbones(residual: str, options: dict, backbone: dict, dtype=torch.float64) -> list[VisionTransformer]:
    models = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        models.append(VisionTransformer(residual, dict(options), fused_attn=False, **SIZE, **backbone).to(dtype))
    return models


def batches(dtype=torch.float64) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """STEPS stacked batches (K, B, ...), each run its own images; the last has 5 real images and one padded."""
    g = torch.Generator().manual_seed(7)
    out = []
    for s in range(STEPS):
        x = torch.randn(len(SEEDS), BATCH, 3, 8, 8, generator=g, dtype=dtype)
        y = torch.randint(0, 10, (len(SEEDS), BATCH), generator=g)
        weight = torch.ones(len(SEEDS), BATCH, dtype=dtype)
        if s == STEPS - 1:
            weight[:, -1] = 0
            x[:, -1], y[:, -1] = 0, 0
        out.append((x, y, weight))
    return out


def train_alone(model: VisionTransformer, k: int, data) -> None:
    """Run k trained as its plain run trains it (ViTClassifier): label-smoothed cross-entropy on its real images,
    fused AdamW over the backbone's groups (a parametrisation's per-group learning rate and ε multipliers applied
    as ``configure_optimizers`` applies them), LambdaLR(WarmupCosine) stepped per step, the variant's projection."""
    groups = [g | {"lr": LRS[k] * g["lr_scale"]} if "lr_scale" in g else g
              for g in model.param_groups(WEIGHT_DECAYS[k])]
    groups = [g | {"eps": ADAM_EPS * g["eps_scale"]} if "eps_scale" in g else g for g in groups]
    optimizer = OPTIMIZER_CLASSES["adamw"](groups, lr=LRS[k], betas=(0.9, 0.999), eps=ADAM_EPS, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(WARMUP, STEPS))
    model.train()
    for x, y, weight in data:
        n = int(weight[k].sum())
        F.cross_entropy(model(x[k, :n]), y[k, :n], label_smoothing=SMOOTHING).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        model.project_parameters()


def train_stacked_step(models: list[VisionTransformer], data):
    step = build_step(models, optimizer="adamw", lrs=list(LRS), weight_decays=list(WEIGHT_DECAYS), betas=(0.9, 0.999),
                      schedules=[WarmupCosine(WARMUP, STEPS)] * len(SEEDS), total_steps=STEPS, precision="32-true",
                      label_smoothing=SMOOTHING, top5=True, sample=data[0][0][0, :2])
    for x, y, weight in data:
        step(x, y, y, weight)
    return step


FORMS = all_configs() + ENGINE_FORMS
#: the fast tier's forms: one of each way a stack's parameters and updates can differ from the plain run's — the
#: plain layout, a vmap-patched sum (DCA's GRN-v3, MUDDFormer's inverse RMS), a projection after each step (nGPT), a
#: parameter read across layers (ResFormer), CaiT's head, CompleteP's per-group multipliers — and each kind of
#: fallback (no vmap rule, BatchNorm, dropout); the slow tier sweeps every form
FAST_FORMS = ("standard", "dca grn_v3", "muddformer (default)", "ngpt (default)",
              "value_residual=learned (ResFormer)", "class_attention_blocks=2 (CaiT head)",
              "completep with qk_norm and a headwise gate", "hyper_connections (default)", BATCH_NORM,
              "drop_path_rate=0.1")
assert set(FAST_FORMS) <= {c[0] for c in FORMS}, set(FAST_FORMS) - {c[0] for c in FORMS}


def tiered(forms, fast) -> list:
    """``forms`` as pytest params: those labelled in ``fast`` in the fast tier, the others in the slow tier."""
    return [pytest.param(*c, id=c[0], marks=() if c[0] in fast else pytest.mark.slow) for c in forms]


@pytest.mark.parametrize("label,residual,options,backbone", tiered(FORMS, FAST_FORMS))
def test_each_slice_equals_its_run_trained_alone(label, residual, options, backbone):
    models = backbones(residual, options, backbone)
    alone = [copy.deepcopy(m) for m in models]
    data = batches()
    reason = stack_reason(models, data[0][0][0, :2])
    if reason is not None:  # trains as plain runs: one line that says why
        expected = (("BatchNorm (blocks.0.attn.reattn_norm",) if label == BATCH_NORM
                    else (DROPOUT,) if "drop" in label else NO_VMAP_RULE.get(residual))
        assert expected is not None, f"{label} unexpectedly does not stack: {reason}"
        assert "\n" not in reason and all(name in reason for name in expected), reason
        return
    assert residual not in NO_VMAP_RULE and label != BATCH_NORM and "drop" not in label
    step = train_stacked_step(models, data)
    assert step.active.all()
    for k, model in enumerate(alone):
        train_alone(model, k, data)
        stacked = dict(models[k].named_parameters())  # run k's row of the stack, as its own model
        for name, p in model.named_parameters():
            assert torch.allclose(stacked[name], p, rtol=RTOL, atol=ATOL), (label, k, name)
        assert not torch.equal(stacked["head.weight"], dict(alone[(k + 1) % 3].named_parameters())["head.weight"])


def test_every_registered_choice_has_a_form_here():
    """Each registered residual and each choice of a backbone option (its registry's names, the re-attention's
    options, the dropouts, the switches) is one of :data:`FORMS` (the other fields at their defaults): a choice
    added to a registry is checked stacked==alone or its fallback line, or this test names it."""
    from lit_modules import RESIDUALS
    from lit_modules.attention import ATTENTIONS, GATES, HEAD_NORMS, QK_NORMS, THETA_INITS
    from lit_modules.config import GLOBAL_POOLS, ViTConfig
    from lit_modules.parametrization import PARAMETRIZATIONS
    from lit_modules.value_residual import VALUE_RESIDUAL_NAMES
    from lit_modules.vit import NORM_LAYERS

    seen = set()
    for _, residual, _, backbone in FORMS:
        seen.add(("residual", residual))
        for field, value in backbone.items():
            if field == "attention_options":
                seen |= {(key, v) for key, v in value.items()}
            else:
                seen.add((field, value if isinstance(value, (str, bool)) else value > 0))
    defaults = ViTConfig()
    registered = {("residual", name) for name in RESIDUALS}
    for field, names in (("attention", ATTENTIONS), ("qk_norm", QK_NORMS), ("norm_layer", NORM_LAYERS),
                         ("parametrization", PARAMETRIZATIONS), ("attention_gate", GATES),
                         ("value_residual", VALUE_RESIDUAL_NAMES), ("global_pool", GLOBAL_POOLS)):
        registered |= {(field, name) for name in names if name != getattr(defaults, field)}
    # re-attention's defaults (head_norm batch, theta_init identity) are its BATCH_NORM form's
    registered |= {("head_norm", n) for n in HEAD_NORMS if n != "batch"}
    registered |= {("theta_init", t) for t in THETA_INITS if t != "identity"}
    registered |= {(field, True) for field in ("drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate",
                                               "drop_path_rate", "class_attention_blocks")}
    registered |= {("qkv_bias", False), ("class_token", False), ("blocks", "top:2")}
    assert registered <= seen, sorted(registered - seen)


ALONE = [c for c in all_configs() if c[1] in NO_VMAP_RULE]


@pytest.mark.parametrize("label,residual,options,backbone", tiered(ALONE, ("hyper_connections (default)",)))
def test_a_variant_without_a_vmap_rule_trains_alone_through_the_engine_as_its_run(label, residual, options, backbone):
    """On a GPU the trials of a cell that cannot stack train through the engine one at a time (a stack of one needs
    no vmap): that run equals its plain run too."""
    torch.manual_seed(2)
    model = VisionTransformer(residual, dict(options), fused_attn=False, **SIZE, **backbone).double()
    alone = copy.deepcopy(model)
    data = [(x[2:], y[2:], w[2:]) for x, y, w in batches()]  # the third run's batches: K = 1
    step = build_step([model], optimizer="adamw", lrs=[LRS[2]], weight_decays=[WEIGHT_DECAYS[2]], betas=(0.9, 0.999),
                      schedules=[WarmupCosine(WARMUP, STEPS)], total_steps=STEPS, precision="32-true",
                      label_smoothing=SMOOTHING, top5=True, sample=data[0][0][0, :2])
    for x, y, weight in data:
        step(x, y, y, weight)
    full = batches()  # train_alone reads run k's rows of the full batches: the same as data's one row
    train_alone(alone, 2, full)
    for name, p in alone.named_parameters():
        assert torch.allclose(dict(model.named_parameters())[name], p, rtol=RTOL, atol=ATOL), (label, name)


def test_the_headline_study_stacks_every_variant():
    """residual_variants' rows (the eight variants and the parameter-matched controls) all stack: the GPU run of the
    headline trains no plain run."""
    from ablations.studies.spec import load_spec

    spec = load_spec("residual_variants")
    for variant in spec.variants:
        config = spec.run_config({"variant": variant.label, "depth": 4, "seed": 0})
        models = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            models.append(VisionTransformer(config.residual, config.residual_options, fused_attn=False, **SIZE))
        assert stack_reason(models, torch.randn(2, 3, 8, 8)) is None, variant.label


def test_float32_slices_follow_their_runs_to_float32_rounding():
    """The same check in float32, as the runs train: the weights agree to a small fraction of the step size."""
    models = backbones("layerscale", {"init_value": "auto"}, {}, torch.float32)
    alone = [copy.deepcopy(m) for m in models]
    data = batches(torch.float32)
    train_stacked_step(models, data)
    for k, model in enumerate(alone):
        train_alone(model, k, data)
        worst = max((p - dict(models[k].named_parameters())[n]).abs().max().item() for n, p in model.named_parameters())
        assert worst < 0.05 * LRS[k], (k, worst)


def test_what_cannot_stack_says_why_in_one_line():
    torch.manual_seed(0)
    hc = [VisionTransformer("hyper_connections", {}, **SIZE) for _ in range(2)]
    reason = stack_reason(hc, torch.randn(2, 3, 8, 8))
    assert reason == "hand-written autograd Functions without a vmap rule (StreamRead, StreamWrite)"
    dropped = [VisionTransformer("standard", {}, drop_path_rate=0.1, **SIZE) for _ in range(2)]
    assert stack_reason(dropped, torch.randn(2, 3, 8, 8)).startswith("dropout / stochastic depth (blocks.1.drop_path")
    other = [VisionTransformer("standard", {}, **SIZE), VisionTransformer("standard", {}, **(SIZE | {"depth": 2}))]
    assert "other parameters" in stack_reason(other, torch.randn(2, 3, 8, 8))
    functions = custom_functions(hc[0], torch.randn(2, 3, 8, 8))
    assert {c.__name__ for c in functions} == {"StreamWrite", "StreamRead"}
    assert not any(has_vmap_rule(c) for c in functions)


def test_a_run_whose_loss_is_not_finite_takes_no_step_and_stops():
    """The plain run skips a step whose loss is not finite and stops: its slice's weights stay as they were, the
    others train on, and the step count it had is recorded."""
    models = backbones("standard", {}, {})
    step = build_step(models, optimizer="adamw", lrs=list(LRS), weight_decays=list(WEIGHT_DECAYS), betas=(0.9, 0.999),
                      schedules=[WarmupCosine(0, 10)] * 3, total_steps=10, precision="32-true",
                      label_smoothing=0.0, top5=False, sample=None)
    data = batches()
    step(*data[0][:2], data[0][1], data[0][2])
    before = [m.head.weight.detach().clone() for m in models]
    x, y, weight = data[1]
    x = x.clone()
    x[1, 0] = math.inf  # run 1's batch makes its loss NaN
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step(x, y, y, weight)
        step(*data[2][:2], data[2][1], data[2][2])
    assert step.active.tolist() == [True, False, True]
    assert step.diverged_at.tolist() == [-1, 1, -1]
    assert torch.equal(models[1].head.weight, before[1])
    assert not torch.equal(models[0].head.weight, before[0]) and torch.isfinite(models[0].head.weight).all()
    metrics = step.metrics.read()
    assert metrics["images"] == [6 + 6 + 5, 6, 6 + 6 + 5]  # run 1 counted only its first batch


def test_per_run_loss_of_a_padded_batch_is_the_mean_over_its_real_images():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(2, 5, 10, generator=g), torch.randint(0, 10, (2, 5), generator=g)
    weight = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.float32)
    loss = per_run_loss(logits, y, weight, 0.1)
    assert loss[0] == pytest.approx(F.cross_entropy(logits[0], y[0], label_smoothing=0.1).item(), rel=1e-6)
    assert loss[1] == pytest.approx(F.cross_entropy(logits[1, :3], y[1, :3], label_smoothing=0.1).item(), rel=1e-6)
    soft = torch.softmax(torch.randn(2, 5, 10, generator=g), -1)
    assert per_run_loss(logits, soft, weight, 0.0)[1] == pytest.approx(
        F.cross_entropy(logits[1, :3], soft[1, :3]).item(), rel=1e-6)


def test_each_run_model_is_a_view_of_its_row_of_the_stack():
    models = backbones("standard", {}, {}, torch.float32)
    stacked = StackedModel(models)
    with torch.no_grad():
        stacked.weights[1].add_(1.0)
    slot = next(s for s in stacked.slots if s.name == "head.bias")
    assert torch.equal(models[1].head.bias, stacked.weights[1, slot.start:slot.start + slot.numel])
    assert torch.equal(stacked.leaves["head.bias"][1], models[1].head.bias)
    assert models[1].head.bias.data_ptr() == stacked.weights[1, slot.start:].data_ptr()


# --- whole runs: train_stacked against run_training ---------------------------------------------------------------
TIMING = {"wall_time_s", "time_per_epoch_s", "train_images_per_s", "wall_time_this_process_s", "log_dir", "run_name",
          "malloc", "engine", "stack_size", "device", "resumed_checkpoint"}
TINY_RUN = dict(dataset="digits", embed_dim=16, num_heads=2, depth=1, max_epochs=3, batch_size=128,
                precision="32-true", threads=1, patch_size=4, fused_attn=False)


def close(a, b, rel: float = 2e-4) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-6)
    return a == b


def differences(plain: dict, stacked: dict, rel: float = 2e-4) -> dict:
    return {key: (plain.get(key), stacked.get(key)) for key in set(plain) | set(stacked)
            if key not in TIMING and not close(plain.get(key), stacked.get(key), rel)}


def test_stacked_runs_record_what_their_plain_runs_record(tmp_path):
    """Three runs of one cell (two seeds, three learning rates; the largest diverges in its second epoch) trained
    as one stack: each summary equals its run trained alone by Lightning (timings aside), the diverged run's too,
    and each TensorBoard folder has the same scalar tags at the same steps, diagnostics included."""
    from helpers import event_scalars

    from ablations.config import RunConfig
    from ablations.engine.loop import StackedRun, train_stacked
    from ablations.training import run_training
    from lit_modules.predictions import unpack

    configs = [RunConfig(**TINY_RUN, seed=seed, lr=lr, diagnostics_every=2)
               for seed, lr in ((0, 1e-3), (1, 4e-3), (0, 300.0))]
    specs = [StackedRun(c, f"run{k}", tmp_path / "stacked", checkpoint_dir=tmp_path / f"ckpt{k}")
             for k, c in enumerate(configs)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcomes = train_stacked(specs, results_dir=tmp_path, graph=False)
        plain = [run_training(c, log_dir=tmp_path / "plain", run_name=f"run{k}", enable_progress_bar=False,
                              enable_model_summary=False, results_dir=tmp_path) for k, c in enumerate(configs)]
    assert [o.status for o in outcomes] == ["completed"] * 3
    assert [s["diverged"] for s in plain] == [False, False, True] and plain[2]["epochs_completed"] == 1
    for k, (p, o) in enumerate(zip(plain, outcomes, strict=True)):
        # the diverging run's losses (~5e9 at lr 300) amplify float32 rounding: 4e-4 apart, where the others agree
        # to 1e-6
        assert differences(p, o.summary, 2e-3 if k == 2 else 2e-5) == {}, k
        # the last validated epoch's per-image test results, packed as the plain run packs them (the diverged run's:
        # its first epoch's); their mean is the summary's test accuracy
        assert o.summary["test_correct"] == p["test_correct"], k
        assert math.isclose(unpack(o.summary["test_correct"]).mean(), o.summary["test_acc"], rel_tol=1e-6), k
        assert o.summary["engine"] == "stacked 3" and o.summary["stack_size"] == 3
        lightning, ours = event_scalars(tmp_path / "plain" / f"run{k}"), event_scalars(tmp_path / "stacked" / f"run{k}")
        assert set(ours) == set(lightning), k
        for tag, points in lightning.items():
            assert [s for s, _ in ours[tag]] == [s for s, _ in points], (k, tag)
            if not tag.startswith("3_summary/") or tag.split("/")[1] not in TIMING:
                assert close([v for _, v in ours[tag]], [v for _, v in points], 2e-3), (k, tag)
        assert (tmp_path / f"ckpt{k}" / "last.engine.pt").is_file()
        import yaml

        hparams = [yaml.unsafe_load((tmp_path / kind / f"run{k}" / "hparams.yaml").read_text())
                   for kind in ("plain", "stacked")]
        assert hparams[0] == hparams[1], k  # the report reads a run's geometry from it


def test_an_interrupted_stack_resumes_from_its_checkpoints(tmp_path):
    """Stopped inside its third epoch (Ctrl-C), a stack records what each run trained (its summary and TensorBoard
    record, as a stopped plain run's), resumes from the checkpoints of its second and ends where an uninterrupted
    stack ends, each run saying where it resumed."""
    from helpers import event_scalars

    from ablations.config import RunConfig
    from ablations.engine.loop import StackedRun, train_stacked

    configs = [RunConfig(**TINY_RUN, seed=seed, lr=lr) for seed, lr in ((0, 2e-3), (1, 4e-3))]

    def specs(folder: str, resume: bool = False) -> list[StackedRun]:
        return [StackedRun(c, f"run{k}", tmp_path / folder, checkpoint_dir=tmp_path / folder / f"ckpt{k}",
                           resume=resume) for k, c in enumerate(configs)]

    def stop_in_third_epoch(k: int, epoch: int, value: float) -> bool:
        if epoch == 2:
            raise KeyboardInterrupt
        return False

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = train_stacked(specs("whole"), results_dir=tmp_path, graph=False)
        with pytest.raises(KeyboardInterrupt) as stopped:
            train_stacked(specs("cut"), results_dir=tmp_path, graph=False, on_epoch=stop_in_third_epoch)
        assert len(stopped.value.run_summaries) == 2  # what each had trained, for its trial's user attrs
        for k, summary in enumerate(stopped.value.run_summaries):  # written as a stopped plain run writes it
            assert summary["run_name"] == f"run{k}" and summary["epochs_completed"] in (2, 3)
            assert event_scalars(tmp_path / "cut" / f"run{k}")["3_summary/epochs_completed"] == [
                (summary["steps_this_process"], summary["epochs_completed"])]
        saved = [torch.load(tmp_path / "cut" / f"ckpt{k}" / "last.engine.pt", weights_only=False) for k in (0, 1)]
        assert [s["epoch"] for s in saved] == [2, 2]
        resumed = train_stacked(specs("cut", resume=True), results_dir=tmp_path, graph=False)
    for w, r in zip(whole, resumed, strict=True):
        assert differences(w.summary, r.summary).keys() <= {"resumed_from_checkpoint", "start_epoch",
                                                             "start_global_step", "epochs_this_process",
                                                             "steps_this_process", "images_this_process"}
        assert r.summary["resumed_from_checkpoint"] and r.summary["start_epoch"] == 2
        assert r.summary["epochs_this_process"] == 1 and r.summary["epochs_completed"] == 3
        assert r.summary["val_acc_curve"] == pytest.approx(w.summary["val_acc_curve"], rel=1e-6)


def test_larger_evaluation_batches_change_only_the_order_of_sums(tmp_path):
    """On a GPU the engine evaluates in batches of 1024 (fewer launches): the same validation and test curves as
    the run's own batch size, to float32 rounding."""
    from ablations.config import RunConfig
    from ablations.engine.loop import StackedRun, train_stacked

    configs = [RunConfig(**TINY_RUN, seed=seed, lr=3e-3) for seed in (0, 1)]
    curves = []
    for size in (None, 1000):
        specs = [StackedRun(c, f"run{k}", tmp_path / str(size)) for k, c in enumerate(configs)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            curves.append([o.summary for o in train_stacked(specs, results_dir=tmp_path, graph=False,
                                                            eval_batch_size=size)])
    for small, large in zip(*curves, strict=True):
        assert differences(small, large, 1e-5) == {}


def test_a_resident_epoch_is_the_loaders_epoch_bit_for_bit():
    """Crop (reflect padding) and flip drawn on index images and gathered on the device for a whole epoch give the
    loader's batches exactly, the last one padded."""
    import data
    from ablations.engine.data import resident_epoch
    from data.base import TrainAugment

    dm = data.build_datamodule("digits", batch_size=128, seed=3, train_augment=TrainAugment(crop_padding_mode="reflect"))
    dm.max_shift, dm.hflip = 2, True
    dm.setup("fit")
    loader = dm.train_dataloader()
    steps = len(loader)
    for epoch in (0, 1):
        x, y, counts = resident_epoch(loader, dm.transform, epoch, steps, 128)
        loader.sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            assert counts[i] == len(yb)
            assert torch.equal(x[i, :len(yb)], xb) and torch.equal(y[i, :len(yb)], yb)
            assert not x[i, len(yb):].any()
    assert counts[-1] < 128  # the last batch is smaller, and padded


# --- a study: its cells' trials as stacks, each its own trial -----------------------------------------------------
STANDARD, HC = {"label": "standard", "residual": "standard"}, {"label": "hc", "residual": "hyper_connections"}


@pytest.mark.parametrize("variants,budget,seeds", [
    pytest.param((STANDARD,), "smoke", 2, id="standard, smoke: 2 tuning seeds"),
    pytest.param((STANDARD, HC), "default", 3, id="standard and hc, default: 3 tuning seeds", marks=pytest.mark.slow)])
def test_a_study_trains_each_cell_as_a_stack_and_each_trial_as_its_own(tmp_path, variants, budget, seeds):
    """A grid with a tuning stage whose rates extend at the grid's edge, run once with --engine stacked and once
    plain: standard's tuning rates x seeds train as one stack, the rate added beyond the edge (the tuning axis a
    log-float over its bounds) as a stack of its seeds, its reported seeds as one stack; Hyper-Connections (no vmap
    rule; slow tier) as plain runs with one line saying why; every trial ends with the same objective value, user
    attrs (the per-image test results, and what the study's floor reads, among them) and intermediate values as the
    plain study's, and the seed aggregates are written after the stacked trials too."""
    import optuna
    from helpers import run_in_process, write_study

    from ablations.report.load import collect
    from ablations.studies.spec import TUNE_EXTRA, load_spec

    study = write_study(tmp_path / "stacks.yaml", variants=variants, metric="test_acc", axes={"seed": [0, 1]},
                        tune={"lr": [0.002, 0.004], "seeds": [100, 101, 102], "bounds": [0.001, 0.008],
                              "metric": "final_val_acc"},
                        budgets={"smoke": {"tune": {"seeds": [100, 101], "bounds": [0.001, 0.008]}}},
                        floor={"metric": "final_val_acc", "chance_multiple": 2}, base={"fused_attn": False})
    name = "stacks" if budget == "default" else f"stacks-{budget}"
    results = {}
    for engine in ("stacked", "plain"):
        url = f"sqlite:///{tmp_path / engine}.db"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            done = run_in_process("--study", study, "--budget", budget, "--storage", url, "--results-dir", tmp_path / engine,
                                  "--engine", engine, "--threads", "1", "--no-progress", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        results[engine] = (done, {(name, t.params["variant"], t.params["seed"], t.params.get("lr")): t
                                  for name in (name, f"{name}-tune")
                                  for t in optuna.load_study(study_name=name, storage=url).get_trials()})
        extra = optuna.load_study(study_name=name, storage=url).user_attrs[TUNE_EXTRA]
        # what the study's floor makes of each reported run (the report's reading of the same user attrs)
        data = collect(optuna.load_study(study_name=name, storage=url), load_spec(str(study), budget))
        results[engine] += (extra, sorted((r.row, r.seed, r.failed_training) for r in data.runs))
        # the seed aggregates (with standard alone, every trial of the stacked study ends inside the stacked
        # worker: its refresh wrote them)
        assert (tmp_path / engine / "runs" / name / "agg" / "standard").is_dir(), engine
    (done, stacked, extra, floors), (_, plain, plain_extra, plain_floors) = results["stacked"], results["plain"]
    assert floors == plain_floors and len(floors) == 2 * len(variants)
    if HC in variants:
        assert "engine: variant=hc trains as plain runs: hand-written autograd Functions without a vmap rule " \
               "(StreamRead, StreamWrite)" in done.stderr
    added = extra.get('["standard", []]', [])
    assert extra == plain_extra and added, extra  # two rates: the best is at an edge, inside the bounds: one more
    assert set(stacked) == set(plain)
    assert len(stacked) == len(variants) * (2 * seeds + 2) + seeds * sum(map(len, extra.values()))
    for key, trial in stacked.items():
        other = plain[key]
        assert trial.state == other.state == optuna.trial.TrialState.COMPLETE, key
        assert trial.value == pytest.approx(other.value, abs=1e-6), key
        for attr in ("run_name", "phase", "num_classes", "diverged", "test_correct"):
            assert trial.user_attrs[attr] == other.user_attrs[attr], (key, attr)
        for attr in ("val_acc_curve", "final_val_acc"):
            assert trial.user_attrs[attr] == pytest.approx(other.user_attrs[attr], abs=1e-6), (key, attr)
        engine = trial.user_attrs.get("engine")
        if key[1] == "standard":  # the grid's 2 rates x the seeds, then the added rate's seeds, then 2 seeds
            tuning = key[0].endswith("-tune")
            assert engine == (f"stacked {2 * seeds}" if tuning and key[3] in (0.002, 0.004)
                              else f"stacked {seeds}" if tuning else "stacked 2"), key
        else:
            assert engine is None, key  # trained by Lightning
        assert [t for t in trial.intermediate_values.values()] == pytest.approx(
            list(other.intermediate_values.values()), abs=1e-6)


def test_a_cpu_stacks_only_where_it_measured_the_stack_faster(tmp_path):
    """--engine auto on a CPU: measured once per cell and machine (cached with the CPU's signature), stacked only at
    <= 0.90x the plain step per trial; CUDA always stacks; a dry run never measures."""
    from ablations.engine.choice import MIN_GAIN, cache_path, choose

    calls = []

    def fake(ratio):
        def measure(cell):
            calls.append(cell)
            return {"plain_s": 0.01, "stacked_s": 0.04 * ratio, "per_trial_ratio": ratio}
        return measure

    cell = {"embed_dim": 64, "depth": 2, "k": 4, "precision": "32-true"}
    assert choose("auto", "cpu", cell, results_dir=tmp_path, measure=None).engine == "plain"
    slow = choose("auto", "cpu", cell, results_dir=tmp_path, measure=fake(0.95))
    assert slow.engine == "plain" and "0.95x" in slow.source and len(calls) == 1
    assert choose("auto", "cpu", cell, results_dir=tmp_path, measure=fake(0.5)).engine == "plain"  # the cached cell
    assert len(calls) == 1
    from ablations.machine.modes import cpu_signature

    assert cache_path(cpu_signature(), tmp_path).is_file()
    other = dict(cell, embed_dim=32)
    assert choose("auto", "cpu", other, results_dir=tmp_path, measure=fake(MIN_GAIN)).stacked
    assert choose("auto", "cuda").stacked and choose("plain", "cuda").engine == "plain"
    with pytest.raises(ValueError, match="unknown engine 'fast'; valid choices: auto, plain, stacked"):
        choose("fast", "cpu", cell)


def test_an_epochs_metrics_read_once_equal_the_per_batch_metrics():
    """The step sums each run's loss·images, top-1 and top-5 hits and images on the device; read once at the epoch's
    end they equal torchmetrics' per-batch updates (ViTClassifier's MeanMetric weighted by images, micro accuracy)."""
    from torchmetrics.aggregation import MeanMetric
    from torchmetrics.classification import MulticlassAccuracy

    from ablations.engine.step import Metrics, correct

    g = torch.Generator().manual_seed(3)
    metrics = Metrics(2, torch.device("cpu"), top5=True)
    plain = [(MeanMetric(), MulticlassAccuracy(10, top_k=1, average="micro"),
              MulticlassAccuracy(10, top_k=5, average="micro")) for _ in range(2)]
    for size in (8, 8, 5):
        logits, y = torch.randn(2, 8, 10, generator=g), torch.randint(0, 10, (2, 8), generator=g)
        weight = torch.zeros(2, 8)
        weight[:, :size] = 1
        loss = per_run_loss(logits, y, weight, 0.1)
        metrics.add(loss, correct(logits, y, weight, True), weight.sum(1), torch.ones(2, dtype=torch.bool))
        for k, (mean, top1, top5) in enumerate(plain):
            batch_loss = F.cross_entropy(logits[k, :size], y[k, :size], label_smoothing=0.1)
            mean.update(batch_loss, weight=size)
            top1.update(logits[k, :size], y[k, :size])
            top5.update(logits[k, :size], y[k, :size])
    read = metrics.read()
    for k, (mean, top1, top5) in enumerate(plain):
        assert read["loss"][k] == pytest.approx(mean.compute().item(), rel=1e-6)
        assert read["acc"][k] == pytest.approx(top1.compute().item(), abs=1e-7)
        assert read["acc_top5"][k] == pytest.approx(top5.compute().item(), abs=1e-7)
        assert read["images"][k] == 21


# --- CUDA ----------------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_captured_cuda_graph_replays_the_eager_step():
    """The whole stacked step captured once and replayed per batch trains the runs as the eager step does."""
    data = [tuple(t.cuda() for t in b) for b in batches(torch.float32)] * 3
    runs = []
    for graph in (False, True):
        models = [m.cuda() for m in backbones("standard", {}, {}, torch.float32)]
        step = build_step(models, optimizer="adamw", lrs=list(LRS), weight_decays=list(WEIGHT_DECAYS),
                          betas=(0.9, 0.999), schedules=[WarmupCosine(WARMUP, 20)] * 3, total_steps=20,
                          precision="bf16-mixed", label_smoothing=SMOOTHING, top5=True, sample=data[0][0][0, :2])
        for i, (x, y, weight) in enumerate(data):
            if graph and i == 0:
                step.capture(x, y, y, weight)
            (step.replay if graph else step.run)(x, y, y, weight)
        torch.cuda.synchronize()
        runs.append((step.stacked.weights.clone(), step.metrics.read(), step.optimizer.step_count.item()))
    (eager, eager_metrics, eager_steps), (replayed, replayed_metrics, replayed_steps) = runs
    assert eager_steps == replayed_steps == len(data)
    assert torch.allclose(eager, replayed, rtol=1e-5, atol=1e-6)
    assert replayed_metrics["images"] == eager_metrics["images"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_stack_on_cuda_records_what_it_records_on_the_cpu(tmp_path):
    """train_stacked on CUDA (graph replay, bf16 autocast as precision auto picks there) and with the eager step
    give the same epochs; and its summary says how it trained."""
    from ablations.config import RunConfig
    from ablations.engine.loop import StackedRun, train_stacked

    configs = [RunConfig(**(TINY_RUN | {"threads": None}), accelerator="gpu", seed=s, lr=2e-3) for s in (0, 1)]
    summaries = []
    for graph in (True, False):
        specs = [StackedRun(c, f"run{k}", tmp_path / str(graph)) for k, c in enumerate(configs)]
        summaries.append([o.summary for o in train_stacked(specs, results_dir=tmp_path, graph=graph)])
    for replayed, eager in zip(*summaries, strict=True):
        assert replayed["engine"] == "stacked 2 (CUDA graph)" and replayed["device"] == "cuda"
        assert replayed["val_acc_curve"] == pytest.approx(eager["val_acc_curve"], abs=2e-3)
        assert replayed["epochs_completed"] == eager["epochs_completed"] == 3


def test_train_cli_engine_runs_the_same_run(tmp_path):
    """``python -m ablations.train --engine stacked`` trains the run the plain loop trains (the engine's one-run
    stack); what it cannot train (an extra logger) falls back to the plain loop with one line."""
    import json

    from helpers import run_in_process

    from ablations.train import main

    args = ("--dataset", "digits", "--embed-dim", "16", "--num-heads", "2", "--depth", "1", "--max-epochs", "2",
            "--patch-size", "4", "--precision", "32-true", "--threads", "1", "--json", "--no-progress-bar")
    out = {}
    for engine in ("stacked", "plain"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            done = run_in_process(*args, "--engine", engine, "--log-dir", tmp_path / engine, cwd=tmp_path, main=main)
        assert done.returncode == 0, done.stderr[-2000:]
        out[engine] = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["stacked"]["engine"] == "stacked 1" and "engine" not in out["plain"]
    assert differences(out["plain"], out["stacked"], 1e-5) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        done = run_in_process(*args, "--engine", "stacked", "--logger", "csv", "--log-dir", tmp_path / "csv",
                              cwd=tmp_path, main=main)
    assert done.returncode == 0
    assert "engine: trains as a plain run: extra loggers (csv) are written by Lightning's loop" in done.stderr


def test_a_dry_run_prices_the_engine_from_a_measured_stacked_gpu_step(tmp_path):
    """The engine line: the study's trials cut into stacks per cell, each stack's steps at the measured stacked
    CUDA-graph call (smallest measured K >= the stack's, scaled by depth) or its arithmetic, whichever is longer."""
    import json

    from ablations.config import RunConfig
    from ablations.pricing.engine import engine_lines, find_engine_steps, stacks
    from ablations.pricing.gpu_hours import EVAL_STEP_SHARE, trial_batches

    configs = [RunConfig(dataset="digits", embed_dim=64, num_heads=4, depth=4, patch_size=4, seed=s, lr=lr,
                         max_epochs=2) for s in range(5) for lr in (1e-3,)]
    assert engine_lines(configs, "h200", tmp_path)[0].endswith("so not priced (scripts/gpu_measure.py measures "
                                                               "one: docs/gpu-engine.md)")
    report = {"meta": {"device": "cuda", "started": "2026-12-05 10:00:00", "machine": {"gpu": "NVIDIA H200"}},
              "sections": {"engine": {"error": None, "data": {"models": [{
                  "size": {"embed_dim": 64, "depth": 2, "img_size": 8, "patch_size": 4}, "batch": 128,
                  "times_s": {"plain": [0.01], "stacked 2 graph": [0.002, 0.002], "stacked 8 graph": [0.003] * 2}}]}}}}
    (tmp_path / "device" / "cuda" / "b").mkdir(parents=True)
    (tmp_path / "device" / "cuda" / "b" / "bench.json").write_text(json.dumps(report))
    (step,) = find_engine_steps(tmp_path)
    assert step.calls_s == {2: 0.002, 8: 0.003} and step.tokens == 5
    assert step.call_s(5, 4) == pytest.approx(0.003 * 4 / 2) and step.call_s(16, 2) == pytest.approx(0.006)
    assert [k for _, k in stacks(configs, 4)] == [4, 1]
    (line,) = engine_lines(configs, "h200", tmp_path, stack=4)
    train, evaluation = trial_batches(configs[0])
    expected = (train + EVAL_STEP_SHARE * evaluation) * (0.003 * 2 + 0.002 * 2)  # K=4 -> K=8's call, K=1 -> K=2's
    assert f"{expected / 3600:.3g} GPU-hours" in line and "2 of 2 stacks bound by launches" in line


@pytest.mark.slow  # two CLI processes, one stopped by SIGTERM mid-stack (~1-2 min on 2 cores)
def test_a_stack_stopped_by_sigterm_resumes_from_its_engine_checkpoints(tmp_path):
    """SIGTERM while a stack trains: its trials fail as stopped (their engine checkpoints kept), and the same
    command again retries them as one stack resuming from the epoch they had saved; every trial then completes with
    the whole curve, and says where it resumed (and no line says it restarts from scratch)."""
    import signal

    import optuna
    import torch
    from helpers import run_cli, signal_mid_trial, write_study

    epochs = 8
    study = write_study(tmp_path / "stopped.yaml", metric="test_acc", axes={"seed": [0, 1]},
                        base={"max_epochs": epochs, "dataset_options": {"num_samples": 512, "img_size": 8},
                              "fused_attn": False})
    args = ("--study", study, "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}", "--results-dir", tmp_path,
            "--engine", "stacked", "--no-progress", "--grace", "5")
    checkpoint = tmp_path / "runs" / "stopped" / "standard" / "depth=1" / "seed=0" / "checkpoints" / "last.engine.pt"

    def saved_mid_run() -> bool:
        try:
            return 1 <= torch.load(checkpoint, map_location="cpu", weights_only=False)["epoch"] < epochs - 2
        except Exception:  # noqa: BLE001 - missing or being written
            return False

    stopped = signal_mid_trial(args, tmp_path, saved_mid_run, signal.SIGTERM, "the stack saved an epoch")
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    # it says where it resumed, and not that it starts from scratch (Lightning's checkpoint is not the engine's)
    assert "resumed 2 runs from epoch" in again.stderr and "from scratch" not in again.stderr, again.stderr[-2000:]
    trials = optuna.load_study(study_name="stopped", storage=f"sqlite:///{tmp_path / 'db.sqlite'}").get_trials()
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 4  # two variants x two seeds
    retried = [t for t in done if t.user_attrs.get("retry_of") is not None]
    assert retried and all(t.user_attrs["resumed_from_checkpoint"] for t in retried)
    for t in retried:
        assert t.user_attrs["start_epoch"] >= 1 and t.user_attrs["epochs_completed"] == epochs
        assert t.user_attrs["epochs_this_process"] == epochs - t.user_attrs["start_epoch"]
        assert t.user_attrs["engine"].startswith("stacked")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_device_cuda_without_a_gpu_is_one_line(tmp_path):
    from helpers import assert_one_line_error, run_in_process

    from ablations.train import main as train_main

    for main, args in ((None, ("--study", "residual_variants", "--budget", "smoke", "--device", "cuda")),
                       (train_main, ("--device", "cuda", "--max-epochs", "1"))):
        done = run_in_process(*args, cwd=tmp_path, main=main)
        assert_one_line_error(done, "--device cuda, but torch sees no CUDA device", "valid choices here: auto, cpu")


def test_a_stage_s_last_trials_are_shared_among_the_workers_instead_of_one_stack_taking_them_all():
    """A worker's stack holds at most its share of the waiting trials among the command's --workers (rounded up):
    two workers split a stage's last three trials two and one, where one stack of three would leave a worker idle;
    one worker, or enough waiting trials, still fill a stack to --stack."""
    from types import SimpleNamespace

    import optuna

    from ablations.config import RunConfig
    from ablations.run.stacked import StackedWorker, stack_limit

    assert [stack_limit(w, 8, 2) for w in (60, 16, 9, 4, 3, 1)] == [8, 8, 5, 2, 2, 1]
    assert stack_limit(5, 32, 1) == 5 and stack_limit(0, 8, 2) == 1 and stack_limit(40, 8, 0) == 8

    def stacks(waiting: int, workers: int) -> list[int]:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study()
        for seed in range(waiting):
            study.enqueue_trial({"seed": seed, "lr": 0.002})
        objective = SimpleNamespace(config=lambda params: RunConfig(seed=params["seed"], lr=params["lr"]))
        worker = StackedWorker(study, objective, max_stack=8, workers=workers)
        sizes = []

        def train(trials):  # the stack's size, and each trial told as the engine tells it
            sizes.append(len(trials))
            for trial in trials:
                study.tell(trial, 0.5)

        worker._train = train
        worker.run()
        assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == waiting
        return sizes

    assert stacks(3, workers=2) == [2, 1]
    assert stacks(3, workers=1) == [3]
    assert stacks(17, workers=2) == [8, 5, 2, 1, 1]
