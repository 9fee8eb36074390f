"""The 2025-26 frontier designs against hand computation and their reference code's equations (float64, tiny models;
reference: docs/variants.md §21).

Each design: its paper's form by default (equal to the standard ViT at init where the paper says so), its formula
against values computed by hand (or with the reference code's equations, written out here), every parameter live at
step 0 or dead by design, weight decay, and its options. The checkpoint round trip and bf16 autocast run over the
whole registry (``test_checkpoints.py``, ``test_autocast.py``); the backbone options are listed there too.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from backbone import TINY, _float64_one_thread, assert_bad_options, build, perturb  # noqa: F401 (autouse fixture)
from torch import nn

from lit_modules import RESIDUALS, VisionTransformer
from lit_modules.residual.base import BlockArgs

X = [[1.0, -2.0, 0.5, 3.0], [-1.0, 0.25, 2.0, -0.5]]  # the stream x, 2 tokens of width 4
FB = [[0.5, 1.0, -1.0, 2.0], [3.0, -0.5, 0.25, 1.0]]  # the branch output f
U = [[0.2, -0.4, 1.0, -0.8], [0.6, 0.1, -1.2, 0.5]]  # the normalised input u


def T(rows) -> torch.Tensor:
    return torch.tensor([rows])


def images(n: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(seed))


def block_args(layer: int = 0, depth: int = 3, dim: int = 4, heads: int = 1) -> BlockArgs:
    return BlockArgs(dim=dim, num_heads=heads, mlp_ratio=2.0, qkv_bias=True, qk_norm=False, proj_drop=0.0,
                     attn_drop=0.0, drop_path=0.0, norm_layer=nn.LayerNorm, act_layer=nn.GELU, layer=layer,
                     depth=depth, num_prefix_tokens=1)


def sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def silu(v: float) -> float:
    return v * sig(v)


def logits_pair(residual: str, options: dict | None = None, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """(variant, standard) logits with the standard's (perturbed) weights loaded into the variant by name."""
    std = perturb(build("standard", **kw), scale=0.2).eval()
    var = build(residual, options, seed=1, **kw).eval()
    own = var.state_dict()
    var.load_state_dict({k: v for k, v in std.state_dict().items() if k in own}, strict=False)
    imgs = images()
    with torch.no_grad():
        return var(imgs), std(imgs)


def grads_at_init(model: VisionTransformer) -> dict[str, torch.Tensor]:
    F.cross_entropy(model.train()(images()), torch.tensor([0, 1, 2, 1])).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def assert_live(model: VisionTransformer, dead: tuple[str, ...] = ()) -> None:
    """Every parameter gets a non-zero gradient at step 0 except those whose name ends in one of ``dead`` (zero by
    design: asserted exactly zero)."""
    grads = grads_at_init(model)
    for name, g in grads.items():
        assert g is not None, f"{name} is not used by the forward pass"
        if name.endswith(dead):
            assert torch.all(g == 0), f"{name}: should be exactly zero at init (by design)"
        else:
            assert g.norm() > 0, f"{name}: zero gradient at init"
    assert all(any(n.endswith(d) for n in grads) for d in dead), "a dead-by-design suffix matches no parameter"


def decay_of(model: VisionTransformer) -> dict[str, float]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    wd = {by_id[id(p)]: g["weight_decay"] for g in model.param_groups(0.05) for p in g["params"]}
    assert set(wd) == set(by_id.values())
    return wd


def test_frontier_variants_are_registered_with_their_papers():
    for name in ("gpas", "siamese_norm", "deep_delta", "mhc_lite", "kromhc", "muddformer", "hybrid_norm"):
        assert RESIDUALS[name].name == name and "arXiv" in RESIDUALS[name].paper


# ================================================================================================================
# GPAS (arXiv 2506.22049): x ← h − SiLU(g)·sg(h), h = x + F(LN x)


def test_gpas_is_standard_at_init():
    for gate in ("block", "sublayer"):
        out, ref = logits_pair("gpas", {"gate": gate})
        assert (out - ref).abs().max().item() < 1e-12


@pytest.mark.parametrize("g", [0.7, -1.5])
def test_gpas_formula_and_stop_gradient_by_hand(g):
    """Value (1 − SiLU g)·(x + f); the gradient reaches x and f as through x + f (identity), and g gets
    −SiLU'(g)·Σ (x + f)·∂L."""
    from lit_modules.residual.gpas import GPAS

    site = GPAS(4, args=block_args(), gate="sublayer")
    with torch.no_grad():
        site.gate.fill_(g)
    x, f = T(X).requires_grad_(True), T(FB).requires_grad_(True)
    new = x + site(x, T(U), f, None)
    s = silu(g)
    want = [[(1 - s) * (X[n][d] + FB[n][d]) for d in range(4)] for n in range(2)]
    assert torch.allclose(new, T(want), atol=1e-14, rtol=0)
    weights = torch.tensor([[[1.0, -2.0, 0.5, 0.25], [3.0, 1.0, -1.0, 2.0]]])
    (new * weights).sum().backward()
    assert torch.equal(x.grad, weights) and torch.equal(f.grad, weights)
    dsilu = sig(g) * (1 + g * (1 - sig(g)))
    want_g = -dsilu * sum(weights[0, n, d].item() * (X[n][d] + FB[n][d]) for n in range(2) for d in range(4))
    assert site.gate.grad.item() == pytest.approx(want_g, abs=1e-12)
    branch, skip = site.decompose(T(X), T(U), T(FB))
    assert torch.allclose(branch + (skip - 1) * T(X), new.detach() - T(X), atol=1e-14, rtol=0)


def test_gpas_gate_sharing():
    """gate='block': one g per block (stored under ls1, read by both sites); 'sublayer': one per site."""
    block = build("gpas")
    assert sorted(n for n, _ in block.named_parameters() if n.endswith("gate")) == [
        f"blocks.{i}.ls1.gate" for i in range(TINY["depth"])]
    with torch.no_grad():
        block.blocks[0].ls1.gate.fill_(0.5)
    x, f = torch.ones(1, 2, 8), torch.full((1, 2, 8), 2.0)
    assert torch.allclose(block.blocks[0].ls2(x, x, f, None), f - silu(0.5) * (x + f), atol=1e-15, rtol=0)
    sub = build("gpas", {"gate": "sublayer"})
    assert sum(n.endswith("gate") for n, _ in sub.named_parameters()) == 2 * TINY["depth"]


def test_gpas_gates_are_live_and_undecayed():
    for gate in ("block", "sublayer"):
        model = build("gpas", {"gate": gate})
        assert_live(model)
        wd = decay_of(model)
        assert all(wd[n] == 0.0 for n in wd if n.endswith(".gate"))


@pytest.mark.parametrize("options, words", [
    ({"gate": "layer"}, ["gate='layer'", "block, sublayer"]),
    ({"init_value": "zero"}, ["init_value='zero'", "gpas"]),
    ({"alpha": 1.0}, ["'alpha'", "valid options: gate, init_value"]),
])
def test_gpas_bad_options(options, words):
    assert_bad_options("gpas", options, words)


# ================================================================================================================
# SiameseNorm (arXiv 2602.08064): x ← N_post(x); f = F(N_in(x + N_pre(y))); x ← x + f/c; y ← y + f


def layer_norm_hand(row, eps=1e-5):
    """LayerNorm of one token by hand (unit gain, zero bias): biased variance, ε inside the square root."""
    mean = sum(row) / len(row)
    var = sum((v - mean) ** 2 for v in row) / len(row)
    return [(v - mean) / math.sqrt(var + eps) for v in row]


