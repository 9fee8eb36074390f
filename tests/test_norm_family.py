"""The normalisation family: where the norm sits and what replaces it.

- ``post_ln`` (arXiv 1706.03762): x ← LN(x + F(x));
- ``res_post_norm`` (Swin-V2, arXiv 2111.09883): x ← x + LN(F(x));
- ``peri_ln`` (arXiv 2502.02732): x ← x + LN_out(F(LN_in x));
- ``mix_ln`` (arXiv 2412.13795): post-LN in the first ⌊αL⌋ blocks, pre-LN after;
- ``ln_scaling`` (arXiv 2502.05795): x ← x + F(LN(x)/√ℓ);
- ``keel`` (arXiv 2601.19895): x ← LN_out(α·x + F(LN_in x)), α = 2·depth, the first sublayer plain pre-LN;
- ``resi_dual`` (arXiv 2304.14802): post-LN stream x_a, dual stream x_d = x_0 + Σ F, output x_a + LN(x_d);
- ``ngpt`` (arXiv 2410.01131): h ← Norm(h + α(Norm(F(h)) − h)) on the unit sphere, weights renormalised after
  every optimiser step;
- ``norm_layer="dyt"`` (arXiv 2503.10622): γ·tanh(αx) + β; ``norm_layer="derf"`` (arXiv 2512.10938): γ·erf(αx + s) + β.

Formulas are checked against values computed by hand on 2- and 4-wide vectors (the LayerNorm of (1, 2, 3, 4) is
(−3, −1, 1, 3)/√5 = ±1.3416408, ±0.4472136; ε = 1e-6 moves the fifth decimal at most). float64, CPU, tiny models.
"""

from __future__ import annotations

import math
import re
from functools import partial

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from backbone import TINY, _float64_one_thread, build, perturb  # noqa: F401 (autouse fixture)
from torch import nn

from lit_modules import RESIDUALS, VisionTransformer
from lit_modules.blocks import DualStream, InnerDropBlock, PostNormBlock, ResPostBlock, ScaledNormBlock
from lit_modules.norms import DynamicErf, DynamicTanh
from lit_modules.residual.ngpt import NormalizedHead, QKNorm, unit

FAMILY = ("post_ln", "res_post_norm", "peri_ln", "mix_ln", "ln_scaling", "keel", "resi_dual", "ngpt")
LN_1234 = torch.tensor([-3.0, -1.0, 1.0, 3.0]) / math.sqrt(5.0)  # LayerNorm of (1, 2, 3, 4), unit gain, zero bias
WIDE4 = dict(img_size=8, patch_size=4, in_chans=3, num_classes=3, embed_dim=4, num_heads=1)


def images(n: int = 4, size: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def close(a: torch.Tensor, b, tol: float = 1e-5) -> bool:
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=0)


# ================================================================================================================
# registry, options


def test_family_is_registered_and_norm_layers_accepted():
    assert set(FAMILY) <= set(RESIDUALS)
    for name in FAMILY:
        assert RESIDUALS[name].name == name and RESIDUALS[name].paper
    assert isinstance(build(norm_layer="dyt").blocks[0].norm1, DynamicTanh)
    assert isinstance(build(norm_layer="derf").blocks[0].norm1, DynamicErf)


@pytest.mark.parametrize("residual, options, words", [
    ("mix_ln", {"alpha": 1.5}, ["alpha=1.5", "mix_ln", "[0, 1]"]),
    ("keel", {"alpha": -1.0}, ["alpha=-1.0", "keel", "'auto'"]),
    ("keel", {"final_norm": "yes"}, ["final_norm='yes'", "True, False"]),
    ("ngpt", {"alpha_init": "big"}, ["alpha_init='big'", "paper, inverse_depth"]),
    ("ngpt", {"pool_norm": 1}, ["pool_norm=1", "True, False"]),
    ("res_post_norm", {"init_value": "x"}, ["init_value='x'", "None or a float"]),
    ("post_ln", {"alpha": 2.0}, ["option 'alpha'", "valid options: final_norm"]),
    ("resi_dual", {"final_norm": True}, ["option 'final_norm'", "valid options: none"]),
])
def test_bad_options_are_one_line_errors(residual, options, words):
    with pytest.raises(ValueError) as err:
        build(residual, options)
    assert "\n" not in str(err.value)
    for word in words:
        assert word in str(err.value)


