"""Exercises 4 to 6: the Triton forward kernel, merge_partials and the paged decode kernel."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import torch

import minigpt.kernels  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before any kernel is built)
from autograder.launches import call_counting_launches, call_launcher, own_kernels
from autograder.harness import call_learner
from autograder.lab04.common import ATTENTION_CASES, PAGED_CASES, TOL, _close, _err, _qkv
from autograder.lab04.drawn_cases import attention_cases, fenced_pool, paged_cases, runnable_on, scaled, tolerance
from autograder.lab04.tiled import _ATTENTION_REFERENCES, _compare_out_lse
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.wire import run_where
from minigpt.cache.paged_attention import paged_decode_attention
from minigpt.kernels.paged_decode import (gather_then_sdpa, merge_partials, paged_decode, paged_decode_partials,
                                          random_paged_inputs)

# ---------------------------------------------------------------------------------------------------
# Triton: the forward kernel and the paged decode kernel
# ---------------------------------------------------------------------------------------------------

FLASH_FORWARD = "Exercise 4 (the forward kernel)"
_PAGED_REFERENCES = (paged_decode, paged_decode_partials, paged_decode_attention, gather_then_sdpa)
PAGED_DECODE = "Exercise 6 (the paged decode kernel)"
MERGE = "Exercise 5 (merge_partials)"


def check_flash_forward(fn: Callable, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16)) -> None:
    """fn(q, k, v, causal[, block_m, block_n]) -> (out, lse) through a Triton kernel of the notebook's (not the
    package's); CPU tensors run in the interpreter. The fixed cases in `dtypes`, then the drawn ones
    (drawn_cases.py: three dtypes, strided layouts, tile sizes, large scores)."""
    own_work(fn, _ATTENTION_REFERENCES, what=FLASH_FORWARD)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tiles = run_where(fn, accepts_keywords, fn, ("block_m", "block_n"))
    cases = ([(dtype, case) for dtype in dtypes for case in ATTENTION_CASES]
             + [(None, runnable_on(c, device)) for c in attention_cases()])
    for n, (dtype, case) in enumerate(cases):
        drawn = dtype is None
        if not drawn:
            B, Hq, Hkv, Tq, Tk, D, causal, what = case
            qkv, kwargs, what = _qkv(B, Hq, Hkv, Tq, Tk, D, dtype=dtype, seed=3), {}, f"{what}, {dtype}"
            tol = TOL[dtype]
        else:
            qkv, causal, dtype, what = case.tensors(), case.causal, case.dtype, str(case)
            tol = tolerance(case.magnitude, TOL[dtype])
            kwargs = {"block_m": case.block_m, "block_n": case.block_n} if tiles else {}
        q, k, v = (t.to(device) for t in qkv)
        want = [t.cpu().clone() for t in (q, k, v)]       # compared against: the kernel could write into its inputs
        # the first case also refuses a call into the reference (profiling every case in the interpreter would
        # double the check's time); every launch is checked to be the notebook's kernel
        # the drawn cases run once more with each tensor ending at an unreadable page (a load past q, k or v faults)
        got, launches = call_launcher("flash_forward", fn, q, k, v, causal, exercise=FLASH_FORWARD, context=what,
                                      watch=_ATTENTION_REFERENCES if n == 0 else (), guard_pages=drawn,
                                      **kwargs)
        if not launches:
            raise AssertionError(f"{what}: flash_forward launched no Triton kernel; write the forward pass as "
                                 "a @triton.jit kernel and launch it over a grid")
        if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.Tensor) and got[0].dtype != dtype:
            raise AssertionError(f"{what}: the output must be in the input dtype {dtype}, got {got[0].dtype}")
        _compare_out_lse(tuple(t.cpu() for t in got) if isinstance(got, tuple) else got, *want, causal, what, tol)


def check_merge_partials(fn: Callable) -> None:
    """fn(o_part (..., S, D), lse_part (..., S)) -> (..., D): the per-split results merged with LSE weights."""
    own_work(fn, merge_partials, what=MERGE)
    g = torch.Generator().manual_seed(5)
    for shape, what in (((2, 3, 4, 8), "4 splits"), ((1, 2, 1, 8), "a single split"),
                        ((2, 2, 5, 4), "5 splits, some empty (lse = -inf)"),
                        ((3, 4, 8), "a 3-D input (B, S, D): merge over the split dimension, -2")):
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


def accepts_keywords(fn: Callable, names: tuple[str, ...]) -> bool:
    """True when fn accepts every keyword in `names` (the notebook's launchers: `merge`, the function that merges
    the splits; `block_m`, `block_n`, `pages_per_split`, the tiles)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names)


