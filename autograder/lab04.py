"""Checks for Lab 04, FlashAttention in Triton.

Each check takes the learner's function, runs it on small seeded inputs (Triton kernels in the interpreter
on a CPU) and raises AssertionError saying what is wrong (which shape, how far off, the likely cause).

CPU tier (correctness, and the method where the exercise teaches one):
    check_online_softmax(fn)          fn(x (..., N), block_size) -> softmax(x); every reduction (max, sum, softmax)
                                      sees at most block_size columns; fp16 input, very negative rows
    check_tiled_attention(fn)         fn(q, k, v, causal, block_k) -> (out, lse), PyTorch, tiled over keys: no
                                      (Tq x Tk) tensor ever held, no fused attention call
    check_tiled_backward(fn)          fn(q, k, v, out, lse, d_out, causal) -> (dq, dk, dv) from the saved LSE: no
                                      (Tq x Tk) tensor held (key tiles of at most 16), no autograd
    check_flash_forward(fn)           fn(q, k, v, causal) -> (out, lse), must launch a Triton kernel
    check_merge_partials(fn)          fn(o_part (..., S, D), lse_part (..., S)) -> (..., D)
    check_paged_decode(fn)            fn(q, k_pool, v_pool, block_tables, seq_lens) -> (B, Hq, D), Triton
Interview questions: check_q1_online_state, check_q2_naive_hbm_bytes, check_q3_hbm_ratio.
Every check refuses the package's reference handed in (reference_guard: minigpt.kernels.* itself, a thin wrapper
calling it, or, for the Triton checks, a launch of one of the package's kernels).
GPU tier (speed, memory; behind autograder.harness.require_gpu):
    check_flash_speed(fn), check_paged_decode_speed(fn), check_flash_memory(fn)
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import torch

import minigpt.kernels  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before any kernel is built)
from autograder.harness import call_learner, check_answer, quiet
from autograder.reference_guard import no_calls_into, own_work
from autograder.tensor_trace import TensorTrace
from minigpt.attention import naive_attention
from minigpt.cache.paged_attention import paged_decode_attention
from minigpt.kernels import online_softmax as ref_online
from minigpt.kernels.flash_attention import FlashAttentionFunction, flash_attention, flash_attention_forward
from minigpt.kernels.paged_decode import (gather_then_sdpa, merge_partials, paged_decode, paged_decode_partials,
                                          random_paged_inputs)
from minigpt.kernels.tiled_attention import (attention_lse, tiled_attention, tiled_attention_backward,
                                             tiled_attention_forward)

__all__ = ["check_online_softmax", "check_tiled_attention", "check_tiled_backward", "check_flash_forward",
           "check_merge_partials", "check_paged_decode", "check_q1_online_state", "check_q2_naive_hbm_bytes",
           "check_q3_hbm_ratio", "check_flash_speed", "check_paged_decode_speed", "check_flash_memory",
           "ATTENTION_CASES", "PAGED_CASES", "FLASH_SPEED_CHECK", "DECODE_SPEED_CHECK", "MEMORY_CHECK",
           "growth_per_doubling", "Q1_BLOCKS", "Q2_SHAPE",
           "count_triton_launches"]

# GPU thresholds, calibrated per GPU class by `make calibrate` (autograder/calibrate.py; files
# autograder/calibration/<check>.<device class>.json): the learner's speedup over the baseline must reach a fraction
# of the reference kernel's speedup measured in the same run; the memory check bounds the growth per doubling of T.
FLASH_SPEED_CHECK = "lab04_flash_speed"        # slow: 16 x 16 tiles; naive attention itself
DECODE_SPEED_CHECK = "lab04_paged_decode_speed"  # slow: one program per sequence (no split); PyTorch paged attention
MEMORY_CHECK = "lab04_flash_memory"            # slow: naive attention (O(T^2) scores)

# (B, Hq, Hkv, Tq, Tk, D, causal, what): awkward shapes, small enough for the interpreter
ATTENTION_CASES = [
    (1, 2, 2, 1, 1, 8, True, "T = 1"),
    (2, 2, 2, 37, 37, 16, True, "causal prefill, T = 37 not a multiple of the tile, MHA (group 1)"),
    (1, 4, 2, 5, 29, 8, True, "Tq = 5 < Tk = 29 (bottom-right causal mask), GQA group 2"),
    (1, 8, 1, 3, 40, 16, True, "Tq = 3 < Tk = 40, GQA group 8 (one KV head)"),
    (1, 4, 2, 20, 33, 24, False, "non-causal, Tq = 20, Tk = 33, head_dim 24, GQA group 2"),
]
# (B, Hq, Hkv, D, block_size, seq_lens, what)
PAGED_CASES = [
    (3, 4, 2, 16, 16, [1, 37, 70], "seq_lens 1, 37, 70 (partial last pages), GQA group 2"),
    (2, 8, 1, 16, 8, [5, 100], "seq_lens 5 and 100, pages of 8, GQA group 8"),
    (2, 2, 2, 8, 16, [16, 33], "seq_lens 16 (one full page) and 33, group 1"),
]
TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _qkv(B: int, Hq: int, Hkv: int, Tq: int, Tk: int, D: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, Tq, D, generator=g).to(dtype), torch.randn(B, Hkv, Tk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Tk, D, generator=g).to(dtype))


def _full_attention(q, k, v, causal: bool):
    """float64 reference (out, lse) with the bottom-right causal mask."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = q.double() @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        Tq, Tk = q.shape[2], k.shape[2]
        s = s.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    return got.shape == want.shape and bool(torch.isfinite(got).all()) and torch.allclose(
        got.double(), want.double(), atol=tol, rtol=tol)


