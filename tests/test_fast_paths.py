"""The optimised forward code of Attention Residuals, DenseFormer, Hyper-Connections and mHC computes
the same function as the code it replaced (``tests/reference_residuals.py``, the pre-optimisation copy): outputs
and gradients of every parameter and of the input agree to 1e-6 in float64, for every option of each variant,
with every parameter moved off its init (so no dynamic term is trivially zero) and with the same state_dict."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from backbone import LAUREL, TINY, _float64_one_thread, perturb  # noqa: F401 (autouse fixture)
from prerequisites import missing
from reference_residuals import REFERENCES, RefAttnRes, ref_sinkhorn_knopp

from lit_modules import RESIDUALS, VisionTransformer
from lit_modules.residual import stream_kernels
from lit_modules.residual.hyper_connections import StreamGrad, StreamRead, StreamWrite
from lit_modules.residual.mhc import StreamProjection, sinkhorn_knopp

DEPTH = 4  # 8 AttnRes layers: num_blocks 1, 2, 4 and the full form (8 blocks of one layer is the full form,
#           rejected as a second label for it); DenseFormer dilation/period up to 4
CASES = [
    *[("attn_res", {"num_blocks": nb}) for nb in (None, 1, 2, 4)],
    *[("denseformer", {"dilation": d, "period": p}) for d in (1, 2, 3) for p in (1, 2, 4)],
    *[("hyper_connections", {"n": n, "dynamic": dyn}) for n in (1, 2, 4) for dyn in (True, False)],
    *[("mhc", {"n": n, "res_init": init}) for n in (1, 2, 4) for init in ("paddlefleet_pr1849", "identity", "hc")],
    ("mhc", {"sinkhorn_iters": 1}),
    ("mhc", {"sinkhorn_iters": 7, "alpha_init": 0.5}),
]


def build_pair(residual: str, options: dict, **kw) -> tuple[VisionTransformer, VisionTransformer]:
    """(fast, reference): the same options, init seed and (perturbed) weights; the reference built from the
    pre-optimisation classes swapped into the registry."""
    size = TINY | {"depth": DEPTH} | kw
    fast = perturb(VisionTransformer(residual, options, init_seed=3, **size), scale=0.5)
    saved = RESIDUALS[residual]
    RESIDUALS[residual] = REFERENCES[residual]
    try:
        ref = VisionTransformer(residual, options, init_seed=3, **size)
    finally:
        RESIDUALS[residual] = saved
    ref.load_state_dict(fast.state_dict(), strict=True)  # the same keys and shapes
    assert [type(m) for m in fast.modules()] != [type(m) for m in ref.modules()]  # really the old code
    return fast, ref


def outputs_and_grads(model: VisionTransformer, images: torch.Tensor) -> dict[str, torch.Tensor]:
    x = images.clone().requires_grad_(True)
    out = model(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()  # a loss that weighs every logit
    return {"output": out.detach(), "input.grad": x.grad} | {
        f"{n}.grad": p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("residual, options", CASES, ids=[f"{r}-{o}" for r, o in CASES])
def test_fast_path_matches_the_reference(residual, options):
    fast, ref = build_pair(residual, options)
    images = torch.randn(3, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(5))
    got, want = outputs_and_grads(fast.train(), images), outputs_and_grads(ref.train(), images)
    assert set(got) == set(want)
    for name, value in want.items():
        assert value is not None and got[name] is not None, name
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-6, msg=name)
    assert want["output"].abs().max() > 1e-3  # a live function, not zeros
    moved = sum(value.abs().sum().item() for name, value in want.items() if name.endswith(".grad"))
    assert moved > 0


STREAM_CASES = [(r, o) for r, o in CASES if r in ("hyper_connections", "mhc")]


@pytest.fixture
def inductor():
    """The compiled kernels need inductor's CPU toolchain (a C++ compiler, Python's headers, OpenMP)."""
    if not stream_kernels.compiler_works():
        missing("torch.compile cannot build CPU kernels here", "a C++ compiler (g++) and the Python headers")


@pytest.mark.slow  # each case compiles its kernels: 25-50 s on 2 cores with a cold inductor cache
@pytest.mark.parametrize("residual, options", STREAM_CASES, ids=[f"{r}-{o}" for r, o in STREAM_CASES])
def test_compiled_stream_kernels_match_the_reference(residual, options, inductor):
    """The multi-stream passes fused by torch.compile (``stream_kernels="compiled"``) compute the reference's
    outputs and gradients too, for every option; a second batch size runs the kernels recompiled with a dynamic
    token dimension."""
    fast, ref = build_pair(residual, options)
    fast.set_stream_kernels("compiled")
    assert {m.stream_kernels for m in fast.multi_stream_sites()} == {"compiled"}
    for batch in (3, 2):
        images = torch.randn(batch, 3, TINY["img_size"], TINY["img_size"],
                             generator=torch.Generator().manual_seed(5))
        fast.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        got, want = outputs_and_grads(fast.train(), images), outputs_and_grads(ref.train(), images)
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("residual, options", [("attn_res", {}), ("mhc", {}), ("hyper_connections", {})])
def test_fast_path_matches_the_reference_with_drop_path(residual, options):
    """Stochastic depth draws the same masks in the same order in both implementations."""
    fast, ref = build_pair(residual, options, drop_path_rate=0.5)
    images = torch.randn(4, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(6))
    torch.manual_seed(11)
    got = outputs_and_grads(fast.train(), images)
    torch.manual_seed(11)
    want = outputs_and_grads(ref.train(), images)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-6, msg=name)


def test_sinkhorn_matches_the_log_domain_reference_and_its_gradient():
    """Tokens-last, exp-domain Sinkhorn vs the old log-domain one, with logits spread as far as 60 in a row."""
    logits = (torch.randn(5, 7, 4, 4, generator=torch.Generator().manual_seed(0)) * 15).requires_grad_(True)
    assert (logits.amax(-1) - logits.amin(-1)).max() > 40
    weights = torch.randn(5, 7, 4, 4, generator=torch.Generator().manual_seed(1))
    results = []
    for fn in (sinkhorn_knopp, ref_sinkhorn_knopp):
        logits.grad = None
        out = fn(logits, 20)
        (out * weights).sum().backward()
        results.append((out.detach(), logits.grad.clone()))
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-9)


def test_attn_res_standalone_call_matches_the_reference():
    """An aggregation called on a list of sources alone (no cached 1/rms) is the old formula too."""
    fast, ref = build_pair("attn_res", {})
    sources = [torch.randn(2, 5, TINY["embed_dim"], generator=torch.Generator().manual_seed(s)) for s in range(4)]
    site = fast.blocks[1].attn_res
    ref_site = ref.blocks[1].attn_res
    assert isinstance(ref_site, RefAttnRes) and not isinstance(site, RefAttnRes)
    torch.testing.assert_close(site(sources), ref_site(sources), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_stream_read_and_write_backward_pass_gradcheck(n):
    """The hand-written backward of the multi-stream read h = readᵀH and write Δ = M·H + write ⊗ f (per token)
    against finite differences in float64, on non-contiguous inputs (an expanded stream, as the first block sees)."""
    g = torch.Generator().manual_seed(n)
    leaf = torch.randn(6, 1, 5, generator=g).requires_grad_(True)
    read, write = torch.rand(6, n, generator=g).requires_grad_(True), torch.randn(6, n, generator=g).requires_grad_(True)
    mix, f = torch.randn(6, n, n, generator=g).requires_grad_(True), torch.randn(6, 5, generator=g).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, r: StreamRead.apply(x.expand(6, n, 5), r), (leaf, read))
    assert torch.autograd.gradcheck(lambda x, *a: StreamWrite.apply(x.expand(6, n, 5), *a), (leaf, mix, write, f))
    x = leaf.expand(6, n, 5)
    torch.testing.assert_close(StreamRead.apply(x, read), torch.einsum("tj,tjd->td", read, x))
    torch.testing.assert_close(StreamWrite.apply(x, mix, write, f),
                               torch.einsum("tij,tjd->tid", mix, x) + write[..., None] * f[:, None])


def test_stream_projection_backward_gradcheck():
    """mHC's projection x̃φ = (x⃗φ)/rms(x⃗) with its written-out backward, alone (an empty ``StreamGrad``) and on top
    of a gradient already in the buffer (what the site's write and read put there), against finite differences."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(2, 3, 8, generator=g).requires_grad_(True)
    weight = torch.randn(5, 8, generator=g).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v, w: StreamProjection.apply(v, w, 1e-6, StreamGrad()), (v, weight))
    other = torch.randn(6, 2, 4, generator=g)  # a stream term (T, n, D) for the same 2·3 tokens and n·D = 8

    def with_stream_term(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        grad_sum = StreamGrad()
        out = StreamProjection.apply(v, w, 1e-6, grad_sum)
        return _AddsToStreamGrad.apply(out, grad_sum, other)

    got = torch.autograd.grad(with_stream_term(v, weight).sum(), v)[0]
    want = torch.autograd.grad(StreamProjection.apply(v, weight, 1e-6, StreamGrad()).sum(), v)[0]
    torch.testing.assert_close(got, want + other.view_as(v))


class _AddsToStreamGrad(torch.autograd.Function):
    """Identity whose backward puts a fixed stream term into a ``StreamGrad`` (as the site's write does)."""

    @staticmethod
    def forward(ctx, out, grad_sum, term):
        ctx.grad_sum, ctx.term = grad_sum, term
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        ctx.grad_sum.add(ctx.term.clone())
        return grad, None, None


@pytest.mark.parametrize("residual", ["mhc", "hyper_connections"])
def test_stream_gradient_with_forward_hooks_and_a_second_backward(residual):
    """A site with forward hooks (the diagnostics) is called as a module and returns Δ: the same gradients as the
    one-pass write; and a second backward over a retained graph adds the same gradients again (the shared
    ``StreamGrad`` buffer is emptied by each pass)."""
    images = torch.randn(2, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(7))
    model = perturb(VisionTransformer(residual, {"n": 4}, init_seed=3, **(TINY | {"depth": DEPTH})), scale=0.5)
    plain = outputs_and_grads(model, images)
    model.zero_grad(set_to_none=True)
    handles = [m.register_forward_hook(lambda mod, args, out: None) for blk in model.blocks for m in (blk.ls1, blk.ls2)]
    hooked = outputs_and_grads(model, images)
    for h in handles:
        h.remove()
    for name, value in plain.items():
        torch.testing.assert_close(hooked[name], value, rtol=1e-6, atol=1e-6, msg=name)
    model.zero_grad(set_to_none=True)
    x = images.clone().requires_grad_(True)
    loss = model(x).square().sum()
    loss.backward(retain_graph=True)
    once = {n: p.grad.clone() for n, p in model.named_parameters()} | {"input": x.grad.clone()}
    loss.backward()
    twice = {n: p.grad for n, p in model.named_parameters()} | {"input": x.grad}
    for name, value in once.items():
        torch.testing.assert_close(twice[name], 2 * value, rtol=1e-6, atol=1e-9, msg=name)


def live_autograd_contexts() -> int:
    """The custom autograd Functions' nodes (their ``ctx``) alive after a full garbage collection."""
    gc.collect()
    return sum(issubclass(type(o), torch.autograd.function.BackwardCFunction) for o in gc.get_objects())


@pytest.mark.parametrize("residual", sorted(RESIDUALS))
def test_a_step_frees_its_autograd_graph(residual):
    """Once a step's loss is gone, nothing of its graph stays alive: not after backward, and not when the graph is
    dropped without one. mHC's ``StreamGrad`` held its projection's node, whose context holds the ``StreamGrad``:
    on torch 2.14 a node's Python object keeps its C++ node alive, so that cycle kept every step's graph (the bench
    measured ~50 MB more memory a step at section 11's size, freshly faulted pages that made mHC's step ~1.6x
    standard's instead of ~1.3x). Counted by the custom Functions' contexts, which every multi-stream and
    depth-aggregation site uses."""
    model = perturb(VisionTransformer(residual, LAUREL if residual == "laurel" else {}, **TINY)).train()
    images = torch.randn(2, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(4))
    before = live_autograd_contexts()
    for _ in range(2):
        model(images).sum().backward()
    model(images).sum()  # a graph dropped without its backward
    assert live_autograd_contexts() == before


def test_a_partial_backward_leaves_no_stale_stream_gradient():
    """A backward that stops short of mHC's projection (``torch.autograd.grad`` for one site's bias, retaining the
    graph) puts nothing into the site's ``StreamGrad``: the full backward after it equals a single full backward."""
    fast, ref = build_pair("mhc", {})
    images = torch.randn(2, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(8))
    want = outputs_and_grads(ref.train(), images)
    x = images.clone().requires_grad_(True)
    out = fast.train()(x)
    loss = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum()
    (partial,) = torch.autograd.grad(loss, [fast.blocks[1].ls1.b_pre], retain_graph=True)
    torch.testing.assert_close(partial, want["blocks.1.ls1.b_pre.grad"], rtol=1e-6, atol=1e-6)
    loss.backward()
    got = {"input.grad": x.grad} | {f"{n}.grad": p.grad for n, p in fast.named_parameters()}
    for name, value in got.items():
        torch.testing.assert_close(value, want[name], rtol=1e-6, atol=1e-6, msg=name)


def test_a_forward_pre_hook_that_replaces_the_streams_gets_their_gradient():
    """A pre-hook on a site that hands it other streams than the block computed the coefficients from (the
    hooked path calls the site as a module): those streams' gradient flows through the hook, not into the buffer."""
    fast, ref = build_pair("mhc", {})
    images = torch.randn(2, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(9))
    for model in (fast, ref):
        model.blocks[1].ls1.register_forward_pre_hook(lambda mod, args: (2.0 * args[0], *args[1:]))
    got, want = outputs_and_grads(fast.train(), images), outputs_and_grads(ref.train(), images)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.slow
def test_compiled_mhc_has_the_eager_gradients():
    """torch.compile (AOTAutograd, the path inductor takes; the ``aot_eager`` backend compiles no kernels) cannot
    trace the ``StreamGrad`` side channel: mHC builds none while compiling, and its gradients equal eager mode's."""
    fast, _ = build_pair("mhc", {"n": 2}, depth=2)
    fast.set_stream_kernels("compiled")  # under an outer compile the sites trace the eager kernels
    images = torch.randn(2, 3, TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(10))
    want = outputs_and_grads(fast.train(), images)
    fast.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    fast.compile(backend="aot_eager")
    got = outputs_and_grads(fast, images)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-6, msg=name)


