"""The backbone's mechanisms orthogonal to the residual (reference: docs/variants.md, sections 9-12): DeepViT's
Re-attention, CaiT's class-attention head, SkipDense, and the norm layer — each against a hand computation —
plus the guarantee that a model built with the defaults is the model of before these options existed.

float64 on CPU with tiny models (``tests/backbone.py``).
"""

from __future__ import annotations

import math

import pytest
import torch
from backbone import LAUREL, TINY, _float64_one_thread, build, perturb  # noqa: F401 (autouse fixture)
from timm.layers import Attention, LayerNorm, RmsNorm
from timm.models.cait import ClassAttn, LayerScaleBlockClassAttn
from torch import nn

import lit_modules.diagnostics as diag
from lit_modules import RESIDUALS, VisionTransformer
from lit_modules.attention import ATTENTIONS, ReAttention, SelfAttention
from lit_modules.residual import cait_init_value

NO_NORM = {"head_norm": "none"}


def images(n: int = 4, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, TINY["img_size"], TINY["img_size"], generator=g)


def residual_options(residual: str) -> dict:
    return LAUREL if residual == "laurel" else {}


# ================================================================================================================
# the defaults are today's model


# recorded before the attention / class-attention / norm options were added (torch.manual_seed(0), TINY, float64)
DEFAULT_QKV_ROW = [-0.01326458335228758, -0.002591643321722412, -0.005039573919453282, -0.028670607415993764]
DEFAULT_LOGITS = [[-0.029798191721815994, -0.01911140295760618, -0.06993122685894193],
                  [-0.025161346039390943, -0.015544240570396942, -0.07178609695293733]]
DEFAULT_KEYS = sorted(
    [f"blocks.{i}.{name}.{p}" for i in range(3) for name in ("attn.proj", "attn.qkv", "mlp.fc1", "mlp.fc2", "norm1",
                                                           "norm2") for p in ("weight", "bias")]
    + ["cls_token", "head.bias", "head.weight", "norm.bias", "norm.weight", "patch_embed.proj.bias",
       "patch_embed.proj.weight", "pos_embed"])


def test_default_model_is_unchanged():
    model = build().eval()
    assert sorted(model.state_dict()) == DEFAULT_KEYS
    assert model.blocks[0].attn.qkv.weight[0, :4].tolist() == DEFAULT_QKV_ROW
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        logits = model(torch.randn(2, 3, 8, 8, generator=g))
    # float64 to a few ulp, not bit for bit: the BLAS kernels' summation order differs between CPUs (1 ulp on an
    # avx512 Xeon against the EPYC these were recorded on); any change to the model moves them by far more
    torch.testing.assert_close(logits, torch.tensor(DEFAULT_LOGITS, dtype=logits.dtype), rtol=1e-13, atol=0)
    assert all(type(m) is LayerNorm for m in model.modules() if isinstance(m, (nn.LayerNorm, RmsNorm)))
    assert len(model.blocks_token_only) == 0 and model.pos_embed.shape[1] == 5


def test_explicit_defaults_equal_the_implicit_ones():
    explicit = build(attention="self", attention_options={}, class_attention_blocks=0, norm_layer="layernorm",
                     norm_eps=1e-6)
    state, ref = explicit.state_dict(), build().state_dict()
    assert list(state) == list(ref) and all(torch.equal(state[k], ref[k]) for k in ref)


# ================================================================================================================
# Re-attention


def _attention_pair(**options) -> tuple[SelfAttention, ReAttention]:
    torch.manual_seed(3)
    sa = perturb(SelfAttention(8, num_heads=4, qkv_bias=True))
    ra = ReAttention(8, num_heads=4, qkv_bias=True, **options)
    ra.load_state_dict(sa.state_dict(), strict=False)  # the same qkv / proj weights
    return sa, ra


@pytest.mark.parametrize("fused", [True, False])
def test_re_attention_identity_without_norm_is_self_attention(fused):
    sa, ra = _attention_pair(**NO_NORM)
    with torch.no_grad():
        ra.reattn_weights.copy_(torch.eye(4))
    sa.fused_attn = ra.fused_attn = fused
    x = torch.randn(2, 5, 8)
    assert torch.allclose(ra(x), sa(x), atol=1e-6, rtol=0)
    assert torch.allclose(ra(x), sa(x), atol=1e-13, rtol=0)  # float64: equal up to rounding