def _err(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} instead of {tuple(want.shape)}"
    if not torch.isfinite(got).all():
        return "non-finite values (inf / nan)"
    return f"max abs error {(got.double() - want.double()).abs().max().item():.3g}"


# ---------------------------------------------------------------------------------------------------
# Online softmax on a vector
# ---------------------------------------------------------------------------------------------------

ONLINE_SOFTMAX = "Exercise 1 (online_softmax)"
# Reductions a block-by-block pass may only apply to one block (at most block_size columns) at a time.
_REDUCTIONS = ("amax", "max", "sum", "nansum", "mean", "logsumexp", "softmax", "log_softmax", "special_logsumexp",
               "cumsum", "sort", "topk", "amin", "min", "norm", "prod")


def check_online_softmax(fn: Callable) -> None:
    """fn(x (..., N), block_size) -> softmax(x, -1), computed with the running max / denominator: every reduction
    (max, sum, softmax, logsumexp, ...) it applies sees at most block_size columns."""
    own_work(fn, ref_online.online_softmax, what=ONLINE_SOFTMAX)
    g = torch.Generator().manual_seed(1)
    cases = [((4, 10), 3, 1.0, "N = 10 in blocks of 3 (short last block)"),
             ((2, 64), 16, 1.0, "N = 64 in blocks of 16"),
             ((3, 1), 4, 1.0, "N = 1"),
             ((2, 33), 8, 100.0, "large scores (|x| up to ~300): exp overflows without the running max"),
             ((1, 12), 4, 1.0, "increasing scores: the max changes in every block"),
             ((2, 40), 8, 1.0, "very negative scores (about -1e4): exp underflows to 0 without the running max"),
             ((3, 24), 8, 1.0, "float16 input: the result in float16")]
    for shape, block, scale, what in cases:
        x = torch.randn(*shape, generator=g) * scale
        if what.startswith("increasing"):
            x = torch.arange(12.0)[None] * 2
        if what.startswith("very negative"):
            x = x - 1e4
        if what.startswith("float16"):
            x = x.half()
        with TensorTrace() as trace, no_calls_into(ref_online.online_softmax, ref_online.OnlineSoftmaxState,
                                                   ref_online.online_softmax_trace, what=ONLINE_SOFTMAX):
            got = call_learner("online_softmax", fn, x.clone(), block, context=what)
        want = torch.softmax(x.double(), -1)
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{what}: expected a tensor, got {type(got).__name__}")
        if got.dtype != x.dtype:
            raise AssertionError(f"{what}: the result must be in the input's dtype {x.dtype}, got {got.dtype}")
        whole = [c for c in trace.calls_named(*_REDUCTIONS) if c.inputs and c.inputs[0] and c.inputs[0][-1] > block]
        if whole:
            raise AssertionError(f"{what}: {whole[0].name} ran on a tensor of shape {whole[0].inputs[0]}, wider than one "
                                 f"block ({block} columns): the online softmax reads x one block at a time, keeping "
                                 "only the running max m and denominator l between blocks (torch.softmax, or a max "
                                 "over the whole row, is the two-pass method the exercise replaces)")
        if not _close(got, want, 1e-5 if x.dtype == torch.float32 else 1e-3):
            hint = ""
            if not torch.isfinite(got).all():
                hint = " Subtract the running max before exp (m_new = max(m_old, max(block)))."
            elif got.shape == want.shape and not torch.allclose(got.double().sum(-1), torch.ones(shape[0],
                                                                dtype=torch.float64), atol=1e-4):
                hint = (" The rows do not sum to 1: when the max grows, multiply the old denominator by "
                        "exp(m_old - m_new) before adding the new block's sum; and cover the short last block.")
            raise AssertionError(f"{what}: {_err(got, want)} against torch.softmax.{hint}")


