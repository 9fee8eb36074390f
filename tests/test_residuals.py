"""Tests for the residual-connection variants (lit_modules/residual; reference: docs/variants.md).

Everything runs in float64 on CPU with tiny models. Covered, following the spec's mandatory tests (§11):
identity at init (I-exact / I-approx), equality with the standard ViT at init (R-exact) and its documented
exceptions, gradient liveness at step 0, DropPath p=1 leaving only the skip path, every formula against a
hand-computed value, weight-decay grouping, option validation and the remaining construction rules.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from backbone import (  # noqa: F401 (autouse fixture)
    LAUREL,
    TINY,
    _float64_one_thread,
    assert_bad_options,
    build,
    perturb,
    tiny_laurel,
)
from timm.layers import DropPath
from torch import nn

from lit_modules import RESIDUALS, VisionTransformer
from lit_modules.residual import DCA, Highway, LAuReL, LayerScale, ResSE, ReZero, SkipInit, cait_init_value
from lit_modules.residual.base import BlockArgs


def images(n: int = 4, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, TINY["img_size"], TINY["img_size"], generator=g)


def tokens(model: VisionTransformer, imgs: torch.Tensor) -> torch.Tensor:
    """x_0: patch embedding + class token + position, the input of the first block."""
    x = model.patch_embed(imgs)
    x = torch.cat([model.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
    return x + model.pos_embed


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


RAW = {"rw_norm": "none"}  # LAuReL's unbounded α = β = 1: the R-exact form (the default bounds them by a sigmoid)

# ================================================================================================================
# 1. identity at init (I-exact, I-approx)


@pytest.mark.parametrize("residual", ["rezero", "skipinit"])
@pytest.mark.parametrize("norm", [True, False])
def test_i_exact_blocks_are_identity(residual, norm):
    model = build(residual, {"norm": norm}).eval()
    imgs = images()
    x0 = tokens(model, imgs)
    with torch.no_grad():
        for blk in model.blocks:
            assert torch.equal(blk(x0), x0)
        assert torch.equal(model.stream(x0, model.blocks), x0)
        assert torch.equal(model.forward_features(imgs), model.norm(x0))


def test_layerscale_1e6_is_approx_identity():
    model = build("layerscale", {"init_value": 1e-6}).eval()
    x0 = tokens(model, images())
    with torch.no_grad():
        at_init = rel(model.stream(x0, model.blocks), x0)
        # the same weights with the standard residual move the stream ~1e6 times more
        std = build("standard").eval()
        std.load_state_dict(model.state_dict(), strict=False)
        standard = rel(std.stream(x0, std.blocks), x0)
        # O(1) branches (perturbed weights), γ still 1e-6: the update stays O(ε)
        perturb(model)
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.fill_(1e-6)
        perturbed = rel(model.stream(x0, model.blocks), x0)
    assert 0 < at_init < 1e-4 and 0 < perturbed < 1e-4
    assert standard > 1e4 * at_init


# ================================================================================================================
# 2. R-exact: equal to the standard ViT with the same weights


def _r_exact_cases():
    cases = []
    for form in ("rw", "lr", "pa", "rw_lr", "rw_pa", "rw_lr_pa"):
        for gran in ("block", "sublayer"):
            cases.append(("laurel", tiny_laurel({"form": form, "granularity": gran} | (RAW if "rw" in form else {})), 3))
    cases += [
        ("laurel", tiny_laurel({"form": "pa", "pa_h": "lowrank"}), 3),
        ("laurel", tiny_laurel({"form": "rw_pa", "pa_h": "lowrank", "granularity": "sublayer"} | RAW), 3),
        ("laurel", tiny_laurel({"form": "rw_lr", "a_init": "col_orth"} | RAW), 3),
        ("res_se", {"reduction": 2}, 3),
        ("res_se", {"form": "skip_gate", "gate": "two_sigmoid", "reduction": 2}, 3),
        ("res_se", {"gate": "two_sigmoid", "reduction": 2, "pool": "patch_only"}, 3),
    ]
    for k in (None, 1):  # depth 4 > k + 2: the k-DCA stack sums intermediates
        cases += [("dca", {"form": "grn_v1", "k": k}, 4), ("dca", {"form": "grn_v2", "k": k}, 4)]
        for v3 in ("text_A", "fig10_B"):
            cases += [("dca", {"form": f, "grn_v3_form": v3, "k": k}, 4) for f in ("grn_v3", "dca")]
    return cases


def _logits_vs_standard(residual, options, depth):
    std = perturb(build("standard", depth=depth)).eval()  # non-trivial LN weights: DCA's norm1_k/v must be copied
    var = build(residual, options, seed=1, depth=depth).eval()
    var.load_pretrained(std.state_dict())
    imgs = images()
    with torch.no_grad():
        return var(imgs), std(imgs)


@pytest.mark.parametrize("residual, options, depth", _r_exact_cases(),
                         ids=lambda v: str(v) if not isinstance(v, dict) else ",".join(f"{k}={x}" for k, x in v.items()))
def test_r_exact_equals_standard(residual, options, depth):
    out, ref = _logits_vs_standard(residual, options, depth)
    assert (out - ref).abs().max().item() < 1e-10


@pytest.mark.parametrize("residual, options", [
    ("laurel", tiny_laurel({"form": "seed"})),         # g ≈ 0.5 halves the skip
    ("res_se", {"gate": "sigmoid", "reduction": 2}),  # s ≈ 0.5
    ("res_se", {"form": "seed", "reduction": 2}),  # skip × (1 + s) ≈ 1.5
    ("dca", {"form": "seed"}),                     # per-token softmax ≈ (0.5, 0.5)
    ("laurel", tiny_laurel({"form": "rw", "rw_norm": "softmax"})),  # (0.01, 0.99): near-standard, not exact
    ("laurel", tiny_laurel({"form": "rw_lr"})),        # the default: sigmoid-bounded (0.99, 0.99)
])
def test_not_standard_at_init(residual, options):
    out, ref = _logits_vs_standard(residual, options, 3)
    assert (out - ref).abs().max().item() > 1e-4


def test_seed_forms_start_near_half():
    """laurel seed (per-channel gate) and dca seed (per-token softmax): both weights ≈ 0.5 at init, input-dependent."""
    x = torch.randn(2, 5, 8)
    laurel = build("laurel", tiny_laurel({"form": "seed"})).blocks[0].ls1.gate_value(x)
    dca = build("dca", {"form": "seed"}).blocks[0].ls1.weights(x)
    for w in (laurel, dca):
        assert (w - 0.5).abs().max() < 0.05 and w.std() > 0
    assert laurel.shape == (2, 5, 8) and dca.shape == (2, 5, 2)  # per channel; per token (two weights)


# ================================================================================================================
# 3. gradient liveness at step 0

BRANCH = r"^blocks\.\d+\.(norm1|attn|norm2|mlp)\."
# every block the identity + class-token pooling: the logits see only cls_token + pos_embed[0], never the patches
PATCHES = {r"^patch_embed\.": ..., r"^pos_embed$": (slice(None), slice(1, None))}


def _pa_dead(k: int):
    """γ_j of site s has no x_{i−j} yet for j > s (s counts sites in forward order): those entries are unused."""

    def index(name: str):
        m = re.match(r"blocks\.(\d+)\.(res|ls1|ls2)\.pa_gamma$", name)
        site = int(m[1]) if m[2] == "res" else 2 * int(m[1]) + int(m[2][-1]) - 1
        return slice(min(site + 1, k), None)

    return index


# (residual, options, {regex on the parameter name: index of the entries whose gradient is zero by design})
LIVENESS = {
    "standard": ("standard", {}, {}),
    "layerscale_1e-6": ("layerscale", {"init_value": 1e-6}, {}),
    "layerscale_0": ("layerscale", {"init_value": 0.0}, {BRANCH: ...} | PATCHES),
    "rezero": ("rezero", {}, {BRANCH: ...} | PATCHES),
    "rezero_norm": ("rezero", {"norm": True}, {BRANCH: ...} | PATCHES),
    "skipinit_norm": ("skipinit", {"norm": True}, {BRANCH: ...} | PATCHES),
    "skipinit": ("skipinit", {}, {BRANCH: ...} | PATCHES),
    "skipinit_avg": ("skipinit", {}, {BRANCH: ...,  # average pooling sees the patches, not the class token
                                               r"^cls_token$": ..., r"^pos_embed$": (slice(None), slice(0, 1))},
                     {"global_pool": "avg"}),
    "highway": ("highway", {}, {}),
    "highway_zeros": ("highway", {"gate_weight_init": "zeros"}, {}),
    "laurel_rw": ("laurel", tiny_laurel({"form": "rw"}), {}),
    "laurel_rw_softmax": ("laurel", tiny_laurel({"form": "rw", "rw_norm": "softmax"}), {}),
    "laurel_rw_sigmoid": ("laurel", tiny_laurel({"form": "rw", "rw_norm": "sigmoid", "granularity": "sublayer"}), {}),
    "laurel_rw_coupled": ("laurel", tiny_laurel({"form": "rw", "rw_norm": "coupled"}), {}),
    "laurel_rw_raw": ("laurel", tiny_laurel({"form": "rw"} | RAW), {}),
    "laurel_lr": ("laurel", tiny_laurel({"form": "lr"}), {r"\.lr_up$": ...}),  # A(Bx) with B = 0: A dead, B live
    "laurel_rw_lr": ("laurel", tiny_laurel({"form": "rw_lr", "granularity": "sublayer"}), {r"\.lr_up$": ...}),
    "laurel_pa": ("laurel", {"form": "pa", "k": 3}, {r"\.pa_gamma$": _pa_dead(3)}),
    "laurel_pa_sub": ("laurel", {"form": "pa", "granularity": "sublayer", "k": 3},
                      {r"\.pa_gamma$": _pa_dead(3)}),
    # h = I + AB with B = 0 and γ = 0: γ live through I; A, B reach the loss only through γ·A·B: both dead at step 0
    "laurel_pa_lowrank": ("laurel", {"form": "pa", "pa_h": "lowrank", "rank": 2, "k": 3},
                          {r"\.pa_gamma$": _pa_dead(3), r"\.lr_up$": ..., r"\.lr_down$": ...}),
    "laurel_rw_pa": ("laurel", {"form": "rw_pa", "k": 3}, {r"\.pa_gamma$": _pa_dead(3)}),
    # γ = (1, 0, 0): only B_0 sees a non-zero γ; every A is dead because every B is zero
    "laurel_rw_lr_pa": ("laurel", {"form": "rw_lr_pa", "rank": 2, "k": 3},
                        {r"\.pa_gamma$": _pa_dead(3), r"\.lr_up$": ..., r"\.lr_down$": (slice(1, None),)}),
    "laurel_seed": ("laurel", tiny_laurel({"form": "seed"}), {}),
    "res_se": ("res_se", {"reduction": 2}, {r"\.ls\d\.fc1\.": ...}),  # fc2 = 0 blocks fc1; fc2 itself is live
    "res_se_sigmoid": ("res_se", {"reduction": 2, "gate": "sigmoid"}, {}),
    "res_se_seed": ("res_se", {"reduction": 2, "form": "seed"}, {}),
    "dca_fig10B": ("dca", {"form": "dca", "grn_v3_form": "fig10_B"}, {}),
    "dca_textA": ("dca", {"form": "dca", "grn_v3_form": "text_A"}, {r"\.w$": ...}),  # ReLU'(0) = 0: dead w
    "dca_textA_std": ("dca", {"form": "dca", "grn_v3_form": "text_A", "w_init_std": 0.01}, {}),
    "grn_v3_textA": ("dca", {"form": "grn_v3", "grn_v3_form": "text_A"}, {r"\.w$": ...}),
    "grn_v3_fig10B": ("dca", {"form": "grn_v3", "grn_v3_form": "fig10_B", "k": 1}, {}),
    "grn_v1": ("dca", {"form": "grn_v1"}, {}),
    "grn_v2": ("dca", {"form": "grn_v2", "k": 1}, {}),
    "dca_seed": ("dca", {"form": "seed"}, {}),
}

SCALARS = re.compile(r"(\.alpha|\.pa_gamma|\.mix\.logits)$")  # each entry is its own learned scalar


@pytest.mark.parametrize("case", list(LIVENESS))
def test_gradient_liveness_at_init(case):
    residual, options, dead, *kw = LIVENESS[case]
    model = build(residual, options, **(kw[0] if kw else {})).train()
    imgs, y = images(), torch.tensor([0, 1, 2, 1])
    F.cross_entropy(model(imgs), y).backward()
    matched = set()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} is not used by the forward pass"
        zero = torch.zeros_like(p, dtype=torch.bool)
        for pattern, index in dead.items():
            if re.search(pattern, name):
                zero[index(name) if callable(index) else index] = True
                matched.add(pattern)
        assert torch.all(p.grad[zero] == 0), f"{name}: gradient should be exactly zero at init (by design)"
        live = p.grad[~zero]
        if live.numel() == 0:
            continue
        if SCALARS.search(name):
            assert torch.all(live != 0), f"{name}: a scalar that should learn has zero gradient: {p.grad}"
        else:
            assert live.norm() > 0, f"{name}: should learn but has zero gradient"
    assert matched == set(dead), f"patterns matching no parameter: {set(dead) - matched}"


# ================================================================================================================
# 4. DropPath p = 1 leaves only the skip path

DROP_CASES = [
    ("standard", {}), ("layerscale", {"init_value": 0.1}), ("rezero", {}), ("rezero", {"norm": False}),
    ("skipinit", {}), ("skipinit", {"norm": True}), ("highway", {}), ("res_se", {"reduction": 2}),
    ("res_se", {"gate": "sigmoid", "reduction": 2}), ("res_se", {"form": "seed", "reduction": 2}),
    ("laurel", tiny_laurel({"form": "rw_lr"})), ("laurel", tiny_laurel({"form": "rw_lr_pa", "granularity": "sublayer"})),
    ("laurel", tiny_laurel({"form": "pa", "pa_h": "lowrank"})), ("laurel", tiny_laurel({"form": "seed"})),
    ("dca", {"form": "seed"}), ("skipdense", {}),
]
DCA_DROP_CASES = [{"form": "grn_v1"}, {"form": "grn_v2", "k": 1}, {"form": "grn_v3", "grn_v3_form": "text_A"},
                  {"form": "dca", "grn_v3_form": "fig10_B"}, {"form": "dca", "grn_v3_form": "text_A", "k": 1}]


def _force_drop_path(model: VisionTransformer) -> None:
    """drop_path_rate uses timm's linear rule (block 0 gets 0): set p = 1 on every block's DropPath."""
    for blk in model.blocks:
        for attr in ("drop_path1", "drop_path2", "drop_path"):
            if hasattr(blk, attr):
                setattr(blk, attr, DropPath(1.0))


def test_drop_path_rate_one_drops_the_last_block():
    model = perturb(build("highway", drop_path_rate=1.0)).train()
    assert [getattr(b.drop_path2, "drop_prob", 0.0) for b in model.blocks] == [0.0, 0.5, 1.0]  # timm's linear rule
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert torch.equal(model.blocks[-1](x), x)
        assert not torch.equal(model.blocks[0](x), x)


@pytest.mark.parametrize("residual, options", DROP_CASES, ids=lambda v: str(v))
def test_drop_path_one_is_skip_only(residual, options):
    model = perturb(build(residual, options, drop_path_rate=1.0))
    _force_drop_path(model)
    x0 = tokens(model, images())
    with torch.no_grad():
        assert torch.equal(model.train().stream(x0, model.blocks), x0)
        assert not torch.allclose(model.eval().stream(x0, model.blocks), x0)  # the perturbed updates are not 0


def _final_grn_of_x0(out: DCA, form: str, v3: str, x0: torch.Tensor) -> torch.Tensor:
    """The final GRN over [x0, 0, 0, ...]: only stack entry 0 contributes, with weight b_0 (+ its dynamic part)."""
    b0 = 1.0 + out.b_delta[0, 0]  # (1,) for grn_v1, (D,) otherwise
    if form == "grn_v1" or form == "grn_v2":
        return b0 * x0
    s = (x0 * out.w[0]).sum(-1, keepdim=True)  # wᵀx0 per token
    return (b0 + s.clamp(min=0)) * x0 if v3 == "text_A" else (b0 + s).clamp(min=0) * x0


@pytest.mark.parametrize("options", DCA_DROP_CASES, ids=lambda v: str(v))
def test_drop_path_one_dca_stack_holds_zeros(options):
    model = perturb(build("dca", options, depth=4, drop_path_rate=1.0))
    _force_drop_path(model)
    outputs = []
    for blk in model.blocks:
        blk.register_forward_hook(lambda mod, inp, out: outputs.append(out))
    x0 = tokens(model, images())
    with torch.no_grad():
        got = model.train().stream(x0, model.blocks)
        want = _final_grn_of_x0(model.stream.out, options["form"], options.get("grn_v3_form", "fig10_B"), x0)
    assert len(outputs) == 4 and all(torch.equal(o, torch.zeros_like(x0)) for o in outputs)
    assert torch.allclose(got, want, atol=1e-13, rtol=0)
    assert not torch.allclose(got, x0)  # perturbed b' really is used


# ================================================================================================================
# 5. each formula against a hand-computed value on a 2-token, 4-channel input


def block_args(layer: int = 0, depth: int = 3, prefix: int = 1) -> BlockArgs:
    return BlockArgs(dim=4, num_heads=1, mlp_ratio=2.0, qkv_bias=True, qk_norm=False, proj_drop=0.0,
                     attn_drop=0.0, drop_path=0.0, norm_layer=nn.LayerNorm, act_layer=nn.GELU, layer=layer,
                     depth=depth, num_prefix_tokens=prefix)


X = [[1.0, -2.0, 0.5, 3.0], [-1.0, 0.25, 2.0, -0.5]]
FB = [[0.5, 1.0, -1.0, 2.0], [3.0, -0.5, 0.25, 1.0]]  # branch output f
U = [[0.2, -0.4, 1.0, -0.8], [0.6, 0.1, -1.2, 0.5]]
XP = [[0.5, 0.5, -1.0, 1.0], [2.0, -1.0, 0.0, 0.25]]  # a previous stream state x_{i−1}


def T(rows) -> torch.Tensor:
    return torch.tensor([rows])


def sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def assign(param: torch.Tensor, value) -> None:
    with torch.no_grad():
        param.copy_(torch.tensor(value))


def check(site, expected, x=X, history=None):
    out = site(T(x), T(U), T(FB), history)
    assert out.shape == (1, 2, 4)
    assert torch.allclose(out, T(expected), atol=1e-14, rtol=0), (out, expected)


def test_formula_layerscale():
    site = LayerScale(4, args=block_args(), init_value=0.1)
    gamma = [0.5, -1.0, 2.0, 0.25]
    assign(site.gamma, gamma)
    check(site, [[gamma[d] * FB[n][d] for d in range(4)] for n in range(2)])


def test_formula_skipinit_and_rezero_shared_alpha():
    site = SkipInit(4, args=block_args())
    assign(site.alpha, [0.7])
    check(site, [[0.7 * FB[n][d] for d in range(4)] for n in range(2)])

    attn_site, mlp_site = ReZero.build_sites(block_args())
    assert [n for n, _ in mlp_site.named_parameters()] == []  # α stored once
    for alpha in (0.7, -0.2):
        assign(attn_site.alpha, [alpha])  # changing ls1's α changes both sites
        expected = [[alpha * FB[n][d] for d in range(4)] for n in range(2)]
        check(attn_site, expected)
        check(mlp_site, expected)
    model = build("rezero")
    assert sorted(n for n in model.state_dict() if "alpha" in n) == [f"blocks.{i}.ls1.alpha" for i in range(3)]
    assert model.blocks[0].ls2(*torch.ones(3, 1, 2, 8), None).abs().max() == 0
    assign(model.blocks[0].ls1.alpha, [0.5])
    assert torch.equal(model.blocks[0].ls2(*torch.ones(3, 1, 2, 8), None), torch.full((1, 2, 8), 0.5))


def test_formula_highway():
    site = Highway(4, args=block_args())
    W = [[0.1, -0.2, 0.3, 0.0], [0.5, 0.4, -0.1, 0.2], [-0.3, 0.0, 0.2, 0.1], [0.0, 0.6, -0.5, -0.4]]
    b = [-1.0, 0.5, 0.0, 2.0]
    assign(site.gate.weight, W)
    assign(site.gate.bias, b)
    expected = [[sig(sum(W[d][e] * U[n][e] for e in range(4)) + b[d]) * (FB[n][d] - X[n][d]) for d in range(4)]
                for n in range(2)]
    check(site, expected)


@pytest.mark.parametrize("gate", ["two_sigmoid", "sigmoid"])
@pytest.mark.parametrize("pool", ["all", "patch_only"])
def test_formula_res_se(gate, pool):
    site = ResSE(4, args=block_args(prefix=1), reduction=2, gate=gate, pool=pool)
    W1, b1 = [[0.5, -1.0, 0.2, 0.1], [-0.3, 0.8, -0.5, 0.2]], [0.1, -0.2]
    W2, b2 = [[1.0, 2.0], [-0.5, 0.3], [0.25, -1.0], [0.0, 0.7]], [0.1, -0.2, 0.3, 0.0]
    for p, v in ((site.fc1.weight, W1), (site.fc1.bias, b1), (site.fc2.weight, W2), (site.fc2.bias, b2)):
        assign(p, v)
    s = _se_hand(W1, b1, W2, b2, X if pool == "all" else X[1:])  # patch_only: the class token left out
    s = [2 * v for v in s] if gate == "two_sigmoid" else s
    check(site, [[(s[d] - 1) * X[n][d] + FB[n][d] for d in range(4)] for n in range(2)])


def _se_hand(W1, b1, W2, b2, rows):
    """σ(W₂ ReLU(W₁ mean(rows) + b₁) + b₂) by hand."""
    z = [sum(r[d] for r in rows) / len(rows) for d in range(4)]
    h = [max(0.0, sum(W1[j][d] * z[d] for d in range(4)) + b1[j]) for j in range(2)]
    return [sig(sum(W2[d][j] * h[j] for j in range(2)) + b2[d]) for d in range(4)]


def test_formula_res_se_seed():
    """The seed notes' y = x + SE(x) + F, SE(x) = σ(FC₂ ReLU(FC₁ GAP(x))) ⊙ x: Δ = s ⊙ x + f."""
    site = ResSE(4, args=block_args(prefix=1), form="seed", reduction=2)
    W1, b1 = [[0.5, -1.0, 0.2, 0.1], [-0.3, 0.8, -0.5, 0.2]], [0.1, -0.2]
    W2, b2 = [[1.0, 2.0], [-0.5, 0.3], [0.25, -1.0], [0.0, 0.7]], [0.1, -0.2, 0.3, 0.0]
    for p, v in ((site.fc1.weight, W1), (site.fc1.bias, b1), (site.fc2.weight, W2), (site.fc2.bias, b2)):
        assign(p, v)
    s = _se_hand(W1, b1, W2, b2, X)
    check(site, [[s[d] * X[n][d] + FB[n][d] for d in range(4)] for n in range(2)])