def test_re_attention_model_at_init_equals_self_attention_model():
    """theta_init='identity' with head_norm='none': same parameters (per-name seeding) and the same logits."""
    std = build().eval()
    re_ = build(attention="re_attention", attention_options=NO_NORM).eval()
    shared = {k: v for k, v in re_.state_dict().items() if k in std.state_dict()}
    assert all(torch.equal(v, std.state_dict()[k]) for k, v in shared.items())
    assert set(re_.state_dict()) - set(shared) == {f"blocks.{i}.attn.reattn_weights" for i in range(3)}
    with torch.no_grad():
        assert torch.allclose(re_(images()), std(images()), atol=1e-6, rtol=0)


def test_re_attention_formula_by_hand():
    """Norm(Θᵀ softmax(QKᵀ/√d)) V with a random Θ and BatchNorm over heads in eval mode (running statistics)."""
    _, ra = _attention_pair(theta_init="randn")
    bn = ra.reattn_norm
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([0.1, -0.2, 0.05, 0.0]))
        bn.running_var.copy_(torch.tensor([0.5, 2.0, 1.5, 0.25]))
    ra.eval()
    x = torch.randn(2, 5, 8)
    B, N, H, d = 2, 5, 4, 2
    q, k, v = (x @ ra.qkv.weight.T + ra.qkv.bias).reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4)
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
    theta = ra.reattn_weights
    mixed = torch.stack([sum(theta[h, g] * a[:, h] for h in range(H)) for g in range(H)], dim=1)
    shape = (1, H, 1, 1)
    normed = ((mixed - bn.running_mean.view(shape)) / torch.sqrt(bn.running_var.view(shape) + bn.eps)
              * bn.weight.view(shape) + bn.bias.view(shape))
    out = (normed @ v).transpose(1, 2).reshape(B, N, 8) @ ra.proj.weight.T + ra.proj.bias
    assert torch.allclose(ra(x), out, atol=1e-12, rtol=0)


@pytest.mark.parametrize("head_norm", ["batch", "layer", "none"])
def test_theta_receives_gradient(head_norm):
    model = build(attention="re_attention", attention_options={"head_norm": head_norm})
    model(images()).sum().backward()
    for blk in model.blocks:
        grad = blk.attn.reattn_weights.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_batch_norm_over_heads_train_and_eval():
    _, ra = _attention_pair()  # the defaults: identity Θ, BatchNorm over heads
    assert isinstance(ra.reattn_norm, nn.BatchNorm2d) and ra.reattn_norm.num_features == 4
    maps = []
    ra.attn_drop.register_forward_hook(lambda m, args, out: maps.append(out))
    x = torch.randn(3, 5, 8)
    ra.train()
    out = ra(x)
    assert out.shape == x.shape and maps[-1].shape == (3, 4, 5, 5)
    # training: each head's regenerated map is standardised over (batch, query, key); statistics are tracked
    assert torch.allclose(maps[-1].mean(dim=(0, 2, 3)), torch.zeros(4), atol=1e-12)
    assert torch.allclose(maps[-1].var(dim=(0, 2, 3), unbiased=False), torch.ones(4), atol=1e-3)
    assert ra.reattn_norm.num_batches_tracked == 1 and not torch.equal(ra.reattn_norm.running_mean, torch.zeros(4))
    # eval: running statistics, so an image's output does not depend on the rest of the batch; no update
    ra.eval()
    running = ra.reattn_norm.running_mean.clone()
    with torch.no_grad():
        assert torch.allclose(ra(x)[:1], ra(x[:1]), atol=1e-13, rtol=0)
        assert not torch.allclose(ra(x), out)
    assert torch.equal(ra.reattn_norm.running_mean, running) and ra.reattn_norm.num_batches_tracked == 1


