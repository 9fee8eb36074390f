"""Training diagnostics of the residual stream (spec §10): DeepViT attention similarity, CaiT branch/stream ratio,
per-block gradient norms and each variant's own parameters, logged to TensorBoard.

Project definitions (written to TensorBoard as ``diag/definitions`` at fit start):

- Attention maps ``A^l[b, h, i, t]`` (post-softmax; rows i = output/query tokens, columns t = input/key tokens)
  come from one eval-mode, no-grad, fp32 forward on a fixed batch with timm's explicit-softmax path: the maps that
  weight the values, read at ``attn.attn_drop`` of each self-attention block (Re-attention: the regenerated maps
  Θᵀ·softmax **before** the norm over heads, ``ReAttention.map_tap`` — after the BatchNorm every head's map is
  standardised over batch and tokens, which makes the column similarity ≈ 0 by construction; SkipDense: the map
  of the block's own input; class-attention blocks are not included).
- ``M^{p,q}[b, h, t]`` = cosine similarity of **column** t of layer p and of layer q (heads matched by index).
  ``sim_full[p, q] = mean_{b,h,t} M^{p,q}``, ``sim_adj[l] = sim_full[l, l+1]``,
  ``sim_ratio[l] = mean_{b,h,t} 1[M^{l,l+1} > τ]`` with the **project default τ = 0.9** (DeepViT-style; the
  paper's own τ was not retrieved, spec §10.1 [R]).
- ``entropy[l] = mean_{b,h,i} (−Σ_t A log A) / log T`` — 1 for uniform attention, 0 for one-hot; log it beside the
  similarity, which is trivially ≈ 1 for near-uniform attention.
- ``sim_k[l] = mean_{q = l+1..l+K} mean_{b,h,t} M^{l,q}`` (K following blocks, fewer at the top; **project default
  K = 3**, the paper's K was not retrieved) and ``sim_k_ratio[l]`` = share of (b, h, t, q) with M > τ.
- ``similar_blocks`` = #{l < L−1 : sim_k_ratio[l] > 0.5} — DeepViT's collapse count ("similar blocks"), with the
  **project's definition**: block l is similar when more than half (``SIMILAR_SHARE``) of its attention columns,
  over (b, h, t) and the K following blocks q, have M > τ. DeepViT counts blocks whose attention is similar to
  their neighbours, but its exact τ, K and share were not retrieved; ``similar_blocks_fraction`` = that count /
  (L − 1). Both are logged only for L ≥ 2 (a single block has no following block).
- Per residual site (layer l, sublayer s): x = the stream entering the site, b = **what the branch adds** to it
  (γ⊙F, α·F, t⊙F, α·f, g⊙F, ...; ``ResidualSite.decompose``), Δ = the whole update (DropPath is off in eval
  mode). CaiT's ratio ``ρ = ‖b‖/(‖x‖ + 1e-6)`` per token, comparable across variants; ``ratio_mean = mean ρ``,
  ``ratio_rms = sqrt(mean ‖b‖²)/sqrt(mean ‖x‖²)``; ``skip_scale`` = the mean factor the skip multiplies x by
  (1 − t, β, s, ...; 1 for an identity skip); ``update_ratio = mean ‖Δ‖/(‖x‖ + 1e-6)`` (mixes both, secondary);
  ``stream_rms[l] = sqrt(mean ‖x‖²/D)`` for the stream entering block l. DCA blocks: b = Δ = the block output f_t
  and x = the sum of the stack (the R-exact reading). DenseFormer: ordinary sites, x = the block's input (the
  previous DWA's output y) and b = F. Attention Residuals: x = the layer's aggregated input h_l (the softmax mix
  of the earlier outputs — at init their *mean*, 1/(number of sources) of the standard stream), b = Δ = the
  layer's output f_l (the source it adds), skip 1. Hyper-Connections and mHC (the stream is n copies
  H ∈ R^{n×D} per token, a site writes H' = M·H + w ⊗ F(h), h = rᵀH): every tensor is viewed through its mean over
  the n streams (``ResidualSite.stream_view``) — x = mean_i H_i (at init every stream equals the standard ViT's
  stream, and the head reads Norm(Σ_i H_i) = Norm(mean_i H_i) up to the norm's ε), b = mean_i(w_i)·F(h), Δ = the
  mean update; ``skip_scale`` = the mean column sum of M (1 for mHC's doubly stochastic M; 1 at init for HC).
- ``composite_gain`` (multi-stream sites only, else None): with M_k the token-mean n×n stream-mixing matrix of
  site k in forward order (``ResidualSite.stream_mixing``: mHC's H_res, HC's A_rᵀ), G = M_K ⋯ M_1 over all 2L
  sites; ``forward`` = max_i Σ_j |G_ij| (largest absolute row sum) and ``backward`` = max_j Σ_i |G_ij| (largest
  absolute column sum) — mHC's "Amax gain magnitude", 1 for identity or doubly stochastic mixing. The mean is
  taken per site before the product (not a per-token composite).
- ``param/{sublayer}/{layer}/{key}``: the site's own ``ResidualSite.diagnostics(x, u, f)`` on the diagnostic
  batch — x the stream entering the site, u its normalised input, f the branch output (e.g. Ortho's
  ``parallel_ratio`` = mean ‖f_∥‖/‖f‖, the share of the branch its projection removes). Overrides written
  before the branch argument existed, ``diagnostics(x, u)``, still get (x, u) (``ResidualSite.diagnostic_terms``).
- ``grad_norm[l]`` = L2 norm of the gradients of all parameters of block l, taken once per diagnostic epoch at
  the first optimizer step of that epoch (Lightning calls the hook after AMP unscaling, before gradient clipping).
- ``depth_weights[r, j]`` = mean weight (over the batch and tokens, and channels/outputs where the weights have
  them) that consumer r gives earlier representation j, for every variant built from ``DepthWeights`` modules
  (``lit_modules.residual.depth``; None for the others); missing entries are NaN (null in the JSON). DCA: rows
  = blocks 0..L−1 then the final GRN, columns = stack positions (x₀, block outputs f_j; with k-DCA [x₀,
  Σ intermediates, last k outputs]). DenseFormer: rows = the DWA after block i (NaN rows: blocks without a DWA,
  ``period`` > 1), columns = x_0 (embeddings) … x_L (block outputs), NaN off a dilated DWA's residues.
  Attention Residuals: rows = the 2L layers (attn 0, mlp 0, attn 1, …) then the final aggregation, columns =
  the sources (v_0 = embeddings, v_j = layer j's output; block form: block summaries b_0 … b_N, the current
  block's partial sum in its own column); row l at init: 1/(number of its sources).

Layer indices are 0-based block indices (``diag/attn_sim_adj/03`` compares blocks 3 and 4). **Step convention:**
every ``diag/*`` entry is written with ``global_step = epoch index`` (0-based ``trainer.current_epoch`` of the
epoch whose end it describes), not Lightning's optimizer-step counter.

Tags written by :class:`DiagnosticsCallback` (see :data:`TAGS`)::

    diag/ratio_mean/{sublayer}/{layer:02d}   diag/ratio_rms/{sublayer}/{layer:02d}   diag/stream_rms/{layer:02d}
    diag/update_ratio/{sublayer}/{layer:02d}   diag/skip_scale/{sublayer}/{layer:02d}
    diag/attn_sim_adj/{layer:02d}   diag/attn_sim_ratio/{layer:02d}   diag/attn_entropy/{layer:02d}
    diag/attn_sim_k/{layer:02d}   diag/attn_sim_k_ratio/{layer:02d}   diag/attn_sim_k_mean   diag/attn_sim_k_ratio_mean
    diag/similar_blocks   diag/similar_blocks_fraction                      (scalars, L ≥ 2)
    diag/grad_norm/{layer:02d}   diag/param/{sublayer}/{layer:02d}/{key}
    diag/composite_gain/forward   diag/composite_gain/backward              (scalars; multi-stream residuals)
    diag/attn_sim_adj_mean   diag/attn_sim_ratio_mean   diag/attn_entropy_mean   diag/ratio_mean_avg   (scalars)
    diag/attn_sim_full   diag/depth_weights                  (images; depth_weights: DCA, DenseFormer, AttnRes)
    diag/ratio_map                                           (image: ratio_mean, sublayer × layer)
    diag/attn_sim_full_json   diag/depth_weights_json   diag/definitions    (text; JSON = nested lists)

``sublayer`` is ``attn``/``mlp`` for two-site blocks, ``block`` for LAuReL at block granularity and DCA blocks,
``out`` (layer = L) for DCA's final GRN parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from timm.layers import Attention
from torch import Tensor, nn

from .names import DIAGNOSTIC_TAGS
from .residual import ResidualSite
from .residual.depth import DepthWeights, depth_weight_matrix

DEFAULT_TAU = 0.9  # project default similarity threshold (DeepViT-style; the paper's τ was not retrieved)
DEFAULT_SIM_K = 3  # neighbouring blocks each block's similarity is taken against (the paper's K was not retrieved)
SIMILAR_SHARE = 0.5  # a block is "similar" when more than this share of its sim_k comparisons has M > τ (project's)
EPS = 1e-6  # ρ = ‖Δ‖ / (‖x‖ + EPS), spec §10.2
TAGS = DIAGNOSTIC_TAGS  # the tags, torch-free in lit_modules.names (the reports read them too)
DEFINITIONS = f"""\
**Residual-stream diagnostics** (spec §10; step = epoch index, layers 0-based)