# ---------------------------------------------------------------------------------------------------
# Tiled attention forward (PyTorch)
# ---------------------------------------------------------------------------------------------------

TILED_FORWARD = "Exercise 2 (tiled_attention)"
TILED_BACKWARD = "Exercise 3 (tiled_backward)"
BACKWARD_TILE = 16       # the backward's key tiles: at most this many keys (the check's sequences have up to 40)
# Attention done for the learner (a fused kernel, or the reference's own functions): refused in the tiled exercises.
_FUSED = ("scaled_dot_product_attention", "flash_attention", "efficient_attention")
_ATTENTION_REFERENCES = (tiled_attention_forward, tiled_attention, attention_lse, tiled_attention_backward,
                         FlashAttentionFunction.forward, FlashAttentionFunction.backward, flash_attention,
                         flash_attention_forward, naive_attention)


def _full_scores(trace: TensorTrace, Tq: int, Tk: int, tile: int) -> tuple[int, ...] | None:
    """The first (.., Tq, Tk) or (.., Tk, Tq) tensor the traced code held, when Tk is more than one tile."""
    if Tk <= tile:
        return None
    return next((s for s in trace.shapes() if len(s) >= 2 and sorted(s[-2:]) == sorted((Tq, Tk))), None)


def _method(trace: TensorTrace, Tq: int, Tk: int, tile: int, what: str, exercise: str) -> None:
    fused = trace.calls_named(*_FUSED)
    if fused:
        raise AssertionError(f"{what}: {exercise} calls {fused[0].name}: compute the attention yourself, tile by tile")
    full = _full_scores(trace, Tq, Tk, tile)
    if full:
        raise AssertionError(f"{what}: {exercise} held a tensor of shape {full}, the whole ({Tq} x {Tk}) score (or "
                             f"mask, or probability) matrix; with key tiles of {tile} no tensor ever needs more than "
                             f"{tile} keys per query: build scores, masks and P one key tile at a time")


def check_tiled_attention(fn: Callable) -> None:
    """fn(q (B,Hq,Tq,D), k, v (B,Hkv,Tk,D), causal, block_k) -> (out (B,Hq,Tq,D), lse (B,Hq,Tq)), reading keys
    block_k at a time: no (Tq x Tk) tensor is ever held (recorded by a TorchFunctionMode), no fused attention."""
    own_work(fn, _ATTENTION_REFERENCES, what=TILED_FORWARD)
    for B, Hq, Hkv, Tq, Tk, D, causal, what in ATTENTION_CASES:
        for block_k in (8, 16):
            q, k, v = _qkv(B, Hq, Hkv, Tq, Tk, D, seed=block_k)
            with TensorTrace() as trace, no_calls_into(*_ATTENTION_REFERENCES, what=TILED_FORWARD):
                got = call_learner("tiled_attention", fn, q.clone(), k.clone(), v.clone(), causal, block_k,
                                   context=f"{what}, block_k {block_k}")
            _method(trace, Tq, Tk, block_k, f"{what}, block_k = {block_k}", "tiled_attention")
            _compare_out_lse(got, q, k, v, causal, f"{what}, block_k = {block_k}", TOL[torch.float32])


def _compare_out_lse(got: Any, q, k, v, causal: bool, what: str, tol: float) -> None:
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise AssertionError(f"{what}: return a tuple (out, lse) of tensors, got {type(got).__name__}")
    out, lse = got
    want, want_lse = _full_attention(q, k, v, causal)
    if not _close(out, want, tol):
        raise AssertionError(f"{what}: output {_err(out, want)}.{_diagnose(out, q, k, v, causal, tol)}")
    if not _close(lse, want_lse, 1e-4):
        hint = _lse_mistake(lse, q, k, causal)
        raise AssertionError(f"{what}: lse {_err(lse, want_lse)} against logsumexp of the masked scores.{hint}")


def _masked_scores(q, k, causal: bool, scale: float | None = None) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(group, 1).transpose(-2, -1)
    s = s * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        Tq, Tk = q.shape[2], k.shape[2]
        s = s.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool, device=s.device).tril(Tk - Tq), -math.inf)
    return s