def test_stream_kernels_auto_resolves_per_device_and_environment(monkeypatch):
    """``auto``: compiled on a CPU where inductor builds kernels, eager on a GPU or where it cannot; the environment
    variable overrides it; unknown names are one-line errors naming the choices, and no site changes on one."""
    monkeypatch.delenv(stream_kernels.ENV, raising=False)
    monkeypatch.setattr(stream_kernels, "compiler_works", lambda: True)
    assert stream_kernels.resolve("auto", "cpu") == "compiled" and stream_kernels.resolve("auto", "cuda") == "eager"
    assert stream_kernels.resolve("eager", "cpu") == "eager" and stream_kernels.resolve("compiled", "cuda") == "compiled"
    monkeypatch.setattr(stream_kernels, "compiler_works", lambda: False)
    assert stream_kernels.resolve("auto", "cpu") == "eager"
    monkeypatch.setenv(stream_kernels.ENV, "compiled")
    assert stream_kernels.resolve("auto", "cuda") == "compiled"
    monkeypatch.setenv(stream_kernels.ENV, "fast")
    with pytest.raises(ValueError, match="ABLATIONS_STREAM_KERNELS='fast' is not one of: eager, compiled"):
        stream_kernels.resolve("auto", "cpu")
    with pytest.raises(ValueError, match="'fused' is not one of: auto, eager, compiled"):
        stream_kernels.resolve("fused", "cpu")
    model, _ = build_pair("mhc", {}, depth=1)
    with pytest.raises(ValueError, match="not one of: eager, compiled"):
        model.set_stream_kernels("fused")
    assert {m.stream_kernels for m in model.multi_stream_sites()} == {"eager"}


