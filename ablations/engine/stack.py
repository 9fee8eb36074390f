"""K models of one shape trained as one: flat stacked weights, a ``torch.func.vmap`` forward, per-run views.

The K models (:class:`lit_modules.VisionTransformer`, built exactly as K plain runs would build them: their own
seeds, their own initial weights) are copied into one flat ``(K, P)`` weight tensor, ``P`` the parameter count of
one model, with a ``(K, P)`` gradient beside it. Each parameter is a view of both:

- ``leaves[name]``: a ``(K, *shape)`` view of the weights that autograd treats as a leaf; its ``.grad`` is the same
  view of the flat gradient, into which backward accumulates in place. The optimiser
  (:class:`ablations.engine.optim.StackedAdam`) updates the whole ``(K, P)`` tensor in a handful of kernels;
- the K models themselves: their parameters become ``nn.Parameter`` views of row ``k`` of the weights (no copy).
  Whatever reads a run's model — its checkpoint (``state_dict``), the diagnostics, nGPT's projection after each
  step — reads that run's current weights, and nothing is ever copied back.

The forward is ``vmap(functional_call(model, leaves, x))`` over the leading dimension of the leaves and of the
input batch ``(K, B, C, H, W)``: every run sees only its own weights and its own images, and since the K losses are
independent, the gradient of their sum is each run's own gradient. Buffers are stacked the same way (each run's
model reads its row).

Not every model stacks (:func:`stack_reason`): dropout and stochastic depth draw their masks from the global RNG,
which K runs in one process cannot each reproduce; BatchNorm's batch statistics would count the zero images that
pad an epoch's last batch to the stack's shape; a hand-written ``torch.autograd.Function`` without a vmap rule
cannot run under ``vmap``. Those train as plain runs, and the reason is said in one line.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

# Each leaf's .grad is a strided view of the flat (K, P) gradient, into which backward accumulates in place; torch
# warns that such a layout "may impair performance" on every backward. It is the point of the layout: say nothing.
warnings.filterwarnings("ignore", message=".*do not obey the gradient layout contract.*")
# On a CPU, vmap runs the fused attention kernel through torch's per-model fallback and warns of "a performance drop"
# once per process: a CPU stacks a cell only where its measured stacked step, that fallback included, beats the plain
# one (ablations.engine.choice), so the warning says nothing the choice has not weighed.
warnings.filterwarnings("ignore", message=".*performance drop because we have not yet implemented the batching rule.*")


@dataclass(frozen=True)
class Slot:
    """Where one parameter (or buffer) of a model lives in the flat tensors: columns ``start:start + numel``."""

    name: str
    shape: tuple[int, ...]
    start: int
    numel: int


def _layout(named: Sequence[tuple[str, torch.Tensor]]) -> tuple[list[Slot], int]:
    slots, start = [], 0
    for name, t in named:
        slots.append(Slot(name, tuple(t.shape), start, t.numel()))
        start += t.numel()
    return slots, start


def _owner(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The submodule that holds ``name`` (``blocks.0.attn.qkv.weight``) and the attribute's own name."""
    path, _, attr = name.rpartition(".")
    return (module.get_submodule(path) if path else module), attr


def random_modules(model: nn.Module) -> list[str]:
    """Names of the modules that draw random numbers in training mode: dropout with p > 0, stochastic depth."""
    found = []
    for name, module in model.named_modules():
        p = getattr(module, "p", None) if isinstance(module, nn.modules.dropout._DropoutNd) else None
        p = getattr(module, "drop_prob", None) if p is None else p
        if p:  # > 0
            found.append(name or type(module).__name__)
    return found