def _lse_mistake(lse: torch.Tensor, q, k, causal: bool) -> str:
    """Name the mistake when the output is right and the LSE is not (the known wrong variants)."""
    s = _masked_scores(q.cpu(), k.cpu(), causal)
    want, m = torch.logsumexp(s, -1), s.amax(-1)
    log_l, ln2 = want - m, math.log(2)
    variants = {
        "log2": (want / ln2, " Your LSE is in log2 units (m2 + log2(l), as the exp2 kernel computes it): convert it "
                             "to natural log, LSE = ln(2) * m2 + ln(l)."),
        "max_log2": (m / ln2 + log_l, " The running max is still in log2 units (scores scaled by log2(e) / sqrt(D) "
                                      "for exp2): LSE = ln(2) * m2 + ln(l)."),
        "no_max": (log_l, " The LSE is m + log(l) with m the running max of the scaled scores: log(l) alone misses "
                          "the max that l is relative to."),
        "scale_1_over_d": (torch.logsumexp(_masked_scores(q.cpu(), k.cpu(), causal, 1 / q.shape[-1]), -1),
                           " The LSE is of scores scaled by 1/D: the scale is 1/sqrt(D), for the LSE as for P."),
        "unscaled": (torch.logsumexp(_masked_scores(q.cpu(), k.cpu(), causal, 1.0), -1),
                     " The LSE is of unscaled scores q.k: scale them by 1/sqrt(D) first."),
    }
    for candidate, hint in variants.values():
        if _close(lse.cpu(), candidate, 1e-4):
            return hint
    return " The LSE is m + log(l): the running max of the scaled, masked scores plus the log of the denominator."


def _diagnose(out: torch.Tensor, q, k, v, causal: bool, tol: float) -> str:
    """Name the likely mistake by comparing with the known wrong variants."""
    Tq, Tk = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    if out.shape != q.shape or not torch.isfinite(out).all():
        return " Mask the tail (keys past Tk) before the max, and keep -inf rows out of exp(-inf - -inf)."
    vg = v.double().repeat_interleave(group, 1)
    for scale, hint in ((1 / q.shape[-1], " The scores are scaled by 1/D: the scale is 1/sqrt(D)."),
                        (1.0, " The scores are not scaled: multiply q.k by 1/sqrt(D).")):
        if _close(out.cpu(), torch.softmax(_masked_scores(q.cpu(), k.cpu(), causal, scale), -1) @ vg.cpu(), tol):
            return hint
    if causal and Tq < Tk:
        s = _scores(q, k.repeat_interleave(group, 1))
        tl_out = torch.softmax(s.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool).tril(), -math.inf), -1) @ \
            v.double().repeat_interleave(group, 1)
        if _close(out, tl_out, tol):
            return (" Your causal mask is aligned top-left; with Tq < Tk query i sits at position Tk - Tq + i and "
                    "sees keys j <= i + Tk - Tq (bottom-right).")
    if group > 1:
        wrong, _ = _full_attention(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1), causal)
        if _close(out, wrong, tol):
            return (f" Query head h must read KV head h // {group} (consecutive query heads share a KV head), not "
                    f"h % {k.shape[1]}: use repeat_interleave, not repeat.")
    return (" Likely causes: the accumulator and denominator not rescaled by exp(m_old - m_new) when the max grows; "
            "dividing by the denominator inside the loop instead of once after the last tile; the last key tile "
            f"(Tk = {Tk} is not a multiple of the tile) read without masking keys >= Tk to -inf.")


def _scores(q, k) -> torch.Tensor:
    return q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])


# ---------------------------------------------------------------------------------------------------
# Backward from the saved LSE (PyTorch)
# ---------------------------------------------------------------------------------------------------

