"""Three recent designs against hand computation (float64, tiny models; reference: docs/variants.md §13–15).

- ``ortho`` (Oh et al., arXiv 2505.11881): Δ = f − (⟨x, f⟩/(‖x‖² + ε))·x per token, ⟨x, Δ⟩ = 0 up to ε;
- ``deepnorm`` (DeepNet, arXiv 2203.00555): post-LN block LN(α·x + G(x)), α = (2N)^{1/4}, β = (8N)^{−1/4} init;
- ``value_residual`` (ResFormer, arXiv 2410.17897): a backbone option, V_n ← λ₁V_1 + λ₂V_n for layers n ≥ 1.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from backbone import TINY, _float64_one_thread, assert_bad_options, build, perturb  # noqa: F401 (autouse fixture)
from timm.layers import DropPath
from torch import nn

from lit_modules import RESIDUALS, VisionTransformer
from lit_modules.diagnostics import collect_diagnostics
from lit_modules.diagnostics_logging import diagnostic_scalars
from lit_modules.residual.base import BlockArgs
from lit_modules.residual.deepnorm import deepnorm_alpha, deepnorm_beta
from lit_modules.residual.ortho import Ortho
from lit_modules.value_residual import FirstValues, FixedMix, LearnedMix, NoValueResidual


def images(n: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(seed))


def tokens(model: VisionTransformer, imgs: torch.Tensor) -> torch.Tensor:
    x = model.patch_embed(imgs)
    return torch.cat([model.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + model.pos_embed


def block_args(depth: int = 3) -> BlockArgs:
    return BlockArgs(dim=4, num_heads=1, mlp_ratio=2.0, qkv_bias=True, qk_norm=False, proj_drop=0.0, attn_drop=0.0,
                     drop_path=0.0, norm_layer=nn.LayerNorm, act_layer=nn.GELU, layer=0, depth=depth,
                     num_prefix_tokens=1)


def site_inputs(model: VisionTransformer, imgs: torch.Tensor) -> dict[tuple[int, str], tuple]:
    """(x, u, f) and Δ of every residual site in one forward (forward hooks on the sites)."""
    seen, handles = {}, []

    def recorder(key: tuple[int, str]):
        def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            seen[key] = (*args[:3], out)
        return hook

    for layer, name, site in model.residual_sites():
        handles.append(site.register_forward_hook(recorder((layer, name))))
    try:
        model(imgs)
    finally:
        for h in handles:
            h.remove()
    return seen


def assert_all_grads_live(model: VisionTransformer) -> None:
    imgs, y = images(), torch.tensor([0, 1, 2, 1])
    F.cross_entropy(model.train()(imgs), y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} is not used by the forward pass"
        assert p.grad.norm() > 0, f"{name} has zero gradient at init"


def decay_of(model: VisionTransformer) -> dict[str, float]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    wd = {by_id[id(p)]: g["weight_decay"] for g in model.param_groups(0.05) for p in g["params"]}
    assert set(wd) == set(by_id.values())
    return wd


X = [[1.0, -2.0, 0.5, 3.0], [-1.0, 0.25, 2.0, -0.5]]
FB = [[0.5, 1.0, -1.0, 2.0], [3.0, -0.5, 0.25, 1.0]]


# ================================================================================================================
# ortho


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_ortho_formula_by_hand(eps):
    site = Ortho(4, args=block_args(), eps=eps)
    want = []
    for x, f in zip(X, FB, strict=True):
        c = sum(a * b for a, b in zip(x, f, strict=True)) / (sum(a * a for a in x) + eps)
        want.append([fi - c * xi for xi, fi in zip(x, f, strict=True)])
    out = site(torch.tensor([X]), None, torch.tensor([FB]), None)
    assert torch.allclose(out, torch.tensor([want]), atol=1e-14, rtol=0)
    branch, skip = site.decompose(torch.tensor([X]), None, torch.tensor([FB]))
    assert torch.equal(branch, out) and skip == 1.0  # the branch term is the orthogonal component, skip x itself


def test_ortho_update_is_orthogonal_to_the_stream_in_a_model():
    """At every site ⟨x, Δ⟩ = ε·⟨x, f⟩/(‖x‖² + ε) exactly (0 up to ε); with a negligible ε, 0 within rounding."""
    for eps in (1e-6, 1e-30):
        model = perturb(build("ortho", {"eps": eps}), scale=0.1).eval()
        with torch.no_grad():
            seen = site_inputs(model, images())
        assert len(seen) == 2 * TINY["depth"]
        for x, _, f, delta in seen.values():
            dot = (x * delta).sum(-1)
            want = eps * (x * f).sum(-1) / (x.square().sum(-1) + eps)
            scale = x.norm(dim=-1) * f.norm(dim=-1)
            assert torch.allclose(dot, want, atol=1e-14 * scale.max().item(), rtol=1e-9)
            if eps == 1e-30:
                assert (dot.abs() <= 1e-12 * scale).all()
                # so the stream's squared norm grows by exactly ‖Δ‖² (Pythagoras)
                assert torch.allclose((x + delta).square().sum(-1), x.square().sum(-1) + delta.square().sum(-1),
                                      rtol=1e-10, atol=0)


def test_ortho_low_precision_keeps_the_stream_dtype():
    site = Ortho(4, args=block_args())
    x, f = torch.tensor([X], dtype=torch.bfloat16), torch.tensor([FB], dtype=torch.bfloat16)
    out = site(x, None, f, None)
    assert out.dtype == torch.bfloat16
    want = site(x.double(), None, f.double(), None)
    assert torch.allclose(out.double(), want, atol=0.05, rtol=0.02)


def test_ortho_diagnostics_report_the_parallel_split():
    """collect_diagnostics runs and its per-site parallel split equals the hand computation on the site's (x, f)."""
    model = perturb(build("ortho"), scale=0.1).eval()
    imgs = images()
    with torch.no_grad():
        seen = site_inputs(model, imgs)
    result = collect_diagnostics(model, imgs.float())
    for (layer, sublayer), (x, _, f, _) in seen.items():
        c = (x * f).sum(-1, keepdim=True) / (x.square().sum(-1, keepdim=True) + 1e-6)
        ratio = (c * x).norm(dim=-1) / f.norm(dim=-1)
        cos = (x * f).sum(-1) / (x.norm(dim=-1) * f.norm(dim=-1))
        got = result["params"][sublayer][layer]
        assert got["parallel_ratio"] == pytest.approx(ratio.mean().item(), rel=1e-6)  # logged as float32
        assert got["removed_energy"] == pytest.approx(ratio.square().mean().item(), rel=1e-6)
        assert got["cos_mean"] == pytest.approx(cos.mean().item(), rel=1e-6, abs=1e-9)
        assert 0.0 <= got["parallel_ratio"] <= 1.0
    assert result["skip_scale"]["attn"].tolist() == [1.0] * TINY["depth"]
    scalars = diagnostic_scalars(result)
    assert "diag/param/mlp/02/parallel_ratio" in scalars


