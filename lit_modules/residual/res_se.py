"""Res-SE (Varshaneya et al., "Res-SE-Net", arXiv 1902.06066) adapted to a ViT: squeeze-and-excitation on the skip."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import BlockArgs, ResidualSite, check_choice, unused_by_form

FORMS = ("skip_gate", "seed")
#: the forms under which each option changes the model; given under any other form an option is rejected
APPLIES = {"gate": ("skip_gate",)}


class ResSE(ResidualSite):
    """Res-SE-Net is a CNN method: an SE layer on the **projection ("bridge") shortcuts** only, where the width
    changes. A plain ViT has no bridges, so every form here is an **adaptation no paper defines**:

    - ``form="skip_gate"`` (default): SE over tokens scales the identity skip of every sublayer,

          z = mean_tokens(x),   s = gate(W₂ ReLU(W₁ z + b₁) + b₂) ∈ R^{B×D},   x ← s ⊙ x + F(Norm(x))

      so ``Δ = (s − 1) ⊙ x + f``. ``gate="two_sigmoid"`` uses 2σ with W₂, b₂ zero-initialised: s ≡ 1 and the model
      equals the standard ViT at init (R-exact) while W₂ learns from step 0. ``gate="sigmoid"`` is the SE layer's
      literal σ with PyTorch's default Linear init (s ≈ 0.5: it halves the skip at every site).
    - ``form="seed"``: the seed notes' ``y = x + SE(x) + F(Norm(x))`` with ``SE(x) = σ(FC₂ ReLU(FC₁ GAP(x))) ⊙ x``
      (PyTorch's default Linear init), so ``Δ = s ⊙ x + f`` — the skip is scaled by 1 + s ≈ 1.5 at init.

    ``pool="patch_only"`` leaves the class token out of the squeeze (rejected when the blocks have no class token:
    with a class-attention head or ``class_token=False``). Reduction 16 as in the paper.

    Which options each form uses (✓); ``gate`` given with ``form="seed"`` (whose gate is always the SE layer's σ)
    is rejected with a one-line ValueError, so two labels are never the same model:

    ========= ========= ====
    option    skip_gate seed
    ========= ========= ====
    gate      ✓
    reduction ✓         ✓
    pool      ✓         ✓
    ========= ========= ====
    """

    name = "res_se"
    paper = "Varshaneya et al. 2019, arXiv 1902.06066 (adapted: the paper gates CNN projection shortcuts)"

    def __init__(self, dim: int, *, args: BlockArgs, form: str = "skip_gate", reduction: int = 16,
                 gate: str = "two_sigmoid", pool: str = "all") -> None:
        super().__init__(dim, args=args)
        self.form = form
        self.gate_kind = "sigmoid" if form == "seed" else gate
        self.skip_tokens = args.num_prefix_tokens if pool == "patch_only" else 0
        hidden = max(1, dim // reduction)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, dim)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_choice("form", options["form"], FORMS)
        check_choice("gate", options["gate"], ("two_sigmoid", "sigmoid"))
        check_choice("pool", options["pool"], ("all", "patch_only"))
        if not isinstance(options["reduction"], int) or options["reduction"] < 1:
            raise ValueError(f"reduction must be a positive integer, got {options['reduction']!r}")

    @classmethod
    def inapplicable_options(cls, options: dict[str, Any]) -> dict[str, str]:
        return unused_by_form(options, APPLIES, FORMS)

    @classmethod
    def inapplicable_with_backbone(cls, options: dict[str, Any], backbone: dict[str, Any]) -> dict[str, str]:
        """``pool`` when the blocks see no class token (a class-attention head adds it after them, or there is
        none): "all" and "patch_only" pool the same tokens."""
        if backbone.get("class_attention_blocks", 0):
            return {"pool": f"class_attention_blocks={backbone['class_attention_blocks']} (the class token joins "
                            f"after the blocks, so every token pooled is a patch); it applies with a class token "
                            f"in the blocks"}
        if not backbone.get("class_token", True):
            return {"pool": "class_token=False (every token pooled is a patch); it applies with a class token in "
                            "the blocks"}
        return {}

    def init_weights(self) -> None:
        if self.gate_kind == "two_sigmoid":
            nn.init.zeros_(self.fc2.weight)
            nn.init.zeros_(self.fc2.bias)
        else:  # the SE layer as published: PyTorch's default Linear init
            self.fc1.reset_parameters()
            self.fc2.reset_parameters()

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """The per-sample, per-channel SE output s, shape (B, 1, D)."""
        z = x[:, self.skip_tokens:].mean(dim=1)
        s = torch.sigmoid(self.fc2(self.act(self.fc1(z))))
        return (2.0 * s if self.gate_kind == "two_sigmoid" else s).unsqueeze(1)

    def skip_factor(self, x: torch.Tensor) -> torch.Tensor:
        """What the skip multiplies x by: s (skip_gate) or 1 + s (seed)."""
        s = self.scale(x)
        return 1.0 + s if self.form == "seed" else s

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return (self.skip_factor(x) - 1.0) * x + f

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return f, self.skip_factor(x)

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {} if x is None else {"se_scale_mean": self.scale(x).mean().detach()}
