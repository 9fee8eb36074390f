"""LAuReL: Learned Augmented Residual Layer (Menghani, Kumar & Kumar, arXiv 2411.07501, ICML 2025)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import Block, ResidualStream, WholeBlock
from .base import BlockArgs, ResidualSite, check_choice, unused_by_form
from .mix import MIX_NORMS, MixWeights

FORMS = ("rw", "lr", "pa", "rw_lr", "rw_pa", "rw_lr_pa", "seed")
PA_H = ("identity", "lowrank")
RW_FORMS = ("rw", "rw_lr", "rw_pa", "rw_lr_pa")
LR_FORMS = ("lr", "rw_lr", "rw_lr_pa")  # and pa, rw_pa with pa_h="lowrank"
#: the forms under which each option changes the model (the class docstring's table); given under any other form
#: an option is rejected (``validate_options``)
APPLIES = {"granularity": FORMS[:-1], "rank": LR_FORMS, "a_init": LR_FORMS, "k": ("pa", "rw_pa", "rw_lr_pa"),
           "pa_h": ("pa", "rw_pa"), "rw_norm": RW_FORMS, "alpha_init": RW_FORMS, "beta_init": RW_FORMS}


class LAuReL(ResidualSite):
    """``x_{i+1} = α·f(x_i) + β·g(x_i, x_{i−1}, …)`` (paper eq. 2), so ``Δ = α·f + β·g − x`` with

    ======== ======================================================= ==========================
    form     g                                                       α, β
    ======== ======================================================= ==========================
    rw       x_i                                                     learned (``rw_norm``)
    lr       x_i + A B x_i  (eq. 3; A ∈ R^{D×r}, B ∈ R^{r×D} = 0)     1, 1
    pa       x_i + Σ_{j<k} γ_j h_j(x_{i−j})  (eq. 4; γ = 0 at init)  1, 1
    rw_lr    x_i + A B x_i  (eq. 5; the default)                     learned
    rw_pa    Σ_{j<k} γ_j h_j(x_{i−j}), γ = (1, 0, …)                 learned
    rw_lr_pa Σ_{j<k} γ_j (I + A_j B_j) x_{i−j}  (eq. 6)             learned
    seed     the seed notes' per-channel gate (see ``SeedGate``)     —
    ======== ======================================================= ==========================

    **α, β are bounded by default** (``rw_norm="sigmoid"``: α = σ(a), β = σ(b)), as the paper asks ("we cannot let
    α and β grow unbounded … softmax or sigmoid helps"). The paper gives no init; they start at 0.99 each (logits
    ≈ 4.6), near the standard residual. Options: ``"softmax"`` ((α, β) = softmax(a, b), which cannot start near
    standard: α + β = 1; default 0.01, 0.99), ``"coupled"`` (the paper's "single learnable parameter with a
    sigmoid": α = σ(a), β = 1 − α; default 0.5) and ``"none"`` (raw scalars, α = β = 1: R-exact, the unbounded
    form the paper warns against). ``h_j`` is the identity (``pa_h="identity"``) or ``I + A_j B_j``
    (``"lowrank"``; always for rw_lr_pa: eq. 6 as printed has no identity term, reading h = I + AB keeps the
    residual path — an interpretation). ``granularity="block"`` (default, the paper's LLM parameter counts: one
    LAuReL per transformer layer, f = Block(x) − x) or ``"sublayer"``. ``k`` previous stream states feed PA. A is
    Xavier-uniform or column-orthogonal (``a_init="col_orth"``, footnote 2); B = 0 (LoRA-style).

    Which options each form uses (✓); any other option given explicitly is rejected with a one-line ValueError,
    so two labels are never the same model:

    =========== ==== ==== ==== ===== ===== ======== ====
    option      rw   lr   pa   rw_lr rw_pa rw_lr_pa seed
    =========== ==== ==== ==== ===== ===== ======== ====
    granularity ✓    ✓    ✓    ✓     ✓     ✓
    rank,a_init      ✓    (1)  ✓     (1)   ✓
    k                     ✓          ✓     ✓
    pa_h                  ✓          ✓
    rw_norm     ✓              ✓     ✓     ✓
    alpha_init  ✓              ✓     ✓     ✓
    beta_init   (2)            (2)   (2)   (2)
    =========== ==== ==== ==== ===== ===== ======== ====

    (1) only with ``pa_h="lowrank"``; (2) not with ``rw_norm="coupled"`` (β = 1 − α).
    """

    name = "laurel"
    paper = "Menghani et al. 2025, arXiv 2411.07501"

    def __init__(self, dim: int, *, args: BlockArgs, form: str = "rw_lr", granularity: str = "block",
                 rank: int = 16, k: int = 3, pa_h: str = "identity", rw_norm: str = "sigmoid",
                 alpha_init: float | None = None, beta_init: float | None = None, a_init: str = "xavier") -> None:
        super().__init__(dim, args=args)
        self.form, self.rank, self.k, self.a_init = form, rank, k, a_init
        self.uses_pa = "pa" in form
        self.uses_lr = "lr" in form or (self.uses_pa and pa_h == "lowrank")
        norm, alpha, beta = _mix_defaults(form, rw_norm, alpha_init, beta_init)
        self.mix = MixWeights(norm, alpha, beta) if "rw" in form else None
        n_factors = k if self.uses_pa else 1
        if self.uses_lr:
            self.lr_down = nn.Parameter(torch.zeros(n_factors, rank, dim))  # B (zero: LoRA-style)
            self.lr_up = nn.Parameter(torch.zeros(n_factors, dim, rank))    # A
        if self.uses_pa:
            self.pa_gamma = nn.Parameter(torch.zeros(k))
        self.init_weights()

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_choice("form", options["form"], FORMS)
        check_choice("granularity", options["granularity"], ("block", "sublayer"))
        check_choice("a_init", options["a_init"], ("xavier", "col_orth"))
        rank, k, unused = options["rank"], options["k"], cls.inapplicable_options(options)  # unused: not checked
        if "rank" not in unused and (not isinstance(rank, int) or rank < 1 or rank > dim):
            raise ValueError(f"rank={rank!r} must be an integer in 1..{dim} (the width embed_dim={dim})")
        if "k" not in unused and (not isinstance(k, int) or k < 1):
            raise ValueError(f"k={k!r} must be a positive integer (number of previous activations)")
        if "rw_norm" not in unused:
            MixWeights.check(*_mix_defaults(options["form"], options["rw_norm"], options["alpha_init"],
                                            options["beta_init"]))

    @classmethod
    def inapplicable_options(cls, options: dict[str, Any]) -> dict[str, str]:
        check_choice("pa_h", options["pa_h"], PA_H)
        check_choice("rw_norm", options["rw_norm"], MIX_NORMS)
        unused = unused_by_form(options, APPLIES, FORMS)
        form, pa_forms = options["form"], ("pa", "rw_pa")
        for key in ("rank", "a_init"):
            if form in pa_forms and options["pa_h"] == "lowrank":
                unused.pop(key)
            elif key in unused:
                setting = f"form={form!r}" + (", pa_h='identity'" if form in pa_forms else "")
                unused[key] = f"{setting}; it applies to form {', '.join(LR_FORMS)}, and pa, rw_pa with pa_h='lowrank'"
        if "beta_init" not in unused and options["rw_norm"] == "coupled":
            unused["beta_init"] = ("rw_norm='coupled' (beta = 1 - alpha); it applies to rw_norm "
                                   + ", ".join(n for n in MIX_NORMS if n != "coupled"))
        return unused

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        if options["form"] == "seed":
            return Block(args, sites=(SeedGate(args), SeedGate(args)))
        if options["granularity"] == "sublayer":
            return super().build_block(args, **options)
        return WholeBlock(args, site=cls(args.dim, args=args, **options))

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        return ResidualStream(keep_history="pa" in options["form"])

    def init_weights(self) -> None:
        if self.mix is not None:
            self.mix.init_weights()
        if self.uses_lr:
            nn.init.zeros_(self.lr_down)
            for up in self.lr_up:
                if self.a_init == "col_orth":  # A_ij = 1/sqrt(rD) if i mod r == j (footnote 2)
                    rows = torch.arange(up.shape[0])
                    up.data.zero_()[rows, rows % self.rank] = 1.0 / math.sqrt(self.rank * self.dim)
                else:
                    nn.init.xavier_uniform_(up)
        if self.uses_pa:
            with torch.no_grad():
                self.pa_gamma.zero_()
                if self.form != "pa":  # rw_pa / rw_lr_pa: g = Σ γ_j h_j(x_{i−j}) must start as x_i
                    self.pa_gamma[0] = 1.0

    def _previous_activations(self, states: list[torch.Tensor]) -> torch.Tensor:
        """Σ_j γ_j h_j(x_{i−j}) over states [x_i, x_{i−1}, …] with h_j = I or I + A_j B_j. The low-rank part is one
        matmul: Σ_j γ_j A_j (B_j x_{i−j}) = [γ_0 A_0 | γ_1 A_1 | …] · [B_0 x_i ; B_1 x_{i−1} ; …] — no stacked
        copy of the states and one up-projection instead of one per j."""
        gamma = self.pa_gamma[: len(states)]
        out = gamma[0] * states[0]
        for g, state in zip(gamma[1:], states[1:], strict=True):
            out = out + g * state
        if self.uses_lr:
            down = torch.cat([F.linear(state, self.lr_down[j]) for j, state in enumerate(states)], dim=-1)
            up = (self.lr_up[: len(states)] * gamma[:, None, None]).permute(1, 0, 2).flatten(1)  # (D, j·r)
            out = out + F.linear(down, up)
        return out

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        if self.uses_pa:
            history.append(x)
            pa = self._previous_activations(history[: -self.k - 1: -1])  # x_i, x_{i−1}, …
            g = x + pa if self.form == "pa" else pa
        elif self.uses_lr:
            g = x + F.linear(F.linear(x, self.lr_down[0]), self.lr_up[0])
        else:
            g = x
        if self.mix is None:
            return f + g - x
        alpha, beta = self.mix()
        return alpha * f + beta * g - x

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float]:
        if self.mix is None:
            return f, 1.0
        alpha, beta = self.mix()
        return alpha * f, beta

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        stats = {}
        if self.mix is not None:
            alpha, beta = self.mix()
            stats |= {"alpha": alpha.detach(), "beta": beta.detach()}
        if self.uses_pa:
            stats |= {f"pa_gamma_{j}": g for j, g in enumerate(self.pa_gamma.detach())}
        if self.uses_lr:
            stats["lr_norm"] = torch.linalg.matrix_norm(self.lr_up.detach() @ self.lr_down.detach()).mean()
        return stats


def _mix_defaults(form: str, rw_norm: str, alpha: float | None, beta: float | None) -> tuple[str, float, float]:
    """The (normalisation, α₀, β₀) of the RW weights: as near the standard residual as the normalisation allows
    (raw 1/1, sigmoid 0.99/0.99, softmax 0.01/0.99), and 0.5/0.5 for the single coupled sigmoid."""
    defaults = {"none": (1.0, 1.0), "softmax": (0.01, 0.99), "sigmoid": (0.99, 0.99), "coupled": (0.5, 0.5)}[rw_norm]
    a = defaults[0] if alpha is None else alpha
    if rw_norm == "coupled":
        return rw_norm, a, 1.0 - a if beta is None else beta
    return rw_norm, a, defaults[1] if beta is None else beta


class SeedGate(ResidualSite):
    """The seed notes' "LAuReL" (``form="seed"``), literally: a per-channel, input-dependent gate read from its own
    LayerNorm of the stream,

        g = σ(W_g · LN_g(x) + b_g),   y = g ⊙ F(u) + (1 − g) ⊙ x,   W_g ∈ R^{D×D},  u = Norm(x)

    at each residual site (the notes' block has one branch; a ViT block has two). W_g is trunc_normal(0.02) and
    b_g = 0, so g ≈ 0.5 at init, as the notes recommend: every site halves the skip (not standard at init). It is a
    coupled Highway-style gate, not the paper's LAuReL (which learns input-independent α, β, plus LR/PA).
    """

    name = "laurel"

    def __init__(self, args: BlockArgs) -> None:
        super().__init__(args.dim, args=args)
        self.gate_norm = args.norm_layer(args.dim)
        self.gate = nn.Linear(args.dim, args.dim)

    def gate_value(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(self.gate_norm(x)))

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return self.gate_value(x) * (f - x)

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.gate_value(x)
        return g * f, 1.0 - g

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {} if x is None else {"gate_mean": self.gate_value(x).mean().detach()}