def test_ortho_has_no_parameters_and_timm_names():
    ortho, std = build("ortho"), build("standard")
    assert set(ortho.state_dict()) == set(std.state_dict())
    assert all(torch.equal(ortho.state_dict()[k], v) for k, v in std.state_dict().items())  # same init
    assert decay_of(ortho) == decay_of(std)


# ================================================================================================================
# deepnorm


@pytest.mark.parametrize("depth", [1, 3, 12, 100])
def test_deepnorm_constants_follow_the_paper(depth):
    """Encoder-only (Table 1): α = (2N)^{1/4}, β = (8N)^{−1/4}, N = number of blocks."""
    assert deepnorm_alpha(depth) == pytest.approx((2 * depth) ** 0.25, rel=1e-15)
    assert deepnorm_beta(depth) == pytest.approx((8 * depth) ** -0.25, rel=1e-15)
    model = build("deepnorm", depth=depth) if depth <= 12 else None
    if model is not None:
        for _, _, site in model.residual_sites():
            assert site.alpha == deepnorm_alpha(depth) and site.beta == deepnorm_beta(depth)
    assert deepnorm_alpha(12) == pytest.approx(24 ** 0.25) and deepnorm_beta(12) == pytest.approx(96 ** -0.25)


def test_deepnorm_explicit_constants():
    site = build("deepnorm", {"alpha": 2.5, "beta": 0.1}).blocks[0].ls2
    assert (site.alpha, site.beta) == (2.5, 0.1)


