"""A checkpoint round trip for every registered residual variant and every backbone option.

Train a few steps of the real LightningModule (its training step, its optimizer and LR schedule, nGPT's projection
after each step), save what a Lightning checkpoint holds of it (the module's ``state_dict``, the optimizer's and the
scheduler's), restore that into a module built from another initial seed, and take one more step on both: the loss
of that step and every tensor after it must be bit-identical to the uninterrupted run's. A variant that kept
training state outside its ``state_dict`` (a Python attribute, a non-persistent buffer, a running statistic) would
resume from something else and fail here. The registry is read, so a new variant is covered without an edit.
"""

from __future__ import annotations

import io

import pytest
import torch

from lit_modules import RESIDUALS
from lit_modules.classifier import ViTClassifier

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(img_size=8, patch_size=4, in_chans=1, num_classes=4, embed_dim=16, depth=2, num_heads=2)
SCHEDULE = dict(lr=1e-2, steps_per_epoch=4, max_epochs=2, warmup_epochs=0.5, seed=0)  # the LR moves every step
BACKBONE_OPTIONS = [
    {"attention": "re_attention"},
    {"class_attention_blocks": 1},
    {"value_residual": "fixed"},
    {"value_residual": "learned"},
    {"global_pool": "avg", "class_token": False},
    {"norm_layer": "rmsnorm"},
    {"norm_layer": "dyt"},
    {"norm_layer": "derf"},
    {"norm_layer": "seednorm"},
    {"qk_norm": "rmsnorm"},
    {"attention_gate": "elementwise"},
    {"attention_gate": "headwise"},
    {"parametrization": "completep"},  # per-group learning rates and ε in the optimizer's state
    {"drop_path_rate": 0.2},
    {"optimizer": "adam"},
    {"mixup": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "prob": 1.0, "switch_prob": 0.5}},
]
CASES = [(name, {}) for name in RESIDUALS] + [("standard", options) for options in BACKBONE_OPTIONS]
STEPS_BEFORE_SAVE = 3


def _module(residual: str, backbone: dict, init_seed: int) -> ViTClassifier:
    torch.manual_seed(init_seed)
    return ViTClassifier(residual, **(TINY | SCHEDULE | backbone))


def _optimisers(module: ViTClassifier) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    configured = module.configure_optimizers()
    return configured["optimizer"], configured["lr_scheduler"]["scheduler"]


def _step(module, optimizer, scheduler, batch, index: int) -> torch.Tensor:
    """One training step as Lightning takes it: the module's training_step, backward, its optimizer_step (the
    optimizer's step, then the backbone's parameter projection) and the per-step scheduler."""
    module.train()
    torch.manual_seed(1000 + index)  # drop-path draws: the same in both runs, whatever came before
    loss = module.training_step(batch, index)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    module.model.project_parameters()
    scheduler.step()
    return loss.detach()


@pytest.mark.parametrize("residual, backbone", CASES, ids=lambda v: str(v) if v else "")
def test_a_checkpoint_resumes_to_the_same_next_step(residual, backbone):
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 1, 8, 8, generator=generator), torch.randint(0, 4, (8,), generator=generator))
               for _ in range(STEPS_BEFORE_SAVE + 1)]
    first = _module(residual, backbone, init_seed=0)
    optimizer, scheduler = _optimisers(first)
    for index in range(STEPS_BEFORE_SAVE):
        _step(first, optimizer, scheduler, batches[index], index)
    buffer = io.BytesIO()
    torch.save({"state_dict": first.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict()}, buffer)
    expected = _step(first, optimizer, scheduler, batches[-1], STEPS_BEFORE_SAVE)  # the uninterrupted run

    resumed = _module(residual, backbone, init_seed=1)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    fresh = resumed.state_dict()
    assert any(not torch.equal(fresh[k], v) for k, v in checkpoint["state_dict"].items())  # the load has work to do
    resumed.load_state_dict(checkpoint["state_dict"])
    optimizer, scheduler = _optimisers(resumed)
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    got = _step(resumed, optimizer, scheduler, batches[-1], STEPS_BEFORE_SAVE)

    assert torch.isfinite(expected) and torch.equal(got, expected)
    after, want = resumed.state_dict(), first.state_dict()
    assert list(after) == list(want)
    for key, value in want.items():
        assert torch.equal(after[key], value), key
    assert scheduler.get_last_lr() == [group["lr"] for group in optimizer.param_groups]