def test_layer_norm_over_heads():
    _, ra = _attention_pair(head_norm="layer", theta_init="randn")
    seen = []
    ra.reattn_norm.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    ra(torch.randn(2, 5, 8))
    mixed, normed = seen[-1]  # every (b, query, key) entry standardised over its 4 heads
    mu = mixed.mean(dim=1, keepdim=True)
    var = ((mixed - mu) ** 2).mean(dim=1, keepdim=True)
    assert torch.allclose(normed, (mixed - mu) / torch.sqrt(var + ra.reattn_norm.eps), atol=1e-12, rtol=0)
    assert normed.shape == (2, 4, 5, 5) and torch.allclose(normed.mean(dim=1), torch.zeros(2, 5, 5), atol=1e-12)


def test_re_attention_theta_init_and_per_name_seeding():
    model = build(attention="re_attention", attention_options={"theta_init": "randn"})
    again = build(attention="re_attention", attention_options={"theta_init": "randn"}, depth=4)
    thetas = [blk.attn.reattn_weights for blk in model.blocks]
    assert not torch.equal(thetas[0], thetas[1])  # each block's Θ from its own generator
    assert all(torch.equal(t, blk.attn.reattn_weights) for t, blk in zip(thetas, again.blocks, strict=False))
    assert torch.equal(build(attention="re_attention").blocks[0].attn.reattn_weights, torch.eye(2))


def test_re_attention_official_theta_init():
    """theta_init='official': the official code's 1×1 Conv2d(H, H) at PyTorch's default init, Kaiming-uniform with
    a = √5, i.e. Θ ~ U(−1/√H, 1/√H) — the same draws as uniform_(−1/√H, 1/√H) from the same generator state."""
    ra = ReAttention(8, num_heads=4, theta_init="official")
    torch.manual_seed(11)
    ra.init_weights()
    torch.manual_seed(11)
    want = torch.empty(4, 4).uniform_(-0.5, 0.5)  # 1/√4 = 0.5 (Kaiming's bound √(1/3)·√(3/4) up to rounding)
    assert torch.allclose(ra.reattn_weights, want, atol=1e-15, rtol=0) and not torch.equal(want, torch.zeros(4, 4))
    model = build(attention="re_attention", attention_options={"theta_init": "official"}, depth=2, num_heads=4,
                  embed_dim=16)
    thetas = [blk.attn.reattn_weights for blk in model.blocks]
    assert all(t.abs().max() <= 0.5 and not torch.equal(t, torch.eye(4)) for t in thetas)
    assert not torch.equal(thetas[0], thetas[1])


def test_re_attention_blocks_top_k():
    """blocks='top:k': only the last k blocks re-attend (DeepViT-S: top 5 of 16; DeepViT-L: top 12 of 32); the
    others are plain self-attention with the same parameter names, so a top-k model loads the all-blocks
    checkpoint's shared weights and differs from it only in the lower blocks' attention."""
    top = build(attention="re_attention", attention_options={"blocks": "top:1"})
    assert [type(blk.attn) for blk in top.blocks] == [SelfAttention, SelfAttention, ReAttention]
    assert [k for k in top.state_dict() if "reattn" in k] == [
        "blocks.2.attn.reattn_weights", "blocks.2.attn.reattn_norm.weight", "blocks.2.attn.reattn_norm.bias",
        "blocks.2.attn.reattn_norm.running_mean", "blocks.2.attn.reattn_norm.running_var",
        "blocks.2.attn.reattn_norm.num_batches_tracked"]
    every = build(attention="re_attention", attention_options={"blocks": "all"})
    assert all(type(blk.attn) is ReAttention for blk in every.blocks)
    assert top.attention_options["blocks"] == "top:1" and every.attention_options == build(
        attention="re_attention").attention_options  # "all" is the default
    # top:3 at depth 3 is every block: the same model as "all"
    assert sorted(build(attention="re_attention", attention_options={"blocks": "top:3"}).state_dict()) == sorted(
        every.state_dict())
    # with theta = I and no head norm, re-attention is self-attention: top:1 equals the plain model's function
    plain, top_id = build().eval(), build(attention="re_attention", attention_options={"blocks": "top:1", **NO_NORM})
    top_id.load_state_dict(plain.state_dict(), strict=False)
    with torch.no_grad():
        assert torch.allclose(top_id.eval()(images()), plain(images()), atol=1e-12, rtol=0)