@pytest.mark.parametrize("rw_norm", ["none", "softmax", "sigmoid", "coupled"])
def test_formula_laurel_rw(rw_norm):
    site = LAuReL(4, args=block_args(), form="rw", rw_norm=rw_norm, rank=2)
    a, b = 0.3, -0.7
    assign(site.mix.logits, [a] if rw_norm == "coupled" else [a, b])
    alpha, beta = {"none": (a, b), "softmax": (math.exp(a) / (math.exp(a) + math.exp(b)),
                                               math.exp(b) / (math.exp(a) + math.exp(b))),
                   "sigmoid": (sig(a), sig(b)), "coupled": (sig(a), 1 - sig(a))}[rw_norm]
    check(site, [[alpha * FB[n][d] + (beta - 1) * X[n][d] for d in range(4)] for n in range(2)])


A2 = [[0.5, -1.0], [0.25, 0.0], [-0.5, 2.0], [1.0, 0.5]]  # A: D×r
B2 = [[1.0, 0.0, -0.5, 0.25], [0.0, 2.0, 1.0, -1.0]]      # B: r×D


def _ab(A, B, x):
    """A(Bx) for one token, by hand."""
    bx = [sum(B[r][e] * x[e] for e in range(4)) for r in range(2)]
    return [sum(A[d][r] * bx[r] for r in range(2)) for d in range(4)]