def check_tiled_backward(fn: Callable) -> None:
    """fn(q, k, v, out, lse, d_out, causal) -> (dq, dk, dv), equal to autograd of naive attention (float64), computed
    from the saved LSE one key tile (at most BACKWARD_TILE keys) at a time: no (Tq x Tk) tensor, no autograd."""
    own_work(fn, _ATTENTION_REFERENCES, what=TILED_BACKWARD)
    for B, Hq, Hkv, Tq, Tk, D, causal, what in ATTENTION_CASES:
        q, k, v = (t.double().requires_grad_() for t in _qkv(B, Hq, Hkv, Tq, Tk, D, seed=7))
        out, lse = _full_attention(q, k, v, causal)
        d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
        out.backward(d_out)
        args = (q.detach().clone(), k.detach().clone(), v.detach().clone(), out.detach().clone(),
                lse.detach().clone(), d_out.clone(), causal)
        with TensorTrace() as trace, no_calls_into(*_ATTENTION_REFERENCES, what=TILED_BACKWARD):
            got = call_learner("tiled_backward", fn, *args, context=what)
        if trace.grad_used:
            raise AssertionError(f"{what}: tiled_backward used autograd (requires_grad / backward / autograd.grad): "
                                 "the exercise is the backward pass by hand, dV = P^T dO, dS = P * (dP - delta), "
                                 "dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D), with P recomputed from the LSE")
        _method(trace, Tq, Tk, BACKWARD_TILE, what, "tiled_backward")
        if not (isinstance(got, tuple) and len(got) == 3):
            raise AssertionError(f"{what}: return a tuple (dq, dk, dv), got {type(got).__name__}")
        for name, g_, t in zip(("dq", "dk", "dv"), got, (q, k, v)):
            if not isinstance(g_, torch.Tensor) or not _close(g_, t.grad, 1e-6):
                err = _err(g_, t.grad) if isinstance(g_, torch.Tensor) else type(g_).__name__
                hint = {"dq": " dS = P * (dP - delta) with delta = rowsum(dO * O); dQ = dS K / sqrt(D).",
                        "dk": " dK = dS^T Q / sqrt(D), summed over the query heads of each KV head's group.",
                        "dv": " dV = P^T dO with P = exp(s - lse) (the saved LSE normalises P), summed over the group."}[name]
                raise AssertionError(f"{what}: {name} {err} against autograd of naive attention.{hint}")


# ---------------------------------------------------------------------------------------------------
# Triton: the forward kernel and the paged decode kernel
# ---------------------------------------------------------------------------------------------------

class Launches(list):
    """[number of Triton launches]; `.kernels`: the Python function of each kernel launched."""

    def __init__(self) -> None:
        super().__init__([0])
        self.kernels: list[Callable] = []