def test_unknown_norm_layer_names_the_choices():
    with pytest.raises(ValueError, match="unknown norm_layer 'tanh'; valid choices: layernorm, rmsnorm, dyt, derf, "
                                         "seednorm"):
        build(norm_layer="tanh")


# ================================================================================================================
# DyT and Derf


def test_dyt_by_hand():
    """γ·tanh(α x) + β with α = 0.5: tanh(0) = 0, tanh(1) = 0.7615942, tanh(−2) = −0.9640276."""
    dyt = DynamicTanh(3)
    assert dyt.alpha.item() == 0.5 and torch.equal(dyt.weight, torch.ones(3)) and torch.equal(dyt.bias, torch.zeros(3))
    with torch.no_grad():
        dyt.weight.copy_(torch.tensor([1.0, 2.0, -1.0]))
        dyt.bias.copy_(torch.tensor([0.0, 0.5, 1.0]))
    out = dyt(torch.tensor([[0.0, 2.0, -4.0]]))
    assert close(out, [[0.0, 2 * 0.7615942 + 0.5, 0.9640276 + 1.0]], 1e-6)


def test_derf_by_hand():
    """γ·erf(α x + s) + β with α = 0.5, s = 0.25: erf(0) = 0, erf(0.5) = 0.5204999, erf(1) = 0.8427008."""
    derf = DynamicErf(3)
    assert derf.alpha.item() == 0.5 and derf.shift.item() == 0.0
    with torch.no_grad():
        derf.shift.fill_(0.25)
        derf.weight.copy_(torch.tensor([1.0, 2.0, 3.0]))
        derf.bias.copy_(torch.tensor([0.1, 0.0, 0.0]))
    out = derf(torch.tensor([[-0.5, 0.5, 1.5]]))
    assert close(out, [[0.1, 2 * 0.5204999, 3 * 0.8427008]], 1e-6)


