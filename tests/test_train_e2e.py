"""Done-when test: every residual variant trains on ``digits`` above chance through ``run_training`` with the
diagnostics on every epoch, and every diagnostic can be read back from the TensorBoard event files alone."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ablations.config import RunConfig
from ablations.dashboard import display_tag, internal_tag
from ablations.training import run_training
from lit_modules import RESIDUALS

EPOCHS = 5
DEPTH = 2
# patch 4 (4 tokens + class token) learns digits several times faster than the default patch 2; lr 5e-3 with a
# 1-epoch warmup brings the slowest variant (ReZero/SkipInit, α = 0 at init) to ~0.5 val accuracy in 5 epochs
# (measured: 0.50–0.58 for all eight at seed 0; chance = 0.1).
CONFIG = dict(depth=DEPTH, embed_dim=32, num_heads=2, patch_size=4, dataset="digits", max_epochs=EPOCHS, seed=0,
              batch_size=64, lr=5e-3, warmup_epochs=1.0, diagnostics_every=1, diagnostics_batch_size=32, threads=1)
MIN_VAL_ACC = 0.3

SUBLAYERS = {"laurel": ("block",), "dca": ("block",), "skipdense": ("block",)}  # block granularity; the rest have attn + mlp sites
PARAMS = {  # (sublayer, key) the variant must log for every layer (a variant not named here: none required)
    "standard": (),
    "layerscale": (("attn", "gamma_mean"), ("mlp", "gamma_std")),
    "rezero": (("attn", "alpha"),),  # one α per block, stored on the attention site
    "skipinit": (("attn", "alpha"), ("mlp", "alpha")),
    "highway": (("attn", "gate_mean"), ("mlp", "gate_bias_mean")),
    "laurel": (("block", "alpha"), ("block", "beta"), ("block", "lr_norm")),
    "res_se": (("attn", "se_scale_mean"), ("mlp", "se_scale_mean")),
    "dca": (("block", "weight_0"),),
    "skipdense": (),
    "hyper_connections": (("attn", "res_diag_mean"), ("mlp", "post_mean"), ("attn", "s_alpha")),
    "mhc": (("attn", "res_diag_mean"), ("mlp", "pre_mean"), ("mlp", "alpha_res")),
    "denseformer": (),  # its DWA weights are in diag/depth_weights
    "attn_res": (),  # its softmax weights are in diag/depth_weights
    "ortho": (("attn", "parallel_ratio"), ("mlp", "removed_energy"), ("mlp", "cos_mean")),
    "deepnorm": (("attn", "branch_skip_ratio"), ("mlp", "branch_skip_ratio")),
    "post_ln": (("attn", "branch_skip_ratio"), ("mlp", "branch_skip_ratio")),
    "res_post_norm": (),
    "peri_ln": (),
    "mix_ln": (),  # post-LN blocks log branch_skip_ratio, pre-LN blocks nothing: no key in every layer
    "ln_scaling": (),
    "keel": (("mlp", "branch_skip_ratio"),),
    "resi_dual": (("attn", "branch_skip_ratio"), ("mlp", "branch_skip_ratio")),
    "ngpt": (("attn", "alpha_mean"), ("mlp", "alpha_std")),
    "gpas": (("attn", "gate"), ("attn", "scale")),  # one g per block, reported by its attention site
    "siamese_norm": (("attn", "branch_divisor"), ("mlp", "branch_divisor")),
    "deep_delta": (("attn", "beta_mean"), ("mlp", "value_mean"), ("mlp", "skip_eigen_k_mean")),
    "mhc_lite": (("attn", "res_diag_mean"), ("mlp", "pre_mean"), ("mlp", "alpha_res")),
    "kromhc": (("attn", "res_diag_mean"), ("mlp", "post_mean"), ("attn", "alpha_pre")),
    "muddformer": (),  # its dense-connection weights are in diag/depth_weights
    "hybrid_norm": (),
}


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()  # run_training sets the process-wide thread count
    yield
    torch.set_num_threads(threads)


def read_events(run_dir: str):
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, TENSORS, EventAccumulator

    ea = EventAccumulator(run_dir, size_guidance={SCALARS: 0, IMAGES: 0, TENSORS: 0})
    ea.Reload()
    return ea


def text(ea, tag: str) -> list[str]:
    return [e.tensor_proto.string_val[0].decode() for e in ea.Tensors(f"{tag}/text_summary")]


IDENTITY_SKIP = ("standard", "layerscale", "rezero", "skipinit", "dca", "skipdense",
                 "denseformer", "attn_res", "ortho", "muddformer")  # variants whose skip does not rescale x


@pytest.mark.slow
@pytest.mark.parametrize("residual", list(RESIDUALS))
def test_variant_trains_and_logs_every_diagnostic(residual, tmp_path, keep_threads):
    assert set(PARAMS) <= set(RESIDUALS)
    summary = run_training(RunConfig(residual=residual, **CONFIG), log_dir=tmp_path, run_name=residual,
                           enable_progress_bar=False, enable_model_summary=False)
    assert summary["epochs_completed"] == EPOCHS and not summary["diverged"]
    assert summary["final_val_acc"] > MIN_VAL_ACC, summary

    ea = read_events(summary["log_dir"])
    scalars = {internal_tag(t) for t in ea.Tags()["scalars"]}  # TensorBoard's grouped tags -> internal names
    epochs = list(range(EPOCHS))  # step convention: the epoch index

    def series(tag: str) -> list[float]:
        assert tag in scalars, f"{tag} missing; diag tags: {sorted(t for t in scalars if t.startswith('diag/'))}"
        events = ea.Scalars(display_tag(tag))
        assert [e.step for e in events] == epochs, tag
        values = [e.value for e in events]
        assert all(math.isfinite(v) for v in values), (tag, values)
        return values

    for layer in range(DEPTH):
        for sublayer in SUBLAYERS.get(residual, ("attn", "mlp")):
            assert all(v >= 0 for v in series(f"diag/ratio_mean/{sublayer}/{layer:02d}"))
            series(f"diag/ratio_rms/{sublayer}/{layer:02d}")
            assert all(v >= 0 for v in series(f"diag/update_ratio/{sublayer}/{layer:02d}"))
            skip = series(f"diag/skip_scale/{sublayer}/{layer:02d}")
            if residual in IDENTITY_SKIP:  # the skip is x itself: its scale is exactly 1
                assert skip == [1.0] * EPOCHS
        assert all(v > 0 for v in series(f"diag/stream_rms/{layer:02d}"))
        assert all(0 <= v <= 1 + 1e-5 for v in series(f"diag/attn_entropy/{layer:02d}"))
        assert all(v > 0 for v in series(f"diag/grad_norm/{layer:02d}"))
        for sublayer, key in PARAMS.get(residual, ()):
            series(f"diag/param/{sublayer}/{layer:02d}/{key}")
    if residual in ("hyper_connections", "mhc", "mhc_lite", "kromhc"):  # multi-stream: the mixing's composite gain
        gains = series("diag/composite_gain/forward") + series("diag/composite_gain/backward")
        if residual == "mhc":  # doubly stochastic H_res: near 1 (rows to Sinkhorn's precision, columns exact)
            assert all(abs(v - 1) < 0.1 for v in gains), gains
        if residual in ("mhc_lite", "kromhc"):  # exactly doubly stochastic: 1 to float32 rounding
            assert all(abs(v - 1) < 1e-4 for v in gains), gains
    else:
        assert "diag/composite_gain/forward" not in scalars
    for layer in range(DEPTH - 1):  # layer l vs l + 1
        assert all(-1e-5 <= v <= 1 + 1e-5 for v in series(f"diag/attn_sim_adj/{layer:02d}"))
        assert all(0 <= v <= 1 for v in series(f"diag/attn_sim_ratio/{layer:02d}"))
        series(f"diag/attn_sim_k/{layer:02d}")
        assert all(0 <= v <= 1 for v in series(f"diag/attn_sim_k_ratio/{layer:02d}"))
    assert f"diag/attn_sim_adj/{DEPTH - 1:02d}" not in scalars
    series("diag/attn_sim_adj_mean")
    series("diag/ratio_mean_avg")
    # DeepViT's collapse count: blocks 0..L−2 whose sim_k_ratio is above one half, read back from the same epochs
    ratios = [series(f"diag/attn_sim_k_ratio/{layer:02d}") for layer in range(DEPTH - 1)]
    assert series("diag/similar_blocks") == [float(sum(r[e] > 0.5 for r in ratios)) for e in epochs]
    assert series("diag/similar_blocks_fraction") == pytest.approx(
        [sum(r[e] > 0.5 for r in ratios) / (DEPTH - 1) for e in epochs])
    if residual in ("rezero", "skipinit"):  # α starts at 0 and must have moved
        assert series("diag/param/attn/01/alpha")[-1] != 0.0

    images = ea.Tags()["images"]
    assert [e.step for e in ea.Images(display_tag("diag/attn_sim_full"))] == epochs
    sims = [json.loads(t) for t in text(ea, "diag/attn_sim_full_json")]
    assert len(sims) == EPOCHS
    for matrix in sims:
        assert len(matrix) == DEPTH and all(len(row) == DEPTH for row in matrix)
        assert all(row[i] == pytest.approx(1.0, abs=1e-4) for i, row in enumerate(matrix))
        assert matrix[0][1] == pytest.approx(matrix[1][0], abs=1e-5)
    assert matrix[0][1] == pytest.approx(ea.Scalars(display_tag("diag/attn_sim_adj/00"))[-1].value, abs=1e-5)
    # block 0 against the K = 3 following blocks (only DEPTH - 1 exist): the mean of that row of the matrix
    near = [matrix[0][q] for q in range(1, min(1 + 3, DEPTH))]
    assert sum(near) / len(near) == pytest.approx(ea.Scalars(display_tag("diag/attn_sim_k/00"))[-1].value, abs=1e-5)

    if residual == "dca":
        assert [e.step for e in ea.Images(display_tag("diag/depth_weights"))] == epochs
        weights = json.loads(text(ea, "diag/depth_weights_json")[-1])  # rows: blocks 0..L−1, final GRN
        assert len(weights) == DEPTH + 1 and all(len(row) == DEPTH + 1 for row in weights)
        assert weights[0][1:] == [None, None] and weights[1][2] is None and None not in weights[DEPTH]
        series(f"diag/param/out/{DEPTH:02d}/weight_{DEPTH}")
    elif residual in ("denseformer", "attn_res", "muddformer"):  # rows: the DWA / dense connection after block i,
        assert [e.step for e in ea.Images(display_tag("diag/depth_weights"))] == epochs  # or the 2L layers and the mix
        weights = json.loads(text(ea, "diag/depth_weights_json")[-1])
        rows, cols = (2 * DEPTH + 1, 2 * DEPTH + 1) if residual == "attn_res" else (DEPTH, DEPTH + 1)
        assert len(weights) == rows and all(len(row) == cols for row in weights)
        assert weights[0][2:] == [None] * (cols - 2) and None not in weights[rows - 1]
    else:
        assert display_tag("diag/depth_weights") not in images
    assert "τ = 0.9" in text(ea, "diag/definitions")[0]


@pytest.mark.slow
def test_compiled_stream_kernels_train_as_the_eager_ones(tmp_path, keep_threads):
    """mHC trained with the compiled multi-stream kernels (what ``stream_kernels: auto`` picks on a CPU) follows
    the eager run of the same seed to float32 rounding: the warm-up compile before training leaves the RNG and
    the gradients as they were. The summary records the kernels and the warm-up's time; a model without
    multi-stream sites records neither."""
    from prerequisites import missing

    from lit_modules.residual.stream_kernels import compiler_works

    if not compiler_works():
        missing("torch.compile cannot build CPU kernels here", "a C++ compiler (g++) and the Python headers")
    config = CONFIG | {"max_epochs": 2, "diagnostics_every": 0}
    summaries = {k: run_training(RunConfig(residual="mhc", stream_kernels=k, **config), log_dir=tmp_path,
                                 run_name=k, enable_progress_bar=False, enable_model_summary=False)
                 for k in ("eager", "compiled")}
    eager, compiled = summaries["eager"], summaries["compiled"]
    assert (eager["stream_kernels"], compiled["stream_kernels"]) == ("eager", "compiled")
    assert "stream_kernels_compile_s" not in eager and compiled["stream_kernels_compile_s"] > 0
    assert compiled["final_val_acc"] > MIN_VAL_ACC
    assert math.isclose(compiled["final_train_loss"], eager["final_train_loss"], rel_tol=1e-3), (compiled, eager)
    assert abs(compiled["final_val_acc"] - eager["final_val_acc"]) <= 0.02
    standard = run_training(RunConfig(residual="standard", stream_kernels="compiled", **config), log_dir=tmp_path,
                            run_name="standard", enable_progress_bar=False, enable_model_summary=False)
    assert "stream_kernels" not in standard  # no multi-stream site: nothing to record
