"""Multi-stream residuals: Hyper-Connections (``hyper_connections``, arXiv 2409.19606) and mHC (``mhc``, arXiv
2512.24880); lit_modules/residual/hyper_connections.py and mhc.py, reference docs/variants.md sections 13–14.

float64, CPU, tiny models. Every formula is checked against a hand computation in plain Python; the models are
checked against the standard ViT at init, for weight-decay grouping, gradient liveness, DropPath and options, and
the diagnostics for the stream view and the composite gain of the stream mixing.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from backbone import TINY, _float64_one_thread, assert_bad_options, build, perturb  # noqa: F401 (autouse fixture)
from timm.layers import DropPath
from torch import nn

from lit_modules import VisionTransformer
from lit_modules.diagnostics import TAGS, collect_diagnostics, composite_gain
from lit_modules.diagnostics_logging import diagnostic_scalars
from lit_modules.residual.base import BlockArgs
from lit_modules.residual.hyper_connections import HyperBlock, HyperConnections, MultiStream
from lit_modules.residual.mhc import MHC, identity_logit, sinkhorn_knopp


def images(n: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(seed))


def tokens(model: VisionTransformer, imgs: torch.Tensor) -> torch.Tensor:
    x = model.patch_embed(imgs)
    return torch.cat([model.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + model.pos_embed


def block_args(dim: int = 4, layer: int = 0) -> BlockArgs:
    return BlockArgs(dim=dim, num_heads=1, mlp_ratio=2.0, qkv_bias=True, qk_norm=False, proj_drop=0.0,
                     attn_drop=0.0, drop_path=0.0, norm_layer=nn.LayerNorm, act_layer=nn.GELU, layer=layer,
                     depth=3, num_prefix_tokens=1)


def assign(param: torch.Tensor, value) -> None:
    with torch.no_grad():
        param.copy_(torch.tensor(value))


def sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def close(got: torch.Tensor, want, atol: float = 1e-13) -> None:
    want = torch.tensor(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.allclose(got, want, atol=atol, rtol=0), (got, want)


# ================================================================================================================
# 1. equal to the standard ViT at init


@pytest.mark.parametrize("residual, options", [
    ("hyper_connections", {"n": 1, "dynamic": False}), ("hyper_connections", {"n": 1}),
    ("hyper_connections", {"dynamic": False}), ("hyper_connections", {}), ("hyper_connections", {"n": 3}),
    ("mhc", {}), ("mhc", {"res_init": "identity"}), ("mhc", {"res_init": "hc"}), ("mhc", {"n": 1}),
], ids=str)
def test_equals_standard_at_init(residual, options):
    """Every stream stays a copy of the standard stream at init (HC: A_m = e_k, A_r = I, B = 1, W = 0; mHC: any
    doubly stochastic H_res keeps equal streams, H_post = 1, φ = 0), so with the standard model's (perturbed)
    weights the logits agree. The n streams are summed before the final norm (n× the standard stream) and mHC reads
    h = Σσ(b_pre)·x = 1.095·x: both only through the norms' ε, which norm_eps = 1e-20 removes."""
    std = perturb(build("standard", norm_eps=1e-20)).eval()
    model = build(residual, options, seed=1, norm_eps=1e-20).eval()
    result = model.load_state_dict(std.state_dict(), strict=False)
    assert result.unexpected_keys == []
    assert result.missing_keys and all(re.match(r"blocks\.\d\.ls[12]\.", k) for k in result.missing_keys)
    with torch.no_grad():
        out, ref = model(images()), std(images())
    assert (out - ref).abs().max().item() < 1e-12


def test_n1_static_is_exactly_standard_with_the_default_eps():
    """n = 1: h = x, H' = x + T(x), one stream summed: the standard residual, bit for bit up to rounding."""
    std = perturb(build("standard")).eval()
    for options in ({"n": 1, "dynamic": False}, {"n": 1}):
        model = build("hyper_connections", options, seed=1).eval()
        model.load_state_dict(std.state_dict(), strict=False)
        with torch.no_grad():
            assert (model(images()) - std(images())).abs().max().item() < 1e-14
    # n = 2 (the default) with the default ε: n× the stream reaches the final norm, a change of order ε/Var(x)
    model = build("hyper_connections", seed=1).eval()
    model.load_state_dict(std.state_dict(), strict=False)
    with torch.no_grad():
        assert torch.allclose(model(images()), std(images()), rtol=1e-3, atol=1e-6)