def test_formula_laurel_lr():
    site = LAuReL(4, args=block_args(), form="lr", rank=2)
    assign(site.lr_up, [A2])
    assign(site.lr_down, [B2])
    check(site, [[FB[n][d] + _ab(A2, B2, X[n])[d] for d in range(4)] for n in range(2)])


def test_formula_laurel_pa_k2():
    site = LAuReL(4, args=block_args(), form="pa", k=2, rank=2)
    g0, g1 = 0.5, -0.25
    assign(site.pa_gamma, [g0, g1])
    old = [[100.0] * 4, [-100.0] * 4]  # x_{i−2}: outside the k = 2 window, must not contribute
    history = [T(old), T(XP)]
    expected = [[FB[n][d] + g0 * X[n][d] + g1 * XP[n][d] for d in range(4)] for n in range(2)]
    check(site, expected, history=history)
    assert len(history) == 3 and torch.equal(history[-1], T(X))  # the site records its input


def test_formula_laurel_rw_lr_pa():
    """α f + β Σ_j γ_j (I + A_j B_j) x_{i−j} − x (eq. 6 with h = I + AB)."""
    site = LAuReL(4, args=block_args(), form="rw_lr_pa", k=2, rank=2, rw_norm="none")
    A1 = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [-1.0, 0.25]]
    B1 = [[0.5, 0.5, 0.0, 0.0], [0.0, -1.0, 0.0, 1.0]]
    assign(site.lr_up, [A2, A1])
    assign(site.lr_down, [B2, B1])
    assign(site.pa_gamma, [0.75, 0.5])
    assign(site.mix.logits, [1.5, 0.8])
    alpha, beta = 1.5, 0.8
    h0 = [[X[n][d] + _ab(A2, B2, X[n])[d] for d in range(4)] for n in range(2)]
    h1 = [[XP[n][d] + _ab(A1, B1, XP[n])[d] for d in range(4)] for n in range(2)]
    expected = [[alpha * FB[n][d] + beta * (0.75 * h0[n][d] + 0.5 * h1[n][d]) - X[n][d] for d in range(4)]
                for n in range(2)]
    check(site, expected, history=[T(XP)])


