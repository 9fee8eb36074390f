"""Diagnostics (spec §10): the formulas against hand-computed values, the hooked forward on every variant, and the
Lightning callback on a tiny run (TensorBoard tags read back from the event files)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_modules import RESIDUALS, VisionTransformer
from lit_modules.diagnostics import (
    DEFAULT_TAU,
    SIMILAR_SHARE,
    TAGS,
    attention_similarity,
    block_grad_norms,
    branch_ratios,
    collect_diagnostics,
    similar_blocks,
    stream_rms,
)
from lit_modules.diagnostics_logging import DiagnosticsCallback, diagnostic_scalars

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=16, depth=3, num_heads=2, mlp_ratio=2.0)
VARIANTS = [(name, {}) for name in RESIDUALS] + [
    ("dca", {"form": "grn_v1", "k": 1}),
    ("dca", {"form": "seed"}),
    ("laurel", {"form": "rw_lr_pa", "granularity": "sublayer"}),
    ("layerscale", {"init_value": None}),
]


def tiny(residual: str = "standard", options: dict | None = None, seed: int = 0, **kw) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(residual, options, **(TINY | kw))


def images(n: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def maps(*layers) -> list[torch.Tensor]:
    """Hand-written (T, T) maps (or (H, T, T)) -> (1, H, T, T) tensors."""
    out = []
    for m in layers:
        t = torch.tensor(m, dtype=torch.float32)
        out.append(t.reshape(1, *(t.shape if t.ndim == 3 else (1, *t.shape))))
    return out


# --- attention similarity and entropy -------------------------------------------------------------------------------
UNIFORM = [[0.5, 0.5], [0.5, 0.5]]
IDENTITY = [[1.0, 0.0], [0.0, 1.0]]
SWAP = [[0.0, 1.0], [1.0, 0.0]]
MIXED = [[1.0, 0.0], [0.5, 0.5]]  # columns (1, .5) and (0, .5); rows (1, 0) and (.5, .5)


def test_identical_maps_have_similarity_one():
    torch.manual_seed(0)
    a = torch.randn(2, 3, 5, 5).softmax(-1)
    s = attention_similarity([a, a.clone(), a.clone()])
    torch.testing.assert_close(s["sim_full"], torch.ones(3, 3))
    torch.testing.assert_close(s["sim_adj"], torch.ones(2))
    torch.testing.assert_close(s["sim_ratio"], torch.ones(2))


def test_orthogonal_columns_have_similarity_zero():
    s = attention_similarity(maps(IDENTITY, SWAP))
    assert s["sim_adj"].tolist() == [0.0]
    assert s["sim_ratio"].tolist() == [0.0]
    torch.testing.assert_close(s["sim_full"], torch.eye(2))


def test_similarity_is_the_cosine_of_columns_hand_computed():
    # column 0: (.5, .5)·(1, .5) / (√.5 · √1.25) = 0.75 / 0.790569 = 0.948683
    # column 1: (.5, .5)·(0, .5) / (√.5 · 0.5)   = 0.25 / 0.353553 = 0.707107        -> mean 0.827895
    # (the row reading would give (0.707107 + 1) / 2 = 0.853553: columns, not rows, are compared)
    s = attention_similarity(maps(UNIFORM, MIXED))
    assert s["sim_adj"].item() == pytest.approx((0.75 / math.sqrt(0.5 * 1.25) + 0.25 / math.sqrt(0.5 * 0.25)) / 2,
                                                abs=1e-6)
    assert s["sim_adj"].item() == pytest.approx(0.827895, abs=1e-6)
    assert s["sim_ratio"].item() == 0.5  # one column of two above τ = 0.9
    assert attention_similarity(maps(UNIFORM, MIXED), tau=0.95)["sim_ratio"].item() == 0.0
    assert s["sim_full"][0, 1] == s["sim_full"][1, 0] == s["sim_adj"][0]
    assert DEFAULT_TAU == 0.9


def test_a_column_of_tiny_entries_keeps_its_cosine():
    """A column whose float32 entries square below the smallest float (1e-25² = 1e-50) has a norm that underflows;
    its cosine is still the hand-computed one, never above 1: columns (t, 3t)/(t√10) in both maps give cosine 1, and
    (t, 3t) against (3t, t) gives 6t²/10t² = 0.6."""
    t = 1e-25
    first = maps([[0.5, t], [0.5, 3 * t]])
    second = maps([[0.5, 3 * t], [0.5, t]])
    s = attention_similarity(first + first, k=1)
    assert s["sim_adj"].item() == pytest.approx(1.0, abs=1e-6)  # both columns identical across the two maps
    s = attention_similarity(first + second, k=1)
    assert s["sim_adj"].item() == pytest.approx((1.0 + 0.6) / 2, abs=1e-6)  # column 0 equal, column 1 at 0.6
    assert s["sim_full"].max().item() <= 1.0


def test_similarities_stay_in_minus_one_one_whatever_the_scale_and_precision():
    """Softmax maps scaled down to 1e-30 and cast to bfloat16, half and float32: every similarity within [−1, 1], the
    same as at scale 1; an all-zero column has cosine 0 with everything."""
    gen = torch.Generator().manual_seed(3)
    ms = [torch.softmax(torch.randn(2, 2, 5, 5, generator=gen) * 4, dim=-1) for _ in range(4)]
    reference = attention_similarity(ms, k=2)
    for scale, dtype in ((1e-30, torch.float32), (1e-30, torch.bfloat16), (1e-3, torch.float16)):  # half: below ~6e-8 the entries themselves vanish
        s = attention_similarity([(m * scale).to(dtype) for m in ms], k=2)
        for key in ("sim_full", "sim_adj", "sim_k"):
            assert s[key].abs().max().item() <= 1.0, (key, scale, dtype)
            assert torch.allclose(s[key], reference[key], atol=2e-2), (key, scale, dtype)
    zero = maps([[1.0, 0.0], [0.0, 0.0]])  # column 1 is all zeros
    s = attention_similarity(zero + zero, k=1)
    assert s["sim_adj"].item() == pytest.approx(0.5)  # column 0: cosine 1; column 1: defined as 0


def test_heads_are_matched_by_index():
    same = attention_similarity(maps([IDENTITY, UNIFORM], [IDENTITY, UNIFORM]))["sim_adj"].item()
    swapped = attention_similarity(maps([IDENTITY, UNIFORM], [UNIFORM, IDENTITY]))["sim_adj"].item()
    assert same == pytest.approx(1.0)
    # per head: I vs U columns (1,0)·(.5,.5) -> 1/√2 for both columns; same for U vs I
    assert swapped == pytest.approx(1 / math.sqrt(2), abs=1e-6)


def test_similarity_matches_brute_force_cosine():
    torch.manual_seed(1)
    ms = [(torch.randn(2, 3, 7, 7) * 3).softmax(-1) for _ in range(4)]
    s = attention_similarity(ms, tau=0.8)
    for p in range(4):
        for q in range(4):
            m = F.cosine_similarity(ms[p], ms[q], dim=-2)  # (B, H, T): over the query axis = columns
            assert s["sim_full"][p, q].item() == pytest.approx(m.mean().item(), abs=1e-5)
            if q == p + 1:
                assert s["sim_adj"][p].item() == pytest.approx(m.mean().item(), abs=1e-5)
                assert s["sim_ratio"][p].item() == pytest.approx((m > 0.8).float().mean().item(), abs=1e-6)


def test_entropy_uniform_is_one_one_hot_is_zero():
    uniform = torch.full((2, 3, 4, 4), 0.25)
    one_hot = F.one_hot(torch.randint(0, 4, (2, 3, 4)), 4).float()
    s = attention_similarity([uniform, one_hot])
    assert s["entropy"][0].item() == pytest.approx(1.0, abs=1e-6)
    assert s["entropy"][1].item() == 0.0
    assert attention_similarity(maps(MIXED))["entropy"].item() == pytest.approx(0.5, abs=1e-6)  # rows: 0 and 1
    single = attention_similarity([uniform])
    assert single["sim_adj"].shape == (0,) and single["sim_full"].shape == (1, 1)


def test_attention_similarity_rejects_bad_shapes():
    with pytest.raises(ValueError, match="at least one"):
        attention_similarity([])
    with pytest.raises(ValueError, match="same shape"):
        attention_similarity([torch.rand(1, 1, 3, 3), torch.rand(1, 1, 4, 4)])


def test_similar_blocks_counts_blocks_whose_columns_mostly_match_the_following_blocks():
    """Hand-made maps, two heads: blocks 0-2 identity, 3-4 swapped, so M = 1 within a group and 0 across it.
    K = 3: block 0 matches 2 of its 3 followers (ratio 2/3 > 0.5: similar), block 1 matches 1 of 3, block 2 none of
    2, block 3 its only follower (ratio 1: similar) -> 2 similar blocks of L − 1 = 4."""
    five = maps(*([[IDENTITY, IDENTITY]] * 3 + [[SWAP, SWAP]] * 2))
    s = attention_similarity(five, k=3)
    torch.testing.assert_close(s["sim_k_ratio"], torch.tensor([2 / 3, 1 / 3, 0.0, 1.0]))
    assert s["similar_blocks"].item() == 2.0 and SIMILAR_SHARE == 0.5
    # K = 2: block 1 matches exactly half of its followers (1 of 2): not "more than half", so not similar
    s2 = attention_similarity(five, k=2)
    torch.testing.assert_close(s2["sim_k_ratio"], torch.tensor([1.0, 0.5, 0.0, 1.0]))
    assert s2["similar_blocks"].item() == 2.0
    # one head collapsed, the other not: every block's ratio is 1/2 at K = 1 (adjacent), no similar block
    half = maps(*([[IDENTITY, IDENTITY if i % 2 else SWAP] for i in range(4)]))
    s3 = attention_similarity(half, k=1)
    torch.testing.assert_close(s3["sim_k_ratio"], torch.full((3,), 0.5))
    assert s3["similar_blocks"].item() == 0.0
    # identical maps everywhere: every block but the last is similar; a lower share counts the 1/3 block too
    assert attention_similarity([five[0]] * 6)["similar_blocks"].item() == 5.0
    assert similar_blocks(s["sim_k_ratio"], share=0.3).item() == 3.0
    assert similar_blocks(torch.zeros(0)).item() == 0.0
    with pytest.raises(ValueError, match="share"):
        similar_blocks(s["sim_k_ratio"], share=1.0)


def test_similar_blocks_scalars_logged_for_two_or_more_blocks():
    d = collect_diagnostics(tiny(), images())
    scalars = diagnostic_scalars(d)
    count = int((d["attn_sim_k_ratio"] > SIMILAR_SHARE).sum())
    assert d["similar_blocks"] == count
    assert scalars[TAGS["similar_blocks"]] == count
    assert scalars[TAGS["similar_blocks_fraction"]] == count / (TINY["depth"] - 1)
    one = diagnostic_scalars(collect_diagnostics(tiny(depth=1), images()))
    assert TAGS["similar_blocks"] not in one and TAGS["similar_blocks_fraction"] not in one


# --- branch/stream ratio -----------------------------------------------------------------------------------------------
def test_re_attention_similarity_is_measured_before_the_head_norm():
    """After Re-attention's BatchNorm over heads every head's map is standardised over batch and tokens, so the
    column similarity of the normalised maps is ≈ 0 by construction; the diagnostics read the maps Θᵀ·softmax
    before the norm (``ReAttention.map_tap``), whose similarity is that of the regenerated maps (≈ 1 here: nearly
    uniform attention at init, Θ = I)."""
    torch.manual_seed(0)
    model = VisionTransformer("standard", attention="re_attention", img_size=16, patch_size=4, in_chans=3,
                              num_classes=3, embed_dim=32, depth=4, num_heads=4)
    images = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    norms = [blk.attn.reattn_norm for blk in model.blocks]
    for bn in norms:  # running statistics = this batch's (cumulative average over one batch): a trained BatchNorm
        bn.momentum = None
        bn.reset_running_stats()
    model.train()
    model.set_fused_attn(False)
    with torch.no_grad():
        model(images)
    model.eval()
    normed = []
    handles = [blk.attn.attn_drop.register_forward_hook(lambda m, a, out: normed.append(out)) for blk in model.blocks]
    with torch.no_grad():
        model(images)
    for h in handles:
        h.remove()
    old = attention_similarity(normed)["sim_adj"]  # the former measure: on the normalised maps
    assert old.abs().max() < 0.05
    new = collect_diagnostics(model, images)["attn_sim_adj"]
    assert new.min() > 0.99
    assert all(bn.running_mean.abs().sum() > 0 for bn in norms)  # the statistics were kept, not reset


def test_branch_ratio_and_stream_rms_hand_computed():
    x = torch.tensor([[[3.0, 4.0], [0.0, 1.0]]])  # token norms 5, 1
    delta = torch.tensor([[[0.0, 0.5], [2.0, 0.0]]])  # token norms 0.5, 2
    r = branch_ratios(x, delta)
    assert r["ratio_mean"].item() == pytest.approx((0.5 / (5 + 1e-6) + 2 / (1 + 1e-6)) / 2, rel=1e-6)
    assert r["ratio_rms"].item() == pytest.approx(math.sqrt((0.25 + 4) / 2) / math.sqrt((25 + 1) / 2), rel=1e-6)
    assert stream_rms(x).item() == pytest.approx(math.sqrt((25 + 1) / 2 / 2), rel=1e-6)
    assert branch_ratios(x, torch.zeros_like(x))["ratio_mean"].item() == 0.0


# --- the hooked forward ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("residual", "options"), VARIANTS, ids=[f"{r}{o or ''}" for r, o in VARIANTS])
def test_collect_diagnostics_shapes_and_finite(residual, options):
    model = tiny(residual, options)
    d = collect_diagnostics(model, images())
    depth = TINY["depth"]
    assert d["depth"] == depth and d["tau"] == DEFAULT_TAU
    sublayers = list(dict.fromkeys(s for _, s, _ in model.residual_sites()))
    assert d["sublayers"] == sublayers
    for key in ("ratio_mean", "ratio_rms"):
        assert list(d[key]) == sublayers
        for values in d[key].values():
            assert values.shape == (depth,) and torch.isfinite(values).all() and (values >= 0).all()
    assert d["stream_rms"].shape == (depth,) and (d["stream_rms"] > 0).all()
    assert d["attn_sim_full"].shape == (depth, depth)
    assert d["attn_sim_adj"].shape == d["attn_sim_ratio"].shape == (depth - 1,)
    assert d["attn_entropy"].shape == (depth,)
    for key in ("attn_sim_full", "attn_sim_adj", "attn_sim_ratio", "attn_entropy"):
        assert torch.isfinite(d[key]).all(), key
        assert (d[key] >= -1e-6).all() and (d[key] <= 1 + 1e-5).all(), key
    for per_layer in d["params"].values():
        for stats in per_layer.values():
            assert all(math.isfinite(v) for v in stats.values())
    is_dca = residual == "dca" and options.get("form") != "seed"
    aggregates = is_dca or residual in ("denseformer", "attn_res", "muddformer")  # DepthWeights: a depth-weight matrix
    assert (d["depth_weights"] is not None) == aggregates
    if is_dca:
        assert d["depth_weights"].shape[0] == depth + 1
        assert set(d["params"]) == {"block", "out"}
    if residual in ("layerscale", "rezero", "skipinit", "highway", "laurel", "res_se") and options.get(
            "init_value", "auto") is not None:
        assert d["params"], "the variant's parameters are missing"


def test_params_per_variant():
    ls = collect_diagnostics(tiny("layerscale", {"init_value": 0.1}), images())["params"]
    assert set(ls) == {"attn", "mlp"} and set(ls["attn"]) == {0, 1, 2}
    assert ls["mlp"][2]["gamma_mean"] == pytest.approx(0.1)
    rz = collect_diagnostics(tiny("rezero"), images())["params"]
    assert set(rz) == {"attn"} and rz["attn"][1] == {"alpha": 0.0}  # the shared-α second site is skipped
    hw = collect_diagnostics(tiny("highway"), images())["params"]
    assert 0.2 < hw["mlp"][0]["gate_mean"] < 0.35  # σ(−1) ≈ 0.27 (the guideline at depth 3) plus a small input part
    dca = collect_diagnostics(tiny("dca"), images())
    assert dca["params"]["block"][2] == {"weight_0": 1.0, "weight_1": 1.0, "weight_2": 1.0}
    w = dca["depth_weights"]
    assert dca["depth_weights_rows"] == ["block 0", "block 1", "block 2", "out"]
    assert w.shape == (4, 4)
    assert torch.isnan(w[0, 1:]).all() and torch.isnan(w[1, 2:]).all() and not torch.isnan(w[3]).any()
    torch.testing.assert_close(w.nan_to_num(0.0), torch.ones(4, 4).tril())  # b = 1, w = 0 at init


def test_identity_at_init_ratio_is_exactly_zero():
    for name in ("rezero", "skipinit"):
        d = collect_diagnostics(tiny(name), images())
        for values in d["ratio_mean"].values():
            assert values.tolist() == [0.0] * TINY["depth"], name
    std = collect_diagnostics(tiny("standard"), images())
    for values in std["ratio_mean"].values():
        assert (values > 0).all()


def test_ratio_is_measured_after_the_variant_scale_and_dca_uses_the_stack_sum():
    std = collect_diagnostics(tiny("standard"), images())
    ls = collect_diagnostics(tiny("layerscale", {"init_value": 0.1}), images())
    # block 0 sees the same stream in both; its Δ is γ·f with γ = 0.1
    assert ls["ratio_mean"]["attn"][0].item() == pytest.approx(0.1 * std["ratio_mean"]["attn"][0].item(), rel=1e-4)
    assert ls["ratio_rms"]["attn"][0].item() == pytest.approx(0.1 * std["ratio_rms"]["attn"][0].item(), rel=1e-4)
    # DCA at init equals the standard ViT (R-exact): the stack sum is the residual stream
    dca = collect_diagnostics(tiny("dca"), images())
    torch.testing.assert_close(dca["stream_rms"], std["stream_rms"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dca["attn_sim_full"], std["attn_sim_full"], rtol=1e-5, atol=1e-6)


def test_modes_fused_flag_and_hooks_are_restored():
    model = tiny("laurel", {"form": "rw_lr_pa"})
    model.train()
    model.blocks[1].mlp.eval()  # a deliberately frozen submodule keeps its own mode
    model.set_fused_attn(True)
    before = {n: m.training for n, m in model.named_modules()}
    first = collect_diagnostics(model, images())
    assert {n: m.training for n, m in model.named_modules()} == before
    assert all(blk.attn.fused_attn for blk in model.blocks)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    second = collect_diagnostics(model, images())  # leftover hooks would append twice / raise
    for key in ("stream_rms", "attn_sim_full", "attn_sim_adj", "attn_entropy"):
        assert torch.equal(first[key], second[key]), key
    assert first["params"] == second["params"]

    model.set_fused_attn(False)  # the previous state is restored, not forced to True
    collect_diagnostics(model, images())
    assert not any(blk.attn.fused_attn for blk in model.blocks)


def test_state_is_restored_when_the_forward_fails():
    model = tiny("standard")
    model.train()
    with pytest.raises(RuntimeError):
        collect_diagnostics(model, torch.randn(2, 3, 8, 8))  # wrong channel count
    assert model.training and all(m.training for m in model.modules())
    assert all(blk.attn.fused_attn for blk in model.blocks)
    assert all(not m._forward_hooks for m in model.modules())


def test_a_backbone_compiled_in_place_is_diagnosed_eagerly():
    model = tiny("standard")
    compiled = []

    def backend(gm, example_inputs):  # would fail the forward if the compiled path ran
        compiled.append(gm)
        raise AssertionError("compiled path used")

    model.compile(backend=backend)  # what run_training does with compile=True
    assert model._compiled_call_impl is not None
    d = collect_diagnostics(model, images())
    assert not compiled and (d["ratio_mean"]["attn"] > 0).all()


def test_block_grad_norms_match_a_manual_computation():
    model = tiny("dca")
    model(images()).logsumexp(-1).sum().backward()
    norms = block_grad_norms(model)
    for i, blk in enumerate(model.blocks):
        manual = torch.sqrt(sum(p.grad.square().sum() for p in blk.parameters() if p.grad is not None))
        assert norms[i].item() == pytest.approx(manual.item(), rel=1e-5)
    assert block_grad_norms(tiny("standard")).tolist() == [0.0] * TINY["depth"]  # no backward yet


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_collect_diagnostics_and_grad_norms_on_cuda():
    model = tiny("dca").cuda()
    cpu = collect_diagnostics(tiny("dca"), images())
    gpu = collect_diagnostics(model, images().cuda())
    for key in ("stream_rms", "attn_sim_full", "attn_entropy"):
        assert gpu[key].device.type == "cpu"
        torch.testing.assert_close(gpu[key], cpu[key], rtol=1e-3, atol=1e-4)
    model(images().cuda()).sum().backward()
    assert block_grad_norms(model).device.type == "cuda"


# --- the callback on a tiny Lightning run ------------------------------------------------------------------------------
def test_callback_logs_on_diagnostic_epochs_only(tmp_path, monkeypatch):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, TENSORS, EventAccumulator

    import lit_modules.diagnostics_logging as diag

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny("layerscale", {"init_value": 0.1}, depth=2, fused_attn=True)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.model(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x, y = images(24), torch.randint(0, 10, (24,), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    calls = []
    original = diag.block_grad_norms
    monkeypatch.setattr(diag, "block_grad_norms", lambda m: calls.append(1) or original(m))
    callback = DiagnosticsCallback((x[:8], y[:8]), every_n_epochs=2)
    with pytest.raises(ValueError, match="every_n_epochs"):
        DiagnosticsCallback((x, y), every_n_epochs=0)

    module = Tiny()
    logger = TensorBoardLogger(tmp_path, name="", version="run")
    trainer = pl.Trainer(max_epochs=3, logger=logger, callbacks=[callback], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, loader)

    assert [h["epoch"] for h in callback.history] == [1, 2]  # every 2nd epoch (index 1) and the last one
    assert len(calls) == 2  # one gradient-norm pass per diagnostic epoch, not per step
    assert module.model.training and all(blk.attn.fused_attn for blk in module.model.blocks)

    ea = EventAccumulator(str(tmp_path / "run"), size_guidance={SCALARS: 0, IMAGES: 0, TENSORS: 0})
    ea.Reload()
    scalars = set(ea.Tags()["scalars"])
    for layer in ("00", "01"):
        for tag in (f"diag/ratio_mean/attn/{layer}", f"diag/ratio_rms/mlp/{layer}", f"diag/stream_rms/{layer}",
                    f"diag/attn_entropy/{layer}", f"diag/grad_norm/{layer}", f"diag/param/attn/{layer}/gamma_mean",
                    f"diag/param/mlp/{layer}/gamma_std"):
            assert tag in scalars, tag
            assert [e.step for e in ea.Scalars(tag)] == [1, 2], tag  # step = epoch index
    assert {"diag/attn_sim_adj/00", "diag/attn_sim_ratio/00", "diag/attn_sim_adj_mean",
            "diag/ratio_mean_avg", "diag/similar_blocks", "diag/similar_blocks_fraction"} <= scalars
    assert "diag/attn_sim_adj/01" not in scalars  # depth 2: one adjacent pair
    assert all(e.value > 0 for e in ea.Scalars("diag/grad_norm/01"))
    assert sorted(ea.Tags()["images"]) == ["diag/attn_sim_full", "diag/ratio_map"]
    assert [e.step for e in ea.Images("diag/attn_sim_full")] == [1, 2]
    assert [e.step for e in ea.Images("diag/ratio_map")] == [1, 2]  # the per-layer ratios as a heat map
    text = ea.Tensors("diag/attn_sim_full_json/text_summary")
    matrix = json.loads(text[-1].tensor_proto.string_val[0])
    assert len(matrix) == 2 and len(matrix[0]) == 2 and matrix[0][0] == pytest.approx(1.0)
    assert "diag/definitions/text_summary" in ea.Tags()["tensors"]


def test_callback_diagnoses_the_last_epoch_of_a_run_stopped_early(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class StopsAtEpoch1(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny("rezero", depth=2)

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.model(batch[0]), batch[1])

        def on_train_epoch_end(self):
            self.trainer.should_stop = self.current_epoch >= 1

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x, y = images(8), torch.arange(8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    callback = DiagnosticsCallback((x, y), every_n_epochs=10)
    trainer = pl.Trainer(max_epochs=5, logger=TensorBoardLogger(tmp_path, name="", version="run"),
                         callbacks=[callback], enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(StopsAtEpoch1(), loader)
    assert [h["epoch"] for h in callback.history] == [1]
    assert "diag/param/attn/01/alpha" in callback.history[0]
    ea = EventAccumulator(str(tmp_path / "run"))
    ea.Reload()
    assert [e.step for e in ea.Scalars("diag/ratio_mean/mlp/01")] == [1]


def test_callback_is_inert_on_the_step_path(tmp_path):
    """The step hook of a non-diagnostic epoch touches no parameter or gradient."""

    class Trap(nn.Module):
        @property
        def blocks(self):  # noqa: D401 - would be read by block_grad_norms
            raise AssertionError("gradient norms computed on a non-diagnostic step")

    callback = DiagnosticsCallback(images(2), every_n_epochs=5)

    class FakeTrainer:
        current_epoch, max_epochs, is_global_zero = 0, 10, True

    callback.on_train_epoch_start(FakeTrainer(), None)
    callback.on_before_optimizer_step(FakeTrainer(), Trap(), None)  # no error: nothing computed
    assert not callback.is_diagnostic_epoch(0, FakeTrainer.max_epochs)
    assert callback.is_diagnostic_epoch(4, FakeTrainer.max_epochs) and callback.is_diagnostic_epoch(9, 10)