- `attn_sim_*`: cosine similarity M of attention **columns** (input token t's contribution to every output token)
  between layers, heads matched by index; `attn_sim_adj/l` = mean M between blocks l and l+1;
  `attn_sim_ratio/l` = share of (b, h, t) with M > τ; `attn_sim_full` = L×L matrix of mean M. Re-attention:
  the maps Θᵀ·softmax before the norm over heads (after a BatchNorm, M is ≈ 0 by construction).
- `attn_entropy/l` = mean over rows of −Σ A log A / log T (1 = uniform, 0 = one-hot).
- `attn_sim_k/l` = mean M between block l and each of the K = {{k}} following blocks; `attn_sim_k_ratio/l` = share
  of those (b, h, t, q) with M > τ (K is the project's choice; the paper's K was not retrieved).
- `similar_blocks` = number of blocks l < L−1 with `attn_sim_k_ratio/l` > {SIMILAR_SHARE} (more than half of
  block l's attention columns similar to the K following blocks): DeepViT's collapse count, by the project's
  definition (the paper's exact τ, K and share were not retrieved); `similar_blocks_fraction` = count / (L − 1).
- `ratio_mean/s/l` = mean over tokens of ‖b‖/(‖x‖+1e-6), b = what the branch adds to the stream x (γ⊙F, α·F,
  t⊙F, ...: CaiT's ratio, comparable across variants; eval mode); `ratio_rms` = sqrt(mean‖b‖²)/sqrt(mean‖x‖²);
  `skip_scale/s/l` = mean factor the skip multiplies x by (1 for an identity skip); `update_ratio/s/l` = mean
  ‖Δ‖/(‖x‖+1e-6) for the whole update Δ; `stream_rms/l` = sqrt(mean‖x‖²/D) entering block l.
  DCA: b = Δ = block output f_t, x = sum of the stack. Attention Residuals: x = the layer's input h (a softmax
  mix of earlier outputs), b = its output f.
- `depth_weights` (DCA, DenseFormer, Attention Residuals) = matrix of the mean weight each consumer (row) gives
  each earlier representation (column: 0 = embeddings); blank = no such input.
- Hyper-Connections / mHC (n streams H per token): x = the mean of the n streams (= the standard stream at init),
  b = the mean over streams of what the branch writes (mean(B)·F), Δ = the mean update, `skip_scale` = mean
  column sum of the stream mixing M (H' = M·H + ...; 1 for mHC). `composite_gain/forward` and `/backward` =
  largest absolute row / column sum of ∏_sites M (token-mean M for the input-dependent forms): mHC's
  "Amax gain"; near 1 when the stream mixing neither amplifies nor attenuates over depth.
- `grad_norm/l` = L2 norm of block l's gradients at the first optimizer step of the epoch.
- `param/s/l/key` = the variant's own parameters (γ, α, β, gate means, DCA GRN weights) and statistics of the
  site's branch output (Ortho: `parallel_ratio` = mean ‖f_∥‖/‖f‖, the share of the branch its projection removes).
- τ = {{tau}} (project default {DEFAULT_TAU}, DeepViT-style; the paper's own τ was not retrieved).
"""


# --- pure functions ------------------------------------------------------------------------------------------------
def attention_similarity(maps: Sequence[Tensor], tau: float = DEFAULT_TAU, k: int = DEFAULT_SIM_K) -> dict[str, Tensor]:
    """DeepViT cross-layer similarity and attention entropy of post-softmax maps, one (B, H, T, T) per layer.

    Returns float32 tensors on the maps' device: ``sim_full`` (L, L), ``sim_adj`` (L−1,), ``sim_ratio`` (L−1,),
    ``sim_k`` and ``sim_k_ratio`` (L−1,: block l against blocks l+1..l+k), ``similar_blocks`` (0-d: the number of
    blocks with ``sim_k_ratio > SIMILAR_SHARE``, see :func:`similar_blocks`) and ``entropy`` (L,). Column t of a map
    is ``A[b, h, :, t]``; an all-zero column (only possible for hand-made maps) has similarity 0 with everything.
    Each column is scaled by its largest entry before its norm is taken (:func:`unit_columns`: a column of entries
    below ~1e-19 would otherwise square to a zero float32 norm), so every similarity lies in [−1, 1] on any device.
    Memory: one float32 copy of the maps.
    """
    if len(maps) == 0:
        raise ValueError("attention_similarity needs at least one attention map")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer (neighbouring blocks), got {k!r}")
    shape = maps[0].shape
    if len(shape) != 4 or shape[-1] != shape[-2] or any(m.shape != shape for m in maps):
        raise ValueError(f"attention maps must all have the same shape (B, H, T, T), got "
                         f"{[tuple(m.shape) for m in maps]}")
    t = shape[-1]
    n_cols = shape[0] * shape[1] * t  # (b, h, t) triples the means run over
    entropy, flat = [], []
    for m in maps:
        m = m.detach().float()
        entropy.append(-torch.special.xlogy(m, m).sum(dim=-1).mean() / math.log(t) if t > 1 else m.new_zeros(()))
        flat.append(unit_columns(m).transpose(-1, -2).reshape(-1))  # column-major: (b, h, t) blocks of T entries
    flat = torch.stack(flat)  # (L, B·H·T·T)
    sim_full = ((flat @ flat.T) / n_cols).clamp(-1.0, 1.0)  # a mean of cosines: the clamp only trims rounding
    layers = len(maps)

    def per_column(p: int, q: int) -> Tensor:  # M^{p,q} for every (b, h, t)
        return (flat[p] * flat[q]).view(n_cols, t).sum(dim=-1).clamp(-1.0, 1.0)

    adj = [per_column(p, p + 1) for p in range(layers - 1)]
    near = [torch.cat([per_column(p, q) for q in range(p + 1, min(p + k, layers - 1) + 1)]) for p in range(layers - 1)]
    empty = flat.new_zeros(0)

    def summarise(groups: list[Tensor], threshold: bool) -> Tensor:
        if not groups:
            return empty
        return torch.stack([(g > tau).float().mean() if threshold else g.mean() for g in groups])

    sim_k_ratio = summarise(near, True)
    return {
        "sim_full": sim_full,
        "sim_adj": summarise(adj, False),
        "sim_ratio": summarise(adj, True),
        "sim_k": summarise(near, False),
        "sim_k_ratio": sim_k_ratio,
        "similar_blocks": similar_blocks(sim_k_ratio),
        "entropy": torch.stack(entropy),
    }


def unit_columns(maps: Tensor) -> Tensor:
    """``maps`` (..., T, T) with every column (``A[..., :, t]``, the query axis) scaled to unit length. The column is
    first divided by its largest absolute entry, so its norm is at least 1 and cannot underflow however small its
    entries; a column that is all zeros (or not finite) stays all zeros: its cosine with any column is 0."""
    def safe_divide(x: Tensor, by: Tensor) -> Tensor:
        usable = (by > 0) & torch.isfinite(by)
        return torch.where(usable, x / torch.where(usable, by, torch.ones_like(by)), torch.zeros_like(x))

    scaled = safe_divide(maps, maps.abs().amax(dim=-2, keepdim=True))
    return safe_divide(scaled, scaled.norm(dim=-2, keepdim=True))


def similar_blocks(sim_k_ratio: Tensor, share: float = SIMILAR_SHARE) -> Tensor:
    """DeepViT's collapse count by the project's definition: the number of blocks l (0 ≤ l < L−1) whose
    ``sim_k_ratio[l]`` (share of attention columns × following blocks with M > τ) is **strictly** above ``share``,
    as a 0-d float32 tensor. DeepViT reports 5/11/16 similar blocks for a plain ViT at 16/24/32 blocks and none
    with Re-attention; its exact τ, K and share were not retrieved, so τ = 0.9, K = 3, share = 0.5 are this
    project's choices."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"share must be in [0, 1), got {share}")
    return (sim_k_ratio > share).sum().float()  # 0 for L = 1 (no following block)


def branch_ratios(x: Tensor, delta: Tensor, eps: float = EPS) -> dict[str, Tensor]:
    """CaiT branch/stream ratio of an update ``delta`` to the stream ``x`` (both (..., D)), as 0-d tensors:
    ``ratio_mean = mean ‖Δ‖/(‖x‖ + eps)`` over tokens, ``ratio_rms = sqrt(mean ‖Δ‖²)/sqrt(mean ‖x‖²)``."""
    x, delta = x.detach().float(), delta.detach().float()
    nx, nd = x.norm(dim=-1), delta.norm(dim=-1)
    return {
        "ratio_mean": (nd / (nx + eps)).mean(),
        "ratio_rms": nd.square().mean().sqrt() / nx.square().mean().sqrt().clamp_min(1e-30),
    }


def stream_rms(x: Tensor) -> Tensor:
    """``sqrt(mean_tokens ‖x‖² / D)`` — the root mean square entry of the stream, a 0-d tensor."""
    return x.detach().float().square().mean().sqrt()


def composite_gain(matrices: Sequence[Tensor]) -> dict[str, float]:
    """mHC's "Amax gain magnitude" of the composite stream mixing over depth: with the per-site n×n mixing matrices
    M_1 … M_K in forward order (H_{k+1} = M_k H_k + …), G = M_K ⋯ M_1 and

        forward = max_i Σ_j |G_ij|   (largest absolute row sum: how much a stream of the output can amplify the input)
        backward = max_j Σ_i |G_ij|  (largest absolute column sum: the same for gradients flowing back)

    Both are 1 for identity or doubly stochastic matrices. Computed in float64 on the CPU."""
    if len(matrices) == 0:
        raise ValueError("composite_gain needs at least one mixing matrix")
    gain = torch.eye(matrices[0].shape[-1], dtype=torch.float64)
    for m in matrices:
        gain = m.detach().to("cpu", torch.float64) @ gain
    return {"forward": gain.abs().sum(dim=1).max().item(), "backward": gain.abs().sum(dim=0).max().item()}


def block_grad_norms(model: nn.Module) -> Tensor:
    """L2 norm of the gradients of each block's parameters, shape (L,), on the gradients' device.

    One ``torch._foreach_norm`` over all gradients and one ``index_add_``; no host sync (call ``.tolist()`` when
    logging). Blocks without gradients get 0.
    """
    blocks = model.blocks
    grads, owners = [], []
    for i, blk in enumerate(blocks):
        for p in blk.parameters():
            if p.grad is not None:
                grads.append(p.grad.detach())
                owners.append(i)
    if not grads:
        return torch.zeros(len(blocks))
    device = grads[0].device
    squares = torch.stack([n.float().square() for n in torch._foreach_norm(grads)])
    index = torch.tensor(owners, device=device)
    return torch.zeros(len(blocks), device=device).index_add_(0, index, squares).sqrt()


# --- one diagnostic forward ----------------------------------------------------------------------------------------
def collect_diagnostics(model: nn.Module, images: Tensor, tau: float = DEFAULT_TAU,
                        k: int = DEFAULT_SIM_K) -> dict[str, Any]:
    """One eval-mode, no-grad forward of ``model`` (a ``lit_modules.VisionTransformer``) on ``images`` with
    temporary hooks, autocast off: fp32 for an fp32 model (the images are cast to the parameters' dtype, so a model
    cast to bf16 as a whole runs in bf16). Every module's train/eval mode, every attention's fused flag and the hooks
    are restored / removed afterwards, also on error.

    Returns (CPU tensors, L = depth, layers 0-based)::

        depth, tau, sublayers (forward order of one block, e.g. ["attn", "mlp"])
        ratio_mean, ratio_rms, update_ratio, skip_scale: {sublayer: (L,)}     stream_rms: (L,)
        attn_sim_full: (L, L)   attn_sim_adj, attn_sim_ratio, attn_sim_k, attn_sim_k_ratio: (L−1,)
        similar_blocks: int (blocks with attn_sim_k_ratio > SIMILAR_SHARE)   attn_entropy: (L,)
        params: {sublayer: {layer: {key: float}}}    (the variant's ResidualSite.diagnostics())
        depth_weights: (consumers, sources) mean weights of every ``DepthWeights`` module (DCA, DenseFormer,
            AttnRes), NaN where a consumer has no such input, or None (no such module)
        depth_weights_rows: the row labels, depth_weights_columns: what the columns are (None without)
        composite_gain: {"forward": float, "backward": float} of the product of the multi-stream sites' mixing
            matrices (Hyper-Connections, mHC; see ``composite_gain``), or None (single-stream residual)
    """
    sites = model.residual_sites()
    depth = len(model.blocks)
    aggregators = [m for m in model.modules() if isinstance(m, DepthWeights)]
    seen = _Capture(depth)
    seen.forward(model, images, sites, aggregators)
    # a block whose attention runs more than once per forward (SkipDense) says so and runs its own input first
    calls = [getattr(blk, "attention_calls", 1) for blk in model.blocks]
    missing = [i for i, m in enumerate(seen.maps) if len(m) != calls[i]]
    if missing:
        raise RuntimeError(f"attention maps of blocks {missing} were captured {[len(seen.maps[i]) for i in missing]} "
                           f"times instead of {[calls[i] for i in missing]}: does the attention route through "
                           f"its map_tap (attn.attn_drop)?")
    sim = attention_similarity([m[0] for m in seen.maps], tau=tau, k=k)
    sublayers = list(dict.fromkeys(s for _, s, _ in sites))
    out: dict[str, Any] = {"depth": depth, "tau": float(tau), "k": k, "sublayers": sublayers}
    for key in ("ratio_mean", "ratio_rms", "update_ratio", "skip_scale"):
        out[key] = {s: _stack_layers(seen.site_stats, depth, s, key).cpu() for s in sublayers}
    first = {layer: s for layer, s, _ in reversed(sites)}  # the first site of each block sees the block's input
    out["stream_rms"] = torch.stack([seen.site_stats[layer, first[layer]]["stream_rms"]
                                     for layer in range(depth)]).cpu()
    for key in ("sim_full", "sim_adj", "sim_ratio", "sim_k", "sim_k_ratio"):
        out[f"attn_{key}"] = sim[key].cpu()
    out["similar_blocks"] = int(sim["similar_blocks"].item())
    out["attn_entropy"] = sim["entropy"].cpu()
    out["params"] = _params_to_floats(seen.param_stats)
    ordered = [seen.mixings[layer, s] for layer, s, _ in sites if (layer, s) in seen.mixings]  # forward order
    out["composite_gain"] = composite_gain(ordered) if ordered else None
    return out | _depth_weights(seen.depth_rows, aggregators)


class _Capture:
    """What the hooks of one diagnostic forward see: each site's statistics, the variants' own parameters, the
    multi-stream sites' mixing matrices, each block's attention maps and each depth aggregator's weights."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.site_stats: dict[tuple[int, str], dict[str, Tensor]] = {}
        self.param_stats: dict[tuple[int, str], dict[str, Tensor]] = {}
        self.mixings: dict[tuple[int, str], Tensor] = {}  # multi-stream sites' token-mean stream-mixing matrices
        self.maps: list[list[Tensor]] = [[] for _ in range(depth)]
        self.depth_rows: dict[int, Tensor] = {}

    def site_hook(self, layer: int, sublayer: str, site: nn.Module):
        def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
            x, branch, output, skip, params, mixing = site.diagnostic_terms(args, output)
            if mixing is not None:  # multi-stream sites: their n×n mixing, multiplied over depth
                self.mixings[layer, sublayer] = mixing
            update = branch_ratios(x, output)["ratio_mean"]
            skip = torch.as_tensor(skip, dtype=torch.float32, device=x.device).detach().mean()
            self.site_stats[layer, sublayer] = branch_ratios(x, branch) | {
                "stream_rms": stream_rms(x), "update_ratio": update, "skip_scale": skip}
            if params:
                self.param_stats[layer, sublayer] = params
        return hook

    def attn_hook(self, layer: int, read_input: bool):
        def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
            self.maps[layer].append((args[0] if read_input else output).detach())
        return hook

    def out_hook(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        self.param_stats[self.depth, "out"] = module.diagnostics(args[0])

    def depth_hook(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        self.depth_rows[module.depth_index] = module.depth_weights(*args)

    def forward(self, model: nn.Module, images: Tensor, sites: list, aggregators: list) -> None:
        """The forward with every hook on (eval mode, explicit attention, autocast off); the modes, fused flags and
        hooks are put back afterwards, also on error."""
        modes = [(m, m.training) for m in model.modules()]
        fused = [(m, m.fused_attn) for m in model.modules() if hasattr(m, "fused_attn")]  # incl. class attention
        handles = []
        try:
            model.eval()
            model.set_fused_attn(False)
            for layer, sublayer, site in sites:
                handles.append(site.register_forward_hook(self.site_hook(layer, sublayer, site)))
            for layer, blk in enumerate(model.blocks):  # the attention kind says where its maps are (``map_tap``)
                attn = _block_attention(blk, layer)
                tap, read_input = attn.map_tap() if hasattr(attn, "map_tap") else (attn.attn_drop, False)
                handles.append(tap.register_forward_hook(self.attn_hook(layer, read_input)))
            final_grn = getattr(getattr(model, "stream", None), "out", None)
            if isinstance(final_grn, ResidualSite):
                handles.append(final_grn.register_forward_hook(self.out_hook))
            for module in aggregators:  # each reports its row of the depth-weight matrix
                handles.append(module.register_forward_hook(self.depth_hook))
            param = next(model.parameters())
            with torch.no_grad(), torch.autocast(param.device.type, enabled=False):
                # .forward, not __call__: a backbone compiled in place (``model.compile()``) runs eagerly here, so
                # the hooks fire and the diagnostic forward neither recompiles nor graph-breaks the training graph
                model.forward(images.to(device=param.device, dtype=param.dtype))
        finally:
            for h in handles:
                h.remove()
            for m, flag in fused:
                m.fused_attn = flag
            for m, training in modes:
                m.training = training


def _depth_weights(depth_rows: dict[int, Tensor], aggregators: list) -> dict[str, Any]:
    """The depth aggregators' mean weights as one (consumers, sources) matrix with its row and column labels
    (None without an aggregator)."""
    if not aggregators:
        return {"depth_weights": None, "depth_weights_rows": None, "depth_weights_columns": None}
    rows = [f"{i} (none)" for i in range(aggregators[0].depth_extent[0])]
    for module in aggregators:
        rows[module.depth_index] = module.depth_label
    return {"depth_weights": depth_weight_matrix(depth_rows, aggregators[0].depth_extent),
            "depth_weights_rows": rows, "depth_weights_columns": aggregators[0].depth_columns}


def _block_attention(blk: nn.Module, layer: int) -> Attention:
    attn = getattr(blk, "attn", None)
    if not isinstance(attn, Attention):
        raise TypeError(f"block {layer} ({type(blk).__name__}) has no timm Attention under .attn")
    return attn


def _stack_layers(stats: dict, depth: int, sublayer: str, key: str) -> Tensor:
    """(L,) on the statistics' device (one host transfer per array later); NaN for a layer without the site."""
    device = next(iter(stats.values()))[key].device
    nan = torch.tensor(float("nan"), device=device)
    return torch.stack([stats[layer, sublayer][key] if (layer, sublayer) in stats else nan
                        for layer in range(depth)])


def _params_to_floats(stats: dict[tuple[int, str], dict[str, Tensor]]) -> dict[str, dict[int, dict[str, float]]]:
    """{(layer, sublayer): {key: 0-d tensor}} -> {sublayer: {layer: {key: float}}} with one host transfer."""
    entries = [(layer, s, k, v) for (layer, s), d in stats.items() for k, v in d.items()]
    values = torch.stack([v.detach().float().reshape(()) for *_, v in entries]).tolist() if entries else []
    out: dict[str, dict[int, dict[str, float]]] = {}
    for (layer, s, k, _), value in zip(entries, values, strict=True):
        out.setdefault(s, {}).setdefault(layer, {})[k] = value
    return out
