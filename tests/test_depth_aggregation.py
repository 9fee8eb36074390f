"""DenseFormer (``denseformer``) and Attention Residuals (``attn_res``): the depth-aggregating variants against
hand computation on tiny float64 inputs — DWA and its dilation/period index rules, the AttnRes softmax and its
full and block source rules, levels at init, gradient liveness, weight decay, option errors and the depth-weight
heat map of the diagnostics (reference: docs/variants.md, sections 13 and 14)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from backbone import TINY, _float64_one_thread, assert_bad_options, build, perturb  # noqa: F401 (autouse fixture)
from timm.layers import DropPath
from torch import nn

from lit_modules.diagnostics import TAGS, collect_diagnostics
from lit_modules.diagnostics_logging import log_diagnostics
from lit_modules.residual.attn_res import AttnRes, BlockSources
from lit_modules.residual.base import BlockArgs
from lit_modules.residual.denseformer import DWA, DWAStream

NAN = float("nan")


def images(n: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(seed))


def tokens(model, imgs: torch.Tensor) -> torch.Tensor:
    """x_0: patch embedding + class token + position, the first block's input."""
    x = model.patch_embed(imgs)
    return torch.cat([model.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + model.pos_embed


def assert_matrix(got: torch.Tensor, want: list[list[float]]) -> None:
    want = torch.tensor(want, dtype=torch.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), got
    torch.testing.assert_close(got.nan_to_num(0.0), want.nan_to_num(0.0), rtol=0, atol=1e-6)


# ================================================================================================================
# DenseFormer


def test_denseformer_equals_standard_at_init():
    """α_{i,i} = 1, α_{i,j<i} = 0: with the standard ViT's (perturbed) weights the logits are the standard's."""
    std = perturb(build("standard")).eval()
    for options in ({}, {"dilation": 2, "period": 2}):
        model = build("denseformer", options, seed=1).eval()
        report = model.load_pretrained(std.state_dict())
        assert report.new == sorted(n for n, _ in model.named_parameters() if n.startswith("stream.dwa."))
        with torch.no_grad():
            assert torch.equal(model(images()), std(images())), options


@pytest.mark.parametrize("depth, dilation, period, columns", [
    (4, 1, 1, {0: [0, 1], 1: [0, 1, 2], 2: [0, 1, 2, 3], 3: [0, 1, 2, 3, 4]}),
    (6, 2, 1, {0: [1], 1: [0, 2], 2: [1, 3], 3: [0, 2, 4], 4: [1, 3, 5], 5: [0, 2, 4, 6]}),
    (6, 3, 1, {0: [1], 1: [2], 2: [0, 3], 3: [1, 4], 4: [2, 5], 5: [0, 3, 6]}),
    (6, 1, 2, {1: [0, 1, 2], 3: [0, 1, 2, 3, 4], 5: [0, 1, 2, 3, 4, 5, 6]}),
    (6, 2, 3, {2: [1, 3], 5: [0, 2, 4, 6]}),
])
def test_dwa_index_rules(depth, dilation, period, columns):
    """epfml/DenseFormer's rules: a DWA after block i (0-based) iff (i + 1) mod period = 0, over the
    representations j ≤ i + 1 with j ≡ i + 1 (mod dilation): (i + 1 + dilation) // dilation weights."""
    stream = DWAStream(depth, dilation=dilation, period=period)
    assert {int(i): m.columns for i, m in stream.dwa.items()} == columns
    for i, m in stream.dwa.items():
        assert m.alpha.shape == (1, (int(i) + 1 + dilation) // dilation)
        assert m.alpha.tolist() == [[0.0] * (m.alpha.shape[1] - 1) + [1.0]]  # y_i = x_{i+1} at init


class Affine(nn.Module):
    """A stand-in block, x → c·x + 1, so the stream can be followed by hand."""

    def __init__(self, c: float) -> None:
        super().__init__()
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c * x + 1.0


def test_dwa_formula_with_hand_set_weights():
    """depth 4, dilation 2, period 2: DWAs after blocks 1 and 3 (0-based) over x_0, x_2 and x_0, x_2, x_4."""
    stream = DWAStream(4, dilation=2, period=2)
    with torch.no_grad():
        stream.dwa["1"].alpha.copy_(torch.tensor([[0.5, -2.0]]))
        stream.dwa["3"].alpha.copy_(torch.tensor([[0.25, 3.0, -1.0]]))
    x0 = torch.tensor([[[1.0, 2.0]]])
    got = stream(x0, [Affine(2.0), Affine(3.0), Affine(4.0), Affine(5.0)])
    out = []
    for a in (1.0, 2.0):  # the two channels, by hand
        x1 = 2 * a + 1  # block 0, no DWA
        x2 = 3 * x1 + 1  # block 1, then y = 0.5 x_0 − 2 x_2
        y1 = 0.5 * a - 2.0 * x2
        x3 = 4 * y1 + 1  # block 2, no DWA
        x4 = 5 * x3 + 1  # block 3, then y = 0.25 x_0 + 3 x_2 − x_4
        out.append(0.25 * a + 3.0 * x2 - 1.0 * x4)
    assert got.tolist() == [[out]]


def test_dwa_module_on_tiny_tensors():
    reps = [torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(j)) for j in range(4)]
    dwa = DWA(2, depth=3, dilation=1)  # after block 2 (0-based): over x_0 … x_3
    with torch.no_grad():
        dwa.alpha.copy_(torch.tensor([[0.1, -0.2, 0.3, 0.9]]))
    want = 0.1 * reps[0] - 0.2 * reps[1] + 0.3 * reps[2] + 0.9 * reps[3]
    torch.testing.assert_close(dwa(reps), want, rtol=0, atol=1e-15)


def test_denseformer_drop_path_one_keeps_the_embeddings():
    """Blocks are ordinary pre-norm blocks (DropPath drops Δ = F): with p = 1 every block output is its input and
    the identity DWAs pass x_0 through."""
    model = perturb(build("denseformer", drop_path_rate=1.0))
    for blk in model.blocks:
        blk.drop_path1 = blk.drop_path2 = DropPath(1.0)
    with torch.no_grad():
        for m in model.stream.dwa.values():
            m.init_weights()
        x0 = tokens(model, images())
        assert torch.equal(model.train().stream(x0, model.blocks), x0)


# ================================================================================================================
# Attention Residuals


def block_args(dim: int = 4) -> BlockArgs:
    return BlockArgs(dim=dim, num_heads=1, mlp_ratio=2.0, qkv_bias=True, qk_norm=False, proj_drop=0.0,
                     attn_drop=0.0, drop_path=0.0, norm_layer=nn.LayerNorm, act_layer=nn.GELU, layer=0, depth=3,
                     num_prefix_tokens=1)


def hand_attn_res(w: list[float], gamma: list[float], sources: list[list[float]], eps: float = 1e-6):
    """One token: α_t = softmax_t(Σ_d w_d γ_d v_td / sqrt(mean_d v_td² + ε)), h = Σ_t α_t v_t (plain floats)."""
    logits = [sum(wd * gd * vd for wd, gd, vd in zip(w, gamma, v, strict=True))
              / math.sqrt(sum(vd * vd for vd in v) / len(v) + eps) for v in sources]
    top = max(logits)
    e = [math.exp(z - top) for z in logits]
    alpha = [x / sum(e) for x in e]
    return alpha, [sum(a * v[d] for a, v in zip(alpha, sources, strict=True)) for d in range(len(w))]


def test_attn_res_weights_by_hand():
    site = AttnRes(4, args=block_args())
    w, gamma = [0.5, -1.0, 2.0, 0.25], [1.0, 0.5, -1.5, 2.0]
    with torch.no_grad():
        site.query.copy_(torch.tensor(w))
        site.key_norm.weight.copy_(torch.tensor(gamma))
    sources = [[1.0, -2.0, 0.5, 3.0], [0.5, 1.0, -1.0, 2.0], [-3.0, 0.25, 0.0, 1.0]]
    alpha, h = hand_attn_res(w, gamma, sources)
    listed = [torch.tensor([[v]]) for v in sources]  # each (B=1, N=1, D=4)
    torch.testing.assert_close(site.weights(listed), torch.tensor([[alpha]]), rtol=0, atol=1e-14)
    got = site(listed)
    torch.testing.assert_close(got, torch.tensor([[h]]), rtol=0, atol=1e-14)
    # w = 0 (the paper's init): uniform weights, h = the mean of the sources
    site.init_weights()
    torch.testing.assert_close(site([torch.tensor([[v]]) for v in sources]),
                               torch.tensor([[[sum(c) / 3 for c in zip(*sources, strict=True)]]]), rtol=0, atol=1e-15)


@pytest.mark.parametrize("block_size, expected", [
    # sublayer s sees these sources (names of f_0 … f_5 sums); the last entry is the final aggregation's
    (1, [["x"], ["x", "0"], ["x", "0", "1"], ["x", "0", "1", "2"], ["x", "0", "1", "2", "3"],
         ["x", "0", "1", "2", "3", "4"], ["x", "0", "1", "2", "3", "4", "5"]]),
    (2, [["x"], ["x", "0"], ["x", "01"], ["x", "01", "2"], ["x", "01", "23"], ["x", "01", "23", "4"],
         ["x", "01", "23", "45"]]),
    (3, [["x"], ["x", "0"], ["x", "01"], ["x", "012"], ["x", "012", "3"], ["x", "012", "34"], ["x", "012", "345"]]),
    (6, [["x"], ["x", "0"], ["x", "01"], ["x", "012"], ["x", "0123"], ["x", "01234"], ["x", "012345"]]),
])
def test_block_sources_follow_eq6(block_size, expected):
    """Eq. 6: the first layer of block n reads [b_0, …, b_{n−1}], later layers also the partial sum b_n^{i−1};
    the final aggregation reads [b_0, …, b_N]. One-hot stand-in outputs make each source readable as the set of
    layer outputs it sums."""
    x0, outs = torch.zeros(7), torch.eye(7)[1:]  # x0 = 0; f_s = e_{s+1}
    state, seen = BlockSources(x0 + torch.eye(7)[0], block_size), []
    for s in range(6):
        seen.append(state.sources())
        state.add(outs[s])
    seen.append(state.sources())

    def name(v: torch.Tensor) -> str:
        return "x" if v[0] == 1 else "".join(str(i - 1) for i in range(1, 7) if v[i] == 1)
    assert [[name(v) for v in src] for src in seen] == expected


def _capture_aggregations(model):
    """Forward hooks: every AttnRes aggregation's (sources, output) and every layer's output f, in call order."""
    calls, outputs = [], []
    for blk in model.blocks:
        for agg in (blk.attn_res, blk.mlp_res):
            agg.register_forward_hook(lambda m, a, o: calls.append((m, [v.clone() for v in a[0]], o)))
        for site in (blk.ls1, blk.ls2):
            site.register_forward_hook(lambda m, a, o: outputs.append(o))
    model.stream.out.register_forward_hook(lambda m, a, o: calls.append((m, [v.clone() for v in a[0]], o)))
    return calls, outputs


@pytest.mark.parametrize("num_blocks", [None, 3, 2])
def test_attn_res_in_the_model_matches_the_hand_formula(num_blocks):
    """Perturbed queries and key norms: each layer's input is Σ_i softmax_i(w_lᵀ RMSNorm(v_i)) v_i over the sources
    the full / block rule gives (v_0 = x_0, v_i = layer outputs f or their block sums)."""
    model = perturb(build("attn_res", {"num_blocks": num_blocks}), scale=0.5).eval()
    calls, outputs = _capture_aggregations(model)
    imgs = images(2)
    with torch.no_grad():
        model(imgs)
        x0 = tokens(model, imgs)
    size = 1 if num_blocks is None else 6 // num_blocks
    assert len(calls) == 7 and len(outputs) == 6
    for s, (module, sources, h) in enumerate(calls):
        assert module.depth_index == s
        blocks = [x0] + [sum(outputs[b * size:(b + 1) * size]) for b in range(s // size)]
        partial = outputs[(s // size) * size:s]
        want_sources = blocks + ([sum(partial)] if partial and s < 6 else [])
        assert len(sources) == len(want_sources), s
        for got, want in zip(sources, want_sources, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        stack = torch.stack(sources, dim=2)
        keys = stack / stack.square().mean(-1, keepdim=True).add(1e-6).sqrt() * module.key_norm.weight
        alpha = torch.softmax(keys @ module.query, dim=-1)
        torch.testing.assert_close(h, (alpha.unsqueeze(-1) * stack).sum(2), rtol=0, atol=1e-12)


def test_attn_res_level_at_init_is_the_standard_vit_up_to_the_norms_eps():
    """w = 0: each input is the mean of its sources = the standard stream / (number of sources); the pre-norms and
    the final norm are scale-invariant, so only ε separates the logits from the standard ViT's (not R-exact)."""
    for eps, close in ((1e-12, True), (1e-6, False)):
        std = perturb(build("standard", norm_eps=eps), scale=0.1).eval()
        with torch.no_grad():
            ref = std(images())
        for options in ({}, {"num_blocks": 3}):
            model = build("attn_res", options, seed=1, norm_eps=eps).eval()
            model.load_pretrained(std.state_dict())
            with torch.no_grad():
                diff = (model(images()) - ref).abs().max().item()
            assert (diff < 1e-7) == close and diff > 0, (eps, options, diff)
    # the stream itself is 1/(number of sources) of the standard one: block l's first layer reads 2l + 1 sources
    std, full = build("standard", norm_eps=1e-12), build("attn_res", norm_eps=1e-12)
    d_std, d_full = collect_diagnostics(std, images()), collect_diagnostics(full, images())
    scale = torch.tensor([1.0, 3.0, 5.0], dtype=torch.float32)
    torch.testing.assert_close(d_full["stream_rms"] * scale, d_std["stream_rms"], rtol=1e-5, atol=0)


def test_attn_res_drop_path_one_leaves_the_embeddings_weighted():
    """DropPath drops each layer's output f before it becomes a source: at p = 1 every source but x_0 is zero, and
    the final aggregation gives x_0 its softmax weight against zero keys: out = x_0 · e^{z}/(e^{z} + L), z =
    w_outᵀ RMSNorm(x_0) per token."""
    model = perturb(build("attn_res", drop_path_rate=1.0))
    for blk in model.blocks:
        blk.drop_path1 = blk.drop_path2 = DropPath(1.0)
    x0 = tokens(model, images())
    with torch.no_grad():
        got = model.train().stream(x0, model.blocks)
        out = model.stream.out
        z = (x0 / x0.square().mean(-1, keepdim=True).add(1e-6).sqrt() * out.key_norm.weight) @ out.query
        want = x0 * (z.exp() / (z.exp() + 6)).unsqueeze(-1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    assert not torch.allclose(got, x0)


# ================================================================================================================
# both: gradients, weight decay, options, construction


def _grads(model) -> dict[str, torch.Tensor]:
    model.train()
    F.cross_entropy(model(images()), torch.tensor([0, 1, 2, 1])).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_gradient_liveness_denseformer():
    """Every α_{i,j}, the zeros included, gets a gradient at init: ∂L/∂α_{i,j} = ⟨∂L/∂y_i, x_j⟩."""
    grads = _grads(build("denseformer", {"dilation": 1}))
    alphas = {n: g for n, g in grads.items() if n.startswith("stream.dwa.")}
    assert len(alphas) == 3
    assert all(g is not None and torch.all(g != 0) for g in alphas.values()), alphas


def test_gradient_liveness_attn_res():
    """At init (w = 0) every pseudo-query is live except the first layer's (a softmax over its single source x_0
    is constant 1, for every w: inert forever, as in the paper's per-layer parameters), and every key norm γ has
    exactly zero gradient — the logits are Σ_d w_d γ_d k̂_d, so ∂/∂γ = 0 while w = 0 — so γ is checked after the
    queries have moved (a perturbation standing in for the first optimizer step)."""
    model = build("attn_res")
    grads = _grads(model)
    inert = {"blocks.0.attn_res.query", "blocks.0.attn_res.key_norm.weight"}
    for name, g in grads.items():
        if name.endswith("_res.query") or name.startswith("stream.out.query"):
            assert (g.abs().max() == 0) == (name in inert), name
        elif "key_norm" in name:
            assert torch.equal(g, torch.zeros_like(g)), name
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("query"):
                p.copy_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    model.zero_grad()
    grads = _grads(model)
    for name, g in grads.items():
        if "key_norm" in name or name.endswith("query"):
            assert (g.abs().max() == 0) == (name in inert), name


@pytest.mark.parametrize("residual, options, no_decay, decay", [
    # the reference (epfml/DenseFormer) trains the DWA weights in AdamW's decay group (nn.Linear weights)
    ("denseformer", {}, [], ["stream.dwa.0.alpha", "stream.dwa.2.alpha"]),
    ("denseformer", {"dilation": 3, "period": 3}, [], ["stream.dwa.2.alpha"]),
    ("attn_res", {}, ["blocks.0.attn_res.query", "blocks.1.mlp_res.key_norm.weight", "stream.out.query",
                      "stream.out.key_norm.weight"], []),
])
def test_weight_decay_groups(residual, options, no_decay, decay):
    model = build(residual, options)
    wd = {}
    by_id = {id(p): n for n, p in model.named_parameters()}
    for group in model.param_groups(0.05):
        for p in group["params"]:
            wd[by_id[id(p)]] = group["weight_decay"]
    assert set(wd) == set(by_id.values())
    for name in no_decay:
        assert wd[name] == 0.0, name
    for name in decay:
        assert wd[name] == 0.05, name
    own = [n for n in wd if ".dwa." in n or "_res." in n or n.startswith("stream.")]  # the variant's parameters
    assert set(no_decay) | set(decay) <= set(own)
    if residual == "denseformer":
        assert all(wd[n] == 0.05 for n in own) and model.stream.dwa["2"].alpha.ndim == 2
    else:
        assert all(wd[n] == 0.0 for n in own)
    assert wd["blocks.0.attn.qkv.weight"] == 0.05 and wd["blocks.0.norm1.weight"] == 0.0


@pytest.mark.parametrize("residual, options, words", [
    ("denseformer", {"dilation": 0}, ["dilation=0", "valid choices: integers 1..3"]),
    ("denseformer", {"dilation": 4}, ["dilation=4", "1..3"]),
    ("denseformer", {"period": "2"}, ["period='2'", "1..3"]),
    ("denseformer", {"period": True}, ["period=True"]),
    ("denseformer", {"k": 2}, ["'k'", "belongs to dca", "dilation, period"]),
    ("attn_res", {"num_blocks": 4}, ["num_blocks=4", "6 layers", "valid choices: None (full AttnRes), 1, 2, 3"]),
    ("attn_res", {"num_blocks": 0}, ["num_blocks=0", "1, 2, 3"]),
    ("attn_res", {"num_blocks": 6}, ["num_blocks=6 (one layer per block) is full AttnRes at depth 3: give "
                                     "num_blocks=None; Block AttnRes: 1, 2, 3"]),
    ("attn_res", {"num_blocks": 2.0}, ["num_blocks=2.0"]),
    ("attn_res", {"dilation": 2}, ["'dilation'", "belongs to denseformer", "valid options: num_blocks"]),
])
def test_bad_options_raise_one_line(residual, options, words):
    assert_bad_options(residual, options, words)


def test_construction_and_site_names():
    df = build("denseformer")
    assert [s[1] for s in df.residual_sites()] == ["attn", "mlp"] * 3
    assert sum(p.numel() for n, p in df.named_parameters() if ".dwa." in n) == 2 + 3 + 4  # L(L+3)/2 = 9
    ar = build("attn_res", {"num_blocks": 3})
    assert [s[1] for s in ar.residual_sites()] == ["attn", "mlp"] * 3
    assert all(torch.equal(p, torch.zeros(8)) for n, p in ar.named_parameters() if n.endswith("query"))
    assert all(torch.equal(p, torch.ones(8)) for n, p in ar.named_parameters() if "key_norm" in n)
    assert sum(n.endswith("query") for n, _ in ar.named_parameters()) == 2 * 3 + 1  # one per layer + the final
    assert ar.stream.block_size == 2 and build("attn_res").stream.block_size == 1


# ================================================================================================================
# diagnostics: the depth-weight heat map


def test_diagnostics_denseformer_matrix():
    d = collect_diagnostics(build("denseformer"), images())
    assert d["sublayers"] == ["attn", "mlp"] and torch.isfinite(d["ratio_mean"]["attn"]).all()
    assert_matrix(d["depth_weights"], [[0, 1, NAN, NAN], [0, 0, 1, NAN], [0, 0, 0, 1]])  # α at init
    assert d["depth_weights_rows"] == ["block 0", "block 1", "block 2"]
    # dilation 2, period 2 at depth 4: DWAs after blocks 1 (x_0, x_2) and 3 (x_0, x_2, x_4); perturbed α
    model = build("denseformer", {"dilation": 2, "period": 2}, depth=4)
    with torch.no_grad():
        model.stream.dwa["1"].alpha.copy_(torch.tensor([[0.25, 0.5]]))
    d = collect_diagnostics(model, images())
    assert_matrix(d["depth_weights"], [[NAN] * 5, [0.25, NAN, 0.5, NAN, NAN], [NAN] * 5, [0, NAN, 0, NAN, 1]])
    assert d["depth_weights_rows"] == ["0 (none)", "block 1", "2 (none)", "block 3"]


@pytest.mark.parametrize("num_blocks, width", [(None, 7), (3, 4), (2, 3)])
def test_diagnostics_attn_res_matrix_at_init(num_blocks, width):
    """Rows: attn 0, mlp 0, …, mlp 2, out; row s at init = 1/(number of its sources) over those sources."""
    d = collect_diagnostics(build("attn_res", {"num_blocks": num_blocks}), images())
    size = 1 if num_blocks is None else 6 // num_blocks
    # x_0, the completed blocks, the current partial sum; the final aggregation reads b_0 … b_N
    counts = [1 + s // size + (1 if s % size else 0) for s in range(6)] + [6 // size + 1]
    want = [[1 / c if j < c else NAN for j in range(width)] for c in counts]
    assert_matrix(d["depth_weights"], want)
    assert d["depth_weights_rows"] == ["attn 0", "mlp 0", "attn 1", "mlp 1", "attn 2", "mlp 2", "out"]
    for values in d["ratio_mean"].values():
        assert values.shape == (3,) and torch.isfinite(values).all() and (values > 0).all()
    assert d["skip_scale"]["attn"].tolist() == [1.0] * 3


def test_diagnostics_attn_res_matrix_is_the_mean_softmax():
    """With perturbed queries the row is the softmax weights averaged over batch and tokens (hand formula on the
    final aggregation's sources)."""
    model = perturb(build("attn_res"), scale=0.5)
    calls, _ = _capture_aggregations(model)
    d = collect_diagnostics(model, images())
    module, sources, _ = calls[-1]
    stack = torch.stack(sources, dim=2)
    keys = stack / stack.square().mean(-1, keepdim=True).add(1e-6).sqrt() * module.key_norm.weight
    want = torch.softmax(keys @ module.query, dim=-1).mean(dim=(0, 1))
    torch.testing.assert_close(d["depth_weights"][6], want.float(), rtol=1e-6, atol=1e-7)
    assert abs(d["depth_weights"][6].sum().item() - 1.0) < 1e-6


class FakeExperiment:
    def __init__(self) -> None:
        self.figures, self.texts, self.scalars = {}, {}, {}

    def add_figure(self, tag, figure, global_step):
        self.figures[tag] = figure

    def add_text(self, tag, text, global_step):
        self.texts[tag] = text

    def add_scalar(self, tag, value, global_step):
        self.scalars[tag] = value


@pytest.mark.parametrize("residual", ["denseformer", "attn_res", "standard"])
def test_depth_weights_are_logged_as_image_and_json(residual):
    result = collect_diagnostics(build(residual), images())
    experiment = FakeExperiment()
    log_diagnostics(experiment, result, {}, step=0)
    if residual == "standard":
        assert TAGS["depth_weights"] not in experiment.figures and result["depth_weights"] is None
        return
    assert TAGS["depth_weights"] == "diag/depth_weights" and TAGS["depth_weights"] in experiment.figures
    matrix = json.loads(experiment.texts[TAGS["depth_weights_json"]])
    assert len(matrix) == result["depth_weights"].shape[0] and matrix[0][-1] is None