def test_default_options_and_init():
    hc = build("hyper_connections")  # n = 2: the paper's ViT rate (Appendix E.2); 4 is its language-model rate
    assert hc.residual_options == {"n": 2, "dynamic": True}
    site = hc.blocks[1].ls2  # layer k = 2·1 + 1 = 3
    assert site.index == 3 and site.a_m[:, 0].tolist() == [0.0, 1.0]
    assert [s.a_m.argmax().item() for blk in hc.blocks for s in (blk.ls1, blk.ls2)] == [0, 1, 0, 1, 0, 1]
    assert torch.equal(site.a_r, torch.eye(2)) and site.b.tolist() == [[1.0] * 2]
    assert site.s_alpha.item() == site.s_beta.item() == 0.01
    assert all(torch.equal(w, torch.zeros_like(w)) for w in (site.w_m, site.w_r, site.w_b))
    assert (site.w_m.shape, site.w_r.shape, site.w_b.shape) == ((8, 1), (8, 2), (8, 1))  # the paper's W shapes
    lm = build("hyper_connections", {"n": 4}).blocks[1].ls2  # the language-model rate, by name
    assert lm.a_m[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0] and torch.equal(lm.a_r, torch.eye(4))
    mhc = build("mhc")
    assert mhc.residual_options == {"n": 4, "sinkhorn_iters": 20, "alpha_init": 0.01, "res_init": "paddlefleet_pr1849"}
    site = mhc.blocks[0].ls2
    assert site.b_pre.tolist() == [[-3.0, 3.0, -3.0, -3.0]] and site.b_post.tolist() == [[0.0] * 4]
    assert torch.equal(site.b_res, 6 * torch.eye(4) - 3)
    assert [a.item() for a in (site.alpha_pre, site.alpha_post, site.alpha_res)] == [0.01] * 3
    assert (site.phi_pre.shape, site.phi_post.shape, site.phi_res.shape) == ((32, 4), (32, 4), (32, 16))


# ================================================================================================================
# 2. the formulas against hand computations

H2 = [[1.0, -2.0, 0.5, 3.0], [0.25, 3.0, -1.0, 0.5]]  # two streams of one token, D = 4
FB = [2.0, -1.0, 0.5, 1.5]  # the branch output T(h)


def hc_update_hand(a_m, a_r, b, H=H2, f=FB):
    """h = A_mᵀH and Δ = A_rᵀH + Bᵀf − H, written out."""
    n, d = len(H), len(H[0])
    h = [sum(a_m[i] * H[i][c] for i in range(n)) for c in range(d)]
    new = [[sum(a_r[i][j] * H[i][c] for i in range(n)) + b[j] * f[c] for c in range(d)] for j in range(n)]
    return h, [[new[j][c] - H[j][c] for c in range(d)] for j in range(n)]


def test_formula_static_read_write():
    site = HyperConnections(4, args=block_args(), n=2, dynamic=False)
    a_m, a_r, b = [0.7, -0.4], [[0.9, 0.2], [-0.3, 1.1]], [0.5, 1.5]
    assign(site.a_m, [[v] for v in a_m])
    assign(site.a_r, a_r)
    assign(site.b, [b])
    h, delta = hc_update_hand(a_m, a_r, b)
    x = torch.tensor([[H2]])  # (batch 1, token 1, n 2, D 4)
    mixing = site.mixing(x)
    close(site.read(x, mixing), [[h]])
    close(site(x, torch.zeros(1, 1, 4), torch.tensor([[FB]])), [[delta]])
    close(mixing.res, [[a_r[i][j] for i in range(2)] for j in range(2)])  # M = A_rᵀ: row = output stream


def layer_norm_hand(row, weight, bias, eps=1e-5):
    mean = sum(row) / len(row)
    var = sum((v - mean) ** 2 for v in row) / len(row)
    return [(v - mean) / math.sqrt(var + eps) * w + c for v, w, c in zip(row, weight, bias, strict=True)]