def _layer_norm_hand(row, weight, bias, eps=1e-5):
    """LayerNorm of one token by hand: biased variance, ε inside the square root, last dimension only."""
    mean = sum(row) / len(row)
    var = sum((v - mean) ** 2 for v in row) / len(row)
    return [(v - mean) / math.sqrt(var + eps) * w + b for v, w, b in zip(row, weight, bias, strict=True)]


WG = [[0.1, -0.2, 0.3, 0.0], [0.5, 0.4, -0.1, 0.2], [-0.3, 0.0, 0.2, 0.1], [0.0, 0.6, -0.5, -0.4]]
BG = [-1.0, 0.5, 0.0, 2.0]


def test_formula_laurel_seed():
    """The seed notes' gate: g = σ(W_g LN_g(x) + b_g) per channel, y = g ⊙ F + (1 − g) ⊙ x."""
    site = LAuReL.build_block(block_args(), **LAuReL.validate_options({"form": "seed"})).ls1
    ln_w, ln_b = [1.5, 0.5, -1.0, 2.0], [0.1, 0.0, -0.2, 0.3]
    for p, v in ((site.gate.weight, WG), (site.gate.bias, BG), (site.gate_norm.weight, ln_w),
                 (site.gate_norm.bias, ln_b)):
        assign(p, v)
    expected = []
    for n in range(2):
        z = _layer_norm_hand(X[n], ln_w, ln_b)
        g = [sig(sum(WG[d][e] * z[e] for e in range(4)) + BG[d]) for d in range(4)]
        expected.append([g[d] * FB[n][d] + (1 - g[d]) * X[n][d] - X[n][d] for d in range(4)])
    check(site, expected)


def test_formula_dca_seed():
    """The seed notes' predictor: (α_skip, α_branch) = softmax(W₂ GELU(W₁ x + b₁) + b₂) per token (D/4 = 1 hidden
    unit at D = 4), y = α_skip x + α_branch F."""
    site = DCA.build_block(block_args(), **DCA.validate_options({"form": "seed"})).ls1
    W1, b1, W2, b2 = [[0.5, -0.25, 1.0, 0.2]], [0.1], [[1.5], [-0.5]], [0.2, -0.1]
    for p, v in zip(site.predictor.parameters(), (W1, b1, W2, b2), strict=True):
        assign(p, v)
    gelu = lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2)))  # noqa: E731 (exact GELU)
    expected = []
    for n in range(2):
        h = gelu(sum(W1[0][e] * X[n][e] for e in range(4)) + b1[0])
        logits = [W2[0][0] * h + b2[0], W2[1][0] * h + b2[1]]
        skip = math.exp(logits[0]) / (math.exp(logits[0]) + math.exp(logits[1]))
        expected.append([skip * X[n][d] + (1 - skip) * FB[n][d] - X[n][d] for d in range(4)])
    check(site, expected)


