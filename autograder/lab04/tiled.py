"""Exercises 2 and 3: tiled attention forward and its backward from the saved LSE, in PyTorch."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

import minigpt.kernels  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before any kernel is built)
from autograder.harness import call_learner
from autograder.lab04.common import ATTENTION_CASES, TOL, _close, _err, _full_attention, _qkv
from autograder.checking import isolation
from autograder.checking.library_refusal import FUSED_ATTENTION, refuse_library
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.tensor_trace import TensorTrace
from minigpt.attention import naive_attention
from minigpt.kernels.flash_attention import FlashAttentionFunction, flash_attention, flash_attention_forward
from minigpt.kernels.tiled_attention import (attention_lse, tiled_attention, tiled_attention_backward,
                                             tiled_attention_forward)

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


# The long sequence judged in a witness whose address space is bounded to what torch maps plus LONG_ALLOWANCE
# (autograder/checking/isolation.py): the lab's imports take about 240 MiB of it, key tiles of LONG_BLOCK_K a few MiB
# each (T * LONG_BLOCK_K * 4 bytes), while the (T x T) scores need T * T * 4 bytes (1 GiB) in float32, 512 MiB in
# float16.
LONG_T, LONG_D, LONG_BLOCK_K = 16384, 16, 128
LONG_ALLOWANCE = 512 << 20
LONG_ROWS = 24                   # query rows compared with the exact attention (drawn in secret)
# The backward's long sequence (float64, as the exercise's inputs): its (T x T) scores or P need T * T * 8 bytes
# (800 MiB), 400 MiB even in float32; the witness's bound is the forward's.
LONG_BACKWARD_T = 10240


def check_tiled_attention(fn: Callable) -> None:
    """fn(q (B,Hq,Tq,D), k, v (B,Hkv,Tk,D), causal, block_k) -> (out (B,Hq,Tq,D), lse (B,Hq,Tq)), reading keys
    block_k at a time: no (Tq x Tk) tensor is ever held (recorded by a TorchFunctionMode in the kernel; in the
    witness, a sequence of LONG_T tokens under a memory bound no such tensor fits, set before any learner code ran),
    no fused attention (refused in the witness)."""
    own_work(fn, _ATTENTION_REFERENCES, what=TILED_FORWARD)
    refuse_library(FUSED_ATTENTION, what=TILED_FORWARD)
    for B, Hq, Hkv, Tq, Tk, D, causal, what in ATTENTION_CASES:
        for block_k in (8, 16):
            q, k, v = _qkv(B, Hq, Hkv, Tq, Tk, D, seed=block_k)
            with TensorTrace() as trace, no_calls_into(*_ATTENTION_REFERENCES, what=TILED_FORWARD):
                got = call_learner("tiled_attention", fn, q.clone(), k.clone(), v.clone(), causal, block_k,
                                   context=f"{what}, block_k {block_k}")
            _method(trace, Tq, Tk, block_k, f"{what}, block_k = {block_k}", "tiled_attention")
            _compare_out_lse(got, q, k, v, causal, f"{what}, block_k = {block_k}", TOL[torch.float32])
    for what, (q, k, v), tol in _edge_inputs():
        with no_calls_into(*_ATTENTION_REFERENCES, what=TILED_FORWARD):
            got = call_learner("tiled_attention", fn, q.clone(), k.clone(), v.clone(), True, 8, context=what)
        if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.Tensor) and got[0].dtype != q.dtype:
            raise AssertionError(f"{what}: the output must be in the input dtype {q.dtype}, got {got[0].dtype}")
        _compare_out_lse(got, q, k, v, True, what, tol)
    _check_long_under_memory_bound(fn)


def _check_long_under_memory_bound(fn: Callable) -> None:
    """Graded again in a witness, a causal sequence of LONG_T tokens, the witness started with its address space
    bounded (before any learner cell ran there) to what torch maps plus LONG_ALLOWANCE: key tiles fit, a (T x T)
    matrix of scores or probabilities does not, whatever the process reports. The output is compared on LONG_ROWS
    query rows drawn in secret. Outside that witness (nothing bounds the process) it is not run."""
    import secrets

    if not isolation.bound_witness_memory(LONG_ALLOWANCE):
        return
    what = f"{TILED_FORWARD}, a causal sequence of {LONG_T} tokens, key tiles of {LONG_BLOCK_K}"
    q, k, v = _qkv(1, 1, 1, LONG_T, LONG_T, LONG_D, seed=secrets.randbelow(2**31))
    try:
        got = fn(q, k, v, True, LONG_BLOCK_K)
    except Exception as exc:       # noqa: BLE001  (an allocation the bound refused, or the learner's own error)
        raise AssertionError(
            f"{what}: tiled_attention failed in a process whose memory is bounded to about {LONG_ALLOWANCE >> 20} MiB "
            f"beyond what torch takes ({type(exc).__name__}: {str(exc)[:200]}). A ({LONG_T} x {LONG_T}) score matrix "
            f"needs {LONG_T * LONG_T * 4 >> 20} MiB in float32, {LONG_T * LONG_T * 2 >> 20} MiB in float16; one key "
            f"tile at a time needs {LONG_T * LONG_BLOCK_K * 4 >> 20} MiB: build scores, masks and P one key tile at a "
            "time") from None
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise AssertionError(f"{what}: return a tuple (out, lse) of tensors, got {type(got).__name__}")
    out, lse = got
    if out.shape != q.shape or lse.shape != q.shape[:-1]:
        raise AssertionError(f"{what}: out must have shape {tuple(q.shape)} and lse {tuple(q.shape[:-1])}, got "
                             f"{tuple(out.shape)} and {tuple(lse.shape)}")
    rows = torch.tensor(sorted(secrets.SystemRandom().sample(range(LONG_T), LONG_ROWS)))
    s = (q[0, 0, rows].double() @ k[0, 0].double().T) / math.sqrt(LONG_D)
    s = s.masked_fill(torch.arange(LONG_T)[None, :] > rows[:, None], -math.inf)
    want, want_lse = torch.softmax(s, -1) @ v[0, 0].double(), torch.logsumexp(s, -1)
    if not (_close(out[0, 0, rows], want, TOL[torch.float32]) and _close(lse[0, 0, rows], want_lse, 1e-4)):
        raise AssertionError(f"{what}: output or lse differs from the exact attention on query rows the grader drew "
                             f"(output {_err(out[0, 0, rows], want)})")


def _edge_inputs() -> list[tuple[str, tuple[torch.Tensor, ...], float]]:
    """Causal, Tq = 20, Tk = 33, GQA group 2, key tiles of 8: in float16 (computed in float32, returned in float16);
    with query rows whose scores sit about +200 and -200 (each row needs its own running max: one max for the whole
    tensor underflows the low rows); with every score far below -1e4 (keys all ones, queries negative integers, so a
    query's scores tie exactly: a mask or a running max of -1e4 instead of -inf is wrong)."""
    from autograder.lab04.drawn_cases import FAR_BELOW, scaled, tolerance

    q, k, v = _qkv(1, 4, 2, 20, 33, 24, seed=5)
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0]).view(1, 4, 1, 1)
    return [("float16 inputs, causal, Tq = 20, Tk = 33", tuple(t.half() for t in (q, k, v)), TOL[torch.float16]),
            ("query rows with scores near +200 and near -200, causal", ((q.abs() + 0.5) * 30 * sign, k.abs() + 0.5, v),
             TOL[torch.float32]),
            ("every score far below -1e4, causal", (scaled(q, FAR_BELOW, "q"), scaled(k, FAR_BELOW, "k"), v),
             tolerance(FAR_BELOW, TOL[torch.float32]))]


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
    refuse_library(FUSED_ATTENTION, what=TILED_BACKWARD)
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
    _check_long_backward_under_memory_bound(fn)


