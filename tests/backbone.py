"""Shared by the backbone tests: a tiny float64 model, the fixture that sets float64 / one thread, and a helper that
moves every parameter off its init."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_modules import VisionTransformer

TINY = dict(img_size=8, patch_size=4, in_chans=3, num_classes=3, embed_dim=8, depth=3, num_heads=2)


@pytest.fixture(autouse=True)
def _float64_one_thread():
    """float64 everywhere; one intra-op thread (tiny tensors: threads only add contention on shared CPUs)."""
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)


def tiny_laurel(options: dict) -> dict:
    """LAuReL ``options`` for TINY's width 8 (the default rank 16 exceeds it): rank 2 and k 2 added where the form
    uses them (an option the form ignores is rejected, ``LAuReL.inapplicable_options``); given keys are kept."""
    from lit_modules.residual import LAuReL

    merged = {"rank": 2, "k": 2} | options
    filled = {n: merged.get(n, p.default) for n, p in LAuReL.options().items()}
    unused = LAuReL.inapplicable_options(filled)
    return {k: v for k, v in merged.items() if k in options or k not in unused}


LAUREL = tiny_laurel({})  # the default form (rw_lr) at TINY's width: {"rank": 2}


def build(residual: str = "standard", options: dict | None = None, seed: int = 0, **kw) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(residual, options, **(TINY | kw))


@torch.no_grad()
def perturb(model: nn.Module, scale: float = 0.3, seed: int = 7) -> nn.Module:
    """Move every parameter off its init so nothing is trivially zero/one."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def assert_bad_options(residual: str, options: dict, words: list[str]) -> None:
    """Building ``residual`` with ``options`` raises a one-line ValueError that contains every one of ``words``."""
    with pytest.raises(ValueError) as err:
        build(residual, options)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)