@pytest.mark.parametrize("norm_layer, cls", [("dyt", DynamicTanh), ("derf", DynamicErf)])
def test_norm_free_layer_replaces_every_layernorm_and_is_live(norm_layer, cls):
    model = build(norm_layer=norm_layer, global_pool="avg")
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    assert sum(isinstance(m, cls) for m in model.modules()) == 2 * TINY["depth"] + 1  # norm1, norm2 per block, fc_norm
    F.cross_entropy(model(images()), torch.tensor([0, 1, 2, 0])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert {"blocks.0.norm1.alpha"} <= {n for g in model.param_groups(0.05) if g["weight_decay"] == 0
                                         for n, p in model.named_parameters() if any(p is q for q in g["params"])}


@pytest.mark.parametrize("norm_layer, options, attrs", [
    ("dyt", {"alpha_init": 0.25}, {"alpha": 0.25}),
    ("derf", {"alpha_init": 0.8, "shift_init": 0.1}, {"alpha": 0.8, "shift": 0.1}),
])
def test_norm_options_reach_every_norm_of_the_model(norm_layer, options, attrs):
    """``norm_options`` are the norm layer's own arguments (the DyT paper's remedy for instability is a smaller α₀):
    every norm of the model — pre-norms, the final norm — starts from them."""
    model = build(norm_layer=norm_layer, norm_options=options, global_pool="avg")
    norms = [m for m in model.modules() if isinstance(m, (DynamicTanh, DynamicErf))]
    assert len(norms) == 2 * TINY["depth"] + 1
    for m in norms:
        for attr, value in attrs.items():
            assert getattr(m, attr).item() == pytest.approx(value)


def test_seednorm_groups_option():
    from lit_modules.norms import SeeDNorm

    model = build(norm_layer="seednorm", norm_options={"groups": 2})
    assert {m.groups for m in model.modules() if isinstance(m, SeeDNorm)} == {2}


@pytest.mark.parametrize("norm_layer, options, message", [
    ("dyt", {"alpha": 0.25}, "option 'alpha' is not valid for norm_layer 'dyt'; valid options: alpha_init"),
    ("derf", {"alpha_init": "small"}, "alpha_init='small' is not valid for norm_layer 'derf'; valid: a finite number"),
    ("seednorm", {"groups": 1.5}, "groups=1.5 is not valid for norm_layer 'seednorm'; valid: an integer >= 1"),
    ("seednorm", {"groups": 0}, "groups=0 is not valid for norm_layer 'seednorm'; valid: an integer >= 1"),
    ("seednorm", {"groups": 3}, "groups=3 is not valid for norm_layer 'seednorm' at width 8; valid: a divisor of 8 "
                                "(1, 2, 4, 8)"),
    ("layernorm", {"alpha_init": 0.5}, "option 'alpha_init' is not valid for norm_layer 'layernorm'; valid options: "
                                      "none"),
])
def test_bad_norm_options_are_one_line_errors(norm_layer, options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build(norm_layer=norm_layer, norm_options=options)


def test_norm_options_from_the_command_line_name_the_run():
    from ablations.config import RunConfig
    from ablations.train import build_parser, config_from_args

    config = config_from_args(build_parser().parse_args(["--norm-layer", "dyt", "--norm-option", "alpha_init=0.25"]))
    assert config.norm_options == {"alpha_init": 0.25}
    assert "+dyt-alpha_init=0.25_" in config.run_name()
    assert "norm.alpha_init" in config.to_hparams() and "norm.alpha_init" not in RunConfig().to_hparams()


# ================================================================================================================
# post_ln, mix_ln, resi_dual: the post-LN site


def test_post_ln_site_by_hand():
    """Δ = LN(x + f) − x: x = (1, 1, 1, 1), f = (0, 1, 2, 3) → LN(1, 2, 3, 4) − 1."""
    model = build("post_ln", **WIDE4)
    assert isinstance(model.blocks[0], PostNormBlock) and isinstance(model.norm, nn.Identity)
    site = model.blocks[0].ls1
    x, f = torch.ones(1, 1, 4), torch.tensor([[[0.0, 1.0, 2.0, 3.0]]])
    assert close(site(x, x, f), LN_1234 - 1.0)


def test_post_ln_is_deepnorm_with_alpha_one_and_timm_init():
    """The reference form: DeepNorm's block with α = 1, β = 1 and timm's init is exactly post-LN."""
    ours = perturb(build("post_ln"), scale=0.2).eval()
    ref = perturb(build("deepnorm", {"alpha": 1.0, "beta": 1.0, "init": "timm_scaled"}), scale=0.2).eval()
    assert ours.state_dict().keys() == ref.state_dict().keys()
    with torch.no_grad():
        assert torch.equal(ours(images()), ref(images()))


def test_mix_ln_places_post_ln_in_the_first_quarter():
    """⌊0.25·4⌋ = 1 post-LN block, then pre-LN; its post-LN site is post_ln's formula, the rest the standard's."""
    model = build("mix_ln", depth=4, **{k: v for k, v in WIDE4.items()})
    kinds = [type(b) for b in model.blocks]
    assert kinds[0] is PostNormBlock and all(k.__name__ == "Block" for k in kinds[1:])
    assert isinstance(model.norm, nn.LayerNorm)  # the last blocks are pre-LN: the final norm stays
    x, f = torch.ones(1, 1, 4), torch.tensor([[[0.0, 1.0, 2.0, 3.0]]])
    assert close(model.blocks[0].ls2(x, x, f), LN_1234 - 1.0)
    assert torch.equal(model.blocks[1].ls1(x, x, f), f)
    assert [type(b).__name__ for b in build("mix_ln", {"alpha": 0.5}, depth=4).blocks] == ["PostNormBlock"] * 2 + [
        "Block"] * 2


@pytest.mark.parametrize("options, reference, ref_options", [
    ({}, "standard", {}),  # ⌊0.25·3⌋ = 0: every block pre-LN, the standard ViT
    ({"alpha": 1.0}, "post_ln", {"final_norm": True}),  # every block post-LN, the final norm kept
])
def test_mix_ln_extremes_equal_their_reference_forms(options, reference, ref_options):
    ours, ref = perturb(build("mix_ln", options), scale=0.2).eval(), perturb(build(reference, ref_options),
                                                                             scale=0.2).eval()
    assert ours.state_dict().keys() == ref.state_dict().keys()
    with torch.no_grad():
        assert torch.equal(ours(images()), ref(images()))


def test_resi_dual_site_feeds_the_dual_stream_by_hand():
    """x_d ← x_d + f and Δ = LN(x + f) − x: x = x_d = (1, 1, 1, 1), f = (0, 1, 2, 3)."""
    site = build("resi_dual", **WIDE4).blocks[0].ls1
    x, f = torch.ones(1, 1, 4), torch.tensor([[[0.0, 1.0, 2.0, 3.0]]])
    history = [torch.ones(1, 1, 4)]
    assert close(site(x, x, f, history), LN_1234 - 1.0)
    assert close(history[0], [[[1.0, 2.0, 3.0, 4.0]]], 0)


class _FixedBlock(nn.Module):
    """Returns a fixed x_a and adds a fixed f into the dual stream."""

    def __init__(self, out: list[float], f: list[float]) -> None:
        super().__init__()
        self.out, self.f = torch.tensor(out), torch.tensor(f)

    def forward(self, x: torch.Tensor, history: list) -> torch.Tensor:
        history[0] = history[0] + self.f
        return self.out.expand_as(x)


def test_resi_dual_stream_output_by_hand():
    """output = x_a + LN(x_0 + Σ f): x_0 = 0, f = (1, 1, 1, 1) then (0, 1, 2, 3), x_a = (1, 0, 0, 0)."""
    stream = DualStream(4, nn.LayerNorm)
    blocks = nn.ModuleList([_FixedBlock([5.0, 5.0, 5.0, 5.0], [1.0] * 4), _FixedBlock([1.0, 0, 0, 0], [0, 1.0, 2.0, 3.0])])
    out = stream(torch.zeros(1, 1, 4), blocks)
    assert close(out, torch.tensor([1.0, 0, 0, 0]) + LN_1234)


def test_resi_dual_model_equals_its_two_streams():
    """The backbone's ResiDual: x_a from the post-LN blocks, plus the stream's LN of x_0 + every branch output."""
    model = perturb(build("resi_dual"), scale=0.2).eval()
    assert isinstance(model.norm, nn.Identity) and isinstance(model.stream, DualStream)
    branches = []
    for blk in model.blocks:
        for module in (blk.attn, blk.mlp):
            module.register_forward_hook(lambda m, a, out: branches.append(out))
    x0 = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model.stream(x0, model.blocks)
        x_a = x0
        for blk in model.blocks:
            x_a = blk(x_a, None)
        dual = x0 + sum(branches[: 2 * len(model.blocks)])
        norm = model.stream.norm
        want = x_a + F.layer_norm(dual, (8,), norm.weight, norm.bias, norm.eps)
    assert torch.allclose(out, want, atol=1e-12, rtol=0)


# ================================================================================================================
# res_post_norm, peri_ln, ln_scaling


def test_res_post_norm_site_by_hand_and_timm_parity():
    """Δ = LN(f) whatever x: f = (1, 2, 3, 4); the block equals timm's ResPostBlock with the same weights."""
    from timm.models.vision_transformer import ResPostBlock as TimmResPostBlock

    model = build("res_post_norm", {"init_value": 1.0}, **WIDE4)  # unit gain: Δ is the plain LN(f)
    blk = model.blocks[0]
    assert isinstance(blk, ResPostBlock) and isinstance(model.norm, nn.LayerNorm)
    assert close(blk.ls1(torch.full((1, 1, 4), 7.0), None, torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])), LN_1234)
    ours = perturb(build("res_post_norm"), scale=0.2).blocks[1].eval()
    ref = TimmResPostBlock(8, 2, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6)).eval()
    ref.load_state_dict({k: v for k, v in ours.state_dict().items()}, strict=True)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), atol=1e-12, rtol=0)