def test_formula_dynamic_term():
    """DHC: A_m(H) = A_m + s_α tanh(H̄ W_m), A_r(H) = A_r + s_α tanh(H̄ W_r), B(H) = B + s_β tanh(H̄ W_β)ᵀ with
    H̄ = LN(H) per stream (row i of the dynamic part from stream i)."""
    site = HyperConnections(4, args=block_args(), n=2, dynamic=True)
    a_m, a_r, b = [0.7, -0.4], [[0.9, 0.2], [-0.3, 1.1]], [0.5, 1.5]
    w_m, w_b = [0.5, -1.0, 0.25, 2.0], [-0.5, 0.75, 1.0, -0.25]
    w_r = [[1.0, -0.5], [0.25, 0.5], [-1.5, 0.0], [0.5, 2.0]]  # (D, n)
    ln_w, ln_b = [1.5, 0.5, -1.0, 2.0], [0.1, 0.0, -0.2, 0.3]
    s_a, s_b = 0.3, -0.6
    assign(site.a_m, [[v] for v in a_m])
    assign(site.a_r, a_r)
    assign(site.b, [b])
    assign(site.w_m, [[v] for v in w_m])
    assign(site.w_r, w_r)
    assign(site.w_b, [[v] for v in w_b])
    assign(site.s_alpha, [s_a])
    assign(site.s_beta, [s_b])
    assign(site.dyn_norm.weight, ln_w)
    assign(site.dyn_norm.bias, ln_b)
    hbar = [layer_norm_hand(row, ln_w, ln_b) for row in H2]
    dot = lambda u, w: sum(p * q for p, q in zip(u, w, strict=True))  # noqa: E731
    dm = [a_m[i] + s_a * math.tanh(dot(hbar[i], w_m)) for i in range(2)]
    dr = [[a_r[i][j] + s_a * math.tanh(dot(hbar[i], [w_r[c][j] for c in range(4)])) for j in range(2)]
          for i in range(2)]
    db = [b[j] + s_b * math.tanh(dot(hbar[j], w_b)) for j in range(2)]
    x = torch.tensor([[H2]])
    got_m, got_r, got_b = site.coefficients(x)
    close(got_m, [[dm]])
    close(got_r, [[dr]])
    close(got_b, [[db]])
    h, delta = hc_update_hand(dm, dr, db)
    close(site.read(x, site.mixing(x)), [[h]])
    close(site(x, torch.zeros(1, 1, 4), torch.tensor([[FB]])), [[delta]])
    # with W = 0 (the init) the dynamic part vanishes whatever s: DHC = SHC at init
    for w in (site.w_m, site.w_r, site.w_b):
        torch.nn.init.zeros_(w)
    static = [t.tolist() for t in site.coefficients(x)]
    assert static == [[[a_m]], [[a_r]], [[b]]]


def sinkhorn_hand(m, iters):
    """exp, then rows, then columns, ``iters`` times: the paper's iteration in plain Python."""
    m = [[math.exp(v) for v in row] for row in m]
    n = len(m)
    for _ in range(iters):
        m = [[v / sum(row) for v in row] for row in m]
        cols = [sum(m[i][j] for i in range(n)) for j in range(n)]
        m = [[m[i][j] / cols[j] for j in range(n)] for i in range(n)]
    return m


def test_sinkhorn_knopp_matches_the_plain_iteration():
    logits = [[0.0, 1.0, -0.5], [2.0, 0.0, 0.3], [-1.0, 0.5, 1.5]]
    for iters in (1, 3, 20):
        close(sinkhorn_knopp(torch.tensor(logits), iters), sinkhorn_hand(logits, iters), atol=1e-14)
    out = sinkhorn_knopp(torch.tensor(logits), 20)
    assert torch.allclose(out.sum(-2), torch.ones(3), atol=1e-14)  # columns last: exact
    assert torch.allclose(out.sum(-1), torch.ones(3), atol=1e-8)