def custom_functions(model: nn.Module, x: torch.Tensor) -> list[type]:
    """The hand-written ``torch.autograd.Function`` classes a plain forward of ``model`` on ``x`` records in its
    autograd graph (their nodes carry ``_forward_cls``), in first-seen order."""
    out = model(x)
    seen, found, stack = set(), [], [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        cls = getattr(node, "_forward_cls", None)
        if cls is not None and cls not in found:
            found.append(cls)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def has_vmap_rule(cls: type) -> bool:
    """Whether a ``torch.autograd.Function`` can run under ``vmap``: a ``setup_context`` of its own and either
    ``generate_vmap_rule = True`` or a ``vmap`` staticmethod."""
    base = torch.autograd.Function
    own_setup = getattr(cls, "setup_context", None) is not getattr(base, "setup_context", None)
    rule = getattr(cls, "generate_vmap_rule", False) or getattr(cls, "vmap", None) is not getattr(base, "vmap", None)
    return own_setup and bool(rule)


def stack_reason(models: Sequence[nn.Module], sample: torch.Tensor) -> str | None:
    """Why ``models`` cannot train stacked (one line), or None when they can: :func:`layout_reason`, then (more than
    one model) :func:`vmap_reason`. ``sample``: one input batch of one model (a couple of images suffice)."""
    return layout_reason(models) or (vmap_reason(models[0], sample) if len(models) > 1 else None)


def layout_reason(models: Sequence[nn.Module]) -> str | None:
    """Why ``models`` cannot be one stack, even of one: other parameters (names, shapes, dtypes, devices) than the
    first's; BatchNorm (its batch statistics would count the padding of an epoch's last batch); dropout or
    stochastic depth (masks drawn from the global random stream)."""
    first = models[0]
    layout = [(n, tuple(p.shape), p.dtype, p.device) for n, p in first.named_parameters()]
    buffers = [(n, tuple(b.shape), b.dtype) for n, b in first.named_buffers()]
    for k, m in enumerate(models[1:], 1):
        if [(n, tuple(p.shape), p.dtype, p.device) for n, p in m.named_parameters()] != layout or \
                [(n, tuple(b.shape), b.dtype) for n, b in m.named_buffers()] != buffers:
            return f"run {k}'s model has other parameters than run 0's (a different shape or option)"
    if len({(d, dev) for _, _, d, dev in layout}) > 1:
        return "the model's parameters have more than one dtype or device"
    norms = [n for n, m in first.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        return (f"BatchNorm ({norms[0]}{', ...' if len(norms) > 1 else ''}): its batch statistics would count the "
                "zero images that pad an epoch's last, smaller batch to the stack's one shape")
    drawn = random_modules(first)
    if drawn:
        return (f"dropout / stochastic depth ({', '.join(drawn[:3])}{', ...' if len(drawn) > 3 else ''}) draw "
                "each run's masks from the global random stream, which stacked runs cannot each reproduce")
    return None


def vmap_reason(model: nn.Module, sample: torch.Tensor) -> str | None:
    """Why two copies of ``model`` cannot run under ``vmap`` (a forward and backward of a stack of two on
    ``sample``), naming the hand-written autograd Functions without a vmap rule where that is the cause; None when
    they can. One run at a time needs no vmap (:meth:`StackedModel.forward` of one model)."""
    probe = StackedModel([_copy(model), _copy(model)])
    try:
        x = sample[:2].unsqueeze(0).expand(2, *sample[:2].shape)
        probe.forward(x).float().sum().backward()
    except Exception as exc:  # noqa: BLE001 - any failure means: train these runs one by one
        text = " ".join(str(exc).split())
        if "setup_context" in text:  # functorch's message for a Function without a vmap rule: name them
            with torch.enable_grad():
                names = sorted(c.__name__ for c in custom_functions(_copy(model), sample[:2]) if not has_vmap_rule(c))
            if names:
                return f"hand-written autograd Functions without a vmap rule ({', '.join(names)})"
        return f"its vmap forward/backward fails: {text[:200]}"
    return None


def _copy(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model)


class StackedModel:
    """K models of identical parameter layout as one: flat weights ``(K, P)``, flat gradients ``(K, P)``, the
    per-parameter views (``leaves``) and the K models re-pointed at their rows (module docstring)."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        if not models:
            raise ValueError("StackedModel needs at least one model")
        self.models = list(models)
        self.k = len(self.models)
        first = self.models[0]
        named = list(first.named_parameters())
        self.slots, self.size = _layout(named)
        self.buffer_slots, buffer_size = _layout(list(first.named_buffers()))
        device, dtype = named[0][1].device, named[0][1].dtype
        self.requires_grad = {name: p.requires_grad for name, p in named}
        with torch.no_grad():
            self.weights = torch.empty(self.k, self.size, device=device, dtype=dtype)
            for row, model in zip(self.weights, self.models, strict=True):
                params = dict(model.named_parameters())
                for s in self.slots:
                    row[s.start:s.start + s.numel].copy_(params[s.name].reshape(-1))
            self.grads = torch.zeros_like(self.weights)
            self.buffers = {}
            for s in self.buffer_slots:  # buffers may be integers (num_batches_tracked): stacked one by one
                self.buffers[s.name] = torch.stack([dict(m.named_buffers())[s.name] for m in self.models]).clone()
        del buffer_size
        self.leaves: dict[str, torch.Tensor] = {}
        for s in self.slots:
            leaf = self.view(self.weights, s)
            leaf.requires_grad_(self.requires_grad[s.name])
            if leaf.requires_grad:
                leaf.grad = self.view(self.grads, s)
            self.leaves[s.name] = leaf
        for k, model in enumerate(self.models):  # each model's parameters: views of its row
            for s in self.slots:
                owner, attr = _owner(model, s.name)
                owner._parameters[attr] = nn.Parameter(self.view(self.weights, s)[k],
                                                       requires_grad=self.requires_grad[s.name])
            for s in self.buffer_slots:
                owner, attr = _owner(model, s.name)
                owner._buffers[attr] = self.buffers[s.name][k]
        self.base = first

    def view(self, flat: torch.Tensor, slot: Slot) -> torch.Tensor:
        """The ``(K, *shape)`` view of one parameter in a flat ``(K, P)`` tensor."""
        return flat[:, slot.start:slot.start + slot.numel].view(self.k, *slot.shape)

    def columns(self, values: dict[str, float], default: float = 1.0) -> torch.Tensor:
        """A ``(P,)`` tensor: each parameter's value of ``values`` (by name; ``default`` for the others) in its
        columns, in the weights' dtype."""
        out = torch.full((self.size,), float(default), device=self.weights.device, dtype=self.weights.dtype)
        for s in self.slots:
            if s.name in values:
                out[s.start:s.start + s.numel] = float(values[s.name])
        return out

    def trainable_mask(self, names: set[str]) -> torch.Tensor:
        """A ``(P,)`` bool tensor: True in the columns of the parameters in ``names``."""
        mask = torch.zeros(self.size, device=self.weights.device, dtype=torch.bool)
        for s in self.slots:
            if s.name in names:
                mask[s.start:s.start + s.numel] = True
        return mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The K models on their own batches: ``x`` (K, B, ...) -> (K, B, classes)."""
        from torch.func import functional_call, vmap

        def one(params: dict, buffers: dict, images: torch.Tensor) -> torch.Tensor:
            return functional_call(self.base, (params, buffers), (images,), strict=True)

        if self.k == 1:  # one run: its own kernels, no batching rules (fused attention has none on a CPU)
            params = {name: leaf[0] for name, leaf in self.leaves.items()}
            return one(params, {name: b[0] for name, b in self.buffers.items()}, x[0]).unsqueeze(0)
        return vmap(one, in_dims=(0, 0, 0), randomness="error")(self.leaves, self.buffers, x)

    __call__ = forward

    def train(self, mode: bool = True) -> StackedModel:
        for model in self.models:
            model.train(mode)
        return self

    def eval(self) -> StackedModel:
        return self.train(False)

    def zero_grad(self) -> None:
        self.grads.zero_()

    @torch.no_grad()
    def project_parameters(self) -> None:
        """Each model's parameter constraint (nGPT's unit-norm matrices; a no-op for every other variant), on its
        own row of the weights."""
        for model in self.models:
            model.project_parameters()


def frozen_parameters(model: nn.Module, sample: torch.Tensor | None) -> set[str]:
    """Names of the parameters no gradient reaches in a forward and backward of (a copy of) ``model`` on
    ``sample``, or that do not require one: the plain run's optimiser leaves them alone (their ``grad`` is None)."""
    names = {n for n, p in model.named_parameters() if not p.requires_grad}
    if sample is None:
        return names
    probe = _copy(model)
    with torch.enable_grad():
        probe(sample).float().sum().backward()
    return names | {n for n, p in probe.named_parameters() if p.requires_grad and p.grad is None}


@dataclass(frozen=True)
class GroupScales:
    """Per parameter (by name), what its optimiser group (:func:`lit_modules.classifier.optimizer_groups`) sets:
    ``decay``, the group's weight decay per unit of the run's (0: undecayed; CompleteP's hidden matrices: m_N),
    ``lr``, the multiplier of the run's learning rate, and ``eps``, Adam's ε (CompleteP scales both per group; the
    standard parametrisation keeps 1 and ``ADAM_EPS``)."""

    decay: dict[str, float]
    lr: dict[str, float]
    eps: dict[str, float]


def group_scales(model: nn.Module) -> GroupScales:
    """The :class:`GroupScales` of ``model``: its optimiser groups at a learning rate and weight decay of 1 (a
    group's learning rate and weight decay are linear in the run's, so their values there are the factors)."""
    from lit_modules.classifier import ADAM_EPS, optimizer_groups

    names = {id(p): name for name, p in model.named_parameters()}
    decay, lr, eps = {}, {}, {}
    for group in optimizer_groups(model, lr=1.0, weight_decay=1.0):
        for p in group["params"]:
            name = names[id(p)]
            decay[name] = float(group["weight_decay"])
            lr[name] = float(group.get("lr", 1.0))
            eps[name] = float(group.get("eps", ADAM_EPS))
    return GroupScales(decay, lr, eps)


def projects(model: nn.Module) -> bool:
    """Whether the model's variant constrains its parameters after each optimiser step (nGPT): its class overrides
    ``ResidualSite.project_parameters``."""
    from lit_modules import RESIDUALS
    from lit_modules.residual.base import ResidualSite

    variant = RESIDUALS[model.residual]
    return getattr(variant.project_parameters, "__func__", None) is not \
        getattr(ResidualSite.project_parameters, "__func__", None)