# a stack of 3 vectors per token: G[n][j] (2 tokens, 3 stacked layers, 4 channels)
G = [[[1.0, -1.0, 2.0, 0.5], [0.5, 0.5, -1.0, 1.0], [-2.0, 1.0, 0.0, 0.25]],
     [[0.0, 1.0, 1.0, -1.0], [2.0, -0.5, 0.5, 0.0], [1.0, 1.0, -1.0, 2.0]]]
BD = [[[0.5, -0.25, 0.0, 1.0], [-1.5, 0.25, 0.5, 0.0], [0.0, 1.0, -2.0, -0.5]],  # b' per output (3 outputs)
      [[0.0, 0.0, 0.0, 0.0], [-2.0, -1.0, 0.5, 0.25], [0.5, -0.5, 1.0, -1.5]],
      [[-0.5, 0.5, 1.5, -1.0], [1.0, -0.75, 0.0, 0.5], [-1.0, 0.0, 0.25, 2.0]]]
WS = [[0.5, -0.25, 0.1, 1.0], [-1.0, 0.5, 0.5, 0.25], [0.2, 0.2, -0.6, -0.3]]  # w per output


def _grn_hand(bd, w, form, v3):
    """g[n][d] by hand for one output: b = 1 + b'; s_j = wᵀG_j."""
    out = []
    for n in range(2):
        row = []
        for d in range(4):
            total = 0.0
            for j in range(3):
                b = 1.0 + (bd[j][0] if form == "grn_v1" else bd[j][d])
                if form in ("grn_v1", "grn_v2"):
                    weight = b
                else:
                    s = sum(w[e] * G[n][j][e] for e in range(4))
                    weight = b + max(0.0, s) if v3 == "text_A" else max(0.0, b + s)
                total += weight * G[n][j][d]
            row.append(total)
        out.append(row)
    return out


@pytest.mark.parametrize("form, v3", [("grn_v1", None), ("grn_v2", None), ("grn_v3", "text_A"),
                                      ("grn_v3", "fig10_B"), ("dca", "text_A"), ("dca", "fig10_B")])
def test_formula_dca_grn(form, v3):
    site = DCA(4, args=block_args(layer=2), form=form, grn_v3_form=v3 or "fig10_B")
    outputs = 3 if form == "dca" else 1
    assert site.b_delta.shape == (outputs, 3, 1 if form == "grn_v1" else 4)
    bd = [[[r[0]] for r in o] for o in BD] if form == "grn_v1" else BD
    assign(site.b_delta, bd[:outputs])
    if site.w is not None:
        assign(site.w, WS[:outputs])
    out = site(torch.tensor([G]))  # (1, 2, 3, 4) stack
    assert out.shape == (outputs, 1, 2, 4)
    for o in range(outputs):
        want = torch.tensor([_grn_hand(bd[o], WS[o], form, v3)])
        assert torch.allclose(out[o], want, atol=1e-14, rtol=0), (o, out[o], want)


def test_formula_hand_values_exercise_relu():
    """Guard for the DCA hand test: both ReLU placements clip something on this stack, so they differ."""
    assert _grn_hand(BD[0], WS[0], "grn_v3", "text_A") != _grn_hand(BD[0], WS[0], "grn_v3", "fig10_B")
    assert any(sum(WS[0][e] * G[n][j][e] for e in range(4)) < 0 for n in range(2) for j in range(3))


@pytest.mark.parametrize("chunk_elements", [1, 64, 1 << 19])  # chunks of 8 tokens with a remainder; one chunk
def test_relu_mix_gradients_match_plain_autograd(monkeypatch, chunk_elements):
    """The fused fig10_B GRN (ReLUMix: chunked, weights recomputed in backward) has the gradients of the plain
    autograd formula, with exact ties b + wᵀG = 0 (ReLU'(0) = 0 in both) and a token count not divisible by the
    chunk; gradcheck confirms them against finite differences."""
    from lit_modules.residual.dca import ReLUMix

    monkeypatch.setattr(ReLUMix, "CHUNK_ELEMENTS", chunk_elements)
    gen = torch.Generator().manual_seed(3)
    G = torch.randn(19, 3, 4, generator=gen, requires_grad=True)
    w = torch.randn(2, 4, generator=gen, requires_grad=True)
    b = torch.randn(2, 3, 4, generator=gen)
    with torch.no_grad():
        b[0, 1] = -(G[5, 1] @ w[0])  # a tie: pre-activation exactly 0 for token 5, j = 1, output 0
    b.requires_grad_()
    assert (b[0, 1] + G[5, 1] @ w[0] == 0).all()
    grad = torch.randn(2, 19, 4, generator=gen)
    plain = (F.relu(b[:, None] + torch.einsum("mtd,od->omt", G, w)[..., None]) * G).sum(dim=2)
    fused = ReLUMix.apply(G, w, b)
    assert torch.allclose(fused, plain, atol=1e-13, rtol=0)
    want = torch.autograd.grad(plain, (G, w, b), grad)
    got = torch.autograd.grad(fused, (G, w, b), grad)
    for name, g_want, g_got in zip("Gwb", want, got, strict=True):
        assert torch.allclose(g_got, g_want, atol=1e-12, rtol=0), name
    assert got[1].abs().sum() > 0 and got[2].abs().sum() > 0  # w and b train
    inputs = tuple(x.detach().clone().requires_grad_() for x in (G, w, b))
    inputs[2].data += 1e-3  # gradcheck's finite differences need a margin from the ReLU kink
    assert torch.autograd.gradcheck(ReLUMix.apply, inputs)


def test_relu_mix_chunks_are_cache_sized_on_a_cpu_and_large_elsewhere():
    """A chunk is ~CHUNK_ELEMENTS elements on a CPU and ~DEVICE_CHUNK_ELEMENTS on another device (a 'meta' tensor
    stands in: a GPU's launch-bound chunks made DCA's step grow with the batch); the slices cover every token once."""
    from lit_modules.residual.dca import ReLUMix

    tokens, t, D, outputs = 1024 * 65, 7, 192, 3
    for device, limit in (("cpu", ReLUMix.CHUNK_ELEMENTS), ("meta", ReLUMix.DEVICE_CHUNK_ELEMENTS)):
        G = torch.empty(tokens, t, D, device=device)
        chunks = ReLUMix.chunks(G, outputs)
        assert chunks[0].stop - chunks[0].start == limit // (outputs * t * D), device
        assert [i for c in chunks for i in range(tokens)[c]] == list(range(tokens))
    assert len(ReLUMix.chunks(torch.empty(tokens, t, D), outputs)) == 512  # 130 tokens a chunk
    assert len(ReLUMix.chunks(torch.empty(tokens, t, D, device="meta"), outputs)) == 4  # 16,644 tokens a chunk


@pytest.mark.parametrize("fused", [True, False])
def test_dca_block_wiring(fused):
    """a = MHSA(LN_q q_in, LN_k k_in, LN_v v_in), f_t = a + MLP(LN₂(q_in + a)), written out with an explicit
    softmax; the three GRN outputs are made different so swapping query/key/value inputs is caught."""
    model = perturb(build("dca", {"form": "dca"}, fused_attn=fused)).eval()
    blk = model.blocks[2]
    stack = torch.randn(2, 5, 3, 8)
    with torch.no_grad():
        q_in, k_in, v_in = blk.grn(stack)
        assert not torch.allclose(k_in, v_in) and not torch.allclose(q_in, k_in)
        W, b = blk.attn.qkv.weight, blk.attn.qkv.bias
        heads = lambda t: t.reshape(2, 5, 2, 4).transpose(1, 2)  # noqa: E731  (B, H, N, head_dim)
        q = heads(blk.norm1(q_in) @ W[:8].T + b[:8])
        k = heads(blk.norm1_k(k_in) @ W[8:16].T + b[8:16])
        v = heads(blk.norm1_v(v_in) @ W[16:].T + b[16:])
        attn = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)  # 1/sqrt(head_dim = 4)
        a = blk.attn.proj((attn @ v).transpose(1, 2).reshape(2, 5, 8))
        want = a + blk.mlp(blk.norm2(q_in + a))
        assert torch.allclose(blk(stack), want, atol=1e-12, rtol=0)


