"""Tests for the backbone (lit_modules/vit.py): timm parity, retrofitting a timm checkpoint into every variant,
configuration errors and the fused/explicit attention switch. float64, CPU, tiny models."""

from __future__ import annotations

import re

import pytest
import timm.models.vision_transformer as timm_vit
import torch
from backbone import LAUREL, TINY, _float64_one_thread, build, tiny_laurel  # noqa: F401 (autouse fixture)

from lit_modules import RESIDUALS, LoadReport, VisionTransformer


def timm_model(seed: int = 0, **kw) -> timm_vit.VisionTransformer:
    """A timm ViT of the given config with every parameter moved off its init (so parity is not trivial)."""
    torch.manual_seed(seed)
    model = timm_vit.VisionTransformer(**kw)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def images(n: int = 2, size: int = 8, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g)


# ================================================================================================================
# timm parity

PARITY = dict(img_size=32, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=5)


@pytest.mark.parametrize("global_pool", ["token", "avg"])
@pytest.mark.parametrize("residual, options, timm_kw", [
    ("standard", {}, {}),
    ("layerscale", {"init_value": 1e-5}, {"init_values": 1e-5}),
])
def test_timm_state_dict_loads_strict_with_same_logits(residual, options, timm_kw, global_pool):
    ref = timm_model(**PARITY, global_pool=global_pool, **timm_kw)
    ours = VisionTransformer(residual, options, **PARITY, global_pool=global_pool).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    imgs = images(size=32)
    with torch.no_grad():
        out, want = ours(imgs), ref(imgs)
    assert out.shape == (2, 5)
    assert (out - want).abs().max().item() < 1e-6
    if residual == "layerscale":  # the loaded (perturbed) γ is really applied
        assert not torch.allclose(ours.blocks[0].ls1.gamma, torch.full((16,), 1e-5))


def test_timm_layerscale_checkpoint_does_not_fit_standard():
    ref = timm_model(**PARITY, init_values=1e-5)
    with pytest.raises(RuntimeError, match="ls1.gamma"):
        VisionTransformer("standard", **PARITY).load_state_dict(ref.state_dict(), strict=True)


# ================================================================================================================
# retrofit: load_pretrained


def _blocks(depth, *suffixes):
    return {f"blocks.{i}.{s}" for i in range(depth) for s in suffixes}