def test_res_post_norm_default_is_swin_v2s_official_init_every_block_the_identity():
    """The default init is Swin-V2's ``_init_respostnorm`` (microsoft/Swin-Transformer, timm's Swin-V2): the output
    norms' weight and bias zeroed, so Δ = 0 and every block is the identity at init. Checked against timm's own
    SwinTransformerV2 stage after its init, whose post-norms are the same two zero vectors."""
    from timm.models.swin_transformer_v2 import SwinTransformerV2

    ref = SwinTransformerV2(img_size=16, patch_size=4, embed_dim=8, depths=(2,), num_heads=(2,), window_size=4)
    ref_norms = [blk.norm1 for blk in ref.layers[0].blocks] + [blk.norm2 for blk in ref.layers[0].blocks]
    assert all(torch.equal(n.weight, torch.zeros(8)) and torch.equal(n.bias, torch.zeros(8)) for n in ref_norms)
    model = build("res_post_norm")
    for blk in model.blocks:
        for norm in (blk.norm1, blk.norm2):
            assert torch.equal(norm.weight, torch.zeros(8)) and torch.equal(norm.bias, torch.zeros(8))
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert all(torch.equal(blk(x), x) for blk in model.blocks)


def test_res_post_norm_unit_gain_adds_a_unit_variance_update_at_step_0():
    """``init_value=1.0`` (the norm layer's own gain): every block adds LN(F(x)), a unit-variance vector per token."""
    model = build("res_post_norm", {"init_value": 1.0})
    assert torch.equal(model.blocks[2].norm2.weight, torch.ones(8))
    x, f = torch.randn(2, 2, 5, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        delta = model.blocks[0].ls1(x, x, f, None)
    assert torch.allclose(delta.var(dim=-1, unbiased=False), torch.ones(2, 5), atol=1e-4)


def test_peri_ln_site_by_hand():
    """Δ = LN_out(f): f = (1, 2, 3, 4) → LN(f); the input norm is the block's norm1 (timm's name)."""
    model = build("peri_ln", **WIDE4)
    site = model.blocks[0].ls1
    assert isinstance(site.norm, nn.LayerNorm) and isinstance(model.blocks[0].norm1, nn.LayerNorm)
    assert close(site(torch.full((1, 1, 4), 9.0), None, torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])), LN_1234)
    assert isinstance(model.norm, nn.LayerNorm)