def test_k_dca_stack_is_input_sum_of_intermediates_and_last_k():
    """k-DCA (k=1, depth 4): block t reads [x0, Σ older outputs, last output] (paper's selection)."""
    model = perturb(build("dca", {"form": "grn_v2", "k": 1}, depth=4)).eval()
    stacks, outs = [], []
    for blk in model.blocks:
        blk.register_forward_hook(lambda mod, inp, out: stacks.append(inp[0]) or outs.append(out))
    x0 = tokens(model, images())
    with torch.no_grad():
        model.stream(x0, model.blocks)
    assert [s.shape[2] for s in stacks] == [1, 2, 3, 3]
    f1, f2, f3 = outs[:3]
    expect = {0: [x0], 1: [x0, f1], 2: [x0, f1, f2], 3: [x0, f1 + f2, f3]}
    for t, parts in expect.items():
        assert torch.allclose(stacks[t], torch.stack(parts, dim=2), atol=1e-14, rtol=0)


def test_k_dca_depth8_stack_sizes():
    model = build("dca", {"k": 2}, depth=8)
    sizes = [blk.grn.b_delta.shape[1] for blk in model.blocks]
    assert sizes == [1, 2, 3, 4, 4, 4, 4, 4] and max(sizes) <= 4
    assert model.stream.out.b_delta.shape[1] == 4
    full = build("dca", {}, depth=8)
    assert [blk.grn.b_delta.shape[1] for blk in full.blocks] == list(range(1, 9))
    assert full.stream.out.b_delta.shape[1] == 9


# ================================================================================================================
# 7. weight-decay grouping

COMMON_DECAY = ["patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight",
                "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.weight", "head.weight"]
COMMON_NO_DECAY = ["pos_embed", "cls_token", "blocks.0.norm1.weight", "blocks.0.attn.qkv.bias", "head.bias"]

WD_CASES = {  # residual, options, names that must not decay, names that must decay
    "standard": ("standard", {}, [], []),
    "layerscale": ("layerscale", {"init_value": 1e-5}, ["blocks.0.ls1.gamma", "blocks.2.ls2.gamma"], []),
    "rezero": ("rezero", {}, ["blocks.0.ls1.alpha"], []),
    "skipinit": ("skipinit", {}, ["blocks.0.ls1.alpha", "blocks.1.ls2.alpha"], []),
    "highway": ("highway", {}, ["blocks.0.ls1.gate.bias"], ["blocks.0.ls1.gate.weight", "blocks.2.ls2.gate.weight"]),
    "laurel": ("laurel", tiny_laurel({"form": "rw_lr_pa"}), ["blocks.0.res.mix.logits", "blocks.1.res.pa_gamma"],
               ["blocks.0.res.lr_down", "blocks.0.res.lr_up"]),
    "laurel_sub": ("laurel", tiny_laurel({"form": "rw", "granularity": "sublayer"}), ["blocks.0.ls2.mix.logits"], []),
    "laurel_seed": ("laurel", tiny_laurel({"form": "seed"}), ["blocks.0.ls1.gate.bias", "blocks.1.ls2.gate_norm.weight"],
                    ["blocks.0.ls1.gate.weight"]),
    "res_se": ("res_se", {"reduction": 2}, ["blocks.0.ls1.fc1.bias", "blocks.0.ls1.fc2.bias"],
               ["blocks.0.ls1.fc1.weight", "blocks.0.ls1.fc2.weight"]),
    "dca": ("dca", {"form": "dca"}, ["blocks.0.grn.b_delta", "blocks.2.grn.b_delta", "stream.out.b_delta",
                                     "blocks.0.norm1_k.weight", "blocks.0.grn.w", "stream.out.w"], []),
    "grn_v3": ("dca", {"form": "grn_v3"}, ["blocks.1.grn.w", "blocks.1.grn.b_delta", "stream.out.w"], []),
    "grn_v1": ("dca", {"form": "grn_v1", "k": 1}, ["blocks.1.grn.b_delta", "stream.out.b_delta"], []),
    "dca_seed": ("dca", {"form": "seed"}, ["blocks.0.ls1.predictor.0.bias", "blocks.0.ls2.predictor.2.bias"],
                 ["blocks.0.ls1.predictor.0.weight", "blocks.0.ls1.predictor.2.weight"]),
    "res_se_seed": ("res_se", {"form": "seed", "reduction": 2}, ["blocks.0.ls1.fc2.bias"], ["blocks.0.ls2.fc2.weight"]),
}


@pytest.mark.parametrize("case", list(WD_CASES))
def test_weight_decay_groups(case):
    residual, options, no_decay, decay = WD_CASES[case]
    model = build(residual, options)
    groups = model.param_groups(0.05)
    by_id = {id(p): n for n, p in model.named_parameters()}
    wd = {}
    for g in groups:
        for p in g["params"]:
            assert by_id[id(p)] not in wd, "a parameter is in two groups"
            wd[by_id[id(p)]] = g["weight_decay"]
    assert set(wd) == set(by_id.values())
    has_norms = "blocks.0.norm1.weight" in wd  # ReZero/SkipInit's default blocks have no LayerNorm
    for name in [n for n in COMMON_NO_DECAY if has_norms or "norm1" not in n] + no_decay:
        assert wd[name] == 0.0, f"{name} must not be decayed"
    for name in COMMON_DECAY + decay:
        assert wd[name] == 0.05, f"{name} must be decayed"
    params = dict(model.named_parameters())
    for name, p in params.items():
        if p.ndim <= 1 or p.numel() == 1:
            assert wd[name] == 0.0, f"scalar/vector {name} must not be decayed"
    if residual == "dca" and options["form"] != "seed":
        assert params["blocks.1.grn.b_delta"].ndim >= 2  # so timm's ndim rule alone would have decayed it
        assert all(n in model.no_weight_decay() for n in params if n.endswith("b_delta"))
    if residual == "dca" and options["form"] in ("dca", "grn_v3"):
        assert params["blocks.1.grn.w"].ndim == 2  # (outputs, D): timm's ndim rule alone would have decayed it
        assert all(n in model.no_weight_decay() for n in params if n.endswith(".w"))


# ================================================================================================================
# 8. option validation (per variant)