# residual, options, the keys the variant adds to the timm ViT (left at init when retrofitting), R-exact?
RETROFIT = {
    "standard": ("standard", {}, set(), True),
    "layerscale": ("layerscale", {"init_value": 1e-5}, _blocks(3, "ls1.gamma", "ls2.gamma"), False),
    "layerscale_none": ("layerscale", {"init_value": None}, set(), True),
    "rezero": ("rezero", {"norm": True}, _blocks(3, "ls1.alpha"), False),  # the default has no norms to load
    "skipinit": ("skipinit", {"norm": True}, _blocks(3, "ls1.alpha", "ls2.alpha"), False),
    "highway": ("highway", {}, _blocks(3, *(f"ls{s}.gate.{p}" for s in (1, 2) for p in ("weight", "bias"))), False),
    "laurel": ("laurel", LAUREL, _blocks(3, "res.mix.logits", "res.lr_down", "res.lr_up"), False),  # α, β = 0.99
    "laurel_raw": ("laurel", tiny_laurel({"rw_norm": "none"}), _blocks(3, "res.mix.logits", "res.lr_down", "res.lr_up"),
                   True),
    "laurel_pa_sub": ("laurel", tiny_laurel({"form": "rw_lr_pa", "granularity": "sublayer", "rw_norm": "none"}),
                      _blocks(3, *(f"ls{s}.{p}" for s in (1, 2) for p in ("mix.logits", "lr_down", "lr_up",
                                                                          "pa_gamma"))), True),
    "res_se": ("res_se", {"reduction": 2},
               _blocks(3, *(f"ls{s}.fc{j}.{p}" for s in (1, 2) for j in (1, 2) for p in ("weight", "bias"))), True),
    "dca": ("dca", {}, _blocks(3, "grn.b_delta", "grn.w") | {"stream.out.b_delta", "stream.out.w"}, True),
    "grn_v2_k1": ("dca", {"form": "grn_v2", "k": 1}, _blocks(3, "grn.b_delta") | {"stream.out.b_delta"}, True),
    "dca_seed": ("dca", {"form": "seed"}, _blocks(3, *(f"ls{s}.predictor.{j}.{p}" for s in (1, 2) for j in (0, 2)
                                                        for p in ("weight", "bias"))), False),
    "skipdense": ("skipdense", {}, set(), False),  # timm's names, no parameters of its own; dense sums differ
    # n = 4 streams summed before the final norm: the standard ViT up to that norm's ε; n = 1 exactly
    "hyper_connections": ("hyper_connections", {}, _blocks(3, *(f"ls{s}.{p}" for s in (1, 2) for p in (
        "a_m", "a_r", "b", "w_m", "w_r", "w_b", "s_alpha", "s_beta", "dyn_norm.weight", "dyn_norm.bias"))), False),
    "hyper_connections_n1": ("hyper_connections", {"n": 1, "dynamic": False},
                             _blocks(3, *(f"ls{s}.{p}" for s in (1, 2) for p in ("a_m", "a_r", "b"))), True),
    "mhc": ("mhc", {}, _blocks(3, *(f"ls{s}.{p}_{k}" for s in (1, 2) for p in ("phi", "b", "alpha")
                                    for k in ("pre", "post", "res"))), False),
    "denseformer": ("denseformer", {}, {f"stream.dwa.{i}.alpha" for i in range(3)}, True),  # α = identity rows
    # uniform weights: each layer reads the mean of its sources, the standard ViT only up to the norms' ε
    "attn_res": ("attn_res", {}, _blocks(3, *(f"{s}_res.{p}" for s in ("attn", "mlp")
                                              for p in ("query", "key_norm.weight")))
                 | {"stream.out.query", "stream.out.key_norm.weight"}, False),
    "ortho": ("ortho", {}, set(), False),  # timm's names, no parameters; the projection changes the function
    # post-LN: timm's pre-norm weights load into the post-norms norm1/norm2 by name (the function differs); the
    # default drops the final norm, so a timm checkpoint's norm.* loads only with final_norm=True
    "deepnorm": ("deepnorm", {"final_norm": True}, set(), False),
    # the normalisation family: every layout with timm's norm1/norm2 keys loads by name
    "post_ln": ("post_ln", {"final_norm": True}, set(), False),  # pre-norm weights into the post-norms
    "res_post_norm": ("res_post_norm", {}, set(), False),  # into the output norms (timm's ResPostBlock names)
    "peri_ln": ("peri_ln", {}, _blocks(3, *(f"ls{s}.norm.{p}" for s in (1, 2) for p in ("weight", "bias"))), False),
    "mix_ln": ("mix_ln", {}, set(), True),  # ⌊0.25·3⌋ = 0 post-LN blocks: the pre-LN ViT itself
    "mix_ln_post": ("mix_ln", {"alpha": 0.34}, set(), False),  # block 0 post-LN
    "ln_scaling": ("ln_scaling", {}, set(), False),
    "keel": ("keel", {"final_norm": True}, _blocks(3, *(f"ls{s}.post_norm.{p}" for s in (1, 2)
                                                        for p in ("weight", "bias")))
             - {"blocks.0.ls1.post_norm.weight", "blocks.0.ls1.post_norm.bias"}, False),
    # the 2025-26 frontier
    "gpas": ("gpas", {}, _blocks(3, "ls1.gate"), True),  # SiLU(0) = 0: pre-LN exactly
    "gpas_sublayer": ("gpas", {"gate": "sublayer"}, _blocks(3, "ls1.gate", "ls2.gate"), True),
    # timm's norm1/norm2 load into the input norms N_in; the post/y norms and the streams' final norms are new
    "siamese_norm": ("siamese_norm", {}, _blocks(3, *(f"ls{s}.{n}.{p}" for s in (1, 2) for n in ("post_norm", "y_norm")
                                                      for p in ("weight", "bias")))
                     | {f"stream.norm_{s}.{p}" for s in "xy" for p in ("weight", "bias")}, False),
    "deep_delta": ("deep_delta", {}, _blocks(3, *(f"ls{s}.{n}" for s in (1, 2)
                                                  for n in ("beta.weight", "beta.bias", "value.weight"))), False),
    # the streams' ends normalise each stream (no final norm): the timm checkpoint's norm.* loads with "sum"
    "mhc_lite": ("mhc_lite", {"stream_out": "sum"}, _blocks(3, *(f"ls{s}.{p}" for s in (1, 2) for p in (
        "gamma", "phi_pre", "phi_res", "phi_post", "b_pre", "b_res", "b_post", "alpha_pre", "alpha_res",
        "alpha_post"))), False),
    "kromhc": ("kromhc", {"stream_out": "sum"}, _blocks(3, *(f"ls{s}.{p}" for s in (1, 2) for p in (
        "gamma", "phi_pre", "phi_res", "phi_post", "b_pre", "b_res", "b_post", "alpha_pre", "alpha_res",
        "alpha_post"))), False),
    # R-exact: W₂ = 0 and B = 1 on the newest output; norm1_k, norm1_v are copied from norm1 (blocks 1, 2)
    "muddformer": ("muddformer", {}, {f"stream.dense.{i}.{p}" for i in range(3) for p in ("bias", "w1.weight",
                                                                                           "w2.weight")}, True),
}