def test_a_toolchain_that_cannot_compile_means_eager_kernels(monkeypatch):
    """A C++ compiler alone is not enough (a missing Python.h fails the first compile): ``compiler_works``
    compiles a probe, and a failure warns once and gives False, so ``auto`` trains with the eager kernels."""
    monkeypatch.setattr(stream_kernels, "cpp_compiler", lambda: "/usr/bin/g++")

    def broken(fn, **kw):
        def call(*args):
            raise RuntimeError("fatal error: Python.h: No such file or directory\ncompilation terminated.")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    stream_kernels.compiler_works.cache_clear()
    try:
        with pytest.warns(UserWarning, match="cannot build CPU kernels here .*Python.h.*eager kernels"):
            assert stream_kernels.compiler_works() is False
    finally:
        stream_kernels.compiler_works.cache_clear()
    monkeypatch.setattr(stream_kernels, "cpp_compiler", lambda: None)
    assert stream_kernels.compiler_works() is False
    stream_kernels.compiler_works.cache_clear()


@pytest.mark.slow  # compiles the four kernels
def test_compiled_kernels_alone_match_the_eager_ones_in_every_case(inductor):
    """Each compiled kernel against its eager form in float64: backward with and without a gradient already in
    the buffer and without one for x (``need_x`` False), n = 1, 2, 4 and two token counts, and each really ran
    compiled (dynamo made graphs for them, with n static)."""
    from torch._dynamo.utils import counters

    compiled, eager = stream_kernels.compiled(), stream_kernels.EAGER
    graphs = counters["stats"]["unique_graphs"]
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 4):
        for tokens in (7, 12):
            x, grad = torch.randn(tokens, n, 5, generator=g), torch.randn(tokens, n, 5, generator=g)
            read, write, mix = torch.rand(tokens, n, generator=g), torch.rand(tokens, n, generator=g), torch.randn(
                tokens, n, n, generator=g)
            f, h_grad = torch.randn(tokens, 5, generator=g), torch.randn(tokens, 5, generator=g)
            torch.testing.assert_close(compiled.read_forward(x, read), eager.read_forward(x, read))
            torch.testing.assert_close(compiled.write_forward(x, mix, write, f), eager.write_forward(x, mix, write, f))
            for need_x in (True, False):
                for total in (None, torch.randn(tokens, n, 5, generator=g)):
                    got = compiled.read_backward(x, read, h_grad, copy(total), need_x)
                    want = eager.read_backward(x, read, h_grad, copy(total), need_x)
                    assert (got[0] is None) == (want[0] is None) == (not need_x)
                    torch.testing.assert_close(got, want)
                    got = compiled.write_backward(x, mix, write, f, grad, copy(total), need_x)
                    want = eager.write_backward(x, mix, write, f, grad, copy(total), need_x)
                    torch.testing.assert_close(got, want)
    assert counters["stats"]["unique_graphs"] > graphs