def test_peri_ln_block_reads_and_writes_normalised():
    model = perturb(build("peri_ln"), scale=0.2).eval()
    blk = model.blocks[1]
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        y = x + blk.ls1.norm(blk.attn(blk.norm1(x)))
        want = y + blk.ls2.norm(blk.mlp(blk.norm2(y)))
        assert torch.allclose(blk(x), want, atol=1e-12, rtol=0)


def test_peri_ln_embedding_norm_is_optional_and_normalises_the_embeddings_before_the_first_block():
    """The paper's optional y_0 = Norm(x_0): off by default (no norm_pre, timm's Identity); with
    ``embedding_norm=True`` a LayerNorm (gain 1, bias 0) over patches + position and class token, which the blocks
    read, learned and never weight-decayed."""
    plain = build("peri_ln")
    assert isinstance(plain.norm_pre, nn.Identity) and plain.residual_options == {"embedding_norm": False}
    model = perturb(build("peri_ln", {"embedding_norm": True}), scale=0.2).eval()
    assert isinstance(model.norm_pre, nn.LayerNorm)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters()) + 2 * 8
    undecayed = {id(p) for g in model.param_groups(0.05) if g["weight_decay"] == 0.0 for p in g["params"]}
    assert {id(model.norm_pre.weight), id(model.norm_pre.bias)} <= undecayed
    x = images()
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        model(x)
        tokens = torch.cat([model.cls_token.expand(4, -1, -1), model.patch_embed(x)], dim=1) + model.pos_embed
        want = F.layer_norm(tokens, (8,), model.norm_pre.weight, model.norm_pre.bias, eps=model.norm_pre.eps)
    assert torch.allclose(seen[0], want, atol=1e-12, rtol=0)
    fresh = build("peri_ln", {"embedding_norm": True})
    assert torch.equal(fresh.norm_pre.weight, torch.ones(8)) and torch.equal(fresh.norm_pre.bias, torch.zeros(8))
    with pytest.raises(ValueError, match=r"^embedding_norm='yes' is not valid for peri_ln; valid: True, False$"):
        build("peri_ln", {"embedding_norm": "yes"})