def _layer_norm(z: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    mu = z.mean(-1, keepdim=True)
    var = (z - mu).square().mean(-1, keepdim=True)  # biased variance, ε inside the square root
    return (z - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def test_deepnorm_block_by_hand():
    """y = LN₁(α·x + Attn(x)), out = LN₂(α·y + MLP(y)): no pre-norm, the branches read the stream."""
    model = perturb(build("deepnorm"), scale=0.2).eval()
    blk = model.blocks[1]
    alpha = (2 * TINY["depth"]) ** 0.25
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        B, N, D = x.shape
        q, k, v = (x @ blk.attn.qkv.weight.T + blk.attn.qkv.bias).reshape(B, N, 3, 2, 4).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v
        attn = a.transpose(1, 2).reshape(B, N, D) @ blk.attn.proj.weight.T + blk.attn.proj.bias
        y = _layer_norm(alpha * x + attn, blk.norm1)
        mlp = F.gelu(y @ blk.mlp.fc1.weight.T + blk.mlp.fc1.bias) @ blk.mlp.fc2.weight.T + blk.mlp.fc2.bias
        want = _layer_norm(alpha * y + mlp, blk.norm2)
        assert torch.allclose(blk(x), want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("norm_layer", ["layernorm", "rmsnorm"])
def test_deepnorm_decompose_reassembles_the_update(norm_layer):
    """Δ = b + (c − 1)·x with c = α/σ(α·x + G) per token (the post-norm's scale of the skip)."""
    model = perturb(build("deepnorm", norm_layer=norm_layer), scale=0.2)
    x, f = torch.randn(2, 2, 5, 8, generator=torch.Generator().manual_seed(4)).unbind(0)
    for _, _, site in model.residual_sites():
        branch, skip = site.decompose(x, x, f)
        assert skip.shape == (2, 5, 1) and (skip > 0).all()
        assert torch.allclose(site(x, x, f, None), branch + (skip - 1) * x, atol=1e-12, rtol=0)
    site = build("deepnorm", norm_layer=norm_layer).blocks[0].ls1  # unit-gain norm: c = α/σ by hand
    z = site.alpha * x + f
    z = z - z.mean(-1, keepdim=True) if norm_layer == "layernorm" else z
    assert torch.allclose(site.decompose(x, x, f)[1], site.alpha / torch.sqrt(z.square().mean(-1, keepdim=True)
                                                                              + 1e-6), atol=1e-12, rtol=0)


def _weights(blk: nn.Module) -> dict[str, torch.Tensor]:
    q, k, v = blk.attn.qkv.weight.chunk(3)
    return {"q": q, "k": k, "v": v, "proj": blk.attn.proj.weight, "fc1": blk.mlp.fc1.weight,
            "fc2": blk.mlp.fc2.weight}


def test_deepnorm_xavier_init_scales_v_proj_fc_by_beta():
    """The paper's Fig. 2: Xavier-normal, gain β for fc1/fc2, the value rows and the output projection, gain 1
    for the query and key rows; biases 0. Empirical stds of a wider model against the formula."""
    depth, dim, ratio = 8, 96, 4.0
    torch.manual_seed(0)
    model = VisionTransformer("deepnorm", img_size=8, patch_size=4, embed_dim=dim, depth=depth, num_heads=2,
                              mlp_ratio=ratio)
    beta, hidden = (8 * depth) ** -0.25, int(dim * ratio)
    want = {"q": math.sqrt(2 / (2 * dim)), "k": math.sqrt(2 / (2 * dim)), "v": beta * math.sqrt(2 / (2 * dim)),
            "proj": beta * math.sqrt(2 / (2 * dim)), "fc1": beta * math.sqrt(2 / (dim + hidden)),
            "fc2": beta * math.sqrt(2 / (dim + hidden))}
    for blk in model.blocks:
        for name, w in _weights(blk).items():
            assert w.std().item() == pytest.approx(want[name], rel=0.05), name
            assert abs(w.mean().item()) < 0.1 * want[name], name
        assert blk.attn.qkv.bias.abs().max() == 0 and blk.mlp.fc1.bias.abs().max() == 0
    v_over_q = [_weights(b)["v"].std() / _weights(b)["q"].std() for b in model.blocks]
    assert sum(v_over_q).item() / depth == pytest.approx(beta, rel=0.03)


def test_deepnorm_timm_scaled_init_is_standard_times_beta():
    std = build("standard")
    scaled = build("deepnorm", {"init": "timm_scaled"})
    beta = (8 * TINY["depth"]) ** -0.25
    for a, b in zip(std.blocks, scaled.blocks, strict=True):
        wa, wb = _weights(a), _weights(b)
        for name in ("q", "k"):
            assert torch.equal(wa[name], wb[name]), name
        for name in ("v", "proj", "fc1", "fc2"):
            assert torch.allclose(wb[name], beta * wa[name], atol=0, rtol=1e-15), name
    # embeddings, head and the norms (post-norms here) keep the shared init
    assert torch.equal(std.patch_embed.proj.weight, scaled.patch_embed.proj.weight)
    assert torch.equal(std.head.weight, scaled.head.weight)


def test_deepnorm_final_norm_injection():
    """A post-LN stream ends normalised: no final norm by default; final_norm=True keeps timm's; a class-attention
    head (pre-norm updates of the class token) always keeps it."""
    assert isinstance(build("deepnorm").norm, nn.Identity)
    assert isinstance(build("deepnorm", global_pool="avg").fc_norm, nn.Identity)
    assert isinstance(build("deepnorm", {"final_norm": True}).norm, nn.LayerNorm)
    assert isinstance(build("deepnorm", class_attention_blocks=1).norm, nn.LayerNorm)
    for value in (True, False):  # so final_norm cannot change that model: given with the head, it is rejected
        with pytest.raises(ValueError) as err:
            build("deepnorm", {"final_norm": value}, class_attention_blocks=1)
        assert str(err.value) == ("option 'final_norm' does not apply to residual 'deepnorm' with "
                                  "class_attention_blocks=1 (the class-attention head always keeps the final norm); "
                                  "it applies with class_attention_blocks=0")
    assert isinstance(build("standard").norm, nn.LayerNorm) and isinstance(build("ortho").norm, nn.LayerNorm)
    model = perturb(build("deepnorm"), scale=0.1).eval()
    with torch.no_grad():  # the head reads the last block's post-LN output directly
        feats = model.stream(tokens(model, images()), model.blocks)
        assert torch.allclose(model(images()), model.head(feats[:, 0]), atol=1e-13, rtol=0)


def test_deepnorm_drop_path_drops_g_inside_the_norm():
    """DeepNet's code drops G inside the post-LN: with p = 1 each site is LN(α·x); with p = 0.5 a kept sample is
    LN(α·x + 2G) — still normalised in training (dropping Δ instead left kept samples un-normalised)."""
    model = perturb(build("deepnorm", drop_path_rate=1.0))
    for blk in model.blocks:
        blk.drop_path1, blk.drop_path2 = DropPath(1.0), DropPath(1.0)
    x0 = tokens(model, images())
    alpha = model.blocks[0].ls1.alpha
    with torch.no_grad():
        want = x0
        for blk in model.blocks:
            want = blk.norm2(alpha * blk.norm1(alpha * want))
        assert torch.allclose(model.train().stream(x0, model.blocks), want, atol=1e-12, rtol=0)
        assert not torch.allclose(model.eval().stream(x0, model.blocks), want)
        for blk in model.blocks:
            blk.drop_path1, blk.drop_path2 = DropPath(0.5), DropPath(0.5)
        torch.manual_seed(0)
        out = model.train().stream(x0, model.blocks)
        norm = model.blocks[-1].norm2  # every token of every sample leaves the last post-LN normalised
        centred = (out - norm.bias) / norm.weight
        assert torch.allclose(centred.mean(-1), torch.zeros_like(centred.mean(-1)), atol=1e-9)
        assert torch.allclose(centred.var(-1, unbiased=False), torch.ones_like(centred.mean(-1)), atol=1e-4)


def test_deepnorm_weight_decay_and_liveness():
    model = build("deepnorm")
    wd = decay_of(model)
    assert wd["blocks.0.norm1.weight"] == 0.0 and wd["blocks.2.norm2.bias"] == 0.0
    assert wd["blocks.0.attn.qkv.weight"] == 0.05 and wd["blocks.1.mlp.fc2.weight"] == 0.05
    assert "norm.weight" not in wd
    assert_all_grads_live(build("deepnorm"))


def test_deepnorm_diagnostics():
    model = perturb(build("deepnorm"), scale=0.1).eval()
    result = collect_diagnostics(model, images().float())
    for sublayer in ("attn", "mlp"):
        assert torch.isfinite(result["skip_scale"][sublayer]).all()
        assert (result["skip_scale"][sublayer] - 1).abs().min() > 1e-3  # α/σ, not 1
        assert all(v["branch_skip_ratio"] > 0 for v in result["params"][sublayer].values())


# ================================================================================================================
# value residual


def test_value_residual_none_is_todays_model():
    default, none = build(), build(value_residual="none")
    assert default.state_dict().keys() == none.state_dict().keys()
    assert all(isinstance(blk.attn.value_residual, NoValueResidual) for blk in none.blocks)
    with torch.no_grad():
        assert torch.equal(default(images()), none(images()))


def test_value_residual_modules_per_layer():
    fixed, learned = build(value_residual="fixed"), build(value_residual="learned")
    for model, later in ((fixed, FixedMix), (learned, LearnedMix)):
        assert type(model.blocks[0].attn.value_residual) is FirstValues
        assert all(type(b.attn.value_residual) is later for b in model.blocks[1:])
    assert not any("lambdas" in k for k in fixed.state_dict())
    assert [k for k in learned.state_dict() if "lambdas" in k] == [
        "blocks.1.attn.value_residual.lambdas", "blocks.2.attn.value_residual.lambdas"]
    assert all(b.attn.value_residual.lambdas.tolist() == [0.5, 0.5] for b in learned.blocks[1:])
    with torch.no_grad():  # the learned form starts as the fixed one (same seed, same shared weights)
        assert torch.allclose(fixed(images()), learned(images()), atol=1e-14, rtol=0)


def _recorder(inputs: list, outputs: list):
    def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:  # returns None: the output is kept
        inputs.append(args[0])
        outputs.append(out)
    return hook


def _capture_values(model: VisionTransformer) -> tuple[list, list]:
    """Per layer, the values each attention call computed (input of value_residual) and used (its output)."""
    own, used = [[] for _ in model.blocks], [[] for _ in model.blocks]
    for i, blk in enumerate(model.blocks):
        blk.attn.value_residual.register_forward_hook(_recorder(own[i], used[i]))
    return own, used


def test_value_residual_attention_output_by_hand():
    """Layer 1 of a fixed-λ model: U = softmax(QKᵀ/√d)·(½V_1 + ½V_n) with V_1 = layer 0's values, then proj."""
    model = perturb(build(value_residual="fixed"), scale=0.2).eval()
    inputs, outputs = [[], []], [[], []]
    for i in (0, 1):
        model.blocks[i].attn.register_forward_hook(_recorder(inputs[i], outputs[i]))
    with torch.no_grad():
        model(images())
        inputs, outputs = [i[0] for i in inputs], [o[0] for o in outputs]
        B, N, D = inputs[0].shape

        def qkv(i):
            attn = model.blocks[i].attn
            return (inputs[i] @ attn.qkv.weight.T + attn.qkv.bias).reshape(B, N, 3, 2, 4).permute(2, 0, 3, 1, 4)

        v1 = qkv(0)[2]
        q, k, v = qkv(1)
        a = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ (0.5 * v1 + 0.5 * v)
        attn = model.blocks[1].attn
        want = a.transpose(1, 2).reshape(B, N, D) @ attn.proj.weight.T + attn.proj.bias
        assert torch.allclose(outputs[1], want, atol=1e-13, rtol=0)
        # layer 0 uses its own values: its output is plain self-attention
        q0, k0, v0 = qkv(0)
        a0 = torch.softmax(q0 @ k0.transpose(-1, -2) / 2.0, dim=-1) @ v0
        want0 = a0.transpose(1, 2).reshape(B, N, D) @ model.blocks[0].attn.proj.weight.T + model.blocks[0].attn.proj.bias
        assert torch.allclose(outputs[0], want0, atol=1e-13, rtol=0)


@pytest.mark.parametrize("residual, options, calls", [
    ("standard", {}, [1, 1, 1]),
    ("layerscale", {"init_value": 0.1}, [1, 1, 1]),
    ("ortho", {}, [1, 1, 1]),
    ("deepnorm", {}, [1, 1, 1]),
    ("laurel", {"rank": 2}, [1, 1, 1]),
    ("dca", {}, [1, 1, 1]),            # DCA's cross-attention: layer 0 records the values of its composed v input
    ("skipdense", {}, [1, 2, 3]),      # block l runs its attention l + 1 times: every call mixes the same V_1
])
@pytest.mark.parametrize("attention", ["self", "re_attention"])
def test_first_layer_values_reach_every_layer(residual, options, calls, attention):
    model = perturb(build(residual, options, value_residual="fixed", attention=attention), scale=0.1).eval()
    own, used = _capture_values(model)
    with torch.no_grad():
        model(images())
    assert [len(c) for c in own] == calls
    v1 = own[0][0]
    assert torch.equal(used[0][0], v1)
    for i in range(1, len(model.blocks)):
        for v, u in zip(own[i], used[i], strict=True):
            assert torch.allclose(u, 0.5 * v1 + 0.5 * v, atol=1e-15, rtol=0)
    assert model.value_state.first is None  # closed after the forward: no reference kept


@pytest.mark.parametrize("residual", list(RESIDUALS))
def test_value_residual_combines_with_every_residual(residual):
    """Every registered variant builds its attentions through ``BlockArgs.attention()``: with the learned value
    residual, layer 0 records V_1 once per forward and every later layer mixes that V_1 into each of its calls."""
    options = {"rank": 2} if residual == "laurel" else {}
    model = perturb(build(residual, options, value_residual="learned"), scale=0.05)
    own, used = _capture_values(model)
    out = model.train()(images())
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    assert len(own[0]) == 1 and all(len(c) >= 1 for c in own)
    for i in range(1, len(model.blocks)):
        mix = model.blocks[i].attn.value_residual
        assert mix.lambdas.grad is not None and (mix.lambdas.grad != 0).all()
        lambda1, lambda2 = mix.lambdas.detach()  # perturbed off their init 0.5
        for v, u in zip(own[i], used[i], strict=True):
            assert torch.allclose(u, lambda1 * own[0][0] + lambda2 * v, atol=1e-14, rtol=0)


def test_value_residual_is_per_forward():
    """A second forward on other images records its own V_1 (not the first forward's)."""
    model = perturb(build(value_residual="fixed"), scale=0.1).eval()
    own, used = _capture_values(model)
    with torch.no_grad():
        model(images(seed=1))
        model(images(seed=2))
    assert torch.allclose(used[2][1], 0.5 * own[0][1] + 0.5 * own[2][1], atol=1e-15, rtol=0)
    assert not torch.allclose(own[0][0], own[0][1])


def test_value_residual_needs_the_backbone_forward():
    model = build(value_residual="fixed")
    with pytest.raises(RuntimeError, match="attention layer 1 ran before layer 0"):
        model.blocks[1](torch.randn(2, 5, 8))


def test_learned_lambdas_are_live_and_undecayed():
    model = perturb(build("layerscale", {"init_value": 0.1}, value_residual="learned", attention="re_attention"),
                    scale=0.05)
    for blk in model.blocks[1:]:
        nn.init.constant_(blk.attn.value_residual.lambdas, 0.5)
    imgs, y = images(), torch.tensor([0, 1, 2, 1])
    F.cross_entropy(model.train()(imgs), y).backward()
    for blk in model.blocks[1:]:
        grad = blk.attn.value_residual.lambdas.grad
        assert grad is not None and (grad != 0).all()
    wd = decay_of(model)
    assert wd["blocks.1.attn.value_residual.lambdas"] == 0.0
    assert "blocks.1.attn.value_residual.lambdas" in model.no_weight_decay()
    assert_all_grads_live(build(value_residual="learned"))


def test_value_residual_with_the_class_attention_head():
    """The CaiT class-attention blocks (timm's ClassAttn) are not self-attention layers: left unchanged."""
    model = perturb(build(value_residual="learned", class_attention_blocks=2), scale=0.05)
    out = model(images())
    assert torch.isfinite(out).all()
    assert not any(hasattr(b.attn, "value_residual") for b in model.blocks_token_only)


def test_value_residual_diagnostics_run():
    model = perturb(build("ortho", value_residual="learned"), scale=0.1)
    result = collect_diagnostics(model, images().float())
    assert len(result["params"]["attn"]) == TINY["depth"]


# ================================================================================================================
# option validation


@pytest.mark.parametrize("residual, options, words", [
    ("ortho", {"eps": 0.0}, ["eps=0.0", "ortho", "> 0"]),
    ("ortho", {"eps": "small"}, ["eps='small'"]),
    ("ortho", {"alpha": 2.0}, ["'alpha'", "belongs to deepnorm", "valid options: eps"]),
    ("deepnorm", {"alpha": -1.0}, ["alpha=-1.0", "'auto'"]),
    ("deepnorm", {"beta": "paper"}, ["beta='paper'", "'auto'"]),
    ("deepnorm", {"init": "kaiming"}, ["init='kaiming'", "xavier_normal", "timm_scaled"]),
    ("deepnorm", {"final_norm": "yes"}, ["final_norm='yes'", "True, False"]),
    ("deepnorm", {"eps": 1e-6}, ["'eps'", "belongs to ortho", "alpha, beta, final_norm, init"]),
])
def test_bad_options_raise_one_line(residual, options, words):
    assert_bad_options(residual, options, words)


def test_bad_value_residual_raises_one_line():
    with pytest.raises(ValueError) as err:
        build(value_residual="both")
    assert str(err.value) == "unknown value_residual 'both'; valid choices: none, fixed, learned"


def test_value_residual_config_and_cli():
    from ablations.config import RunConfig
    from ablations.train import build_parser, config_from_args

    assert RunConfig().value_residual == "none"
    with pytest.raises(ValueError, match=r"unknown value_residual 'on'; valid choices: none, fixed, learned"):
        RunConfig(value_residual="on")
    c = config_from_args(build_parser().parse_args(["--value-residual", "learned", "--residual", "ortho"]))
    assert (c.residual, c.value_residual) == ("ortho", "learned")
    assert c.run_name() == "ortho+vr_learned_d4_w64_digits_s0"
    assert c.to_hparams()["value_residual"] == "learned"
    from lit_modules.classifier import ViTClassifier

    module = ViTClassifier("deepnorm", img_size=8, patch_size=4, embed_dim=8, depth=2, num_heads=2,
                           value_residual=c.value_residual)
    assert module.model.value_residual == "learned" and module.model.residual == "deepnorm"