def tokens(model: VisionTransformer, imgs: torch.Tensor) -> torch.Tensor:
    x = model.patch_embed(imgs)
    return torch.cat([model.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + model.pos_embed


def siamese_reference(model: VisionTransformer, imgs: torch.Tensor) -> torch.Tensor:
    """The reference's DeiT forward (Qwen-Applications/SiameseNorm ``deit-model-siamesenorm.py``: ``Block.forward``
    and ``forward_features``), written out on the model's own modules."""
    x = tokens(model, imgs)
    y = x.clone()
    for i, blk in enumerate(model.blocks):
        c = ((i + 1) * 2) ** 0.5
        for site, norm, sub in ((blk.ls1, blk.norm1, blk.attn), (blk.ls2, blk.norm2, blk.mlp)):
            x = site.post_norm(x)
            z = sub(norm(x + site.y_norm(y)))
            x, y = x + z / c, y + z
    x = model.norm(model.stream.norm_x(x) + model.stream.norm_y(y))
    return model.head(x[:, 0])


def test_siamese_norm_equals_the_reference_forward():
    model = perturb(build("siamese_norm"), scale=0.2).eval()
    imgs = images()
    with torch.no_grad():
        assert torch.allclose(model(imgs), siamese_reference(model, imgs), atol=1e-12, rtol=0)
    assert [round(b.ls2.c ** 2, 12) for b in model.blocks] == [2.0, 4.0, 6.0]  # c² = 2(l + 1)


def test_siamese_norm_site_by_hand():
    """Δ = LN_post(x) + f/c − x (block 1: c = 2) and y ← y + f, with LN computed by hand."""
    from lit_modules.residual.siamese_norm import SiameseNorm

    site = SiameseNorm(4, args=block_args(layer=1))
    y0 = T(U)
    history = [y0]
    out = site(T(X), T(U), T(FB), history)
    want = [[layer_norm_hand(X[n])[d] + FB[n][d] / 2.0 - X[n][d] for d in range(4)] for n in range(2)]
    assert torch.allclose(out, T(want), atol=1e-14, rtol=0)
    assert torch.allclose(history[0], y0 + T(FB), atol=0, rtol=0)
    branch, skip = site.decompose(T(X), T(U), T(FB))
    assert torch.allclose(branch + (skip - 1) * T(X), out, atol=1e-13, rtol=0)
    assert site(T(X), T(U), T(FB), None).shape == (1, 2, 4)  # outside the stream: y left alone


def test_siamese_norm_first_input_is_pre_ln_and_the_model_is_not_standard():
    """N_in(N_post(x₀) + N_pre(x₀)) = LN(2·LN x₀) = LN x₀ up to ε: block 0's attention reads pre-LN's input
    (ε = 1e-20 here: the class token's tiny norm makes ε visible otherwise)."""
    std, var = build("standard", norm_eps=1e-20).eval(), build("siamese_norm", norm_eps=1e-20).eval()
    seen = {}
    for name, model in (("std", std), ("var", var)):
        model.blocks[0].attn.register_forward_pre_hook(lambda m, a, name=name: seen.__setitem__(name, a[0]))
    imgs = images()
    with torch.no_grad():
        out, ref = var(imgs), std(imgs)
    assert torch.allclose(seen["var"], seen["std"], atol=1e-10, rtol=0)
    assert (out - ref).abs().max() > 1e-4


def test_siamese_norm_drop_path_one_keeps_the_post_norm_and_leaves_y():
    from timm.layers import DropPath

    model = perturb(build("siamese_norm", drop_path_rate=1.0), scale=0.2).train()
    for blk in model.blocks:
        blk.drop_path1, blk.drop_path2 = DropPath(1.0), DropPath(1.0)
    x0 = tokens(model, images())
    with torch.no_grad():
        got = model.stream(x0, model.blocks)
        x = x0
        for blk in model.blocks:
            x = blk.ls2.post_norm(blk.ls1.post_norm(x))
        want = model.stream.norm_x(x) + model.stream.norm_y(x0)
    assert torch.allclose(got, want, atol=1e-13, rtol=0)


def test_siamese_norm_parameters_live_undecayed_and_counted():
    model = build("siamese_norm")
    assert_live(model)
    wd = decay_of(model)
    assert all(wd[n] == 0.0 for n in wd if "norm" in n)
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in build("standard").parameters())
    assert extra == TINY["depth"] * 8 * TINY["embed_dim"] + 4 * TINY["embed_dim"]  # +8D per block, 2 final LNs
    divided = build("siamese_norm", {"branch_divisor": 1.0})
    assert [b.ls1.c for b in divided.blocks] == [1.0] * TINY["depth"]


def test_siamese_norm_bad_options():
    assert_bad_options("siamese_norm", {"branch_divisor": 0.0}, ["branch_divisor=0.0", "'auto'"])
    with pytest.raises(RuntimeError, match="needs the stream's history"):
        build("siamese_norm").blocks[0](torch.randn(1, 5, 8))


# ================================================================================================================
# Deep Delta Learning (arXiv 2601.00417): x ← x + β (v − kᵀx) k, k = F(u)/‖F(u)‖


def delta_reference(site, x: torch.Tensor, context: torch.Tensor, k_in: torch.Tensor) -> torch.Tensor:
    """The reference's ``DeepDeltaResidualVdim1.forward`` (yifanzhang-pro/deep-delta-learning,
    ``model/DDL-vdim1-gpt-mha-rope.py``) written out, on the site's ``beta`` and ``value`` layers: x + update."""
    k_dim = k_in.shape[-1]
    k_rms = F.rms_norm(k_in, [k_dim], eps=(1e-5 * 1e-5) / k_dim)
    k_scale = 1.0 / math.sqrt(k_dim)
    beta = 2.0 * torch.sigmoid(site.beta(context))
    proj = torch.sum(k_rms * x, dim=-1, keepdim=True) * k_scale
    v = torch.sigmoid(site.value(x)) * 4.0 if site.value is not None else torch.full_like(proj, 2.0)
    return x + (beta * (v - proj) * k_scale) * k_rms


def test_deep_delta_default_value_is_the_papers_linear_map_of_the_normalised_context():
    """The paper's Appendix A.1 (the reported models): v = W_v c with c the sublayer's normalised input, no bias; the
    reference code's sigmoid of the raw stream is ``value="sigmoid"``."""
    from lit_modules.residual.deep_delta import DeepDelta

    site = DeepDelta(4, args=block_args())
    site.init_weights()
    perturb(site, scale=0.5)
    assert site.value.bias is None and site.beta.bias is not None
    x, u, f = T(X), T(U), T(FB)
    k = f / torch.sqrt(f.square().sum(-1, keepdim=True) + 1e-10)
    beta = 2 * torch.sigmoid(site.beta(u))
    v = u @ site.value.weight.T
    want = beta * (v - (k * x).sum(-1, keepdim=True)) * k
    assert torch.allclose(site(x, u, f, None), want, atol=1e-14, rtol=0)
    shifted = site(x + 1.0, u, f, None) + beta * k.sum(-1, keepdim=True) * k  # x moved: only kᵀx changes
    assert torch.allclose(shifted, want, atol=1e-12, rtol=0)  # v does not read the raw stream
    code = DeepDelta(4, args=block_args(), value="sigmoid")
    code.init_weights()
    perturb(code, scale=0.5)
    shifted = code(x + 1.0, u, f, None) + 2 * torch.sigmoid(code.beta(u)) * k.sum(-1, keepdim=True) * k
    assert not torch.allclose(shifted, code(x, u, f, None), atol=1e-6)  # the code's v reads x


@pytest.mark.parametrize("value", ["sigmoid", "constant"])
def test_deep_delta_equals_the_reference_update(value):
    from lit_modules.residual.deep_delta import DeepDelta

    site = DeepDelta(4, args=block_args(), value=value)
    site.init_weights()
    perturb(site, scale=0.5)
    x, u, f = T(X), T(U), T(FB)
    assert torch.allclose(x + site(x, u, f, None), delta_reference(site, x, u, f), atol=1e-14, rtol=0)


def test_deep_delta_by_hand_and_the_skip_operator():
    """One token by hand: k = f/‖f‖, β = 2σ(w_β·u + b_β), v = 4σ(w_v·x + b_v); with β = 1 and v = 0 the update erases
    x's component along k (x_new ⟂ k), with β = 2 and v = 0 it reflects it (kᵀx_new = −kᵀx)."""
    from lit_modules.residual.deep_delta import DeepDelta

    site = DeepDelta(4, args=block_args(), value="sigmoid")
    wb, bb, wv, bv = [0.3, -0.2, 0.1, 0.5], 0.4, [-0.1, 0.2, 0.05, 0.3], -0.25
    with torch.no_grad():
        site.beta.weight.copy_(torch.tensor([wb]))
        site.beta.bias.fill_(bb)
        site.value.weight.copy_(torch.tensor([wv]))
        site.value.bias.fill_(bv)
    x, u, f = X[0], U[0], FB[0]
    norm = math.sqrt(sum(v * v for v in f) + 1e-10)
    k = [v / norm for v in f]
    beta = 2 * sig(sum(a * b for a, b in zip(wb, u, strict=True)) + bb)
    val = 4 * sig(sum(a * b for a, b in zip(wv, x, strict=True)) + bv)
    proj = sum(a * b for a, b in zip(k, x, strict=True))
    want = [beta * (val - proj) * kd for kd in k]
    assert torch.allclose(site(T([x]), T([u]), T([f]), None), T([want]), atol=1e-14, rtol=0)
    with torch.no_grad():
        site.beta.weight.zero_()
        site.value.weight.zero_()
        site.value.bias.fill_(-1e4)  # v = 4σ(−10⁴) = 0
    kt = torch.tensor(k)
    for b0, sign in ((1.0, 0.0), (2.0, -1.0)):
        with torch.no_grad():
            site.beta.bias.fill_(math.log(b0 / 2 / (1 - b0 / 2)) if b0 < 2 else 30.0)
        new = T(X)[0, 0] + site(T(X), T(U), T(FB), None)[0, 0]
        assert (new @ kt).item() == pytest.approx(sign * (T(X)[0, 0] @ kt).item(), abs=1e-9)


def test_deep_delta_init_liveness_and_decay():
    model = build("deep_delta")
    site = model.blocks[1].ls2
    assert torch.allclose(site.beta.bias, torch.zeros(1)) and site.beta_init == 1.0  # logit(1/2) = 0: β = 1
    assert 0.5 * site.beta.weight.std().item() < 0.5 / math.sqrt(8) < 2 * site.beta.weight.std().item()
    assert site.value.bias is None and 0.5 * site.value.weight.std().item() < 0.5 / math.sqrt(8)
    assert build("deep_delta", {"value": "sigmoid"}).blocks[0].ls1.value.bias.abs().item() <= 1 / math.sqrt(8)
    assert build("deep_delta", {"beta_init": 0.5}).blocks[0].ls1.beta.bias.item() == pytest.approx(math.log(1 / 3))
    assert not hasattr(build("deep_delta", {"value": "constant"}).blocks[0].ls1.value, "weight")
    out, ref = logits_pair("deep_delta")
    assert (out - ref).abs().max() > 1e-4  # β ≈ 1 projects x off k: not the standard ViT
    assert_live(model)
    wd = decay_of(model)
    assert wd["blocks.0.ls1.beta.weight"] == 0.05 and wd["blocks.0.ls1.beta.bias"] == 0.0
    assert wd["blocks.0.ls1.value.weight"] == 0.05


@pytest.mark.parametrize("residual, options", [("deep_delta", {}), ("gpas", {}), ("gpas", {"gate": "sublayer"})])
def test_drop_path_drops_the_branch_before_the_site_of_a_design_that_acts_after_the_add(residual, options):
    """DropPath p = 1 drops f before the site: Deep Delta's site is then the identity (k = 0), GPAS's still scales
    the stream, x ← (1 − SiLU g)·x; a kept f enters the site rescaled by 1/(1 − p) (timm's DropPath), which leaves
    Deep Delta's direction k, and so its skip's eigenvalue 1 − β, unchanged."""
    from timm.layers import DropPath

    model = perturb(build(residual, options, drop_path_rate=1.0), scale=0.2).train()
    blk = model.blocks[1]
    blk.drop_path1, blk.drop_path2 = DropPath(1.0), DropPath(1.0)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        out = blk(x)
        if residual == "deep_delta":
            want = x
        else:
            s1 = torch.nn.functional.silu(blk.ls1.gate)
            s2 = s1 if options == {} else torch.nn.functional.silu(blk.ls2.gate)
            want = (1 - s2) * (1 - s1) * x
    assert torch.allclose(out, want, atol=1e-12, rtol=0)
    if residual == "deep_delta":  # k = f/‖f‖: a kept f rescaled by 1/(1 − p) gives the same update
        with torch.no_grad():
            u = blk.norm1(x)
            f = blk.attn(u)
            assert torch.allclose(blk.ls1(x, u, f, None), blk.ls1(x, u, f / 0.5, None), atol=1e-9, rtol=0)  # ε in ‖f‖
        # p = 0.5 at the attention site only: each sample is either dropped there (the site is the identity) or kept
        # with exactly the p = 0 update — dropping Δ instead would double a kept sample's update
        x = torch.randn(16, 5, 8, dtype=torch.float64)
        blk.drop_path1, blk.drop_path2 = DropPath(0.5), nn.Identity()
        with torch.no_grad():
            torch.manual_seed(3)
            out = blk(x)
            blk.drop_path1 = nn.Identity()
            plain = blk(x)
            blk.drop_path1 = DropPath(1.0)
            dropped = blk(x)
        kept = [torch.allclose(out[i], plain[i], atol=1e-9, rtol=0) for i in range(16)]
        gone = [torch.allclose(out[i], dropped[i], atol=1e-9, rtol=0) for i in range(16)]
        assert all(k or g for k, g in zip(kept, gone, strict=True)) and any(kept) and any(gone)


@pytest.mark.parametrize("options, words", [
    ({"value": "learned"}, ["value='learned'", "linear, sigmoid, constant"]),
    ({"beta_init": 2.5}, ["beta_init=2.5", "[0, 2]"]),
])
def test_deep_delta_bad_options(options, words):
    assert_bad_options("deep_delta", options, words)


# ================================================================================================================
# mHC-lite (arXiv 2601.05732) and KromHC (arXiv 2601.21579): doubly stochastic mixing without Sinkhorn


def lite_reference(site, x: torch.Tensor, f: torch.Tensor, kron: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's ``width_connection`` and ``depth_connection`` (FFTYYY/mhc-lite ``hyper_conn/mhc_lite.py``;
    wz1119/KromHC ``hyper_conn/Kromhc.py``, ``_build_kronecker_hres``), written out for streams x (T, n, D) and a
    branch output f (T, D), on the site's parameters: (branch input, new streams)."""
    import itertools

    T_, n, D = x.shape
    normed = F.normalize(x.reshape(T_, n * D), dim=-1) * (n * D) ** 0.5 * (site.gamma + 1)
    dynamic_alpha_fn = torch.cat([site.phi_pre, site.phi_res], dim=1)  # (nD, n + R): pre first, then the residual
    wc = normed @ dynamic_alpha_fn
    dynamic_pre, dynamic_residual = wc[..., :n], wc[..., n:]
    res_coeff = site.alpha_res * dynamic_residual + site.b_res
    if kron:
        weights = F.softmax(res_coeff.view(T_, -1, 2), dim=-1)
        p = weights[..., 0]
        mats = torch.stack([torch.stack([p, 1 - p], -1), torch.stack([1 - p, p], -1)], -2)  # (T, K, 2, 2)
        alpha_residual = mats[:, 0]
        for k in range(1, mats.shape[1]):
            kr = alpha_residual[:, :, None, :, None] * mats[:, k][:, None, :, None, :]
            alpha_residual = kr.reshape(T_, alpha_residual.shape[1] * 2, alpha_residual.shape[2] * 2)
    else:
        perms = torch.eye(n)[torch.tensor(list(itertools.permutations(range(n))))]
        alpha_residual = torch.einsum("tr,rij->tij", torch.softmax(res_coeff, dim=-1), perms)
    alpha_pre = torch.sigmoid(site.alpha_pre * dynamic_pre + site.b_pre)  # (T, n)
    alpha = torch.cat([alpha_pre[..., None], alpha_residual], dim=-1)  # (T, s, 1 + s)
    mix_h = torch.einsum("tsu,tsd->tud", alpha, x)
    branch_input, residuals = mix_h[:, 0], mix_h[:, 1:]
    beta = 2 * torch.sigmoid((normed @ site.phi_post) * site.alpha_post + site.b_post)
    return branch_input, torch.einsum("td,ts->tsd", f, beta) + residuals


@pytest.mark.parametrize("residual, n", [("mhc_lite", 3), ("mhc_lite", 4), ("kromhc", 4), ("kromhc", 8)])
def test_lite_and_krom_equal_the_reference_equations(residual, n):
    site = RESIDUALS[residual](4, 1, args=block_args(layer=1), n=n)
    perturb(site, scale=0.3)
    g = torch.Generator().manual_seed(3)
    x, f = torch.randn(5, n, 4, generator=g), torch.randn(5, 4, generator=g)
    mixing = site.mixing(x)
    want_h, want_new = lite_reference(site, x, f, kron=residual == "kromhc")
    assert torch.allclose(site.read(x, mixing), want_h, atol=1e-12, rtol=0)
    assert torch.allclose(site.write(x, f, mixing), want_new, atol=1e-12, rtol=0)
    assert torch.allclose(x + site(x, None, f, None), want_new, atol=1e-12, rtol=0)
    res = mixing.res  # exactly doubly stochastic, every token
    assert torch.allclose(res.sum(-1), torch.ones(5, n), atol=1e-13) and torch.allclose(res.sum(-2), torch.ones(5, n))
    assert (res >= 0).all()


def test_kromhc_factors_by_hand():
    """n = 4, logits (a, b) and (c, d): p = σ(a − b), q = σ(c − d), A = [[p, 1−p], [1−p, p]] ⊗ [[q, 1−q], [1−q, q]]."""
    from lit_modules.residual.kromhc import KromHC

    site = KromHC(4, 0, args=block_args(), n=4)
    a, b, c, d = 0.3, -0.4, 1.2, 0.1
    res = site.residual_matrix(torch.tensor([a, b, c, d]))
    p, q = sig(a - b), sig(c - d)
    U, V = [[p, 1 - p], [1 - p, p]], [[q, 1 - q], [1 - q, q]]
    want = [[U[i // 2][j // 2] * V[i % 2][j % 2] for j in range(4)] for i in range(4)]
    assert torch.allclose(res, torch.tensor(want), atol=1e-15, rtol=0)


@pytest.mark.parametrize("residual", ["mhc_lite", "kromhc"])
def test_lite_and_krom_home_streams_are_drawn_at_init_from_the_seed(residual):
    """The reference draws each layer's home stream (its +1 in b_pre and b_post, one draw for both) with
    ``randrange(n)``: here from the init seed — the same seed gives the same homes, another seed other homes;
    ``home="cyclic"`` is HC's k mod n."""
    def homes(model):
        out = []
        for site in (s for blk in model.blocks for s in (blk.ls1, blk.ls2)):
            assert site.b_pre.tolist() == site.b_post.tolist() and sorted(site.b_pre.tolist()) == [-1, -1, -1, 1]
            out.append(int(site.b_pre.argmax()))
        return out

    drawn = {seed: homes(build(residual, seed=seed, depth=8)) for seed in range(4)}
    assert homes(build(residual, seed=0, depth=8)) == drawn[0]
    assert len({tuple(h) for h in drawn.values()}) > 1 and any(len(set(h)) > 1 for h in drawn.values())
    assert homes(build(residual, {"home": "cyclic"}, depth=8)) == [k % 4 for k in range(16)]


def test_lite_and_krom_init_and_parameter_counts():
    """The reference's static logits: H_pre = σ(±1), H_post = 2σ(±1) (+1 on the home stream, here HC's k mod n),
    the identity permutation at 0 and every other at −8; per site 132D + 35 (mHC-lite) and 52D + 15 (KromHC) at
    n = 4."""
    e8 = math.exp(-8)
    for residual, per_site, diag in (("mhc_lite", 132 * 8 + 35, (1 + 5 * e8) / (1 + 23 * e8)),
                                     ("kromhc", 52 * 8 + 15, (1 / (1 + e8)) ** 2)):
        model = build(residual, {"home": "cyclic"})
        site = model.blocks[1].ls2  # layer k = 3: home stream 3
        assert site.b_pre.tolist() == [-1.0, -1.0, -1.0, 1.0] == site.b_post.tolist()
        mixing = site.mixing(torch.zeros(4, 8))
        assert torch.allclose(mixing.read, torch.tensor([sig(-1)] * 3 + [sig(1)]), atol=1e-15)
        assert torch.allclose(mixing.write, torch.tensor([2 * sig(-1)] * 3 + [2 * sig(1)]), atol=1e-15)
        assert torch.allclose(mixing.res.diagonal(), torch.full((4,), diag), atol=1e-12)
        assert sum(p.numel() for p in site.parameters()) == per_site
        out, ref = logits_pair(residual)
        assert (out - ref).abs().max() > 1e-3  # the write weights differ per stream: not the standard ViT


def test_lite_stream_ends():
    """norm_each (the reference): Σ_i Norm(H_i), no final norm; sum: the streams summed, then the final norm."""
    from lit_modules.residual.hyper_connections import MultiStream
    from lit_modules.residual.mhc_lite import NormEachStream

    each, summed = build("mhc_lite"), build("mhc_lite", {"stream_out": "sum"})
    assert isinstance(each.stream, NormEachStream) and isinstance(each.norm, nn.Identity)
    assert type(summed.stream) is MultiStream and isinstance(summed.norm, nn.LayerNorm)
    h = torch.randn(2, 5, 4, 8)
    with torch.no_grad():
        assert torch.allclose(each.stream.norm(h).sum(-2), sum(each.stream.norm(h[..., i, :]) for i in range(4)))
    assert (build("kromhc", {"stream_out": "sum"}).residual_options["stream_out"]) == "sum"


@pytest.mark.parametrize("residual", ["mhc_lite", "kromhc"])
def test_lite_and_krom_liveness_and_decay(residual):
    """Dead at step 0 by design: γ and the three α (their factor φ is 0); at the network's first site the streams are
    equal, so any doubly stochastic mixing leaves them alone: b_res and φ_res get no gradient there (to rounding).
    Every other parameter is live. γ, b and α are undecayed, φ is decayed."""
    model = build(residual)
    grads = grads_at_init(model)
    for name, g in grads.items():
        if name.endswith(("gamma", "alpha_pre", "alpha_res", "alpha_post")):
            assert torch.all(g == 0), name
        elif name in ("blocks.0.ls1.b_res", "blocks.0.ls1.phi_res"):
            assert g.abs().max() < 1e-12, name
        else:
            assert g.norm() > 0, name
    wd = decay_of(model)
    for name, decay in wd.items():
        if ".ls" in name:
            assert decay == (0.05 if ".phi_" in name else 0.0), name


@pytest.mark.parametrize("residual, options, words", [
    ("mhc_lite", {"n": 7}, ["n=7", "n! permutation matrices", "2..6"]),
    ("mhc_lite", {"n": 1}, ["n=1", "plain residual", "standard"]),
    ("mhc_lite", {"home": "first"}, ["home='first'", "random, cyclic"]),
    ("kromhc", {"n": 3}, ["n=3", "power of 2"]),
    ("kromhc", {"n": 1}, ["n=1", "power of 2"]),
    ("mhc_lite", {"stream_out": "mean"}, ["stream_out='mean'", "norm_each, sum"]),
    ("kromhc", {"sinkhorn_iters": 20}, ["'sinkhorn_iters'", "belongs to mhc"]),
])
def test_lite_and_krom_bad_options(residual, options, words):
    assert_bad_options(residual, options, words)


# ================================================================================================================
# MUDDFormer (arXiv 2502.12170): multiway dynamic dense connections


def mudd_reference(model: VisionTransformer, imgs: torch.Tensor) -> torch.Tensor:
    """The reference's forward (Caiyun-AI/MUDDFormer ``pytorch/muddformer/modeling_muddformer.py``: ``MUDDFormer
    .forward``, ``TransformerBlock.forward``, ``MultiwayDynamicDenseBlock``; ``sepln``, ``dense_type='qkvr'``)
    written out on the model's modules; the attention is this backbone's (q, k, v from three inputs)."""
    from lit_modules.residual.dca import cross_attention

    x = tokens(model, imgs)
    hiddens = [x]
    for i, blk in enumerate(model.blocks):
        if i == 0:
            res, attn_out = x, blk.attn(blk.norm1(x))
        else:
            res = x[-1]
            attn_out = cross_attention(blk.attn, blk.norm1(x[0]), blk.norm1_k(x[1]), blk.norm1_v(x[2]))
        h = res + attn_out
        x = h + blk.mlp(blk.norm2(h))
        hiddens.append(x)
        dense = model.stream.dense[i]
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # RMSnormNoscale
        dw = dense.w2(F.gelu(dense.w1(normed)))  # B T (C L)
        C, L = dense.bias.shape
        dw = dw.reshape(*dw.shape[:2], C, L).permute(2, 0, 1, 3) + dense.bias[:, None, None, :]  # C B T L
        x = tuple(sum(dw[c, :, :, j, None] * hiddens[j] for j in range(i + 2)) for c in range(C))
    return model.head(model.norm(x[0])[:, 0])


def test_muddformer_equals_the_reference_forward():
    model = perturb(build("muddformer"), scale=0.2).eval()
    imgs = images()
    with torch.no_grad():
        assert torch.allclose(model(imgs), mudd_reference(model, imgs), atol=1e-12, rtol=0)
    assert [d.bias.shape for d in model.stream.dense] == [(4, 2), (4, 3), (1, 4)]  # C = 1 after the last block


def test_muddformer_is_standard_at_init():
    """B = 1 on the newest output, W₂ = 0: every composition is the newest output, the pre-norm ViT exactly (with a
    standard checkpoint's norm1 copied into norm1_k, norm1_v)."""
    std = perturb(build("standard"), scale=0.2).eval()
    for options in ({}, {"multiway": False}, {"dynamic": False}):
        var = build("muddformer", options, seed=1).eval()
        report = var.load_pretrained(std.state_dict())
        assert set(report.derived) == ({f"blocks.{i}.norm1_{s}.{p}" for i in (1, 2) for s in "kv"
                                        for p in ("weight", "bias")} if options.get("multiway", True) else set())
        imgs = images()
        with torch.no_grad():
            assert (var(imgs) - std(imgs)).abs().max().item() < 1e-12


def test_muddformer_hidden_widths_and_parameters():
    from lit_modules.residual.muddformer import dense_hidden

    assert [dense_hidden(4, s, False, "round64") for s in (2, 15, 16, 17)] == [64, 64, 128, 128]
    assert dense_hidden(1, 13, True, "round64") == 64 and dense_hidden(1, 13, True, "exact") == 52
    model = build("muddformer", {"hidden": "exact"})
    dense = model.stream.dense
    assert [(d.w1.out_features, d.w2.out_features) for d in dense] == [(8, 8), (12, 12), (16, 4)]
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in build("standard").parameters())
    D = TINY["embed_dim"]
    want = sum(D * h + h * o + o for h, o in ((8, 8), (12, 12), (16, 4))) + 2 * 4 * D  # + norm1_k, norm1_v (blocks 1, 2)
    assert extra == want
    static = build("muddformer", {"dynamic": False})
    assert all(d.w1 is None for d in static.stream.dense)


def test_muddformer_liveness_and_decay():
    """W₁ is dead at step 0 (its only path is through W₂ = 0); everything else, B included, is live. B undecayed."""
    model = build("muddformer")
    assert_live(model, dead=("w1.weight",))
    wd = decay_of(model)
    assert all(wd[n] == (0.0 if n.endswith("bias") else 0.05) for n in wd if n.startswith("stream.dense"))


def test_muddformer_options():
    assert_bad_options("muddformer", {"dynamic": False, "hidden": "exact"},
                       ["'hidden' does not apply", "dynamic=False"])
    assert_bad_options("muddformer", {"hidden": "round128"}, ["hidden='round128'", "round64, exact"])
    assert_bad_options("muddformer", {"multiway": "yes"}, ["multiway='yes'", "True, False"])
    single = build("muddformer", {"multiway": False})
    assert not hasattr(single.blocks[1], "norm1_k") and [d.ways for d in single.stream.dense] == [1, 1, 1]


# ================================================================================================================
# HybridNorm (arXiv 2503.04598): QKV-norm inside the attention, post-norm on the MLP


def hybrid_reference(model: VisionTransformer, imgs: torch.Tensor, star: bool = False) -> torch.Tensor:
    """The reference's ``OLMoSequentialBlock.forward`` (BryceZhuo/HybridNorm ``dense_model/olmo/model.py``) with
    ``attn_norm: false``, ``ffn_norm: true``, ``ffn_residual_after_norm: true`` and q/k/v norms (``attention``:
    the norms on the (B, H, T, d) heads before SDPA), written out on the model's modules; ``star``: HybridNorm*,
    block 0 with ``attn_norm: true, ffn_residual: false``."""
    x = tokens(model, imgs)
    for i, blk in enumerate(model.blocks):
        pre = star and i == 0
        h = blk.norm1(x) if pre else x
        a = blk.attn
        B, N, D = h.shape
        q, k, v = a.qkv(h).split(D, dim=-1)
        q, k, v = (t.view(B, N, a.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        q, k, v = a.q_norm(q), a.k_norm(k), a.v_norm(v)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v
        x = x + a.proj(att.transpose(1, 2).reshape(B, N, D))
        og_x = x
        x = blk.norm2(x)
        if not pre:
            og_x = x
        x = og_x + blk.mlp(x)
    return model.head(model.norm(x)[:, 0])


@pytest.mark.parametrize("first_block", ["hybrid", "pre_norm"])
def test_hybrid_norm_equals_the_reference_forward(first_block):
    model = perturb(build("hybrid_norm", {"first_block": first_block}), scale=0.2).eval()
    imgs = images()
    with torch.no_grad():
        want = hybrid_reference(model, imgs, star=first_block == "pre_norm")
        assert torch.allclose(model(imgs), want, atol=1e-12, rtol=0)
    assert isinstance(model.blocks[0].norm1, nn.Identity if first_block == "hybrid" else nn.LayerNorm)
    assert isinstance(model.blocks[1].norm1, nn.Identity) and isinstance(model.blocks[1].attn.v_norm, nn.LayerNorm)
    assert model.blocks[0].ls2.post == (first_block == "hybrid") and model.blocks[1].ls2.post


def test_hybrid_norm_mlp_site_by_hand_and_drop_path():
    """Δ = LN(x) + f − x at the MLP site (u = LN x by hand); with DropPath p = 1 a block is x ← LN(x + 0)."""
    from timm.layers import DropPath

    model = build("hybrid_norm", embed_dim=4, num_heads=1)
    site = model.blocks[1].ls2
    u = T([layer_norm_hand(row, eps=1e-6) for row in X])
    out = site(T(X), u, T(FB), None)
    want = [[u[0, n, d].item() + FB[n][d] - X[n][d] for d in range(4)] for n in range(2)]
    assert torch.allclose(out, T(want), atol=1e-14, rtol=0)
    branch, skip = site.decompose(T(X), u, T(FB))
    assert torch.allclose(branch + (skip - 1) * T(X), out, atol=1e-13, rtol=0)
    blk = perturb(build("hybrid_norm", drop_path_rate=1.0), scale=0.2).blocks[2].train()
    blk.drop_path1, blk.drop_path2 = DropPath(1.0), DropPath(1.0)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert torch.allclose(blk(x), blk.norm2(x), atol=1e-14, rtol=0)


def test_hybrid_norm_liveness_decay_and_refusals():
    model = build("hybrid_norm")
    assert_live(model)
    wd = decay_of(model)
    assert all(wd[n] == 0.0 for n in wd if "_norm." in n)  # the q/k/v norms' gains and biases
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in build("standard").parameters())
    d, D = TINY["embed_dim"] // TINY["num_heads"], TINY["embed_dim"]
    assert extra == TINY["depth"] * (3 * 2 * d - 2 * D)  # +3 LayerNorms of size d, −1 of size D, per block
    with pytest.raises(ValueError, match="qk_norm='rmsnorm' does not apply to residual 'hybrid_norm'"):
        build("hybrid_norm", qk_norm="rmsnorm")
    assert_bad_options("hybrid_norm", {"first_block": "post_norm"}, ["first_block='post_norm'", "hybrid, pre_norm"])


# ================================================================================================================
# QK-norm as in ViT-5 (arXiv 2602.08071): each head's q and k through an RMSNorm over d, in fp32


def test_qk_rmsnorm_by_hand_and_in_fp32():
    """(1, 2, 3, 4)/√(mean of squares = 7.5) times the gain; a bf16 input is normalised in fp32 and returned in bf16."""
    from lit_modules.attention import QKRMSNorm

    norm = QKRMSNorm(4, eps=1e-6)
    assert torch.equal(norm.weight, torch.ones(4))
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, -1.0, 0.5]))
    q = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    r = math.sqrt(7.5 + 1e-6)
    assert torch.allclose(norm(q), torch.tensor([[1 / r, 4 / r, -3 / r, 2 / r]]), atol=1e-15, rtol=0)
    low = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.bfloat16)
    want = (norm.weight.float() * (low.float() * torch.rsqrt(low.float().square().mean(-1, keepdim=True) + 1e-6))
            .to(torch.bfloat16)).to(torch.bfloat16)
    assert norm(low).dtype == torch.bfloat16 and torch.equal(norm(low), want)