def test_ln_scaling_scales_by_inverse_sqrt_layer():
    """1/√ℓ, ℓ = 1..4: 1, 0.7071068, 0.5773503, 0.5; the branch of block 4 reads LN(1, 2, 3, 4)·0.5."""
    model = build("ln_scaling", depth=4, **WIDE4)
    assert all(isinstance(b, ScaledNormBlock) for b in model.blocks)
    assert [round(b.scale, 7) for b in model.blocks] == [1.0, 0.7071068, 0.5773503, 0.5]
    seen = []
    model.blocks[3].attn.register_forward_hook(lambda m, a, out: seen.append(a[0]))
    with torch.no_grad():
        model.blocks[3](torch.tensor([[[1.0, 2.0, 3.0, 4.0]]]))
    assert close(seen[0], 0.5 * LN_1234)


def test_ln_scaling_one_block_is_the_standard_vit():
    ours, ref = perturb(build("ln_scaling", depth=1), scale=0.2).eval(), perturb(build("standard", depth=1),
                                                                                 scale=0.2).eval()
    with torch.no_grad():
        assert torch.equal(ours(images()), ref(images()))


# ================================================================================================================
# keel


def test_keel_site_by_hand():
    """α = 2·depth = 4 (depth 2); x = (0.25, 0.5, 0.75, 1), f = (1, 1, 1, 1) → LN(α x + f) = LN(2, 3, 4, 5)
    = LN(1, 2, 3, 4); Δ = that − x. The network's first sublayer is plain: Δ = f."""
    model = build("keel", depth=2, **WIDE4)
    assert all(isinstance(b, InnerDropBlock) for b in model.blocks) and isinstance(model.norm, nn.Identity)
    first, site = model.blocks[0].ls1, model.blocks[0].ls2
    assert first.post_norm is None and site.alpha == 4.0 and model.blocks[1].ls1.post_norm is not None
    x, f = torch.tensor([[[0.25, 0.5, 0.75, 1.0]]]), torch.ones(1, 1, 4)
    assert close(site(x, None, f), LN_1234 - x)
    assert torch.equal(first(x, None, f), f)
    branch, skip = site.decompose(x, None, f)
    assert torch.allclose(branch + (skip - 1) * x, site(x, None, f), atol=1e-12, rtol=0)


def test_keel_block_by_hand():
    model = perturb(build("keel"), scale=0.2).eval()
    blk, alpha = model.blocks[1], 2.0 * TINY["depth"]
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        y = blk.ls1.post_norm(alpha * x + blk.attn(blk.norm1(x)))
        want = blk.ls2.post_norm(alpha * y + blk.mlp(blk.norm2(y)))
        assert torch.allclose(blk(x), want, atol=1e-12, rtol=0)
        first = model.blocks[0]
        y = x + first.attn(first.norm1(x))  # the first sublayer: plain pre-LN
        want = first.ls2.post_norm(alpha * y + first.mlp(first.norm2(y)))
        assert torch.allclose(first(x), want, atol=1e-12, rtol=0)


def test_keel_drop_path_drops_f_inside_the_output_norm():
    model = perturb(build("keel", drop_path_rate=1.0), scale=0.2).train()
    blk = model.blocks[2]  # drop rate 1.0 at the last block (timm's linear rule)
    x = torch.randn(2, 5, 8)
    alpha = 2.0 * TINY["depth"]
    y = blk.ls1.post_norm(alpha * x)
    assert torch.allclose(blk(x), blk.ls2.post_norm(alpha * y), atol=1e-12, rtol=0)


# ================================================================================================================
# ngpt


