"""Exercises 7 and 8 (part two): the FlashAttention-2 backward as Triton kernels, and the autograd Functions in the
interface course suites use (apply(q, k, v, is_causal=False) on (B, T, D) or (B, H, T, D), one saved LSE)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable

import torch

import minigpt.kernels  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before any kernel is built)
from autograder.checking.models import count_triton_launches
from autograder.harness import call_learner
from autograder.lab04.common import ATTENTION_CASES, TOL, _close, _err, _full_attention, _qkv
from autograder.lab04.drawn_cases import FAR_BELOW, X40, attention_cases, runnable_on
from autograder.lab04.triton_kernels import accepts_keywords, call_launcher
from autograder.checking.reference_guard import ReferenceHandedIn, no_calls_into, own_work
from autograder.checking.wire import is_class, run_where
from minigpt.kernels.flash_attention import FlashAttentionFunction
from minigpt.kernels.flash_backward import attention_delta, flash_attention_backward
from minigpt.kernels.tiled_attention import (TiledAttentionFunction, as_heads, tiled_attention_backward)

FLASH_BACKWARD = "Exercise 7 (the backward kernels)"
FUNCTIONS = "Exercise 8 (the autograd Functions)"
# (B, Hq, Hkv, Tq, Tk, D, causal, what): the forward's awkward shapes (T = 1, T = 37 with tiles of 32, Tq < Tk,
# GQA groups 1, 2 and 8, non-causal with head_dim 24)
BACKWARD_CASES = ATTENTION_CASES
BACKWARD_TOL = {torch.float32: 1e-4, torch.float16: 5e-3}
_BACKWARD_REFERENCES = (flash_attention_backward, attention_delta, tiled_attention_backward,
                        FlashAttentionFunction.forward, FlashAttentionFunction.backward,
                        TiledAttentionFunction.forward, TiledAttentionFunction.backward)
_FUNCTION_REFERENCES = (FlashAttentionFunction.forward, FlashAttentionFunction.backward,
                        TiledAttentionFunction.forward, TiledAttentionFunction.backward, as_heads)


# ---------------------------------------------------------------------------------------------------
# The backward kernels
# ---------------------------------------------------------------------------------------------------

def backward64(q, k, v, d_out, causal: bool, *, ds_scale: bool = True, delta_tile: int | None = None,
               group_sum: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in float64 from the formulas, with the known mistakes switchable (for the diagnosis):
    ds_scale=False leaves 1/sqrt(D) out of dQ and dK; delta_tile=n uses, for each key tile of n keys, the tile's own
    rowsum(P * dP) instead of delta = rowsum(dO * O); group_sum=False gives each KV head its first query head's dK, dV."""
    q, k, v, d_out = (t.detach().double() for t in (q, k, v, d_out))
    group = q.shape[1] // k.shape[1]
    kf, vf = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ kf.transpose(-2, -1) * scale
    if causal:
        Tq, Tk = q.shape[2], k.shape[2]
        s = s.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq), -math.inf)
    p = torch.softmax(s, -1)
    dp = d_out @ vf.transpose(-2, -1)
    if delta_tile:
        pdp = p * dp
        delta = torch.cat([pdp[..., j:j + delta_tile].sum(-1, keepdim=True).expand(*pdp.shape[:-1],
                                                                                  pdp[..., j:j + delta_tile].shape[-1])
                           for j in range(0, pdp.shape[-1], delta_tile)], -1)
    else:
        delta = (d_out * (p @ vf)).sum(-1, keepdim=True)
    ds = p * (dp - delta) * (scale if ds_scale else 1.0)
    dq, dk, dv = ds @ kf, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ d_out
    B, Hkv, Tk, D = k.shape
    if group_sum:
        return dq, dk.view(B, Hkv, group, Tk, D).sum(2), dv.view(B, Hkv, group, Tk, D).sum(2)
    return dq, dk[:, ::group], dv[:, ::group]


