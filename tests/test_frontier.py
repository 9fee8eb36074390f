"""The 2025-26 frontier designs against hand computation and their reference code's equations (float64, tiny models;
reference: docs/variants.md §21).

Each design: its paper's form by default (equal to the standard ViT at init where the paper says so), its formula
against values computed by hand (or with the reference code's equations, written out here), every parameter live at
step 0 or dead by design, weight decay, and its options. The checkpoint round trip and bf16 autocast run over the
whole registry (``test_checkpoints.py``, ``test_autocast.py``); the backbone options are listed there too.
"""

from __future__ import annotations

import math

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
    for name in ("gpas",):
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