def test_ngpt_site_by_hand():
    """α = 0.05 at init (stored as 1/√D = 0.7071068); x = (1, 0), f = (0, 3): Norm(f) = (0, 1),
    z = (0.95, 0.05), ‖z‖ = √0.905 = 0.9513149, h' = (0.9986178, 0.0525588), Δ = h' − x."""
    model = build("ngpt", img_size=8, patch_size=4, num_classes=3, embed_dim=2, num_heads=1, depth=1)
    site = model.blocks[0].ls1
    assert close(site.alpha.param, [0.7071068] * 2, 1e-7) and close(site.alpha(), [0.05, 0.05], 1e-12)
    x, f = torch.tensor([[[1.0, 0.0]]]), torch.tensor([[[0.0, 3.0]]])
    assert close(site(x, x, f), [[[0.9986178 - 1.0, 0.0525588]]], 1e-7)
    branch, skip = site.decompose(x, x, f)
    assert close(skip, [[[0.95 / 0.9513149] * 2]], 1e-7)  # (1 − α)/‖z‖
    assert torch.allclose(branch + (skip - 1) * x, site(x, x, f), atol=1e-12, rtol=0)
    assert build("ngpt", {"alpha_init": "inverse_depth"}).blocks[0].ls1.alpha()[0].item() == pytest.approx(1 / 3)


def test_ngpt_qk_norm_and_head_by_hand():
    """q = (3, 4) → (0.6, 0.8)·s_qk·√d_k with d_k = 2: (0.8485281, 1.1313708). Head: rows (1, 0), (0, 1), s_z = 1,
    pooled h = (3, 4) → unit (0.6, 0.8) → logits (0.6, 0.8); without pool_norm (3, 4)."""
    qk = QKNorm(2, num_heads=1, model_dim=4)
    assert close(qk.s_qk(), [[[1.0, 1.0]]], 1e-12) and close(qk.s_qk.param, [[[0.5, 0.5]]], 1e-12)
    assert close(qk(torch.tensor([[[[3.0, 4.0]]]])), [[[[0.8485281, 1.1313708]]]], 1e-7)
    head = NormalizedHead(2, 2, pool_norm=True)
    with torch.no_grad():
        head.weight.copy_(torch.eye(2))
    assert close(head(torch.tensor([[3.0, 4.0]])), [[0.6, 0.8]], 1e-12)
    head.pool_norm = False
    assert close(head(torch.tensor([[3.0, 4.0]])), [[3.0, 4.0]], 1e-12)


def _unit_norm_errors(model: VisionTransformer) -> dict[str, float]:
    """max |‖v‖ − 1| over each normalised matrix's embedding-dimension vectors."""
    pairs = {"patch_embed.proj.weight": (model.patch_embed.proj.weight, 0), "pos_embed": (model.pos_embed, -1),
             "cls_token": (model.cls_token, -1), "head.weight": (model.head.weight, 1)}
    for i, blk in enumerate(model.blocks):
        pairs |= {f"blocks.{i}.attn.qkv.weight": (blk.attn.qkv.weight, 1),
                  f"blocks.{i}.attn.proj.weight": (blk.attn.proj.weight, 0),
                  f"blocks.{i}.mlp.fc1.weight": (blk.mlp.fc1.weight, 1),
                  f"blocks.{i}.mlp.fc2.weight": (blk.mlp.fc2.weight, 0)}
    return {k: (p.detach().norm(dim=d) - 1).abs().max().item() for k, (p, d) in pairs.items()}


def test_ngpt_is_on_the_sphere_at_init():
    model = build("ngpt")
    assert max(_unit_norm_errors(model).values()) < 1e-12
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    assert model.blocks[0].attn.qkv.bias is None and model.blocks[0].attn.proj.bias is None
    assert model.blocks[0].mlp.fc1.bias is None and model.head.bias is None
    states = []
    for blk in model.blocks:
        blk.register_forward_hook(lambda m, a, out: states.append(out))
    with torch.no_grad():
        model(images())
    for h in states:  # every hidden vector on the unit sphere
        assert torch.allclose(h.norm(dim=-1), torch.ones(h.shape[:-1]), atol=1e-12, rtol=0)