def test_formula_mhc():
    """x⃗ = vec(x) ∈ R^{nD}, x̃ = x⃗/rms(x⃗); H_pre = σ(α_pre x̃φ_pre + b_pre), H_post = 2σ(α_post x̃φ_post + b_post),
    H_res = SK(α_res mat(x̃φ_res) + b_res); h = Σ_j H_pre,j x_j and x' = H_res x + H_postᵀ f (n = 2, D = 2)."""
    site = MHC(2, args=block_args(dim=2), n=2, sinkhorn_iters=20)
    xs = [[1.0, -2.0], [0.5, 3.0]]
    f = [2.0, -1.0]
    phi_pre = [[0.5, -1.0], [0.25, 0.0], [-0.5, 1.0], [1.0, 0.5]]
    phi_post = [[-0.25, 0.5], [1.0, -1.0], [0.0, 0.75], [0.5, 0.25]]
    phi_res = [[0.5, 0.0, -0.5, 1.0], [0.25, 1.0, 0.0, -1.0], [-1.0, 0.5, 0.5, 0.0], [0.0, -0.25, 1.0, 0.5]]
    b_pre, b_post, b_res = [0.3, -0.2], [0.1, 0.4], [[1.0, -0.5], [0.25, 0.75]]
    a_pre, a_post, a_res = 0.7, -0.4, 1.2
    for p, v in ((site.phi_pre, phi_pre), (site.phi_post, phi_post), (site.phi_res, phi_res), (site.b_pre, [b_pre]),
                 (site.b_post, [b_post]), (site.b_res, b_res), (site.alpha_pre, [a_pre]),
                 (site.alpha_post, [a_post]), (site.alpha_res, [a_res])):
        assign(p, v)
    vec = xs[0] + xs[1]
    rms = math.sqrt(sum(v * v for v in vec) / 4 + 1e-6)
    v = [e / rms for e in vec]
    proj = lambda phi, j: sum(v[r] * phi[r][j] for r in range(4))  # noqa: E731
    pre = [sig(a_pre * proj(phi_pre, j) + b_pre[j]) for j in range(2)]
    post = [2 * sig(a_post * proj(phi_post, j) + b_post[j]) for j in range(2)]
    res = sinkhorn_hand([[a_res * proj(phi_res, 2 * i + j) + b_res[i][j] for j in range(2)] for i in range(2)], 20)
    h = [sum(pre[j] * xs[j][c] for j in range(2)) for c in range(2)]
    new = [[sum(res[i][j] * xs[j][c] for j in range(2)) + post[i] * f[c] for c in range(2)] for i in range(2)]
    x = torch.tensor([[xs]])
    mixing = site.mixing(x)
    close(mixing.read, [[pre]])
    close(mixing.write, [[post]])
    close(mixing.res, [[res]])
    close(site.read(x, mixing), [[h]])
    close(site(x, torch.zeros(1, 1, 2), torch.tensor([[f]])), [[[[new[i][c] - xs[i][c] for c in range(2)]
                                                                  for i in range(2)]]])


@pytest.mark.parametrize("residual, options", [("hyper_connections", {}), ("mhc", {"n": 3})], ids=str)
def test_block_wiring(residual, options):
    """Attention site then MLP site, each reading the streams the previous one wrote; DropPath off."""
    model = perturb(build(residual, options), scale=0.2).eval()
    blk = model.blocks[1]
    n = model.residual_options["n"]
    x = torch.randn(2, 5, n, 8)
    with torch.no_grad():
        want = x
        for site, norm, branch in ((blk.ls1, blk.norm1, blk.attn), (blk.ls2, blk.norm2, blk.mlp)):
            mixing = site.mixing(want)
            read, res, write = mixing.read, mixing.res, mixing.write
            f = branch(norm(torch.einsum("bti,btid->btd", read, want)))
            want = torch.einsum("btij,btjd->btid", res, want) + write[..., None] * f[..., None, :]
        assert torch.allclose(blk(x), want, atol=1e-12, rtol=0)
    assert isinstance(blk, HyperBlock) and isinstance(model.stream, MultiStream) and model.stream.n == n