def _drawn_paged(case, device: str) -> tuple[tuple, tuple]:
    """The inputs (q, k_pool, v_pool, block_tables, seq_lens) of a drawn case, twice: as the learner gets them (the
    slots no sequence owns NaN, drawn_cases.fenced_pool) and as the answer is computed (those slots random). Every
    block table exactly full, two spare blocks in the pool; q and K of the case's magnitude and, for an offset
    case, q a slice of a wider buffer (row strides that are not D)."""
    q, k_pool, v_pool, tables, lens = random_paged_inputs(
        list(case.seq_lens), n_heads=case.Hq, n_kv_heads=case.Hkv, head_dim=case.D, block_size=case.page_size,
        dtype=case.dtype, device=device, seed=7,
        num_blocks=len(case.seq_lens) * math.ceil(max(case.seq_lens) / case.page_size) + 2)
    q = scaled(q.float(), case.magnitude, "q").to(case.dtype)
    k_pool = scaled(k_pool.float(), case.magnitude, "k").to(case.dtype)
    if case.offset_query:
        q = torch.cat([torch.full_like(q[..., :8], math.nan), q], -1)[..., 8:]
    fenced = (q, fenced_pool(k_pool, tables, lens), fenced_pool(v_pool, tables, lens), tables, lens)
    return fenced, (q, k_pool, v_pool, tables, lens)


def check_paged_decode(fn: Callable, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16)) -> None:
    """fn(q (B,Hq,D), k_pool, v_pool (num_blocks, block_size, Hkv, D), block_tables (B, max_blocks) int32,
    seq_lens (B,) int32, merge=..., pages_per_split=...) -> (B, Hq, D), through a Triton kernel of the notebook's,
    equal to gather-then-attend: the fixed cases in `dtypes`, then the drawn ones (drawn_cases.py). The check passes
    the package's merge_partials as `merge`, so it grades the split kernel alone: a wrong Exercise 5 does not fail
    this one."""
    own_work(fn, _PAGED_REFERENCES, what=PAGED_DECODE)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    merge = {"merge": merge_partials} if run_where(fn, accepts_keywords, fn, ("merge",)) else {}
    splits = run_where(fn, accepts_keywords, fn, ("pages_per_split",))
    cases = ([(dtype, case) for dtype in dtypes for case in PAGED_CASES]
             + [(None, runnable_on(c, device)) for c in paged_cases()])
    for n, (dtype, case) in enumerate(cases):
        kwargs = dict(merge)
        if dtype is not None:
            B, Hq, Hkv, D, bs, lens, what = case
            args, what = _paged(B, Hq, Hkv, D, bs, lens, dtype, device=device), f"{what}, {dtype}"
            clean, tol = args, TOL[dtype]
        else:
            (args, clean), dtype, what = _drawn_paged(case, device), case.dtype, str(case)
            tol = tolerance(case.magnitude, TOL[dtype])
            kwargs.update({"pages_per_split": case.pages_per_split} if splits else {})
        # the answer first, from copies: the learner's kernel gets tensors it could write into
        want = paged_decode_attention(*(a.cpu().double() if a.is_floating_point() else a.cpu() for a in clean))
        sent = [a.clone() if a._base is None else a._base.clone().as_strided(a.shape, a.stride(), a.storage_offset())
                for a in args]
        got, launches = call_launcher("paged_decode", fn, *sent, exercise=PAGED_DECODE, context=what,
                                      watch=_PAGED_REFERENCES if n == 0 else (), **kwargs)
        if not launches:
            raise AssertionError(f"{what}: paged_decode launched no Triton kernel")
        if isinstance(got, torch.Tensor) and got.dtype != dtype:
            raise AssertionError(f"{what}: the output must be in q's dtype {dtype}, got {got.dtype}")
        if not isinstance(got, torch.Tensor) or not _close(got.cpu(), want, tol):
            err = _err(got.cpu(), want) if isinstance(got, torch.Tensor) else type(got).__name__
            merged = ("the splits were merged by the package's merge_partials, so the partial outputs or "
                      "LSEs are wrong" if merge else "merge the splits with their LSE weights")
            raise AssertionError(f"{what}: {err} against gather-then-attend. Check: physical block = "
                                 "block_tables[b, page]; mask the slots of the last page past seq_len; query head "
                                 "h reads KV head h // group; use each tensor's own strides; load only the slots below "
                                 "seq_len (the others may hold anything, here NaN); subtract the running maximum "
                                 f"before exp2; an empty split writes LSE = -inf; {merged}.")