@contextlib.contextmanager
def count_triton_launches() -> Iterator[Launches]:
    """Count Triton kernel launches (compiled or interpreted) inside the block: yields a one-item list, whose
    `.kernels` names the kernels launched."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    counter = Launches()
    originals = {cls: cls.run for cls in (InterpretedFunction, JITFunction)}

    def wrap(original):
        def run(self, *args, **kwargs):
            counter[0] += 1
            if getattr(self, "fn", None) is not None and self.fn not in counter.kernels:
                counter.kernels.append(self.fn)
            return original(self, *args, **kwargs)
        return run

    try:
        for cls, original in originals.items():
            cls.run = wrap(original)
        yield counter
    finally:
        for cls, original in originals.items():
            cls.run = original


def own_kernels(launches: Launches, what: str) -> None:
    """Refuse a launch of one of the package's Triton kernels (the reference's kernel behind your launcher)."""
    for kernel in launches.kernels:
        own_work(kernel, (), what=what)


FLASH_FORWARD = "Exercise 4 (the forward kernel)"
_PAGED_REFERENCES = (paged_decode, paged_decode_partials, paged_decode_attention, gather_then_sdpa)
PAGED_DECODE = "Exercise 6 (the paged decode kernel)"
MERGE = "Exercise 5 (merge_partials)"


def check_flash_forward(fn: Callable, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16)) -> None:
    """fn(q, k, v, causal) -> (out, lse) through a Triton kernel of the notebook's (not the package's); CPU tensors
    run in the interpreter."""
    own_work(fn, _ATTENTION_REFERENCES, what=FLASH_FORWARD)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    first = True
    for dtype in dtypes:
        for B, Hq, Hkv, Tq, Tk, D, causal, what in ATTENTION_CASES:
            q, k, v = (t.to(device) for t in _qkv(B, Hq, Hkv, Tq, Tk, D, dtype=dtype, seed=3))
            # the first case also refuses a call into the reference (profiling every case in the interpreter would
            # double the check's time); every launch is checked to be the notebook's kernel
            guard = no_calls_into(*_ATTENTION_REFERENCES, what=FLASH_FORWARD) if first else contextlib.nullcontext()
            with count_triton_launches() as launches, guard:
                got = call_learner("flash_forward", fn, q, k, v, causal, context=f"{what}, {dtype}")
            first = False
            if not launches[0]:
                raise AssertionError(f"{what}: flash_forward launched no Triton kernel; write the forward pass as "
                                     "a @triton.jit kernel and launch it over a grid")
            own_kernels(launches, FLASH_FORWARD)
            if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.Tensor) and got[0].dtype != dtype:
                raise AssertionError(f"{what}: the output must be in the input dtype {dtype}, got {got[0].dtype}")
            _compare_out_lse(tuple(t.cpu() for t in got) if isinstance(got, tuple) else got,
                             q.cpu(), k.cpu(), v.cpu(), causal, f"{what}, {dtype}", TOL[dtype])


def check_merge_partials(fn: Callable) -> None:
    """fn(o_part (..., S, D), lse_part (..., S)) -> (..., D): the per-split results merged with LSE weights."""
    own_work(fn, merge_partials, what=MERGE)
    g = torch.Generator().manual_seed(5)
    for shape, what in (((2, 3, 4, 8), "4 splits"), ((1, 2, 1, 8), "a single split"),
                        ((2, 2, 5, 4), "5 splits, some empty (lse = -inf)")):
        # build partials from real attention over random chunks, so the answer is known
        *lead, S, D = shape
        scores = torch.randn(*lead, S, 6, generator=g, dtype=torch.float64) * 3
        values = torch.randn(*lead, S, 6, D, generator=g, dtype=torch.float64)
        if "empty" in what:
            scores[..., 1, :] = -math.inf
            scores[..., 3, :] = -math.inf
        lse_part = torch.logsumexp(scores, -1)
        p = torch.softmax(scores, -1).nan_to_num(0.0)
        o_part = (p.unsqueeze(-1) * values).sum(-2)
        flat = scores.flatten(-2)
        want = (torch.softmax(flat, -1).unsqueeze(-1) * values.flatten(-3, -2)).sum(-2)
        with no_calls_into(merge_partials, what=MERGE):
            got = call_learner("merge_partials", fn, o_part.float(), lse_part.float(), context=what)
        if not isinstance(got, torch.Tensor) or not _close(got, want, 1e-5):
            err = _err(got, want) if isinstance(got, torch.Tensor) else type(got).__name__
            raise AssertionError(f"{what}: merged output {err}. Weight split s by exp(lse_s - logsumexp(lse)): "
                                 "a plain mean of the partial outputs ignores how much softmax mass each split holds, "
                                 "and an empty split (lse = -inf) must get weight 0, not NaN.")


def _paged(B, Hq, Hkv, D, block_size, lens, dtype=torch.float32, device="cpu"):
    return random_paged_inputs(lens, n_heads=Hq, n_kv_heads=Hkv, head_dim=D, block_size=block_size, dtype=dtype,
                               device=device, extra_blocks=1, num_blocks=48)


def check_paged_decode(fn: Callable, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16)) -> None:
    """fn(q (B,Hq,D), k_pool, v_pool (num_blocks, block_size, Hkv, D), block_tables (B, max_blocks) int32,
    seq_lens (B,) int32) -> (B, Hq, D), through a Triton kernel of the notebook's, equal to gather-then-attend."""
    own_work(fn, _PAGED_REFERENCES, what=PAGED_DECODE)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    first = True
    for dtype in dtypes:
        for B, Hq, Hkv, D, bs, lens, what in PAGED_CASES:
            args = _paged(B, Hq, Hkv, D, bs, lens, dtype, device=device)
            guard = no_calls_into(*_PAGED_REFERENCES, what=PAGED_DECODE) if first else contextlib.nullcontext()
            with count_triton_launches() as launches, guard:          # the first case only, as in check_flash_forward
                got = call_learner("paged_decode", fn, *(a.clone() for a in args), context=f"{what}, {dtype}")
            first = False
            if not launches[0]:
                raise AssertionError(f"{what}: paged_decode launched no Triton kernel")
            own_kernels(launches, PAGED_DECODE)
            cpu = [a.cpu() for a in args]
            want = paged_decode_attention(*(a.double() if a.is_floating_point() else a for a in cpu))
            if not isinstance(got, torch.Tensor) or not _close(got.cpu(), want, TOL[dtype]):
                err = _err(got.cpu(), want) if isinstance(got, torch.Tensor) else type(got).__name__
                raise AssertionError(f"{what}, {dtype}: {err} against gather-then-attend. Check: physical block = "
                                     "block_tables[b, page]; mask the slots of the last page past seq_len; query head "
                                     "h reads KV head h // group; merge the splits with their LSE weights.")


# ---------------------------------------------------------------------------------------------------
# Interview questions
# ---------------------------------------------------------------------------------------------------

Q1_BLOCKS = ([2.0, 1.0], [4.0, 0.0])          # score blocks, in the order they are read
Q2_SHAPE = dict(batch=1, heads=32, seq_len=4096, head_dim=128, bytes_per_element=2)


