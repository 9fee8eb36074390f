"""Every residual of the registry trains under bf16 autocast on a CPU — what ``precision: auto`` picks on a CPU with
native bf16, and what ``bf16-mixed`` asks for anywhere: a forward and backward run, every gradient is finite and
the gradients point where the fp32 model's do. The hand-written autograd Functions (the multi-stream read and
write, mHC's projection and Sinkhorn-Knopp, AttnRes' aggregation, the RMS factor) failed there before
(``lit_modules.residual.base.one_dtype``): their backward multiplied the forward's bf16 products with fp32 inputs."""

from __future__ import annotations

import pytest
import torch
from backbone import perturb

from lit_modules import RESIDUALS, VisionTransformer

SIZE = dict(img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=16, num_heads=2, depth=2)


def gradients(model: VisionTransformer, images: torch.Tensor, bf16: bool) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(images)
    (logits.float() * torch.linspace(-1, 1, logits.numel()).view_as(logits)).sum().backward()
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    assert all(g.dtype == torch.float32 for g in grads)
    return torch.cat(grads)


@pytest.mark.parametrize("residual", sorted(RESIDUALS))
def test_a_train_step_under_bf16_autocast_matches_fp32(residual):
    model = perturb(VisionTransformer(residual, {}, init_seed=0, **SIZE), scale=0.2)
    images = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    want, got = gradients(model, images, bf16=False), gradients(model, images, bf16=True)
    assert torch.isfinite(got).all() and want.abs().sum() > 0
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=0).item()
    assert cosine > 0.98, f"{residual}: bf16 gradients at cosine {cosine:.4f} to fp32's"


@pytest.mark.parametrize("backbone", [{"qk_norm": "rmsnorm"}, {"attention_gate": "elementwise"}, {"norm_layer": "seednorm"},
                                      {"attention_gate": "headwise"}, {"parametrization": "completep"}], ids=str)
def test_a_train_step_with_a_backbone_option_under_bf16_autocast_matches_fp32(backbone):
    model = perturb(VisionTransformer("standard", {}, init_seed=0, **SIZE, **backbone), scale=0.2)
    images = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    want, got = gradients(model, images, bf16=False), gradients(model, images, bf16=True)
    assert torch.isfinite(got).all() and want.abs().sum() > 0
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=0).item()
    assert cosine > 0.98, f"{backbone}: bf16 gradients at cosine {cosine:.4f} to fp32's"


@pytest.mark.parametrize("residual, options", [("mhc", {"n": 4}), ("hyper_connections", {"n": 4, "dynamic": True})])
def test_multi_stream_functions_compute_in_the_promoted_dtype(residual, options):
    """Under autocast the stream bookkeeping runs in fp32 (its inputs' widest dtype), not in a bf16 that the saved
    inputs do not share; the model's output keeps autocast's dtype."""
    model = perturb(VisionTransformer(residual, options, init_seed=0, **SIZE), scale=0.2)
    seen = []
    block = model.blocks[1]
    block.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(2, 3, 16, 16))
    assert seen == [torch.float32]