@pytest.mark.parametrize("residual, options, words", [
    ("layerscale", {"rank": 4}, ["'rank'", "belongs to laurel", "layerscale", "init_value"]),
    ("standard", {"init_value": 0.1}, ["'init_value'", "layerscale", "rezero", "skipinit"]),
    ("rezero", {"gate": "sigmoid"}, ["'gate'", "res_se"]),
    ("highway", {"nonsense": 1}, ["'nonsense'", "gate_bias", "gate_weight_init"]),
    ("laurel", {"rank": 9}, ["rank=9", "1..8"]),
    ("laurel", {"rank": 0}, ["rank=0"]),
    ("laurel", {"form": "bogus", "rank": 2}, ["form='bogus'", "rw_lr_pa", "seed"]),
    ("laurel", {"granularity": "layer", "rank": 2}, ["granularity", "block", "sublayer"]),
    ("laurel", {"rw_norm": "tanh", "rank": 2}, ["rw_norm", "softmax", "sigmoid"]),
    ("laurel", {"form": "pa", "pa_h": "full"}, ["pa_h", "identity", "lowrank"]),
    ("laurel", {"a_init": "kaiming", "rank": 2}, ["a_init", "xavier", "col_orth"]),
    ("laurel", {"form": "rw_pa", "k": 0}, ["k=0"]),
    ("laurel", {"rw_norm": "softmax", "alpha_init": 1.0, "beta_init": 1.0, "rank": 2}, ["softmax"]),
    ("dca", {"form": "grn_v4"}, ["form='grn_v4'", "grn_v1", "grn_v3", "dca"]),
    ("dca", {"grn_v3_form": "C"}, ["grn_v3_form", "text_A", "fig10_B"]),
    ("dca", {"k": 0}, ["k=0"]),
    ("dca", {"k": -2}, ["k=-2"]),
    ("dca", {"w_init_std": -1.0}, ["w_init_std"]),
    ("res_se", {"gate": "tanh"}, ["gate", "two_sigmoid", "sigmoid"]),
    ("res_se", {"pool": "cls"}, ["pool", "all", "patch_only"]),
    ("res_se", {"reduction": 0}, ["reduction"]),
    ("res_se", {"form": "bridge"}, ["form='bridge'", "skip_gate", "seed"]),
    ("highway", {"gate_bias": "big"}, ["gate_bias", "auto"]),
    ("laurel", {"rw_norm": "coupled", "alpha_init": 0.3, "beta_init": 0.3, "rank": 2}, ["coupled"]),
    ("highway", {"gate_weight_init": "ones"}, ["gate_weight_init", "trunc_normal", "zeros"]),
    ("layerscale", {"init_value": "big"}, ["init_value", "auto"]),
])
def test_bad_options_raise(residual, options, words):
    assert_bad_options(residual, options, words)


@pytest.mark.parametrize("residual, options, message", [
    ("laurel", {"form": "rw", "rank": 8}, "option 'rank' does not apply to residual 'laurel' with form='rw'; it "
     "applies to form lr, rw_lr, rw_lr_pa, and pa, rw_pa with pa_h='lowrank'"),
    ("laurel", {"form": "pa", "a_init": "col_orth"}, "option 'a_init' does not apply to residual 'laurel' with "
     "form='pa', pa_h='identity'; it applies to form lr, rw_lr, rw_lr_pa, and pa, rw_pa with pa_h='lowrank'"),
    ("laurel", {"form": "rw_lr", "k": 2}, "option 'k' does not apply to residual 'laurel' with form='rw_lr'; it "
     "applies to form pa, rw_pa, rw_lr_pa"),
    ("laurel", {"form": "rw_lr_pa", "pa_h": "lowrank"}, "option 'pa_h' does not apply to residual 'laurel' with "
     "form='rw_lr_pa'; it applies to form pa, rw_pa"),
    ("laurel", {"form": "lr", "rw_norm": "none"}, "option 'rw_norm' does not apply to residual 'laurel' with "
     "form='lr'; it applies to form rw, rw_lr, rw_pa, rw_lr_pa"),
    ("laurel", {"form": "pa", "alpha_init": 0.5}, "option 'alpha_init' does not apply to residual 'laurel' with "
     "form='pa'; it applies to form rw, rw_lr, rw_pa, rw_lr_pa"),
    ("laurel", {"form": "rw", "rw_norm": "coupled", "beta_init": 0.5}, "option 'beta_init' does not apply to "
     "residual 'laurel' with rw_norm='coupled' (beta = 1 - alpha); it applies to rw_norm none, softmax, sigmoid"),
    ("laurel", {"form": "seed", "granularity": "block"}, "option 'granularity' does not apply to residual 'laurel' "
     "with form='seed'; it applies to form rw, lr, pa, rw_lr, rw_pa, rw_lr_pa"),
    ("dca", {"form": "grn_v1", "grn_v3_form": "text_A"}, "option 'grn_v3_form' does not apply to residual 'dca' with "
     "form='grn_v1'; it applies to form dca, grn_v3"),
    ("dca", {"form": "grn_v2", "w_init_std": 0.01}, "option 'w_init_std' does not apply to residual 'dca' with "
     "form='grn_v2'; it applies to form dca, grn_v3"),
    ("dca", {"form": "seed", "k": 2}, "option 'k' does not apply to residual 'dca' with form='seed'; it applies to "
     "form dca, grn_v1, grn_v2, grn_v3"),
    ("res_se", {"form": "seed", "gate": "two_sigmoid"}, "option 'gate' does not apply to residual 'res_se' with "
     "form='seed'; it applies to form skip_gate"),
])
def test_inapplicable_options_raise(residual, options, message):
    """An option the chosen form ignores is rejected at validation (even at its default value), with one line
    naming the option, the form and where it applies: two labels are never the same model."""
    with pytest.raises(ValueError) as err:
        RESIDUALS[residual].validate_options(options)
    assert str(err.value) == message


@pytest.mark.parametrize("backbone, message", [
    ({"class_attention_blocks": 1}, "option 'pool' does not apply to residual 'res_se' with class_attention_blocks=1 "
     "(the class token joins after the blocks, so every token pooled is a patch); it applies with a class token in "
     "the blocks"),
    ({"class_token": False, "global_pool": "avg"}, "option 'pool' does not apply to residual 'res_se' with "
     "class_token=False (every token pooled is a patch); it applies with a class token in the blocks"),
])
def test_res_se_pool_needs_a_class_token_in_the_blocks(backbone, message):
    """Without a class token in the blocks, pool='all' and 'patch_only' squeeze the same tokens: the same model."""
    with pytest.raises(ValueError) as err:
        build("res_se", {"pool": "patch_only"}, **backbone)
    assert str(err.value) == message
    build("res_se", {}, **backbone)  # the default (pool not given) builds


@pytest.mark.parametrize("residual, options", [
    ("laurel", {"form": "pa", "pa_h": "lowrank", "rank": 2, "a_init": "col_orth", "k": 2}),
    ("laurel", {"form": "rw_lr_pa", "rank": 2, "k": 2, "rw_norm": "softmax", "alpha_init": 0.2, "beta_init": 0.8}),
    ("laurel", {"form": "rw", "rw_norm": "coupled", "alpha_init": 0.3, "granularity": "sublayer"}),
    ("dca", {"k": 2, "grn_v3_form": "text_A", "w_init_std": 0.01}),
    ("dca", {"form": "grn_v3", "grn_v3_form": "text_A"}),
    ("dca", {"form": "grn_v1", "k": 1}),
    ("res_se", {"form": "seed", "reduction": 4, "pool": "patch_only"}),
])
def test_applicable_options_accepted(residual, options):
    """Every option of the applicability tables is accepted where the table says it applies."""
    assert RESIDUALS[residual].validate_options(options).items() >= options.items()


# ================================================================================================================
# 9. construction rules


def test_registry_keys():
    from lit_modules.names import RESIDUAL_CLASSES

    assert list(RESIDUALS) == list(RESIDUAL_CLASSES)  # the one list (lit_modules/names.py); a new variant adds a line
    assert list(RESIDUALS)[:8] == ["standard", "layerscale", "rezero", "skipinit", "highway", "laurel", "res_se",
                                   "dca"]  # the product's eight, in design order, first
    assert all(cls.name == name and cls.__name__ == RESIDUAL_CLASSES[name] for name, cls in RESIDUALS.items())