def test_ngpt_drop_path_keeps_the_sphere_and_drops_to_identity():
    model = perturb(build("ngpt", drop_path_rate=1.0), scale=0.1).train()
    x = unit(torch.randn(2, 5, 8))
    assert torch.allclose(model.blocks[2](x), x, atol=1e-12, rtol=0)  # rate 1.0: both sites dropped
    out = model.blocks[1](x)  # rate 0.5: kept samples renormalised
    assert torch.allclose(out.norm(dim=-1), torch.ones(2, 5), atol=1e-12, rtol=0)


def _tiny_config(residual: str, norm_layer: str = "layernorm"):
    from ablations.config import RunConfig

    return RunConfig(residual=residual, norm_layer=norm_layer, dataset="synthetic",
                     dataset_options={"num_samples": 64, "img_size": 8, "in_chans": 1, "num_classes": 4},
                     depth=2, embed_dim=8, num_heads=2, batch_size=32, max_epochs=1, warmup_epochs=0.0, lr=1e-2,
                     threads=1)


def _fit_steps(config, steps: int):
    from ablations.training import build_datamodule, build_model

    torch.set_default_dtype(torch.float32)  # the real training path: float32 data (the autouse fixture restores)
    dm = build_datamodule(config)
    module = build_model(config, dm)
    pl.seed_everything(0)
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0,
                         num_sanity_val_steps=0)
    before = {k: v.clone() for k, v in module.model.state_dict().items()}
    trainer.fit(module, datamodule=dm)
    return module, before


def test_ngpt_scales_are_never_weight_decayed():
    """Every nGPT scale (α, s_qk, s_u, s_z) is in the undecayed AdamW group: the reference decays none of them, and
    s_qk's (H, 1, d) shape would put it in the decayed group by timm's ndim rule alone; the matrices are decayed."""
    model = build("ngpt")
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)]: g["weight_decay"] for g in model.param_groups(0.05) for p in g["params"]}
    assert model.blocks[0].attn.q_norm.s_qk.param.ndim == 3
    scales = [n for n in decay if n.endswith(".param")]
    assert {n.split(".")[-2] for n in scales} == {"alpha", "s_qk", "s_u", "s_z"}
    assert all(decay[n] == 0.0 for n in scales), {n: decay[n] for n in scales if decay[n]}
    assert decay["blocks.0.attn.qkv.weight"] == 0.05 and decay["blocks.0.mlp.fc1.weight"] == 0.05


def test_ngpt_weights_are_unit_norm_after_an_optimiser_step():
    """The LightningModule's optimizer_step renormalises: after real AdamW steps (which move the weights off the
    sphere) every matrix is unit-norm again."""
    module, before = _fit_steps(_tiny_config("ngpt"), steps=2)
    model = module.model
    moved = (model.blocks[0].attn.qkv.weight.detach() - before["blocks.0.attn.qkv.weight"]).abs().max().item()
    assert moved > 1e-4  # the step changed the weights
    errors = _unit_norm_errors(model)
    assert max(errors.values()) < 1e-6, errors


def test_projection_is_a_no_op_for_other_variants():
    model = perturb(build("peri_ln"), scale=0.2)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.project_parameters()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


# ================================================================================================================
# every member: gradients reach every parameter, one training step runs


@pytest.mark.parametrize("residual, norm_layer", [(name, "layernorm") for name in FAMILY]
                         + [("standard", "dyt"), ("standard", "derf")])
@pytest.mark.parametrize("global_pool", ["token", "avg"])
def test_every_parameter_gets_a_gradient(residual, norm_layer, global_pool):
    model = perturb(build(residual, norm_layer=norm_layer, global_pool=global_pool, drop_path_rate=0.1), scale=0.1)
    out = model.train()(images())
    assert torch.isfinite(out).all()
    F.cross_entropy(out, torch.tensor([0, 1, 2, 0])).backward()
    for name, p in model.named_parameters():
        if name == "cls_token" and global_pool == "avg" and residual == "res_post_norm":
            continue
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("residual, norm_layer", [(name, "layernorm") for name in FAMILY]
                         + [("standard", "dyt"), ("standard", "derf")])
def test_trains_one_step(residual, norm_layer):
    module, before = _fit_steps(_tiny_config(residual, norm_layer), steps=1)
    after = module.model.state_dict()
    assert module.trainer.global_step == 1
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(v, after[k]) for k, v in before.items())
