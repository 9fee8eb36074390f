"""Adam / AdamW over stacked runs: one update of the flat ``(K, P)`` weights, each run at its own learning rate.

The plain run trains with ``torch.optim.AdamW`` (or ``Adam``: L2 weight decay added to the gradient) over the
backbone's parameter groups (weight decay on matrices, none on biases, norms, embeddings and the variants' scalars)
and a ``LambdaLR`` of :class:`lit_modules.classifier.WarmupCosine` stepped after every optimizer step. Here the same
arithmetic runs on the whole stack at once:

- the weight decay of each column is the decay of the parameter group it belongs to (a ``(P,)`` factor — 0 or 1,
  or a parametrisation's multiple — times the run's ``weight_decay``), and so are a parametrisation's per-group
  multipliers of the learning rate and of Adam's ε (CompleteP's ``lr_scale`` and ``eps_scale``, applied as
  ``ViTClassifier.configure_optimizers`` applies them);
- the learning rate of run ``k`` at step ``s`` is ``lr_k · WarmupCosine_k(s)``, read from a ``(steps + 1, K)`` table
  made once on the host in float64 (as LambdaLR computes it) and indexed on the device by a step counter that
  lives on the device too, so a captured CUDA graph replays the schedule without the host;
- a run that is not ``active`` (its loss was not finite: the plain run skips that step and stops; or it was
  pruned) gets no update: its gradient is zeroed and its learning rate is 0, so its weights stay bit for bit
  what they were;
- parameters that the plain run's optimiser never updates (no gradient reaches them: ``frozen``) are left alone,
  as ``torch.optim`` skips parameters whose ``grad`` is None.

The update (``torch.optim.AdamW`` with ``fused=True``, per element)::

    p ← p · (1 − lr·wd)                         (AdamW; Adam instead adds wd·p to the gradient)
    m ← m + (1 − β₁)(g − m),  v ← β₂ v + (1 − β₂) g²
    p ← p − lr / (1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)

The fused kernel orders some of these operations differently; the results agree to float32 rounding
(``tests/test_engine.py`` trains every variant both ways).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lit_modules.classifier import ADAM_EPS, WarmupCosine

OPTIMIZERS = ("adamw", "adam")


def schedule_table(base_lrs: Sequence[float], schedules: Sequence[WarmupCosine], steps: int) -> torch.Tensor:
    """``(steps + 1, K)`` float64: run k's learning rate at optimizer step s, ``base_lrs[k] · schedules[k](s)``
    (LambdaLR's value while step s runs; the last row repeats for any step beyond)."""
    table = torch.empty(steps + 1, len(base_lrs), dtype=torch.float64)
    for k, (lr, schedule) in enumerate(zip(base_lrs, schedules, strict=True)):
        table[:, k] = torch.tensor([lr * schedule(s) for s in range(steps + 1)], dtype=torch.float64)
    return table


class StackedAdam:
    """Adam(W) over a :class:`ablations.engine.stack.StackedModel`'s flat weights and gradients (module docstring).

    ``lr_table``: :func:`schedule_table`; ``weight_decay``: each run's (K,); ``decay``: (P,) each column's weight
    decay per unit of the run's (0 where none applies); ``lr_scale``: (P,) each column's multiplier of the learning
    rate (None: 1); ``eps``: Adam's ε, a number or (P,) per column; ``frozen``: (P,) bool, True for columns no
    gradient reaches. The step counter ``step`` (a float64 scalar tensor on the device) counts optimizer steps
    taken, as ``torch.optim``'s ``state["step"]`` and LambdaLR's ``last_epoch`` do."""

    def __init__(self, weights: torch.Tensor, grads: torch.Tensor, *, kind: str, lr_table: torch.Tensor,
                 weight_decay: Sequence[float], decay: torch.Tensor, lr_scale: torch.Tensor | None = None,
                 frozen: torch.Tensor | None = None, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float | torch.Tensor = ADAM_EPS) -> None:
        if kind not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {kind!r}; valid choices: {', '.join(OPTIMIZERS)}")
        k, _ = weights.shape
        device, dtype = weights.device, weights.dtype
        self.kind, self.beta1, self.beta2 = kind, float(betas[0]), float(betas[1])
        self.eps = eps.to(device=device, dtype=dtype).view(1, -1) if torch.is_tensor(eps) else float(eps)
        self.weights, self.grads = weights, grads
        self.exp_avg = torch.zeros_like(weights)
        self.exp_avg_sq = torch.zeros_like(weights)
        self.step_count = torch.zeros((), device=device, dtype=torch.float64)  # bias corrections in float64
        self.lr_table = lr_table.to(device=device, dtype=dtype)
        self.last_step = lr_table.shape[0] - 1
        self.decay = (torch.tensor(list(weight_decay), device=device, dtype=dtype).view(k, 1)
                      * decay.to(device=device, dtype=dtype).view(1, -1))  # (K, P): each column's wd
        self.lr_scale = None if lr_scale is None else lr_scale.to(device=device, dtype=dtype).view(1, -1)
        self.updated = None if frozen is None or not bool(frozen.any()) else (~frozen).to(device).view(1, -1)

    def lr(self) -> torch.Tensor:
        """(K,) the learning rates of the coming step (device tensor; no host sync)."""
        index = self.step_count.clamp(max=self.last_step).long()
        return self.lr_table.index_select(0, index.view(1)).view(-1)

    @torch.no_grad()
    def step(self, active: torch.Tensor) -> None:
        """One update of every active run (``active``: (K,) bool on the device); inactive runs are left as they
        are. No host sync: capturable in a CUDA graph."""
        k = self.weights.shape[0]
        on = active.view(k, 1)
        lr = self.lr().view(k, 1) * on  # 0 for inactive runs
        g = torch.where(on, self.grads, 0.0)  # a skipped run's gradient (maybe NaN) never reaches its state
        if self.lr_scale is not None:
            lr = lr * self.lr_scale  # (K, P): a parametrisation's per-group learning rates
        if self.updated is not None:
            lr = lr * self.updated
        self.step_count += 1
        t = self.step_count
        if self.kind == "adamw":
            self.weights.mul_(1 - lr * self.decay)
        else:
            g = g.add(self.weights * self.decay)
        self.exp_avg.lerp_(g, 1 - self.beta1)
        self.exp_avg_sq.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
        bias1 = 1 - torch.pow(self.beta1, t)
        bias2_sqrt = torch.sqrt(1 - torch.pow(self.beta2, t))
        denom = (self.exp_avg_sq.sqrt() / bias2_sqrt).add_(self.eps)
        self.weights.addcdiv_(self.exp_avg * (lr / bias1).neg_(), denom)

    # --- one run's state ---------------------------------------------------------------------------------------
    def state_of(self, k: int) -> dict[str, torch.Tensor | float]:
        """Run ``k``'s optimiser state (copies): moments, step count."""
        return {"exp_avg": self.exp_avg[k].clone(), "exp_avg_sq": self.exp_avg_sq[k].clone(),
                "step": float(self.step_count.item())}

    def load_state_of(self, k: int, state: dict) -> None:
        """Restore run ``k``'s moments and the step count (the runs of a stack resume from the same step)."""
        with torch.no_grad():
            self.exp_avg[k].copy_(state["exp_avg"])
            self.exp_avg_sq[k].copy_(state["exp_avg_sq"])
            self.step_count.fill_(float(state["step"]))