@pytest.mark.parametrize("depth, value", [(12, 0.1), (18, 0.1), (24, 1e-5), (36, 1e-6), (48, 1e-6)])
def test_layerscale_auto_follows_cait(depth, value):
    assert cait_init_value(depth) == value
    if depth in (12, 24, 36):
        model = build("layerscale", {"init_value": "auto"}, depth=depth, embed_dim=4, num_heads=1)
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                assert torch.equal(p, torch.full((4,), value))
        assert sum(n.endswith("gamma") for n, _ in model.named_parameters()) == 2 * depth


def test_layerscale_zero_and_none():
    zero = build("layerscale", {"init_value": 0.0})
    gammas = [p for n, p in zero.named_parameters() if n.endswith("gamma")]
    assert len(gammas) == 6 and all(torch.equal(g, torch.zeros(8)) for g in gammas)  # zero, not disabled
    x0 = tokens(zero, images())
    with torch.no_grad():
        assert torch.equal(zero.stream(x0, zero.blocks), x0)
    none = build("layerscale", {"init_value": None})
    assert not any("gamma" in n for n, _ in none.named_parameters())
    std = build("standard")
    assert set(none.state_dict()) == set(std.state_dict())
    none.load_state_dict(std.state_dict())
    with torch.no_grad():
        assert torch.equal(none(images()), std(images()))


def test_default_inits():
    """Init values the spec prescribes for the new parameters."""
    hw = build("highway", {"gate_bias": -3.0, "gate_weight_init": "zeros"})
    assert torch.equal(hw.blocks[1].ls2.gate.bias, torch.full((8,), -3.0))
    assert torch.equal(hw.blocks[1].ls2.gate.weight, torch.zeros(8, 8))
    hw_tn = build("highway")  # depth 3: 6 gated sublayers, the paper's guideline gives -1
    assert torch.equal(hw_tn.blocks[0].ls1.gate.bias, torch.full((8,), -1.0))
    assert 0 < hw_tn.blocks[0].ls1.gate.weight.std() < 0.05
    se = build("res_se", {"reduction": 2})
    assert torch.equal(se.blocks[0].ls1.fc2.weight, torch.zeros(8, 4))
    assert torch.equal(se.blocks[0].ls1.fc2.bias, torch.zeros(8))
    assert torch.equal(se.blocks[0].ls1.scale(torch.randn(2, 5, 8)), torch.ones(2, 1, 8))
    se_sig = build("res_se", {"reduction": 2, "gate": "sigmoid"})
    assert se_sig.blocks[0].ls1.fc2.weight.abs().min() > 0  # PyTorch default Linear init, not timm's zero bias
    lr = build("laurel", {"form": "rw_lr", "a_init": "col_orth", "rank": 2})
    A = lr.blocks[0].res.lr_up[0]
    want = torch.tensor([[1 / math.sqrt(2 * 8) if i % 2 == j else 0.0 for j in range(2)] for i in range(8)])
    assert torch.allclose(A, want, atol=1e-15, rtol=0)
    assert torch.equal(lr.blocks[0].res.lr_down, torch.zeros(1, 2, 8))
    assert torch.allclose(torch.stack(lr.blocks[0].res.mix()), torch.tensor([0.99, 0.99]), atol=1e-12, rtol=0)
    assert lr.blocks[0].res.mix.norm == "sigmoid"  # bounded α, β by default (the paper's advice)
    rwpa = build("laurel", {"form": "rw_pa", "k": 3})
    assert rwpa.blocks[0].res.pa_gamma.tolist() == [1.0, 0.0, 0.0]
    assert build("laurel", {"form": "pa", "k": 3}).blocks[0].res.pa_gamma.tolist() == [0.0, 0.0, 0.0]
    soft = build("laurel", {"form": "rw", "rw_norm": "softmax"}).blocks[0].res.mix
    assert torch.allclose(torch.stack(soft()), torch.tensor([0.01, 0.99]), atol=1e-15, rtol=0)
    dca = build("dca", {"w_init_std": 0.01})
    assert torch.equal(dca.blocks[2].grn.b_delta, torch.zeros(3, 3, 8))
    assert 0 < dca.blocks[2].grn.w.abs().max() < 0.05
    assert torch.equal(build("dca").blocks[2].grn.w, torch.zeros(3, 8))


def test_site_counts():
    assert len(build("standard").residual_sites()) == 6
    assert [s[1] for s in build("laurel", LAUREL).residual_sites()] == ["block"] * 3
    assert len(build("laurel", tiny_laurel({"granularity": "sublayer"})).residual_sites()) == 6
    assert len(build("dca").residual_sites()) == 3
    assert [s[1] for s in build("skipdense").residual_sites()] == ["block"] * 3


@pytest.mark.parametrize("depth, bias", [(2, -1.0), (6, -1.0), (8, -2.0), (12, -2.0), (14, -3.0), (32, -3.0)])
def test_highway_auto_bias_follows_the_paper_guideline(depth, bias):
    """−1, −2, −3 for highway nets of depth ≈ 10, 20, 30, counted in gated sublayers (2 per block), clipped."""
    model = build("highway", depth=depth, embed_dim=4, num_heads=1)
    assert all(torch.equal(site.gate.bias, torch.full((4,), bias)) for _, _, site in model.residual_sites())


@pytest.mark.parametrize("residual", ["rezero", "skipinit"])
def test_rezero_skipinit_default_is_normalisation_free(residual):
    """The papers' form: no LayerNorm in any block (only the final pre-head norm); norm=True is the LN control."""
    model = build(residual)
    for blk in model.blocks:
        assert not any(isinstance(m, nn.LayerNorm) for m in blk.modules()), "a block of the default has a norm"
        assert isinstance(blk.norm1, nn.Identity) and isinstance(blk.norm2, nn.Identity)
    assert isinstance(model.norm, nn.LayerNorm)
    control = build(residual, {"norm": True})
    assert all(isinstance(blk.norm1, nn.LayerNorm) and isinstance(blk.norm2, nn.LayerNorm) for blk in control.blocks)


@pytest.mark.parametrize("residual, options", [
    ("layerscale", {"init_value": 0.5}), ("rezero", {"init_value": 0.3}), ("highway", {}),
    ("laurel", tiny_laurel({"form": "rw_lr", "granularity": "sublayer"})), ("res_se", {"reduction": 2}),
    ("res_se", {"form": "seed", "reduction": 2}), ("laurel", tiny_laurel({"form": "seed"})), ("dca", {"form": "seed"}),
])
def test_decompose_reassembles_the_update(residual, options):
    """Diagnostics split the update into branch term b and skip scale c: Δ = b + (c − 1)·x (LAuReL-LR's low-rank
    part is zero at init), so the CaiT ratio ‖b‖/‖x‖ leaves the skip's rescaling out."""
    model = perturb(build(residual, options), scale=0.1)
    x, u, f = torch.randn(3, 2, 5, 8).unbind(0)
    for _, _, site in model.residual_sites():
        if getattr(site, "uses_lr", False):
            torch.nn.init.zeros_(site.lr_down)
        branch, skip = site.decompose(x, u, f)
        assert torch.allclose(site(x, u, f, None), branch + (torch.as_tensor(skip) - 1) * x, atol=1e-12, rtol=0)