def check_q1_online_state(answer: Any) -> None:
    """Running denominator l after both blocks of Q1_BLOCKS (relative to the running max)."""
    b1, b2 = Q1_BLOCKS
    m1 = max(b1)
    l1 = sum(math.exp(x - m1) for x in b1)
    m2 = max(m1, max(b2))
    l2 = l1 * math.exp(m1 - m2) + sum(math.exp(x - m2) for x in b2)
    no_rescale = l1 + sum(math.exp(x - m2) for x in b2)
    absolute = sum(math.exp(x) for x in b1 + b2)
    check_answer(answer, l2, "Q1 (running denominator l after both blocks)",
                 {no_rescale: "the first block's l was not multiplied by exp(m_old - m_new) when the max grew.",
                  absolute: "that is sum exp(x) without subtracting the running max.",
                  math.log(l2) + m2: "that is the log-sum-exp m + log(l), not l."},
                 unit="a plain number (l, relative to the running max)", rel=1e-4)


def _naive_bytes(s: dict) -> int:
    return s["batch"] * s["heads"] * s["bytes_per_element"] * (4 * s["seq_len"] * s["head_dim"] + 4 * s["seq_len"] ** 2)


def _flash_bytes(s: dict) -> int:
    return s["batch"] * s["heads"] * s["bytes_per_element"] * 4 * s["seq_len"] * s["head_dim"]


def check_q2_naive_hbm_bytes(answer: Any) -> None:
    """HBM bytes of three-kernel naive attention (write S, read S, write P, read P, plus Q, K, V, O) for Q2_SHAPE."""
    s = Q2_SHAPE
    want = _naive_bytes(s)
    bhe = s["batch"] * s["heads"] * s["bytes_per_element"]
    T, D = s["seq_len"], s["head_dim"]
    check_answer(answer, want, "Q2 (HBM bytes, naive attention)",
                 {bhe * (4 * T * D + 2 * T * T): "counted the (T x T) matrix twice; S is written and read, then P "
                                                 "is written and read: 4 T^2 elements per head.",
                  bhe * 4 * T * T: "left out reading Q, K, V and writing O (4 T D elements per head).",
                  want // s["bytes_per_element"]: "that is elements, not bytes (fp16: 2 bytes each).",
                  want * 2: "fp16 is 2 bytes per element, not 4."},
                 unit="bytes", hint="Per head: (4 T D + 4 T^2) elements of 2 bytes.")


def check_q3_hbm_ratio(answer: Any) -> None:
    """naive / flash HBM bytes for Q2_SHAPE (flash: Q, K, V read once, O written once; LSE ignored)."""
    s = Q2_SHAPE
    want = _naive_bytes(s) / _flash_bytes(s)
    check_answer(answer, want, "Q3 (naive / flash HBM traffic)",
                 {_flash_bytes(s) / _naive_bytes(s): "inverted: naive over flash.",
                  s["seq_len"] / s["head_dim"]: "forgot the Q, K, V, O traffic naive attention also has (ratio = 1 + T / D)."},
                 unit="a ratio", rel=1e-3)


# ---------------------------------------------------------------------------------------------------
# GPU tier: speed and memory (call behind require_gpu). `device="cpu"` and small shapes run the same code with
# the kernels in Triton's interpreter (tests); grading uses the GPU and the default shapes.
# ---------------------------------------------------------------------------------------------------

def check_flash_speed(fn: Callable, *, seq_len: int = 4096, head_dim: int = 64, batch: int = 4, heads: int = 32,
                      device: str = "cuda", rounds: int = 5) -> dict:
    """Learner's fn(q, k, v, causal) speedup over naive attention >= the calibrated fraction (FLASH_SPEED_CHECK)
    of the reference kernel's, fp16, causal, timed in interleaved rounds. On a GPU whose free memory cannot hold
    naive attention's temporaries (3 fp32 copies of B x H x T x T scores: 26 GB at the default shape) the batch is
    halved until they fit; the result says which batch was timed."""
    from autograder.gpu_bench import fits, free_bytes, naive_attention_bytes
    from autograder.thresholds import threshold
    from minigpt.attention import naive_attention
    from minigpt.timing import bench_interleaved, device_class

    fraction = threshold(FLASH_SPEED_CHECK, device_class(device))
    if torch.device(device).type == "cuda":
        while batch > 1 and not fits(naive_attention_bytes(batch, heads, seq_len, seq_len), free_bytes(device)):
            batch //= 2
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=device, generator=g).half() for _ in range(3))
    with quiet():
        out = call_learner("your forward kernel at the benchmark shape", fn, q, k, v, True)[0]
        want = flash_attention_forward(q, k, v, causal=True)[0]
    if not torch.allclose(out.float(), want.float(), atol=1e-2, rtol=1e-2):
        raise AssertionError("the kernel's output differs from the reference at the benchmark shape")
    with quiet():
        times = bench_interleaved({"naive": lambda: naive_attention(q, k, v), "learner": lambda: fn(q, k, v, True),
                                   "reference": lambda: flash_attention_forward(q, k, v, causal=True)},
                                  rounds=rounds, device=device)
    learner, ref = times["naive"] / times["learner"], times["naive"] / times["reference"]
    need = fraction * ref
    if learner < need:
        raise AssertionError(f"forward kernel speedup over naive attention {learner:.2f}x; the reference reaches "
                             f"{ref:.2f}x here and {need:.2f}x is needed. Skip fully masked tiles, keep the tiles in "
                             "fp16 for tl.dot, and do not re-read Q inside the loop.")
    return {"speedup": learner, "reference_speedup": ref, "threshold": need, "batch": batch,
            "times_ms": {n: t * 1e3 for n, t in times.items()}}