# variants whose layout cannot hold a timm ViT checkpoint: the keys the error names first
NO_RETROFIT = {
    "resi_dual": "norm.bias",  # no final norm (the output ends in LN(x_d)), no option keeps one
    "ngpt": "blocks.0.attn.proj.bias",  # no norms and no biases anywhere
    "hybrid_norm": "blocks.0.norm1.bias",  # no norm before the attention (its q, k, v norms are per head)
}


@pytest.mark.parametrize("residual", ["rezero", "skipinit"])
def test_retrofit_into_normalisation_free_default_names_the_norm_keys(residual):
    """The papers' ReZero/SkipInit have no per-block LayerNorm: a timm checkpoint's norm1/norm2 cannot load."""
    with pytest.raises(ValueError, match=r"checkpoint keys not in residual '\w+' model: blocks\.0\.norm1\.bias"):
        build(residual).load_pretrained(timm_model(**TINY).state_dict())


def test_retrofit_cases_name_registered_variants():
    """The hand-written cases above add expected keys for the variants they name; every variant, named there or not,
    gets the checks derived from its own model below."""
    assert {v[0] for v in RETROFIT.values()} | set(NO_RETROFIT) <= set(RESIDUALS)


@pytest.mark.parametrize("residual", list(RESIDUALS))
def test_a_timm_checkpoint_loads_by_name_or_is_refused_naming_the_keys(residual):
    """Every registered variant at its default options, its expectations read from its own model: a timm checkpoint whose
    every key the model has (same name and shape) loads with every tensor copied, the model's other tensors either
    derived from a checkpoint key or left at their init; one with keys the model lacks is refused with a
    ValueError naming the first of them."""
    size = TINY | {"embed_dim": 16}  # wide enough for every variant's default options (LAuReL's rank 16)
    state = timm_model(**size).state_dict()
    model = build(residual, {}, seed=3, **size)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    unexpected = sorted(set(state) - set(init))
    if unexpected:
        with pytest.raises(ValueError, match=rf"checkpoint keys not in residual '{residual}' model: "
                                             rf"{re.escape(unexpected[0])}"):
            model.load_pretrained(state)
        return
    report = model.load_pretrained(state)
    assert report.loaded == sorted(state)
    assert set(report.new) | set(report.derived) == set(init) - set(state)
    assert not set(report.new) & set(report.derived)
    own = model.state_dict()
    for key in state:
        assert torch.equal(own[key], state[key]), key
    for key, src in report.derived.items():
        assert torch.equal(own[key], state[src]), key
    for key in report.new:
        assert torch.equal(own[key], init[key]), f"{key} should stay at its init"


