"""The pre-optimisation forward code of the depth-aggregating and multi-stream variants, kept as the oracle of
``tests/test_fast_paths.py`` (the fast paths must give the same outputs and gradients).

A plain copy of the computations as they were written before the speed-up, as subclasses of today's
classes: parameters, options and construction are inherited (so state_dict keys and shapes are the production
ones by construction), only the forward computation is the old one — the methods and classes the speed-up
changed (the blocks and streams it left alone, DWAStream, HyperBlock and MultiStream, are today's). ``REFERENCES`` maps a registry name to its
reference class; ``tests/test_fast_paths.py`` swaps it into the registry to build the reference model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lit_modules.residual.attn_res import AttnRes, AttnResBlock, AttnResStream
from lit_modules.residual.denseformer import DWA, DenseFormer
from lit_modules.residual.depth import final_args
from lit_modules.residual.hyper_connections import HyperConnections, Mixing
from lit_modules.residual.mhc import MHC


def stack_sources(sources: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(list(sources), dim=2)


# --- Attention Residuals -----------------------------------------------------------------------------------------
class RefAttnRes(AttnRes):
    def weights(self, stack: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.key_norm(stack) @ self.query.to(stack.dtype), dim=-1)

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        stack = stack_sources(sources)
        return torch.einsum("bnt,bntd->bnd", self.weights(stack), stack)

    @classmethod
    def build_block(cls, args: Any, **options: Any) -> nn.Module:
        block = super().build_block(args, **options)
        block.__class__ = RefAttnResBlock
        return block

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        out = cls(dim, args=final_args(dim, depth, norm_layer), **options)
        out.set_depth(2 * depth, cls.extent(depth, options["num_blocks"]), "out")
        return RefAttnResStream(cls.block_size(depth, options["num_blocks"]), out)


class RefBlockSources:
    def __init__(self, x0: torch.Tensor, block_size: int) -> None:
        self.blocks: list[torch.Tensor] = [x0]
        self.partial: torch.Tensor | None = None
        self.block_size = block_size
        self.layers = 0

    def sources(self) -> list[torch.Tensor]:
        if self.layers % self.block_size == 0 and self.partial is not None:
            self.blocks.append(self.partial)
            self.partial = None
        return [*self.blocks] if self.partial is None else [*self.blocks, self.partial]

    def add(self, f: torch.Tensor) -> None:
        self.partial = f if self.partial is None else self.partial + f
        self.layers += 1


class RefAttnResBlock(AttnResBlock):
    def forward(self, state: RefBlockSources) -> RefBlockSources:
        h = self.attn_res(state.sources())
        u = self.norm1(h)
        state.add(self.drop_path1(self.ls1(h, u, self.attn(u))))
        h = self.mlp_res(state.sources())
        u = self.norm2(h)
        state.add(self.drop_path2(self.ls2(h, u, self.mlp(u))))
        return state


class RefAttnResStream(AttnResStream):
    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        state = RefBlockSources(x, self.block_size)
        for blk in blocks:
            state = blk(state)
        return self.out(state.sources())


# --- DenseFormer -------------------------------------------------------------------------------------------------
class RefDWA(DWA):
    def forward(self, reps: list[torch.Tensor]) -> torch.Tensor:
        stack = stack_sources([reps[j] for j in self.columns])
        return torch.einsum("bntd,t->bnd", stack, self.alpha[0].to(stack.dtype))


class RefDenseFormer(DenseFormer):
    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        stream = super().build_stream(dim, depth, norm_layer, **options)
        for dwa in stream.dwa.values():
            dwa.__class__ = RefDWA
        return stream


# --- Hyper-Connections and mHC -----------------------------------------------------------------------------------
def ref_sinkhorn_knopp(logits: torch.Tensor, iters: int) -> torch.Tensor:
    log_m = logits
    for _ in range(iters):
        log_m = log_m - torch.logsumexp(log_m, dim=-1, keepdim=True)
        log_m = log_m - torch.logsumexp(log_m, dim=-2, keepdim=True)
    return log_m.exp()


class RefMultiStreamSite:
    """The old site formula (mixed into the two reference sites below)."""

    def read(self, x: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        return torch.matmul(mixing.read.unsqueeze(-2), x).squeeze(-2)

    def write(self, x: torch.Tensor, f: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        return torch.matmul(mixing.res, x) + mixing.write.unsqueeze(-1) * f.unsqueeze(-2)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None, *,
                mixing: Mixing | None = None) -> torch.Tensor:
        mixing = self.mixing(x) if mixing is None else mixing
        return self.write(x, f, mixing) - x


class RefHyperConnections(RefMultiStreamSite, HyperConnections):
    def coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a_m, a_r, b = self.a_m[:, 0], self.a_r, self.b[0]
        if not self.dynamic:
            return a_m, a_r, b
        t = torch.tanh(torch.matmul(self.dyn_norm(x), torch.cat([self.w_m, self.w_r, self.w_b], dim=1)))
        return (a_m + self.s_alpha * t[..., 0], a_r + self.s_alpha * t[..., 1:1 + self.n],
                b + self.s_beta * t[..., -1])

    def mixing(self, x: torch.Tensor) -> Mixing:
        a_m, a_r, b = self.coefficients(x)
        return Mixing(read=a_m, res=a_r.transpose(-1, -2), write=b)


class RefMHC(RefMultiStreamSite, MHC):
    def logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        v = torch.nn.functional.rms_norm(x.flatten(-2), (self.n * self.dim,), eps=1e-6)
        pre = self.alpha_pre * torch.matmul(v, self.phi_pre) + self.b_pre[0]
        post = self.alpha_post * torch.matmul(v, self.phi_post) + self.b_post[0]
        res = self.alpha_res * torch.matmul(v, self.phi_res).unflatten(-1, (self.n, self.n)) + self.b_res
        return pre, post, res

    def mixing(self, x: torch.Tensor) -> Mixing:
        pre, post, res = self.logits(x)
        return Mixing(read=torch.sigmoid(pre), res=ref_sinkhorn_knopp(res, self.sinkhorn_iters),
                      write=2.0 * torch.sigmoid(post))


REFERENCES: dict[str, type] = {"attn_res": RefAttnRes, "denseformer": RefDenseFormer,
                               "hyper_connections": RefHyperConnections, "mhc": RefMHC}