def check_paged_decode_speed(fn: Callable, *, batch: int = 32, context: int = 8192, heads: int = 32,
                             kv_heads: int = 8, head_dim: int = 128, block_size: int = 16, device: str = "cuda",
                             rounds: int = 5) -> dict:
    """Learner's paged decode speedup over gather-then-SDPA >= the calibrated fraction (DECODE_SPEED_CHECK) of the
    reference kernel's, fp16, timed in interleaved rounds."""
    from autograder.thresholds import threshold
    from minigpt.timing import bench_interleaved, device_class

    fraction = threshold(DECODE_SPEED_CHECK, device_class(device))
    args = random_paged_inputs([context] * batch, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
                               block_size=block_size, dtype=torch.float16, device=device)
    with quiet():
        got = call_learner("your decode kernel at the benchmark shape", fn, *args)
        if not torch.allclose(got.float(), paged_decode(*args).float(), atol=1e-2, rtol=1e-2):
            raise AssertionError("the decode kernel's output differs from the reference at the benchmark shape")
        times = bench_interleaved({"gather_sdpa": lambda: gather_then_sdpa(*args), "learner": lambda: fn(*args),
                                   "reference": lambda: paged_decode(*args)}, rounds=rounds, device=device)
    learner, ref = times["gather_sdpa"] / times["learner"], times["gather_sdpa"] / times["reference"]
    need = fraction * ref
    if learner < need:
        raise AssertionError(f"decode speedup over gather-then-SDPA {learner:.2f}x; the reference reaches {ref:.2f}x "
                             f"and {need:.2f}x is needed. Split the context over enough programs to fill the GPU.")
    return {"speedup": learner, "reference_speedup": ref, "threshold": need,
            "times_ms": {n: t * 1e3 for n, t in times.items()}}


def growth_per_doubling(peaks: list[int]) -> list[float]:
    """Ratios of successive peak byte counts (T doubling each step): about 2 for O(T) memory, 4 for O(T^2)."""
    return [b / max(a, 1) for a, b in zip(peaks, peaks[1:])]


def check_flash_memory(fn: Callable, *, seq_lens: tuple[int, ...] = (2048, 4096, 8192), heads: int = 8,
                       head_dim: int = 64) -> dict:
    """Peak extra memory of fn(q, k, v, causal) grows O(T) per doubling of T (about 2x), not O(T^2) (4x): at most the
    calibrated growth (MEMORY_CHECK) per doubling."""
    from autograder.thresholds import threshold
    from minigpt.timing import device_class

    most = threshold(MEMORY_CHECK, device_class("cuda"))
    peaks = []
    for T in seq_lens:
        q, k, v = (torch.randn(1, heads, T, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with quiet():
            call_learner(f"your forward kernel at T={T}", fn, q, k, v, True)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        del q, k, v
    growth = growth_per_doubling(peaks)
    if max(growth) > most:
        raise AssertionError(f"peak extra memory grows {', '.join(f'{g:.1f}x' for g in growth)} per doubling of T "
                             f"({peaks} bytes; at most {most:.2f}x allowed): something of size T x T is being "
                             "materialised")
    return {"seq_lens": list(seq_lens), "peak_bytes": peaks, "growth": growth, "max_growth": max(growth),
            "threshold": most}


def reference_lse(q, k, v, causal: bool = True) -> torch.Tensor:
    """Convenience for the notebook: the exact LSE (B, Hq, Tq)."""
    return attention_lse(q, k, v, causal=causal)