@pytest.mark.parametrize("residual", list(NO_RETROFIT))
def test_retrofit_into_layouts_without_timm_keys_names_them(residual):
    with pytest.raises(ValueError, match=rf"checkpoint keys not in residual '{residual}' model: .*"
                                         rf"{re.escape(NO_RETROFIT[residual])}"):
        build(residual).load_pretrained(timm_model(**TINY).state_dict())


@pytest.mark.parametrize("case", list(RETROFIT))
def test_retrofit_timm_checkpoint(case):
    residual, options, new, r_exact = RETROFIT[case]
    ref = timm_model(**TINY)
    state = ref.state_dict()
    model = build(residual, options, seed=3).eval()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    report = model.load_pretrained(state)
    assert isinstance(report, LoadReport)
    assert report.loaded == sorted(state)
    assert report.new == sorted(new)
    derived = {}
    if residual == "dca" and options.get("form", "dca") == "dca":  # per-input norms copied from norm1
        derived = {f"blocks.{i}.norm1_{s}.{p}": f"blocks.{i}.norm1.{p}" for i in range(3) for s in "kv"
                   for p in ("weight", "bias")}
    if residual == "muddformer":  # the key and value norms of the multiway blocks (all but block 0)
        derived = {f"blocks.{i}.norm1_{s}.{p}": f"blocks.{i}.norm1.{p}" for i in (1, 2) for s in "kv"
                   for p in ("weight", "bias")}
    assert report.derived == derived
    own = model.state_dict()
    for key in state:
        assert torch.equal(own[key], state[key]), key
    for key, src in derived.items():
        assert torch.equal(own[key], state[src]), key
    for key in new:
        assert torch.equal(own[key], init[key]), f"{key} should stay at its init"
    if r_exact:  # retrofitting does not change the pretrained function
        imgs = images()
        with torch.no_grad():
            assert (model(imgs) - ref(imgs)).abs().max().item() < 1e-10


def test_retrofit_from_file(tmp_path):
    ref = timm_model(**TINY)
    imgs = images()
    with torch.no_grad():
        want = ref(imgs)
    path = tmp_path / "vit.pt"
    torch.save(ref.state_dict(), path)
    wrapped = tmp_path / "lightning.ckpt"
    torch.save({"state_dict": ref.state_dict(), "epoch": 3}, wrapped)
    for source in (path, str(path), wrapped):
        model = build("dca", seed=5).eval()
        report = model.load_pretrained(source)
        assert report.new == sorted(_blocks(3, "grn.b_delta", "grn.w") | {"stream.out.b_delta", "stream.out.w"})
        with torch.no_grad():
            assert (model(imgs) - want).abs().max().item() < 1e-10
    with pytest.raises(ValueError, match="does not exist"):
        build().load_pretrained(tmp_path / "missing.pt")


def test_unexpected_keys_raise_naming_them():
    layerscale = build("layerscale", {"init_value": 1e-5})
    with pytest.raises(ValueError) as err:
        build("standard").load_pretrained(layerscale.state_dict())
    assert "blocks.0.ls1.gamma" in str(err.value) and "'standard'" in str(err.value)
    dca = build("dca")
    with pytest.raises(ValueError, match=re.escape("blocks.0.grn.b_delta")):
        build("laurel", LAUREL).load_pretrained(dca.state_dict())


def test_shape_mismatch_raises():
    other = build("standard", embed_dim=12, num_heads=2)
    with pytest.raises(ValueError, match="shape"):
        build("standard").load_pretrained(other.state_dict())


# ================================================================================================================
# configuration errors