def test_stream_expands_and_sums():
    model = build("hyper_connections", {"n": 3}).eval()
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    x0 = tokens(model, images())
    with torch.no_grad():
        out = model.stream(x0, model.blocks)
    assert seen[0].shape == (4, 5, 3, 8) and all(torch.equal(seen[0][:, :, i], x0) for i in range(3))
    with torch.no_grad():  # the summed output is 3× a standard stream with the same weights
        std = build("standard")
        std.load_state_dict(model.state_dict(), strict=False)
        assert torch.allclose(out, 3 * std.stream(x0, std.blocks), atol=1e-12, rtol=0)


# ================================================================================================================
# 3. mHC's constraint and its inits


def test_h_res_is_doubly_stochastic_for_random_parameters_and_inputs():
    """Random φ, α, b and inputs with logits H̃_res of spread ≈ 1 (std 0.6–1.1 here): 20 iterations give a doubly
    stochastic H_res to 1e-4. Wider spreads, and matrices near a permutation, converge more slowly (next test)."""
    model = perturb(build("mhc"), scale=0.1)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, _, site in model.residual_sites():
            site.b_res.copy_(torch.randn(4, 4, generator=g))
            res = site.mixing(torch.randn(3, 5, 4, 8, generator=g)).res
            assert res.shape == (3, 5, 4, 4) and (res >= 0).all()
            assert torch.allclose(res.sum(-1), torch.ones(3, 5, 4), atol=1e-4, rtol=0)
            assert torch.allclose(res.sum(-2), torch.ones(3, 5, 4), atol=1e-4, rtol=0)
            assert res.std() > 0.01  # the input-dependent part is really there