@pytest.mark.parametrize(("kw", "words"), [
    ({"attention": "talking_heads"}, "unknown attention 'talking_heads'; valid choices: self, re_attention"),
    ({"attention": "re_attention", "attention_options": {"theta": "eye"}},
     "option 'theta' is not valid for attention 're_attention'; valid options: blocks, head_norm, theta_init"),
    ({"attention": "self", "attention_options": {"head_norm": "batch"}},
     "option 'head_norm' is not valid for attention 'self'; valid options: none"),
    ({"attention": "re_attention", "attention_options": {"head_norm": "group"}},
     "head_norm='group' is not valid; valid choices: batch, layer, none"),
    ({"attention": "re_attention", "attention_options": {"theta_init": "zeros"}},
     "theta_init='zeros' is not valid; valid choices: identity, randn, official"),
    ({"attention": "re_attention", "attention_options": {"blocks": "top:4"}},
     "blocks='top:4' asks for more blocks than depth=3; valid: 'all' or 'top:k' with 1 <= k <= 3"),
    ({"attention": "re_attention", "attention_options": {"blocks": "bottom:2"}},
     "blocks='bottom:2' is not valid; valid: 'all' or 'top:k' (the last k blocks, k >= 1)"),
    ({"attention": "re_attention", "attention_options": {"blocks": "top:0"}},
     "blocks='top:0' is not valid; valid: 'all' or 'top:k' (the last k blocks, k >= 1)"),
    ({"attention": "re_attention", "attention_options": {"head_norm": "layer"}, "num_heads": 1},
     "head_norm='layer' normalises over the heads and needs num_heads >= 2"),
    ({"norm_layer": "batchnorm"}, "unknown norm_layer 'batchnorm'; valid choices: layernorm, rmsnorm"),
    ({"norm_eps": 0.0}, "norm_eps must be > 0"),
    ({"class_attention_blocks": -1}, "class_attention_blocks must be an integer >= 0"),
    ({"class_attention_blocks": 2, "global_pool": "avg"}, "class_attention_blocks > 0 needs class_token=True"),
])
def test_bad_backbone_options_raise_one_line(kw, words):
    with pytest.raises(ValueError) as info:
        build(**kw)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_set_fused_attn_covers_every_attention():
    model = build(attention="re_attention", class_attention_blocks=2)
    for flag in (False, True):
        model.set_fused_attn(flag)
        flags = [m.fused_attn for m in model.modules() if isinstance(m, (Attention, ClassAttn))]
        assert len(flags) == 5 and all(f is flag for f in flags)
    model.eval()
    with torch.no_grad():
        fused = model(images())
        model.set_fused_attn(False)
        assert torch.allclose(model(images()), fused, atol=1e-12, rtol=0)


# ================================================================================================================
# CaiT's class-attention head


def test_class_attention_updates_only_the_class_token():
    model = perturb(build(class_attention_blocks=2)).eval()
    imgs = images()
    with torch.no_grad():
        x = model.pos_drop(model.patch_embed(imgs) + model.pos_embed)  # patch tokens only: no class token yet
        before = model.stream(x, model.blocks)
        cls = model.cls_token.expand(len(imgs), -1, -1)
        for blk in model.blocks_token_only:
            new = blk(before, cls)
            assert new.shape == cls.shape and not torch.allclose(new, cls)
            # by hand: x_cls + γ₁ ⊙ CA(LN[x_cls; x]) then + γ₂ ⊙ MLP(LN x_cls), query from x_cls alone
            u = blk.norm1(torch.cat([cls, before], dim=1))
            mid = cls + blk.gamma_1 * _class_attention_by_hand(blk.attn, u)
            assert torch.allclose(new, mid + blk.gamma_2 * blk.mlp(blk.norm2(mid)), atol=1e-12, rtol=0)
            cls = new
        features = model.forward_features(imgs)
    assert features.shape == (4, 5, 8)
    assert torch.allclose(features[:, 1:], model.norm(before), atol=1e-13, rtol=0)  # patches: untouched by CA
    assert torch.allclose(features[:, :1], model.norm(cls), atol=1e-13, rtol=0)