def _diagnose_backward(got: tuple, q, k, v, d_out, causal: bool, tol: float) -> str:
    """Name the known mistake the learner's gradients match, if any."""
    def matches(**wrong) -> bool:
        want = backward64(q, k, v, d_out, causal, **wrong)
        return all(_close(g.cpu(), w, tol) for g, w in zip(got, want) if g is not None)

    if matches(ds_scale=False):
        return (" dQ and dK are sqrt(D) times too large: the scores are s = q k^T / sqrt(D), so dQ = dS K / sqrt(D) "
                "and dK = dS^T Q / sqrt(D): the softmax scale appears once more in dS's products.")
    if q.shape[1] > k.shape[1] and matches(group_sum=False):
        return (f" dK and dV hold only one query head's share: a KV head serves {q.shape[1] // k.shape[1]} query "
                "heads, and its dK, dV are the sums over all of them (loop over the group inside the dK/dV program).")
    for tile in (16, 32, 64):
        if k.shape[2] > tile and matches(delta_tile=tile):
            return (f" delta was computed per key tile (rowsum of P * dP over {tile} keys): delta_i = rowsum(dO_i * "
                    "O_i) is one number per query row over the whole row; compute it once, before the key loop "
                    "(the preprocessing kernel), and load it in both gradient kernels.")
    dv_ok = got[2] is not None and _close(got[2].cpu(), backward64(q, k, v, d_out, causal)[2], tol)
    if causal:
        return (" With the causal mask check the loop bounds: the dQ program must visit key tiles up to its last "
                "visible key, min(Tk, start_m + BLOCK_M + Tk - Tq), the diagonal tile included; the dK/dV program "
                "must start at the query tile holding query start_n - (Tk - Tq), rounded down to a tile boundary; "
                "and P must be zero where a key is masked (keys j > i + Tk - Tq).")
    if dv_ok:
        return " dV is right, so P is: check dS = P * (dP - delta) with dP = dO V^T and delta = rowsum(dO * O)."
    return (" Check P = exp(s - lse) with s = q k^T / sqrt(D) and the saved (natural-log) lse, zero for keys past Tk "
            "and query rows past Tq; dV = P^T dO summed over the group's query heads.")