def test_sinkhorn_converges_slowly_near_a_permutation():
    """Pitfall (docs): H_res near the identity (res_init='paddlefleet_pr1849' once its logits move) converges slowly; after
    the paper's 20 iterations the columns are exact (normalised last) but the rows can be off by ~1e-2."""
    logits = 6 * torch.eye(4) - 3 + 0.3 * torch.randn(8, 4, 4, generator=torch.Generator().manual_seed(0))
    errors = [(sinkhorn_knopp(logits, t).sum(-1) - 1).abs().max().item() for t in (20, 200)]
    assert errors[0] > 1e-3 and errors[1] < errors[0] / 10
    assert torch.allclose(sinkhorn_knopp(logits, 20).sum(-2), torch.ones(8, 4), atol=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_identity_init_gives_h_res_identity(n):
    model = build("mhc", {"n": n, "res_init": "identity"})
    x = torch.randn(2, 5, n, 8, generator=torch.Generator().manual_seed(0))
    for _, _, site in model.residual_sites():
        assert torch.allclose(site.b_res, identity_logit(n) * torch.eye(n))
        assert (site.mixing(x).res - torch.eye(n)).abs().max() < 1e-4


def test_paddlefleet_and_hc_inits_as_documented():
    """'paddlefleet_pr1849' (the default): b_res = 6I − 3 → diag e⁶/(e⁶ + n − 1) ≈ 0.9926 at n = 4; 'hc' (b_res = I,
    the trap) → diag e/(e + n − 1) ≈ 0.4754: not the identity. H_pre = σ(±3) (home stream k mod n), H_post = 2σ(0) = 1."""
    x = torch.randn(2, 5, 4, 8, generator=torch.Generator().manual_seed(0))
    for res_init, diag in (("paddlefleet_pr1849", math.exp(6) / (math.exp(6) + 3)), ("hc", math.e / (math.e + 3))):
        site = build("mhc", {"res_init": res_init}).blocks[0].ls2
        mixing = site.mixing(x)
        want = torch.full((4, 4), (1 - diag) / 3).fill_diagonal_(diag)
        assert torch.allclose(mixing.res, want.expand(2, 5, 4, 4), atol=1e-12, rtol=0)
        assert torch.allclose(mixing.read[0, 0], torch.tensor([sig(-3), sig(3), sig(-3), sig(-3)]), atol=1e-15)
        assert torch.equal(mixing.write, torch.ones(2, 5, 4))
    assert round(math.exp(6) / (math.exp(6) + 3), 4) == 0.9926 and round(math.e / (math.e + 3), 4) == 0.4754


# ================================================================================================================
# 4. gradients, weight decay, DropPath

HC_DEAD = r"\.(s_alpha|s_beta|dyn_norm\.weight|dyn_norm\.bias)$"  # s·tanh(H̄·0): s and the norm reach nothing
MHC_DEAD = r"\.alpha_(pre|post|res)$"  # α·(x̃φ) with φ = 0


@pytest.mark.parametrize("residual, options, dead", [
    ("hyper_connections", {}, HC_DEAD), ("hyper_connections", {"dynamic": False}, None),
    ("mhc", {}, MHC_DEAD), ("mhc", {"res_init": "identity"}, MHC_DEAD),
], ids=str)
def test_gradient_liveness(residual, options, dead):
    """At init the scales of the zero-initialised dynamic parts (HC's s_α, s_β and its norm; mHC's α) have exactly
    zero gradient, by design (their factor W or φ is 0); every other parameter has one. Some only weakly: the
    streams start equal, so the pre-norm's scale invariance all but cancels the read weights' gradient (A_m,
    b_pre, φ_pre), and a doubly stochastic H_res acts on equal streams as the identity (b_res, φ_res). After one
    perturbation (the streams differ, W, φ ≠ 0) every parameter, every scalar included, has a non-zero gradient."""
    imgs, y = images(), torch.tensor([0, 1, 2, 1])
    model = build(residual, options).train()
    F.cross_entropy(model(imgs), y).backward()
    own = [(n, p) for n, p in model.named_parameters() if ".ls" in n]
    assert own
    for name, p in own:
        if dead and re.search(dead, name):
            assert torch.all(p.grad == 0), name
        else:
            assert p.grad.norm() > 0, name
    model = perturb(build(residual, options), scale=0.1).train()
    F.cross_entropy(model(imgs), y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.norm() > 0, name
        if p.numel() == 1:
            assert p.grad.item() != 0, name


@pytest.mark.parametrize("residual, options, no_decay, decay", [
    ("hyper_connections", {}, ["a_m", "a_r", "b", "s_alpha", "s_beta", "dyn_norm.weight", "dyn_norm.bias"],
     ["w_m", "w_r", "w_b"]),
    ("hyper_connections", {"dynamic": False}, ["a_m", "a_r", "b"], []),
    ("mhc", {}, ["b_pre", "b_post", "b_res", "alpha_pre", "alpha_post", "alpha_res"],
     ["phi_pre", "phi_post", "phi_res"]),
], ids=str)
def test_weight_decay_groups(residual, options, no_decay, decay):
    """The static connection parameters are never decayed (2-D A_r and b_res included, which timm's ndim rule
    alone would decay: dynamic HC in a ViT went to NaN with them decayed); W and φ matrices are decayed."""
    model = build(residual, options)
    by_id = {id(p): n for n, p in model.named_parameters()}
    wd = {by_id[id(p)]: g["weight_decay"] for g in model.param_groups(0.05) for p in g["params"]}
    assert set(wd) == set(by_id.values())
    own = sorted(n.split(".", 3)[3] for n in wd if n.startswith("blocks.0.ls1."))
    assert own == sorted(no_decay + decay)
    for layer, site in ((0, "ls1"), (2, "ls2")):
        for name in no_decay:
            assert wd[f"blocks.{layer}.{site}.{name}"] == 0.0, name
        for name in decay:
            assert wd[f"blocks.{layer}.{site}.{name}"] == 0.05, name
    assert wd["blocks.0.attn.qkv.weight"] == 0.05 and wd["blocks.0.norm1.weight"] == 0.0


@pytest.mark.parametrize("residual", ["hyper_connections", "mhc"])
def test_drop_path_drops_the_layer_output_and_keeps_the_mixing(residual):
    """DropPath drops the layer's output only (the paper's Algorithm 3): with p = 1 every site is its stream
    mixing, H ← res·H, never the identity; the stream returns the sum of the mixed copies of x₀."""
    model = perturb(build(residual, drop_path_rate=1.0))
    for blk in model.blocks:
        blk.drop_path1, blk.drop_path2 = DropPath(1.0), DropPath(1.0)
    x0, n = tokens(model, images()), model.residual_options["n"]
    with torch.no_grad():
        h = x0.unsqueeze(-2).expand(*x0.shape[:-1], n, 8)
        for blk in model.blocks:
            for site in (blk.ls1, blk.ls2):
                h = torch.matmul(site.mixing(h).res, h)
        got = model.train().stream(x0, model.blocks)
        assert torch.allclose(got, h.sum(-2), atol=1e-12, rtol=0)
        copies = x0.unsqueeze(-2).expand(*x0.shape[:-1], n, 8).sum(-2)
        if residual == "hyper_connections":  # the (perturbed) A_r really applies under DropPath
            assert not torch.allclose(got, copies)
        else:  # H_res's rows sum to 1 (to Sinkhorn's precision): equal streams stay equal, whatever H_res is
            assert torch.allclose(got, copies, atol=1e-2)
        assert not torch.allclose(model.eval().stream(x0, model.blocks), got)  # the branches are back in eval


# ================================================================================================================
# 5. options


@pytest.mark.parametrize("residual, options, words", [
    ("hyper_connections", {"n": 0}, ["n=0", "positive integer", "expansion rate"]),
    ("hyper_connections", {"n": 2.5}, ["n=2.5"]),
    ("hyper_connections", {"dynamic": "yes"}, ["dynamic='yes'", "True", "False"]),
    ("hyper_connections", {"sinkhorn_iters": 5}, ["'sinkhorn_iters'", "belongs to mhc", "dynamic, n"]),
    ("mhc", {"dynamic": False}, ["'dynamic'", "belongs to hyper_connections", "res_init", "sinkhorn_iters"]),
    ("mhc", {"res_init": "eye"}, ["res_init='eye'", "paddlefleet_pr1849", "identity", "hc"]),
    ("mhc", {"res_init": "paper"}, ["res_init='paper' names no init", "gives no bias init", "'paddlefleet_pr1849', b_res = 6I - 3"]),
    ("mhc", {"sinkhorn_iters": 0}, ["sinkhorn_iters=0", "positive integer"]),
    ("mhc", {"n": -1}, ["n=-1"]),
    ("mhc", {"alpha_init": "big"}, ["alpha_init='big'"]),
], ids=str)
def test_bad_options_raise_one_line(residual, options, words):
    assert_bad_options(residual, options, words)


# ================================================================================================================
# 6. diagnostics


def test_composite_gain_of_hand_set_matrices():
    """G = M_K ⋯ M_1 (forward order); forward = largest absolute row sum, backward = largest absolute column sum."""
    m1, m2 = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    assert composite_gain([m1, m2]) == {"forward": 3.0, "backward": 2.0}  # M2·M1 = [[2, 1], [0, 1]]
    assert composite_gain([m2, m1]) == {"forward": 4.0, "backward": 3.0}  # M1·M2 = [[2, 2], [0, 1]]
    assert composite_gain([torch.tensor([[0.5, -1.5], [0.25, 0.0]])]) == {"forward": 2.0, "backward": 1.5}
    doubly = torch.tensor([[0.7, 0.3], [0.3, 0.7]])
    gain = composite_gain([doubly, torch.tensor([[0.0, 1.0], [1.0, 0.0]]), doubly])
    assert gain["forward"] == pytest.approx(1.0, abs=1e-15) and gain["backward"] == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(ValueError, match="at least one"):
        composite_gain([])


def test_composite_gain_of_a_model_multiplies_the_sites_in_forward_order():
    """Static HC (input-independent mixing) with hand-set A_r per site: collect_diagnostics's composite gain is that
    of ∏ A_rᵀ, later sites on the left."""
    model = build("hyper_connections", {"n": 2, "dynamic": False})
    mats = [[[1.0, 0.5], [0.0, 1.0]], [[0.9, 0.0], [0.2, 1.1]], [[1.0, -0.3], [0.4, 1.0]],
            [[1.2, 0.0], [0.0, 0.8]], [[0.5, 0.5], [0.5, 0.5]], [[1.0, 0.1], [-0.2, 1.3]]]
    for (_, _, site), a_r in zip(model.residual_sites(), mats, strict=True):
        assign(site.a_r, a_r)
    gain = [[1.0, 0.0], [0.0, 1.0]]
    for a_r in mats:
        m = [[a_r[j][i] for j in range(2)] for i in range(2)]  # M = A_rᵀ
        gain = [[sum(m[i][k] * gain[k][j] for k in range(2)) for j in range(2)] for i in range(2)]
    want = {"forward": max(sum(abs(v) for v in row) for row in gain),
            "backward": max(sum(abs(gain[i][j]) for i in range(2)) for j in range(2))}
    got = collect_diagnostics(model, images())["composite_gain"]
    assert got["forward"] == pytest.approx(want["forward"], rel=1e-12)
    assert got["backward"] == pytest.approx(want["backward"], rel=1e-12)
    assert got["forward"] != pytest.approx(got["backward"])


def test_collect_diagnostics_on_both_variants():
    std = collect_diagnostics(build("standard", norm_eps=1e-20), images())
    assert std["composite_gain"] is None
    assert not any("composite_gain" in tag for tag in diagnostic_scalars(std))
    for residual in ("hyper_connections", "mhc"):
        init = collect_diagnostics(build(residual, norm_eps=1e-20), images())
        assert init["composite_gain"]["forward"] == pytest.approx(1.0, abs=1e-12)
        assert init["composite_gain"]["backward"] == pytest.approx(1.0, abs=1e-12)
        # the stream view: x = mean of the streams = the standard stream at init (the same shared weights; mHC's
        # h = 1.095·x differs only through the pre-norm's ε, removed here)
        for key in ("ratio_mean", "ratio_rms", "update_ratio", "stream_rms"):
            for sublayer, values in (init[key].items() if key != "stream_rms" else [("", init[key])]):
                want = std[key][sublayer] if sublayer else std[key]
                assert torch.allclose(values, want, rtol=1e-6, atol=0), (residual, key)
        assert init["skip_scale"]["attn"].tolist() == pytest.approx([1.0] * 3, abs=1e-12)
        scalars = diagnostic_scalars(init)
        assert scalars[TAGS["composite_gain_forward"]] == init["composite_gain"]["forward"]
        assert TAGS["composite_gain_backward"] in scalars
        assert scalars["diag/param/attn/00/res_diag_mean"] == pytest.approx(
            1.0 if residual == "hyper_connections" else math.exp(6) / (math.exp(6) + 3), abs=1e-6)  # float32
        assert scalars["diag/param/mlp/02/post_mean"] == pytest.approx(1.0, abs=1e-6)
    hc = collect_diagnostics(perturb(build("hyper_connections", {"n": 4}), scale=0.3), images())["composite_gain"]
    assert hc["forward"] > 1.5 and hc["backward"] > 1.5  # unconstrained A_r: the product drifts from 1
    model = perturb(build("mhc"), scale=0.1)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, _, site in model.residual_sites():
            site.b_res.copy_(torch.randn(4, 4, generator=g))  # moderate logits: Sinkhorn converged in 20 steps
    d = collect_diagnostics(model, images())
    assert d["composite_gain"]["forward"] == pytest.approx(1.0, abs=1e-4)  # doubly stochastic: stays at 1
    assert d["composite_gain"]["backward"] == pytest.approx(1.0, abs=1e-4)
    assert set(d["params"]["attn"][1]) == {"pre_mean", "post_mean", "res_diag_mean", "res_offdiag_mean",
                                           "alpha_pre", "alpha_post", "alpha_res"}


@pytest.mark.parametrize("residual", ["hyper_connections", "mhc"])
def test_decompose_reassembles_the_update_in_the_stream_view(residual):
    """In the diagnostics' view (mean over streams), Δ = branch + (skip − 1) ⊙ H, skip_j = Σ_i M_ij."""
    model = perturb(build(residual), scale=0.2)
    x, f = torch.randn(2, 5, model.residual_options["n"], 8), torch.randn(2, 5, 8)
    for _, _, site in model.residual_sites():
        branch, skip = site.decompose(x, None, f)
        want = site.stream_view(branch) + site.stream_view((skip - 1) * x)
        assert torch.allclose(site.stream_view(site(x, None, f)), want, atol=1e-12, rtol=0)