def _class_attention_by_hand(attn: ClassAttn, u: torch.Tensor) -> torch.Tensor:
    B, N, C = u.shape
    H = attn.num_heads
    q = attn.q(u[:, :1]).reshape(B, 1, H, C // H).transpose(1, 2)
    k, v = (lin(u).reshape(B, N, H, C // H).transpose(1, 2) for lin in (attn.k, attn.v))
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(C // H), dim=-1)  # (B, H, 1, N): CLS reads everything
    return attn.proj((a @ v).transpose(1, 2).reshape(B, 1, C))


def test_class_attention_structure_and_init():
    model = build(class_attention_blocks=2)
    assert len(model.blocks_token_only) == 2
    assert all(isinstance(b, LayerScaleBlockClassAttn) for b in model.blocks_token_only)
    assert model.pos_embed.shape == (1, 4, 8)  # CaiT: positions for the patches only
    # the self-attention blocks see no prefix token: Res-SE pools every token, and pool='patch_only' (which would
    # be the same model) is rejected
    res_se = build("res_se", {}, class_attention_blocks=2)
    assert all(site.skip_tokens == 0 for blk in res_se.blocks for site in blk.sites().values())
    with pytest.raises(ValueError, match="option 'pool' does not apply to residual 'res_se'"):
        build("res_se", {"pool": "patch_only"}, class_attention_blocks=2)
    assert build("res_se", {"pool": "patch_only"}).blocks[0].ls1.skip_tokens == 1
    gamma = cait_init_value(3)
    assert all(torch.equal(b.gamma_1, torch.full((8,), gamma)) for b in model.blocks_token_only)
    # per-name seeding: shared parameters equal today's model; one CA block equals the first of two
    std, one = build().state_dict(), build(class_attention_blocks=1).state_dict()
    state = model.state_dict()
    assert all(torch.equal(state[k], std[k]) for k in std if k.startswith("blocks."))
    assert all(torch.equal(state[k], v) for k, v in one.items() if k.startswith("blocks_token_only."))
    assert not torch.equal(state["blocks_token_only.0.attn.q.weight"], state["blocks_token_only.1.attn.q.weight"])
    assert model.cls_token.std() > 1e-3  # CaiT's trunc_normal(0.02): the class token is the CA query


def test_class_attention_load_pretrained_still_works_without_it():
    timm_like = build().state_dict()
    report = build(seed=1).load_pretrained(timm_like)
    assert report.new == []
    with pytest.raises(ValueError, match="pos_embed"):
        build(class_attention_blocks=2).load_pretrained(timm_like)


# ================================================================================================================
# every residual with every attention kind and with the class-attention head


@pytest.mark.parametrize("residual", list(RESIDUALS))
@pytest.mark.parametrize("backbone", [{"attention": "self"}, {"attention": "re_attention"},
                                      {"attention": "re_attention", "attention_options": {"head_norm": "layer",
                                                                                          "theta_init": "randn"}},
                                      {"class_attention_blocks": 2},
                                      {"class_attention_blocks": 2, "attention": "re_attention",
                                       "norm_layer": "rmsnorm"}],
                         ids=["self", "re_attention", "re_attention_layer", "ca2", "ca2_re_rms"])
def test_every_residual_runs_with_every_mechanism(residual, backbone):
    model = perturb(build(residual, residual_options(residual), **backbone), scale=0.05)
    out = model(images())
    assert out.shape == (4, 3) and torch.isfinite(out).all()
    out.square().sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    kind = ATTENTIONS[backbone.get("attention", "self")]
    assert all(type(blk.attn) is kind for blk in model.blocks)
    assert sum(g.abs().sum() for g in (b.attn.qkv.weight.grad for b in model.blocks)) > 0


@pytest.mark.parametrize("fused", [True, False])
def test_dca_cross_attention_uses_re_attention(fused):
    """DCA's q/k/v composition runs the block's attention core: with identity Θ and no norm it equals DCA with
    self-attention; with a random Θ it differs."""
    std = build("dca", fused_attn=fused).eval()
    ident = build("dca", attention="re_attention", attention_options=NO_NORM, fused_attn=fused).eval()
    mixed = build("dca", attention="re_attention", attention_options={"theta_init": "randn", "head_norm": "none"},
                  fused_attn=fused).eval()
    with torch.no_grad():
        assert torch.allclose(ident(images()), std(images()), atol=1e-12, rtol=0)
        assert not torch.allclose(mixed(images()), std(images()), atol=1e-6)


# ================================================================================================================
# diagnostics


def _captured_maps(monkeypatch, model: VisionTransformer) -> list[torch.Tensor]:
    captured = []
    real = diag.attention_similarity

    def spy(maps, **kw):
        captured.extend(maps)
        return real(maps, **kw)

    monkeypatch.setattr(diag, "attention_similarity", spy)
    diag.collect_diagnostics(model, images())
    return captured


def test_diagnostics_record_the_regenerated_maps_before_the_head_norm(monkeypatch):
    model = perturb(build(attention="re_attention", attention_options={"theta_init": "randn"}), scale=0.1)
    model.train()(images(8, seed=5))  # non-trivial BatchNorm running statistics
    maps = _captured_maps(monkeypatch, model)
    assert model.training  # restored
    assert len(maps) == 3 and maps[0].shape == (4, 2, 5, 5)
    model.eval()
    with torch.no_grad():  # block 0's map by hand: the standard tokens, norm1, qkv, softmax, Θ — before the
        # BatchNorm over heads (after it the column similarity is ≈ 0 by construction: ReAttention.map_tap)
        imgs = images()
        x = model.patch_embed(imgs)
        x = torch.cat([model.cls_token.expand(len(imgs), -1, -1), x], dim=1) + model.pos_embed
        blk = model.blocks[0]
        u = blk.norm1(x)
        q, k, _ = (u @ blk.attn.qkv.weight.T + blk.attn.qkv.bias).reshape(4, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)
        regenerated = torch.einsum("bhij,hg->bgij", a, blk.attn.reattn_weights)
        normalised = blk.attn.reattn_norm(regenerated)
    assert torch.allclose(maps[0], regenerated, atol=1e-12, rtol=0)
    assert not torch.allclose(maps[0], a, atol=1e-3)  # not the plain softmax
    assert not torch.allclose(maps[0], normalised, atol=1e-3)  # nor the maps after the head norm


def test_diagnostics_run_on_class_attention_and_skipdense(monkeypatch):
    model = build(class_attention_blocks=2)
    model.set_fused_attn(True)
    maps = _captured_maps(monkeypatch, model)
    assert len(maps) == 3 and maps[0].shape == (4, 2, 4, 4)  # self-attention blocks: patch tokens only
    assert all(m.fused_attn is True for m in model.modules() if isinstance(m, ClassAttn))  # restored
    out = diag.collect_diagnostics(build("skipdense"), images())
    assert out["attn_sim_full"].shape == (3, 3) and torch.isfinite(out["ratio_mean"]["block"]).all()


# ================================================================================================================
# SkipDense


def test_skipdense_equals_its_formula_on_three_blocks():
    """x_{l+1} = x_l + Σ_{i ≤ l} f_l(x_i), f_l(x) = A_l(LN₁x) + M_l(LN₂(x + A_l(LN₁x))), computed by hand."""
    model = perturb(build("skipdense")).eval()
    imgs = images()
    with torch.no_grad():
        x = model.patch_embed(imgs)
        x0 = torch.cat([model.cls_token.expand(len(imgs), -1, -1), x], dim=1) + model.pos_embed

        def f(layer: int, state: torch.Tensor) -> torch.Tensor:
            blk = model.blocks[layer]
            a = blk.attn(blk.norm1(state))
            return a + blk.mlp(blk.norm2(state + a))

        x1 = x0 + f(0, x0)
        x2 = x1 + f(1, x0) + f(1, x1)
        x3 = x2 + f(2, x0) + f(2, x1) + f(2, x2)
        assert torch.allclose(model.stream(x0, model.blocks), x3, atol=1e-12, rtol=0)
        assert torch.allclose(model(imgs), model.head(model.norm(x3)[:, 0]), atol=1e-12, rtol=0)
        # not the standard residual once there is more than one block
        assert not torch.allclose(x3, x2 + f(2, x2), atol=1e-6)


def test_skipdense_depth_one_is_standard_and_has_no_parameters():
    std, dense = build(depth=1).eval(), build("skipdense", depth=1).eval()
    assert list(dense.state_dict()) == [k.replace("ls1.", "").replace("ls2.", "") for k in std.state_dict()]
    with torch.no_grad():
        assert torch.allclose(dense(images()), std(images()), atol=1e-12, rtol=0)
    calls = []
    model = build("skipdense")
    for blk in model.blocks:
        blk.attn.register_forward_hook(lambda m, a, o: calls.append(m))
    model(images())
    assert len(calls) == 1 + 2 + 3  # quadratic: block l runs its branch l + 1 times


# ================================================================================================================
# the norm layer


def _row_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and biased variance of the last dimension by explicit sums (divide by D, not D − 1)."""
    D = x.shape[-1]
    mu = x.sum(dim=-1, keepdim=True) / D
    return mu, ((x - mu) ** 2).sum(dim=-1, keepdim=True) / D


def test_layer_norm_matches_the_hand_formula_and_its_pitfalls():
    torch.manual_seed(0)
    ln = build(norm_eps=1e-2).norm  # the model's own (timm) LayerNorm, with the ε it was given
    with torch.no_grad():
        ln.weight.copy_(torch.randn(8))
        ln.bias.copy_(torch.randn(8))
    x = torch.randn(2, 3, 8) * torch.tensor([0.05, 1.0, 20.0]).view(1, 3, 1)  # tokens of very different scale
    mu, var = _row_stats(x)
    want = ln.weight * (x - mu) / torch.sqrt(var + 1e-2) + ln.bias
    got = ln(x)
    assert ln.eps == 1e-2 and torch.allclose(got, want, atol=1e-12, rtol=0)
    # pitfall 1: the unbiased variance (D − 1) is not what LayerNorm uses
    unbiased = ln.weight * (x - mu) / torch.sqrt(x.var(dim=-1, keepdim=True, unbiased=True) + 1e-2) + ln.bias
    assert not torch.allclose(got, unbiased, atol=1e-3)
    # pitfall 2: ε inside the square root, not added to the standard deviation (matters for the small token)
    outside = ln.weight * (x - mu) / (torch.sqrt(var) + 1e-2) + ln.bias
    assert not torch.allclose(got[:, 0], outside[:, 0], atol=1e-3)
    # pitfall 3: the last dimension only — each token of a (B, N, D) input on its own, not over (N, D) or batch
    assert torch.allclose(got[1, 2], ln(x[1, 2]), atol=1e-13, rtol=0)
    whole = (x - x.mean(dim=(1, 2), keepdim=True)) / torch.sqrt(x.var(dim=(1, 2), keepdim=True, unbiased=False)
                                                                 + 1e-2)
    assert not torch.allclose(got, ln.weight * whole + ln.bias, atol=1e-3)
    assert torch.allclose(((got - ln.bias) / ln.weight).mean(dim=-1), torch.zeros(2, 3), atol=1e-12)


def test_rms_norm_matches_the_hand_formula():
    model = build(norm_layer="rmsnorm", norm_eps=1e-3)
    norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, RmsNorm))]
    assert norms and all(type(m) is RmsNorm and m.eps == 1e-3 for m in norms)
    assert "norm.bias" not in model.state_dict()  # RMSNorm has a gain only
    rms = model.norm
    with torch.no_grad():
        rms.weight.copy_(torch.randn(8))
    x = torch.randn(2, 3, 8) + 3.0  # a mean RMSNorm must not remove
    want = rms.weight * x / torch.sqrt((x ** 2).sum(dim=-1, keepdim=True) / 8 + 1e-3)
    assert torch.allclose(rms(x), want, atol=1e-12, rtol=0)
    assert not torch.allclose(rms(x), rms.weight * (x - x.mean(-1, keepdim=True)) / torch.sqrt(
        _row_stats(x)[1] + 1e-3), atol=1e-3)  # not LayerNorm: no centring
    assert torch.allclose(rms(x)[0, 1], rms(x[0, 1]), atol=1e-13, rtol=0)  # per token