def check_flash_backward(fn: Callable, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16)) -> None:
    """fn(q, k, v, out, lse, d_out, causal[, block_m, block_n]) -> (dq, dk, dv) in the dtypes of q, k, v, through
    Triton kernels of the notebook's (not the package's), equal to autograd of naive attention (float64): on
    BACKWARD_CASES in `dtypes`, then on the drawn cases of the forward check (drawn_cases.py: strided and
    NaN-fenced layouts, unequal tiles, three dtypes), but for those far below -1e4 (a float32 exp(s - lse) keeps
    too few digits there for a gradient's tolerance)."""
    own_work(fn, _BACKWARD_REFERENCES, what=FLASH_BACKWARD)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tiles = run_where(fn, accepts_keywords, fn, ("block_m", "block_n"))
    cases = [(dtype, case) for dtype in dtypes for case in BACKWARD_CASES]
    cases += [(None, runnable_on(_gradient_case(c), device)) for c in attention_cases()
              if c.magnitude != FAR_BELOW]
    for n, (dtype, case) in enumerate(cases):
        kwargs: dict = {}
        if dtype is not None:
            B, Hq, Hkv, Tq, Tk, D, causal, what = case
            context, qkv = f"{what}, {dtype}", _qkv(B, Hq, Hkv, Tq, Tk, D, dtype=dtype, seed=11)
        else:
            context, qkv, causal, dtype = str(case), case.tensors(), case.causal, case.dtype
            kwargs = {"block_m": case.block_m, "block_n": case.block_n} if tiles else {}
        q, k, v = (t.double() for t in qkv)
        out, lse = _full_attention(q, k, v, causal)
        d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
        d_out = d_out.to(dtype).double()
        args = [qkv[0].to(device), qkv[1].to(device), qkv[2].to(device),
                out.to(dtype).to(device), lse.float().to(device), d_out.to(dtype).to(device)]
        # the first case also refuses a call into the reference, as check_flash_forward does
        got, launches = call_launcher("flash_backward", fn, *args, causal, exercise=FLASH_BACKWARD,
                                      context=context, watch=_BACKWARD_REFERENCES if n == 0 else (), **kwargs)
        if not launches:
            raise AssertionError(f"{context}: flash_backward launched no Triton kernel; write the preprocessing, "
                                 "dK/dV and dQ passes as @triton.jit kernels and launch them")
        if not (isinstance(got, tuple) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
            raise AssertionError(f"{context}: return a tuple (dq, dk, dv) of tensors, got {type(got).__name__}")
        for name, g_ in zip(("dq", "dk", "dv"), got):
            if g_.dtype != dtype:
                raise AssertionError(f"{context}: {name} must be in the input dtype {dtype}, got {g_.dtype}")
        want = backward64(q, k, v, d_out, causal)
        tol = BACKWARD_TOL.get(dtype, TOL[dtype])
        for name, g_, w in zip(("dq", "dk", "dv"), got, want):
            if not _close(g_.cpu(), w, tol):
                hint = _diagnose_backward(got, q, k, v, d_out, causal, tol)
                raise AssertionError(f"{context}: {name} {_err(g_.cpu(), w)} against autograd of naive "
                                     f"attention.{hint}")


def _gradient_case(case):
    """A drawn case for the backward: queries x40 run in float32 (in float16 such scores leave a gradient too few
    digits: the solution's dk was off by 0.057 against a tolerance of 5e-3)."""
    return dataclasses.replace(case, dtype=torch.float32) if case.magnitude == X40 else case


# ---------------------------------------------------------------------------------------------------
# The autograd Functions in the course-suite interface
# ---------------------------------------------------------------------------------------------------

class FunctionRun:
    """One forward and backward of a learner's autograd Function, run in the process where the Function lives (the
    learner's kernel when the check is judged: an autograd graph cannot cross processes). Each step returns plain
    data (tensors, counts) for the check to judge; `watch` names references a step must not call (no_calls_into)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.inputs: tuple[torch.Tensor, ...] = ()
        self.out: Any = None

    def forward(self, qkv: tuple, is_causal: bool, pass_as: str, watch: tuple, what: str) -> dict:
        """cls.apply(q, k, v, is_causal) on leaf copies of qkv: {"out" (detached, or None), "returned" (type name),
        "grad_fn" (bool), "saved" (the saved tensors shaped like q without its last axis), "launches"}."""
        q, k, v = self.inputs = tuple(t.clone().requires_grad_() for t in qkv)
        guard = no_calls_into(*watch, what=what) if watch else contextlib.nullcontext()
        with count_triton_launches() as launches, guard:
            if pass_as == "keyword":
                self.out = self.cls.apply(q, k, v, is_causal=is_causal)
            else:
                self.out = self.cls.apply(q, k, v, is_causal)
        out = self.out
        if not isinstance(out, torch.Tensor):
            return {"out": None, "returned": type(out).__name__, "grad_fn": False, "saved": [],
                    "launches": launches[0]}
        lse_shape = tuple(q.shape[:-1])
        saved = [t.detach() for t in out.grad_fn.saved_tensors if tuple(t.shape) == lse_shape] if out.grad_fn else []
        return {"out": out.detach(), "returned": "Tensor", "grad_fn": out.grad_fn is not None, "saved": saved,
                "launches": launches[0]}

    def backward(self, d_out: torch.Tensor, watch: tuple, what: str) -> dict:
        """out.backward(d_out): {"grads": [q.grad, k.grad, v.grad] (None where none), "launches"}."""
        guard = no_calls_into(*watch, what=what) if watch else contextlib.nullcontext()
        with count_triton_launches() as launches, guard:
            self.out.backward(d_out)
        return {"grads": [t.grad for t in self.inputs], "launches": launches[0]}


def is_autograd_function(cls: Any) -> bool:
    """True when cls is a subclass of torch.autograd.Function (asked where cls lives: run_where)."""
    return isinstance(cls, type) and issubclass(cls, torch.autograd.Function)


def _function_case(cls: Any, qkv: tuple, is_causal: bool, pass_as: str, context: str, triton: bool,
                   watch: tuple = ()) -> None:
    """One call of cls.apply and its backward (each refusing calls into `watch`), checked against float64
    attention. The Function runs where it lives (FunctionRun); what it returned, saved and computed is judged here."""
    name = cls.__name__
    run = run_where(cls, FunctionRun, cls)
    q = qkv[0]
    forward = call_learner(f"{name}.apply", run.forward, qkv, is_causal, pass_as, watch, FUNCTIONS, context=context)
    out = forward["out"]
    if out is None or out.shape != q.shape:
        raise AssertionError(f"{context}: apply must return the output shaped like q {tuple(q.shape)}, got "
                             f"{tuple(out.shape) if out is not None else forward['returned']}")
    heads = (qkv[0].unsqueeze(1), qkv[1].unsqueeze(1), qkv[2].unsqueeze(1)) if q.ndim == 3 else qkv
    want, want_lse = _full_attention(*heads, is_causal)
    want, want_lse = (want.squeeze(1), want_lse.squeeze(1)) if q.ndim == 3 else (want, want_lse)
    if not _close(out, want, 1e-4):
        raise AssertionError(f"{context}: output {_err(out, want)} against attention in float64")
    if not forward["grad_fn"]:
        raise AssertionError(f"{context}: the output has no grad_fn: return it from forward of a "
                             "torch.autograd.Function (and call Function.apply)")
    shape, saved = tuple(q.shape[:-1]), forward["saved"]
    if len(saved) != 1:
        raise AssertionError(f"{context}: the Function must save exactly one log-sum-exp tensor of shape {shape} "
                             f"with ctx.save_for_backward; found {len(saved)} tensors of that shape")
    if not _close(saved[0], want_lse, 1e-4):
        raise AssertionError(f"{context}: the saved tensor of shape {shape} is not the log-sum-exp "
                             f"({_err(saved[0], want_lse)}): save the forward's lse, squeezed to (batch, Nq) for "
                             "(batch, seq, dim) inputs")
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(21))
    backward = call_learner(f"{name}.backward", run.backward, d_out, watch, FUNCTIONS, context=context)
    if triton and not (forward["launches"] and backward["launches"]):
        part = "forward" if not forward["launches"] else "backward"
        raise AssertionError(f"{context}: the Triton Function's {part} launched no Triton kernel: use flash_forward "
                             "and flash_backward (or the package's kernels meanwhile)")
    grads = backward64(*heads, d_out.unsqueeze(1) if q.ndim == 3 else d_out, is_causal)
    for grad_name, got, w in zip(("dq", "dk", "dv"), backward["grads"], grads):
        w = w.squeeze(1) if q.ndim == 3 else w
        if got is None or not _close(got, w, 1e-4):
            err = _err(got, w) if got is not None else "no gradient"
            raise AssertionError(f"{context}: {grad_name} {err} against autograd of naive attention: return (dq, dk, "
                                 "dv, None) from backward, shaped like the inputs (squeeze the head axis back for "
                                 "(batch, seq, dim) inputs)")


def check_attention_function(cls: Any, triton: bool) -> None:
    """cls: a torch.autograd.Function with apply(q, k, v, is_causal=False) (is_causal positional or keyword) on
    (B, T, D) and on (B, Hq, T, D) / (B, Hkv, T, D) (GQA), returning out shaped like q, saving exactly one LSE tensor
    ((B, Nq) for 3-D inputs), gradients equal to autograd of naive attention, and ValueError for is_causal=True with
    Tq != Tk (the course's bottom-right mask against the top-left one). triton=True: forward and backward launch
    Triton kernels."""
    what = FUNCTIONS
    own_work(cls, (TiledAttentionFunction, FlashAttentionFunction), what=what, methods=("forward", "backward"))
    if not (is_class(cls) and run_where(cls, is_autograd_function, cls)):
        raise AssertionError(f"{what}: pass the class, a subclass of torch.autograd.Function (got "
                             f"{cls!r:.60})")
    g = torch.Generator().manual_seed(20)
    cases = [
        ((torch.randn(2, 19, 16, generator=g), torch.randn(2, 19, 16, generator=g), torch.randn(2, 19, 16, generator=g)),
         True, "positional", "(batch 2, seq 19, dim 16), is_causal=True positional"),
        ((torch.randn(1, 5, 8, generator=g), torch.randn(1, 13, 8, generator=g), torch.randn(1, 13, 8, generator=g)),
         False, "keyword", "(batch 1, 5 queries, 13 keys, dim 8), is_causal=False as a keyword"),
        (_qkv(1, 4, 2, 9, 9, 8, seed=22), True, "keyword", "(1, 4 query heads, 2 KV heads, 9, 8), is_causal=True"),
        (_qkv(2, 1, 1, 7, 7, 8, seed=23), True, "keyword", "(2, 1 head, 7, 8): 4-D with a single head, is_causal=True "
                                                           "(the output keeps its head dimension)"),
    ]
    name = cls.__name__
    for i, (qkv, is_causal, pass_as, context) in enumerate(cases):
        # the first case also refuses calls into the reference (forward and backward, each watched on its own so that
        # the refusal comes before any other verdict on what the reference returned)
        _function_case(cls, qkv, is_causal, pass_as, f"{name}, {context}", triton,
                       _FUNCTION_REFERENCES if i == 0 else ())
    q, k, v = torch.randn(1, 3, 8, generator=g), torch.randn(1, 7, 8, generator=g), torch.randn(1, 7, 8, generator=g)
    try:
        cls.apply(q, k, v, True)
    except ValueError as e:
        if not all(n in str(e) for n in ("3", "7")):
            raise AssertionError(f"{name}: is_causal=True with 3 queries and 7 keys raised ValueError, good, but its "
                                 f"message should name both counts (3 and 7); got {str(e)!r}") from None
    except (NotImplementedError, ReferenceHandedIn):
        raise
    except Exception as e:           # noqa: BLE001  (any other error is the wrong answer to name)
        raise AssertionError(f"{name}: is_causal=True with 3 queries and 7 keys raised {type(e).__name__}: {e}; raise "
                             "ValueError naming the two mask conventions instead") from None
    else:
        raise AssertionError(f"{name}: is_causal=True with 3 queries and 7 keys returned an answer; the course's mask "
                             "(bottom-right) and a top-left one (torch SDPA, tril()) differ there, so a caller may "
                             "expect either: raise ValueError when is_causal and Tq != Tk")
