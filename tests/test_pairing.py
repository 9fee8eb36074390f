"""Common random numbers: with one seed, every variant starts from the same shared weights and sees the same
data split, batch order and augmentation (so the report can pair runs by seed).

The model-level check builds every registered variant (and the seed forms); the training-level check runs the real
training path (``ablations.training.run_training``) for two variants and records what the first epoch fed them.
"""

from __future__ import annotations

import re

import lightning.pytorch as pl
import pytest
import torch

from ablations.config import RunConfig
from ablations.training import run_training
from lit_modules import RESIDUALS, VisionTransformer

SMALL = dict(img_size=8, patch_size=4, in_chans=1, num_classes=10, embed_dim=32, depth=3, num_heads=2)
FORMS = [(name, {}) for name in RESIDUALS if name != "ngpt"] + [
    ("laurel", {"form": "seed"}), ("res_se", {"form": "seed"}), ("dca", {"form": "seed"}),
    ("dca", {"form": "grn_v1", "k": 1}), ("laurel", {"form": "rw_lr_pa", "granularity": "sublayer"}),
    ("rezero", {"norm": True}), ("deepnorm", {"init": "timm_scaled"}),
]
# Variants whose init redraws or rescales shared weights by design (the documented exception): DeepNorm's paper
# init (Xavier-normal, gain β for v/proj/fc1/fc2) — or, with init="timm_scaled", standard's weights × β — for the
# attention and MLP weights of every block; q and k keep standard's values under timm_scaled.
# Res-post-norm's norm1/norm2 (timm's names) are its output norms, zeroed by Swin-V2's official init.
REINITIALISED = {"deepnorm": r"^blocks\.\d+\.(attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.weight$",
                 "res_post_norm": r"^blocks\.\d+\.norm[12]\.(weight|bias)$"}


def _state(residual: str, options: dict, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return VisionTransformer(residual, options, **SMALL).state_dict()


@pytest.mark.parametrize("residual, options", FORMS, ids=lambda v: str(v))
def test_shared_weights_equal_standard_at_init(residual, options):
    """Every parameter a variant shares with ``standard`` (same name) has standard's initial value, whatever the
    variant adds and in whatever order it builds it; another seed gives other values."""
    ref, other_seed = _state("standard", {}, 0), _state("standard", {}, 1)
    state = _state(residual, options, 0)
    shared = [k for k in ref if k in state and not re.match(REINITIALISED.get(residual, "$^"), k)]
    assert len(shared) >= 20  # embeddings, attention, MLP, head (+ norms where the variant keeps them)
    for key in shared:
        assert torch.equal(state[key], ref[key]), key
    assert not torch.equal(ref["blocks.0.attn.qkv.weight"], other_seed["blocks.0.attn.qkv.weight"])


def test_ngpt_shared_weights_are_standard_projected_on_the_sphere():
    """nGPT keeps no norms or biases and normalises every matrix after init: each of its matrices is standard's
    initial value divided by its norm along the embedding dimension (so the pairing by seed still holds)."""
    import torch.nn.functional as F

    ref, state = _state("standard", {}, 0), _state("ngpt", {}, 0)
    dims = {"patch_embed.proj.weight": 0, "pos_embed": -1, "cls_token": -1, "head.weight": 1}
    for i in range(SMALL["depth"]):
        dims |= {f"blocks.{i}.attn.qkv.weight": 1, f"blocks.{i}.attn.proj.weight": 0,
                 f"blocks.{i}.mlp.fc1.weight": 1, f"blocks.{i}.mlp.fc2.weight": 0}
    for key, dim in dims.items():
        assert torch.allclose(state[key], F.normalize(ref[key], dim=dim), atol=1e-6, rtol=0), key
    assert torch.equal(state["patch_embed.proj.bias"], ref["patch_embed.proj.bias"])


def test_explicit_init_seed_overrides_the_global_rng():
    torch.manual_seed(123)
    a = VisionTransformer("highway", init_seed=7, **SMALL).state_dict()
    torch.manual_seed(456)
    b = VisionTransformer("standard", init_seed=7, **SMALL).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


class _Recorder(pl.Callback):
    """The backbone's weights when training starts and every batch of the first epoch."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.weights = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == 0:
            self.batches.append((batch[0].clone(), batch[1].clone()))


def _record(tmp_path, residual: str, seed: int) -> _Recorder:
    config = RunConfig(residual=residual, dataset="digits", depth=2, embed_dim=16, num_heads=2, max_epochs=1,
                       batch_size=256, seed=seed, threads=1)
    recorder = _Recorder()
    run_training(config, log_dir=tmp_path, run_name=f"{residual}_{seed}", extra_callbacks=[recorder],
                 enable_progress_bar=False, enable_model_summary=False)
    return recorder


def test_training_path_gives_every_variant_the_same_start_and_batches(tmp_path):
    standard, highway, other = (_record(tmp_path, "standard", 0), _record(tmp_path, "highway", 0),
                                _record(tmp_path, "standard", 1))
    shared = [k for k in standard.weights if k in highway.weights]
    assert "patch_embed.proj.weight" in shared and "head.weight" in shared and len(shared) >= 20
    assert all(torch.equal(standard.weights[k], highway.weights[k]) for k in shared)
    assert len(standard.batches) == len(highway.batches) >= 5  # 1,437 digits / 256
    for (xa, ya), (xb, yb) in zip(standard.batches, highway.batches, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)  # same order, same per-sample augmentation
    # the pairing is the seed's doing: another seed changes the weights and the batches
    assert not torch.equal(standard.weights["head.weight"], other.weights["head.weight"])
    assert not torch.equal(standard.batches[0][1], other.batches[0][1])