@pytest.mark.parametrize("kw, words", [
    ({"depth": 0}, ["depth", "positive", "0"]),
    ({"depth": -1}, ["depth", "positive", "-1"]),
    ({"embed_dim": 10, "num_heads": 3}, ["embed_dim=10", "num_heads=3", "divisible", "valid num_heads: 1, 2, 5, 10"]),
    ({"num_heads": 0}, ["num_heads", "positive"]),
    ({"img_size": 10, "patch_size": 4}, ["img_size=10", "patch_size=4"]),
    ({"global_pool": "max"}, ["global_pool", "token", "avg"]),
    ({"global_pool": "token", "class_token": False}, ["class_token"]),
    ({"drop_path_rate": 1.5}, ["drop_path_rate"]),
    ({"num_classes": -1}, ["num_classes"]),
])
def test_bad_config_raises(kw, words):
    with pytest.raises(ValueError) as err:
        build("standard", **kw)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_unknown_residual_lists_all_choices():
    with pytest.raises(ValueError) as err:
        build("resnet")
    msg = str(err.value)
    assert "'resnet'" in msg
    for name in ("standard", "layerscale", "rezero", "skipinit", "highway", "laurel", "res_se", "dca"):
        assert name in msg


def test_option_of_another_variant_names_its_owner():
    with pytest.raises(ValueError) as err:
        build("layerscale", {"rank": 4})
    assert "'rank'" in str(err.value) and "belongs to laurel" in str(err.value)


def test_avg_pool_without_class_token():
    model = build("standard", global_pool="avg", class_token=False).eval()
    assert model.cls_token is None and model.pos_embed.shape[1] == 4
    with torch.no_grad():
        assert model(images()).shape == (2, 3)


# ================================================================================================================
# fused vs explicit attention