def copy(t: torch.Tensor | None) -> torch.Tensor | None:
    """A fresh copy of a buffer the eager kernels add into in place (None stays None)."""
    return None if t is None else t.clone()


CACHE_CHECK = """
import torch
from lit_modules.residual import stream_kernels as sk
g = torch.Generator().manual_seed(0)
T, n, D = 2080, 4, 192  # the issue's size: smaller ones did not show the fault
x, grad, total = (torch.randn(T, n, D, generator=g) for _ in range(3))
mix, write, f = torch.rand(T, n, n, generator=g), torch.rand(T, n, generator=g), torch.randn(T, D, generator=g)
got = sk.compiled().write_backward(x, mix, write, f, grad, total.clone(), True)
want = sk.EAGER.write_backward(x, mix, write, f, grad, total.clone(), True)
for a, b in zip(got, want):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
print("same")
"""


@pytest.mark.slow  # three processes that compile
def test_compiled_kernels_of_another_vector_width_are_not_taken_from_the_cache(tmp_path, inductor):
    """inductor's on-disk cache key did not hold the vector width that ``ATEN_CPU_CAPABILITY`` caps: on one
    machine, AVX-512 code loaded under ``ATEN_CPU_CAPABILITY=avx2`` computed wrong gradients and AVX2 code loaded
    uncapped corrupted the heap. The compiled kernels make the width explicit (``cpp.simdlen``), so processes with
    and without the cap can share one cache. (On a CPU without AVX-512 both widths are AVX2: the test then only
    checks the kernels.)"""
    import os
    import subprocess
    import sys

    for cap in ("", "avx2", ""):
        env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "ATEN_CPU_CAPABILITY": cap}
        proc = subprocess.run([sys.executable, "-c", CACHE_CHECK], env=env, capture_output=True, text=True,
                              timeout=600, cwd=Path(__file__).resolve().parents[1])
        assert proc.returncode == 0 and proc.stdout.strip() == "same", (cap, proc.stdout[-2000:], proc.stderr[-2000:])