def _check_long_backward_under_memory_bound(fn: Callable) -> None:
    """Graded again in the bounded witness (see _check_long_under_memory_bound): the backward of a causal sequence of
    LONG_BACKWARD_T tokens in float64, out and lse from the course's tiled forward computed here; dq compared on
    LONG_ROWS query rows and dk, dv on LONG_ROWS key rows drawn in secret, each from the formulas on those rows only."""
    import secrets

    if not isolation.bound_witness_memory(LONG_ALLOWANCE):
        return
    T, D, scale = LONG_BACKWARD_T, LONG_D, 1 / math.sqrt(LONG_D)
    what = f"{TILED_BACKWARD}, a causal sequence of {T} tokens in float64"
    g = torch.Generator().manual_seed(secrets.randbelow(2**31))
    q, k, v, d_out = (torch.randn(1, 1, T, D, generator=g, dtype=torch.float64) for _ in range(4))
    out, lse = tiled_attention_forward(q, k, v, causal=True, block_k=512)
    try:
        got = fn(q, k, v, out, lse, d_out, True)
    except Exception as exc:       # noqa: BLE001  (an allocation the bound refused, or the learner's own error)
        raise AssertionError(
            f"{what}: tiled_backward failed in a process whose memory is bounded to about {LONG_ALLOWANCE >> 20} MiB "
            f"beyond what torch takes ({type(exc).__name__}: {str(exc)[:200]}). A ({T} x {T}) matrix of scores, P "
            f"or dS needs {T * T * 8 >> 20} MiB in float64: recompute P one key tile at a time from the saved "
            "LSE") from None
    if not (isinstance(got, tuple) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
        raise AssertionError(f"{what}: return a tuple (dq, dk, dv) of tensors, got {type(got).__name__}")
    if any(t.shape != q.shape for t in got):
        raise AssertionError(f"{what}: dq, dk and dv must each have shape {tuple(q.shape)}, got "
                             f"{[tuple(t.shape) for t in got]}")
    dq, dk, dv = (t[0, 0] for t in got)
    q, k, v, d_out, out, lse = (t[0, 0] for t in (q, k, v, d_out, out, lse))
    delta = (d_out * out).sum(-1)
    pick = secrets.SystemRandom()
    rows, cols = (torch.tensor(sorted(pick.sample(range(T), LONG_ROWS))) for _ in range(2))
    positions = torch.arange(T)
    p_rows = torch.exp((q[rows] @ k.T * scale).masked_fill(positions[None] > rows[:, None], -math.inf)
                       - lse[rows, None])
    p_cols = torch.exp((q @ k[cols].T * scale).masked_fill(cols[None] > positions[:, None], -math.inf)
                       - lse[:, None])
    wants = {"dq": (dq[rows], (p_rows * (d_out[rows] @ v.T - delta[rows, None])) @ k * scale),
             "dk": (dk[cols], (p_cols * (d_out @ v[cols].T - delta[:, None])).T @ q * scale),
             "dv": (dv[cols], p_cols.T @ d_out)}
    for name, (got_rows, want) in wants.items():
        if not _close(got_rows, want, 1e-6):
            raise AssertionError(f"{what}: {name} differs from the formulas on rows the grader drew "
                                 f"({_err(got_rows, want)})")