@pytest.mark.parametrize("residual, options", [("standard", {}), ("dca", {}), ("laurel", LAUREL)])
def test_fused_attn_same_logits(residual, options):
    logits = []
    for fused in (True, False):
        torch.manual_seed(0)
        model = VisionTransformer(residual, options, **TINY, fused_attn=fused).eval()
        with torch.no_grad():
            for p in model.parameters():  # sharper attention than at init
                p.add_(0.3 * torch.randn_like(p))
        flags = [m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")]
        assert flags and all(f is fused for f in flags)
        with torch.no_grad():
            logits.append(model(images()))
    assert (logits[0] - logits[1]).abs().max().item() < 1e-10


def test_resolved_options_are_what_the_model_is_built_with_defaults_filled_in():
    """``resolved_options``: each swappable part's options checked, with the defaults the papers give filled in;
    a config that spells the defaults out resolves to the same form, one that changes one does not."""
    from lit_modules import resolved_options
    from lit_modules.config import ViTConfig

    cfg = ViTConfig.build("mhc_lite", **(TINY | {"depth": 2, "norm_layer": "dyt"}))
    form = resolved_options(cfg)
    assert form == {"residual": {"n": 4, "alpha_init": 0.01, "stream_out": "norm_each", "home": "random"},
                    "attention": {}, "norm": {"alpha_init": 0.5}, "parametrization": {"init": "timm"}}
    model = VisionTransformer(cfg)
    assert model.residual_options == form["residual"] and model.blocks[0].norm1.alpha.item() == 0.5
    spelled = ViTConfig.build("mhc_lite", form["residual"], **(TINY | {"depth": 2, "norm_layer": "dyt",
                                                                        "norm_options": form["norm"]}))
    assert resolved_options(spelled) == form
    assert resolved_options(ViTConfig.build("mhc_lite", {"home": "cyclic"}, **(TINY | {"depth": 2})))["residual"][
        "home"] == "cyclic"
    completep = resolved_options(ViTConfig.build("standard", **(TINY | {"parametrization": "completep"})))
    assert completep["parametrization"]["eps_scope"] == "blocks"  # CompleteP's Table 1: ε scaled in the blocks only
    with pytest.raises(ValueError, match="valid options"):
        resolved_options(ViTConfig.build("rezero", {"nope": 1}, **TINY))


def test_upgraded_form_fills_only_the_options_a_class_declares_added(monkeypatch):
    """``upgraded_form``: a recorded form (parsed or its JSON text) gets each option its part's class declares in
    ``added_options`` where the form lacks it, never over a recorded value, and only options the class has (CompleteP
    inherits the standard parametrisation's declaration of ``init``, which it has not); parts and kinds the
    registries do not know, and options no class declares, stay as recorded."""
    import json

    from lit_modules import RESIDUALS, upgraded_form

    recorded = {"residual": {"kind": "layerscale", "options": {"init_value": 0.1}},
                "parametrization": {"kind": "standard", "options": {}},
                "norm": {"kind": "no_such_norm", "options": {}}, "extra": 3}
    today = {**recorded, "parametrization": {"kind": "standard", "options": {"init": "timm"}}}
    assert upgraded_form(recorded) == today == upgraded_form(json.dumps(recorded))
    assert recorded["parametrization"]["options"] == {}  # the recorded form itself is not changed
    completep = {"parametrization": {"kind": "completep", "options": {"alpha": 1.0}}}
    assert upgraded_form(completep) == completep
    monkeypatch.setattr(RESIDUALS["layerscale"], "added_options", {"init_value": 1.0, "no_such_option": True})
    assert upgraded_form(recorded)["residual"] == recorded["residual"]  # the recorded value kept, no stranger added
    del recorded["residual"]["options"]["init_value"]
    assert upgraded_form(recorded)["residual"] == {"kind": "layerscale", "options": {"init_value": 1.0}}
    assert upgraded_form("[1, 2]") == [1, 2]


def test_megatron_init_scales_only_the_output_projections_and_is_refused_where_a_residual_inits_them():
    """``parametrization_options={"init": "megatron"}``: from the same seed, every block's ``attn.proj`` and
    ``mlp.fc2`` weights are timm's draw times 1/sqrt(2L) (std 0.02/sqrt(2L)) and every other parameter is
    unchanged; the default ``init="timm"`` is the model as before. Refused, one line, with DeepNorm and nGPT (their
    own init of those projections) and for CompleteP (not its option); a runs' form from before the option counts
    as ``init="timm"``."""
    from lit_modules import resolved_options, upgraded_form
    from lit_modules.config import ViTConfig

    size = TINY | {"depth": 3}
    models = {}
    for init in (None, "timm", "megatron"):
        torch.manual_seed(0)
        models[init] = VisionTransformer(ViTConfig.build(
            "hybrid_norm", **size, **({} if init is None else {"parametrization_options": {"init": init}})))
    base, timm, megatron = (dict(models[k].named_parameters()) for k in (None, "timm", "megatron"))
    outputs = {f"blocks.{i}.{name}.weight" for i in range(3) for name in ("attn.proj", "mlp.fc2")}
    assert all(torch.equal(base[n], timm[n]) for n in base)
    for name, p in base.items():
        if name in outputs:
            assert torch.allclose(megatron[name], p / 6 ** 0.5, rtol=0, atol=1e-8), name
        else:
            assert torch.equal(megatron[name], p), name
    for residual in ("deepnorm", "ngpt"):
        with pytest.raises(ValueError, match=f"does not apply to residual '{residual}'"):
            VisionTransformer(ViTConfig.build(residual, **size, parametrization_options={"init": "megatron"}))
    with pytest.raises(ValueError, match="valid: timm, megatron"):
        VisionTransformer(ViTConfig.build("standard", **size, parametrization_options={"init": "xavier"}))
    with pytest.raises(ValueError, match="option 'init' is not valid for parametrization 'completep'"):
        VisionTransformer(ViTConfig.build("standard", **size, parametrization="completep",
                                          parametrization_options={"init": "megatron"}))
    before = {"parametrization": {"kind": "standard", "options": {}}}
    assert upgraded_form(before)["parametrization"] == {"kind": "standard",
                                                         "options": resolved_options(models[None].cfg)[
                                                             "parametrization"]}