def vit5_attention(attn, x: torch.Tensor) -> torch.Tensor:
    """ViT-5's ``Attention.forward`` without RoPE and registers (wangf3014/ViT-5 ``models_vit5.py``), written out on
    the module's weights: q, k through ``RMSNorm.forward`` (fp32, ``weight * h``), the explicit softmax path."""
    B, N, C = x.shape
    q, k, v = attn.qkv(x).reshape(B, N, 3, attn.num_heads, C // attn.num_heads).unbind(dim=2)

    def rms(norm, h):  # the reference's .to(torch.float32); this float64 test stays in float64
        wide = h.to(torch.promote_types(h.dtype, torch.float32))
        var = wide.pow(2).mean(-1, keepdim=True)
        return norm.weight * (wide * torch.rsqrt(var + 1e-6)).to(h.dtype)

    q, k, v = rms(attn.q_norm, q).transpose(1, 2), rms(attn.k_norm, k).transpose(1, 2), v.transpose(1, 2)
    out = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
    return attn.proj(out.transpose(1, 2).reshape(B, N, C))


@pytest.mark.parametrize("fused", [False, True])
def test_qk_norm_rmsnorm_equals_vit5(fused):
    model = perturb(build(qk_norm="rmsnorm", fused_attn=fused), scale=0.2).eval()
    attn = model.blocks[1].attn
    assert attn.q_norm.weight.shape == (TINY["embed_dim"] // TINY["num_heads"],)  # one gain of size d for all heads
    x = torch.randn(2, 5, TINY["embed_dim"], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(attn(x), vit5_attention(attn, x), atol=1e-12, rtol=0)


def test_qk_norm_choices_defaults_and_refusals():
    from lit_modules.attention import QKLayerNorm, QKRMSNorm

    plain = build()
    assert isinstance(plain.blocks[0].attn.q_norm, nn.Identity) and plain.cfg.qk_norm == "none"
    assert isinstance(build(qk_norm="layernorm").blocks[0].attn.k_norm, QKLayerNorm)
    assert build(qk_norm=True).cfg.qk_norm == "layernorm" and build(qk_norm=False).cfg.qk_norm == "none"  # timm's
    model = build(qk_norm="rmsnorm")
    assert isinstance(model.blocks[2].attn.k_norm, QKRMSNorm)
    std = perturb(build(), scale=0.2).eval()
    model.load_state_dict(std.state_dict(), strict=False)  # the shared weights; the gains stay 1
    with torch.no_grad():  # q and k rescaled to unit RMS per head: other logits, not the standard ViT at init
        assert (model.eval()(images()) - std(images())).abs().max() > 1e-4
    assert_live(model)
    wd = decay_of(model)
    assert wd["blocks.0.attn.q_norm.weight"] == 0.0 and wd["blocks.0.attn.k_norm.weight"] == 0.0
    for residual in ("ngpt", "hybrid_norm"):
        with pytest.raises(ValueError, match=f"qk_norm='layernorm' does not apply to residual '{residual}'"):
            build(residual, qk_norm="layernorm")
    with pytest.raises(ValueError, match="unknown qk_norm 'l2'; valid choices: none, rmsnorm, layernorm"):
        build(qk_norm="l2")


# ================================================================================================================
# Gated attention (arXiv 2505.06708): o_h = SDPA_h ⊙ σ(X W_g)_h, from the attention's input


def gated_reference(attn, x: torch.Tensor, headwise: bool) -> torch.Tensor:
    """``Qwen3Attention.forward``'s gate (qiuzh20/gated_attention ``modeling_qwen3.py``) written out: the query
    projection widened per head to [q_h | g_h] (here assembled from the module's qkv and gate weights, in the
    reference's layout), split after ``view(bsz, q_len, heads, -1)``, ``attn_output * sigmoid(gate_score)`` before
    the output projection."""
    B, N, D = x.shape
    H, d = attn.num_heads, attn.head_dim
    wq, wk, wv = attn.qkv.weight.chunk(3)
    bq, bk, bv = attn.qkv.bias.chunk(3)
    g = 1 if headwise else d
    q_proj_w = torch.cat([torch.cat([wq[h * d:(h + 1) * d], attn.gate.weight[h * g:(h + 1) * g]]) for h in range(H)])
    q_proj_b = torch.cat([torch.cat([bq[h * d:(h + 1) * d], attn.gate.bias[h * g:(h + 1) * g]]) for h in range(H)])
    query_states = F.linear(x, q_proj_w, q_proj_b).view(B, N, H, -1)
    query_states, gate_score = torch.split(query_states, [d, g], dim=-1)
    q = query_states.transpose(1, 2)
    k, v = (F.linear(x, w, b).view(B, N, H, d).transpose(1, 2) for w, b in ((wk, bk), (wv, bv)))
    out = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(d), dim=-1) @ v
    out = out.transpose(1, 2) * torch.sigmoid(gate_score)
    return attn.proj(out.reshape(B, N, D))


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
def test_gated_attention_equals_the_reference(gate):
    model = perturb(build(attention_gate=gate), scale=0.2).eval()
    attn = model.blocks[1].attn
    assert attn.gate.weight.shape == (TINY["embed_dim"], TINY["embed_dim"]) if gate == "elementwise" else (
        TINY["num_heads"], TINY["embed_dim"])
    x = torch.randn(2, 5, TINY["embed_dim"], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(attn(x), gated_reference(attn, x, gate == "headwise"), atol=1e-12, rtol=0)


def test_gated_attention_halves_the_heads_at_zero_gate_and_trains():
    """With W_g = 0, b_g = 0 every gate is σ(0) = ½: the attention output is W_o(½·o) + b_o. At timm's init (W_g ~
    N(0, 0.02²)) the gates are ≈ ½: not the standard ViT. The gate's weight is decayed, its bias not."""
    gated, plain = build(attention_gate="elementwise").eval(), build().eval()
    x = torch.randn(2, 5, TINY["embed_dim"])
    a, p = gated.blocks[0].attn, plain.blocks[0].attn
    with torch.no_grad():
        a.gate.weight.zero_()
        assert torch.allclose(a(x), 0.5 * (p(x) - p.proj.bias) + p.proj.bias, atol=1e-12, rtol=0)
    model = build(attention_gate="headwise")
    assert_live(model)
    wd = decay_of(model)
    assert wd["blocks.0.attn.gate.weight"] == 0.05 and wd["blocks.0.attn.gate.bias"] == 0.0
    with pytest.raises(ValueError, match="unknown attention_gate 'sparse'; valid choices: none, elementwise, headwise"):
        build(attention_gate="sparse")


@pytest.mark.parametrize("residual", sorted(RESIDUALS))
def test_every_residual_takes_the_attention_gate_and_qk_norm(residual):
    """The gate and the QK-norm reach every attention a variant builds (``BlockArgs.attention()``); QK-norm is
    refused where a variant normalises q and k itself (nGPT, HybridNorm)."""
    options = {"rank": 2} if residual == "laurel" else {}
    qk = "none" if residual in ("ngpt", "hybrid_norm") else "rmsnorm"
    model = perturb(build(residual, options, attention_gate="headwise", qk_norm=qk), scale=0.05)
    out = model(images())
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    assert all(b.attn.gate.weight.grad is not None and b.attn.gate.weight.grad.abs().sum() > 0 for b in model.blocks)


def test_qk_norm_and_attention_gate_are_run_config_fields_and_cli_options():
    from ablations.config import RunConfig
    from ablations.train import build_parser, config_from_args

    c = config_from_args(build_parser().parse_args(["--qk-norm", "rmsnorm", "--attention-gate", "elementwise"]))
    assert (c.qk_norm, c.attention_gate) == ("rmsnorm", "elementwise")
    assert c.run_name() == "standard+qk_rmsnorm+gate_elementwise_d4_w64_digits_s0"
    cfg = c.model_config({"img_size": 8, "in_chans": 1, "num_classes": 10, "patch_size": 4})
    assert (cfg.qk_norm, cfg.attention_gate) == ("rmsnorm", "elementwise")
    assert RunConfig().qk_norm == "none" and RunConfig().attention_gate == "none"
    with pytest.raises(ValueError, match=r"^unknown qk_norm 'yes'; valid choices: none, rmsnorm, layernorm$"):
        RunConfig(qk_norm="yes")
    with pytest.raises(ValueError, match=r"^unknown attention_gate 'on'; valid choices: none, elementwise, headwise$"):
        RunConfig(attention_gate="on")


# ================================================================================================================
# SeeDNorm (arXiv 2510.22777): [γ + α ⊙ tanh(x·β)] ⊙ x / RMS(x)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_seednorm_by_hand(groups):
    from lit_modules.norms import SeeDNorm

    norm = SeeDNorm(4, eps=1e-6, groups=groups)
    gamma, alpha, beta = [1.0, 0.5, -1.0, 2.0], [0.3, -0.7, 1.2, 0.4], [0.2, -0.1, 0.5, 0.3]
    with torch.no_grad():
        for p, v in ((norm.weight, gamma), (norm.alpha, alpha), (norm.beta, beta)):
            p.copy_(torch.tensor(v))
    want = []
    for x in X:
        rms = math.sqrt(sum(v * v for v in x) / 4 + 1e-6)
        size = 4 // groups
        s = [sum(x[j] * beta[j] for j in range(g * size, (g + 1) * size)) for g in range(groups)]
        want.append([(gamma[i] + alpha[i] * math.tanh(s[i // size])) * x[i] / rms for i in range(4)])
    assert torch.allclose(norm(T(X)), T(want), atol=1e-14, rtol=0)


def test_seednorm_is_rmsnorm_at_init_and_its_groups():
    from timm.layers import RmsNorm

    from lit_modules.norms import SeeDNorm

    x = torch.randn(3, 5, 32)
    seed, rms = SeeDNorm(32), RmsNorm(32, eps=1e-6)
    assert seed.groups == 16 and torch.allclose(seed(x), rms(x), atol=1e-14, rtol=0)
    assert SeeDNorm(8).groups == 8 and SeeDNorm(24).groups == 8 and SeeDNorm(64).groups == 16


def test_seednorm_in_every_norm_liveness_and_decay():
    """norm_layer='seednorm' replaces every LayerNorm; at init α has zero gradient (tanh(x·0) = 0), β and γ learn;
    α and β are weight-decayed as the paper trains them (the exception to the 1-D rule), γ is not."""
    from lit_modules.norms import SeeDNorm

    model = build(norm_layer="seednorm")
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    assert sum(isinstance(m, SeeDNorm) for m in model.modules()) == 2 * TINY["depth"] + 1
    assert_live(model, dead=(".alpha",))
    wd = decay_of(model)
    dynamic = [n for n in wd if n.endswith((".alpha", ".beta"))]
    assert len(dynamic) == 2 * (2 * TINY["depth"] + 1) and all(wd[n] == 0.05 for n in dynamic)
    assert all(wd[n] == 0.0 for n in wd if n.endswith(".weight") and "norm" in n)  # γ, and LayerNorm's elsewhere
    assert sum(p.numel() for g in model.param_groups(0.05) for p in g["params"]) == \
        sum(p.numel() for p in model.parameters())  # every parameter in exactly one group


# ================================================================================================================
# CompleteP (arXiv 2505.01618): x ← x + m_L^{−α} F(LN x), μP's init, multipliers and per-group learning rates


def completep_reference(model: VisionTransformer, imgs: torch.Tensor, m_l: float, m_n: float, alpha: float = 1.0,
                        input_alpha: float = 1.0, output_alpha: float = 1.0) -> torch.Tensor:
    """The reference's forward (EleutherAI/nanoGPT-mup, branch completep, ``model.py``: ``Block.forward`` with
    ``residual_scaling = 1/m_L^α``, ``CausalSelfAttention`` with ``attention_scale = 1/d``, ``GPT.forward``'s
    ``x *= mup_input_alpha`` and ``x *= mup_output_alpha / mup_width_multiplier`` before the head), written out on
    the model's modules (a ViT: the patch embedding is the token embedding, the class token is read)."""
    x = tokens(model, imgs) * input_alpha
    scaling = 1 / (m_l ** alpha)
    for blk in model.blocks:
        a = blk.attn
        h = blk.norm1(x)
        B, N, C = h.shape
        q, k, v = a.qkv(h).split(C, dim=2)
        q, k, v = (t.view(B, N, a.num_heads, C // a.num_heads).transpose(1, 2) for t in (q, k, v))
        y = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / k.size(-1)), dim=-1) @ v
        x = x + scaling * a.proj(y.transpose(1, 2).reshape(B, N, C))
        x = x + scaling * blk.mlp(blk.norm2(x))
    x = model.norm(x)[:, 0]
    return model.head(x * (output_alpha / m_n))


@pytest.mark.parametrize("options, m_l, m_n", [({}, 1.5, 8 / 256), ({"base_depth": 3, "base_width": 8}, 1.0, 1.0),
                                               ({"alpha": 0.5, "input_alpha": 2.0, "output_alpha": 0.5}, 1.5, 8 / 256)])
@pytest.mark.parametrize("fused", [False, True])
def test_completep_equals_the_reference_forward(options, m_l, m_n, fused):
    model = perturb(build(parametrization="completep", parametrization_options=options, fused_attn=fused),
                    scale=0.2).eval()
    kw = {k: options[k] for k in ("alpha", "input_alpha", "output_alpha") if k in options}
    imgs = images()
    with torch.no_grad():
        assert torch.allclose(model(imgs), completep_reference(model, imgs, m_l, m_n, **kw), atol=1e-12, rtol=0)
    assert model.blocks[0].ls1.branch_scale == pytest.approx(m_l ** -options.get("alpha", 1.0))


def test_completep_init_scales_the_hidden_matrices_only():
    """Same seed: every matrix of the blocks is standard's × 1/√m_N (σ/√m_N), everything else standard's."""
    std = build().state_dict()
    cp = build(parametrization="completep", parametrization_options={"base_width": 32}).state_dict()  # m_N = 1/4
    for key, value in std.items():
        factor = 2.0 if key.startswith("blocks.") and value.ndim >= 2 else 1.0
        assert torch.allclose(cp[key], factor * value, atol=0, rtol=1e-15), key


def reference_groups(model: VisionTransformer, lr: float, wd: float, eps: float, m_l: float, m_n: float,
                     alpha: float = 1.0, eps_scope: str = "blocks") -> dict[str, tuple[float, float, float]]:
    """The reference's ``configure_optimizers`` (CompleteP branch) written out: name -> (lr, weight decay, ε), with
    its groups mapped to the ViT's parameters — hidden weights (c_attn, c_fc, c_proj: qkv, fc1, proj, fc2), hidden
    norms and biases, and the rest (embeddings, final norm, head); its ``weight_decay`` for the embeddings is the
    backbone's rule here (the reference decays its tied token embedding). ε: the paper's Table 1 scales it in the
    residual blocks only (``eps_scope="blocks"``), the reference code in every group (``"all"``)."""
    depth_lr, width_lr = m_l ** (alpha - 1), 1 / m_n
    base_eps, eps = eps, eps * (1 / m_n) * m_l ** -alpha
    decayed = {n for g in model.param_groups(wd) for p in g["params"] if g["weight_decay"] > 0
               for n, q in model.named_parameters() if q is p}
    out = {}
    for name, _ in model.named_parameters():
        if name.startswith("blocks.") and name.endswith(("qkv.weight", "fc1.weight", "proj.weight", "fc2.weight")):
            out[name] = (lr * width_lr * depth_lr, wd / width_lr, eps)
        elif name.startswith("blocks."):
            out[name] = (lr * depth_lr, 0.0, eps)
        else:
            out[name] = (lr, wd if name in decayed else 0.0, eps if eps_scope == "all" else base_eps)
    return out


@pytest.mark.parametrize("alpha, eps_scope", [(1.0, "blocks"), (0.5, "blocks"), (1.0, "all")])
def test_completep_optimizer_groups_equal_the_reference(alpha, eps_scope):
    """Through the LightningModule: each parameter's learning rate, weight decay and ε, and the schedule keeps the
    ratios (every group's rate follows the same warm-up and cosine)."""
    from lit_modules.classifier import ViTClassifier

    module = ViTClassifier("standard", **(TINY | {"depth": 4}), parametrization="completep",
                           parametrization_options={"base_width": 32, "alpha": alpha, "eps_scope": eps_scope},
                           lr=2e-3, weight_decay=0.05,
                           steps_per_epoch=4, max_epochs=2, warmup_epochs=0.5)
    configured = module.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    want = reference_groups(module.model, 2e-3, 0.05, 1e-8, m_l=2.0, m_n=0.25, alpha=alpha, eps_scope=eps_scope)
    assert len({e for _, _, e in want.values()}) == (1 if eps_scope == "all" else 2)
    names = {id(p): n for n, p in module.model.named_parameters()}
    seen = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            lr, wd, eps = want[names[id(p)]]
            assert (group["initial_lr"], group["weight_decay"], group["eps"]) == pytest.approx((lr, wd, eps)), names[id(p)]
            seen.add(names[id(p)])
    assert seen == set(want)
    assert optimizer.param_groups[0]["lr_scale"] == 1.0  # the logged "lr" is the base rate's
    for _ in range(3):
        optimizer.step()
        scheduler.step()
        ratios = {g["lr"] / g["initial_lr"] for g in optimizer.param_groups}
        assert max(ratios) - min(ratios) < 1e-12


def test_completep_refusals():
    for kw, message in (({"parametrization_options": {"alpha": 0.3}}, "alpha=0.3 is not valid for completep"),
                        ({"parametrization_options": {"base_depth": 0}}, "base_depth=0 is not valid for completep"),
                        ({"parametrization_options": {"depth_multiplier": 2}},
                         "option 'depth_multiplier' is not valid for parametrization 'completep'; valid options: "
                         "alpha, base_depth, base_width, eps_scope, input_alpha, output_alpha"),
                        ({"parametrization_options": {"eps_scope": "head"}},
                         "eps_scope='head' is not valid for completep; valid: blocks, all"),
                        ({"attention": "re_attention"}, "does not apply with attention 're_attention'"),
                        ({"norm_layer": "seednorm"}, "does not apply with norm_layer 'seednorm'"),
                        ({"class_attention_blocks": 1}, "does not apply with class_attention_blocks > 0")):
        with pytest.raises(ValueError, match=re.escape(message)):
            build(parametrization="completep", **kw)
    with pytest.raises(ValueError, match="parametrization 'completep' does not apply to residual 'layerscale'"):
        build("layerscale", parametrization="completep")
    with pytest.raises(ValueError, match="option 'base_depth' is not valid for parametrization 'standard'"):
        build(parametrization_options={"base_depth": 2})
    model = build(parametrization="completep")
    assert_live(model)


# ================================================================================================================
# the frontier study


def test_every_row_of_the_frontier_smoke_budget_trains_through_lightning():
    """Each row of the study's smoke budget (its tuning stage has the same rows) is built from its RunConfig on the
    real digits DataModule and takes one training and one validation batch through Lightning (``fast_dev_run``):
    the residual forms, the backbone options and CompleteP's per-group learning rates as the study trains them."""
    import lightning.pytorch as pl

    from ablations.studies.spec import load_spec
    from ablations.training import build_datamodule, build_model

    spec = load_spec("frontier", "smoke")
    points = spec.grid()
    assert len(points) == 21 and {p["variant"] for p in points} >= {"gpas", "siamese_norm", "deep_delta", "hybrid_norm",
                                                                     "mhc_lite", "kromhc", "muddformer", "qk_norm",
                                                                     "gated_attention", "seednorm", "completep",
                                                                     "hybrid_norm_megatron_init"}
    megatron = spec.run_config(next(p for p in points if p["variant"] == "hybrid_norm_megatron_init"))
    assert megatron.residual == "hybrid_norm" and megatron.parametrization_options == {"init": "megatron"}
    dm = build_datamodule(spec.run_config(points[0]).replace(precision="32-true"))
    torch.set_default_dtype(torch.float32)  # as a run trains (the autouse fixture's float64 is for the formulas)
    for point in points:
        config = spec.run_config(point).replace(precision="32-true")
        module = build_model(config, dm)
        before = [p.detach().clone() for p in module.parameters()]
        trainer = pl.Trainer(fast_dev_run=True, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu")
        trainer.fit(module, datamodule=dm)
        assert not module.diverged, point
        assert any(not torch.equal(b, p) for b, p in zip(before, module.parameters(), strict=True)), point
