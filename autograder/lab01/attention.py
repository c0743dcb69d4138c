"""Exercise 1: attention with the bottom-right causal mask (prefill, decode and chunks; MHA, GQA, MQA)."""

from __future__ import annotations

import contextlib
import math
from typing import Callable

import torch

from autograder.checking.call_conditions import DEVICE_HINT, default_device_elsewhere
from autograder.harness import quiet
from autograder.lab01.common import REFERENCE_ATTENTION
from autograder.checking.reference_guard import no_calls_into, own_work
from minigpt.attention import naive_attention

def _top_left(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The classic bug: torch.tril(ones(Tq, Tk)), i.e. SDPA's is_causal=True, aligned top-left."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v


def check_causal_attention(attention_fn: Callable) -> None:
    """attention_fn(q (B,Hq,Tq,D), k (B,Hkv,Tk,D), v) -> (B,Hq,Tq,D) must match minigpt.attention.naive_attention
    for prefill (Tq == Tk), decode (Tq == 1) and chunks (1 < Tq < Tk), with MHA, GQA and MQA."""
    cases = [  # (B, Hq, Hkv, Tq, Tk, D, what)
        (2, 4, 4, 6, 6, 8, "prefill, MHA (Tq == Tk)"),
        (2, 4, 2, 6, 6, 8, "prefill, GQA (Tq == Tk)"),
        (2, 4, 2, 1, 9, 8, "decode, GQA (Tq == 1 < Tk)"),
        (1, 6, 1, 1, 5, 16, "decode, MQA (Tq == 1 < Tk)"),
        (2, 4, 2, 3, 8, 8, "chunk after a cache, GQA (1 < Tq < Tk)"),
        (1, 2, 2, 1, 1, 4, "first token (Tq == Tk == 1)"),
    ]
    own_work(attention_fn, REFERENCE_ATTENTION, what="Exercise 1 (causal_attention)")
    g = torch.Generator().manual_seed(0)
    for B, Hq, Hkv, Tq, Tk, D, what in cases:
        q = torch.randn(B, Hq, Tq, D, generator=g)
        k, v = torch.randn(B, Hkv, Tk, D, generator=g), torch.randn(B, Hkv, Tk, D, generator=g)
        _compare_attention(attention_fn, q, k, v, what, Tq, Tk)
    # Edge inputs: scores of a few hundred (exp overflows without the max subtracted), and half precision.
    q = torch.randn(2, 4, 3, 8, generator=g) * 30
    k, v = torch.randn(2, 2, 8, 8, generator=g) * 30, torch.randn(2, 2, 8, 8, generator=g)
    _compare_attention(attention_fn, q, k, v, "chunk with scores in the hundreds (softmax must subtract the max)", 3, 8)
    # Every visible score far below -1e4 (positive keys, large negative queries): a mask of -1e4 instead of -inf
    # would outweigh every visible key. Scores stay far apart, so the answer is one key's value, with no near ties.
    q = -(torch.randn(2, 4, 3, 8, generator=g).abs() + 0.5) * 2e4
    k, v = torch.randn(2, 2, 8, 8, generator=g).abs() + 0.5, torch.randn(2, 2, 8, 8, generator=g)
    _compare_attention(attention_fn, q, k, v, "chunk with every score far below -1e4 (masked keys must get "
                       "exactly zero weight: mask with -inf, not a large negative number)", 3, 8)
    # Inputs that are not on torch's default device: the mask must be made on q's device.
    q = torch.randn(2, 4, 3, 8, generator=g)
    k, v = torch.randn(2, 2, 8, 8, generator=g), torch.randn(2, 2, 8, 8, generator=g)
    _compare_attention(attention_fn, q, k, v, "chunk (GQA) with torch's default device moved off the inputs'", 3, 8,
                       elsewhere=True)
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(2, 4, 3, 8, generator=g).to(dtype)
        k, v = torch.randn(2, 2, 8, 8, generator=g).to(dtype), torch.randn(2, 2, 8, 8, generator=g).to(dtype)
        _compare_attention(attention_fn, q, k, v, f"chunk in {dtype} (GQA)", 3, 8)


def _compare_attention(attention_fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, what: str,
                       Tq: int, Tk: int, *, elsewhere: bool = False) -> None:
    """The learner's attention on (q, k, v) against naive_attention computed in float32; `elsewhere`: the learner's
    call runs with torch's default device moved off the inputs' (call_conditions.default_device_elsewhere)."""
    shapes = f"q {tuple(q.shape)}, k/v {tuple(k.shape)}"
    q_in, k_in, v_in = q.clone(), k.clone(), v.clone()
    layouts = [(t.shape, t.stride()) for t in (q_in, k_in, v_in)]
    try:
        with quiet(), torch.no_grad(), no_calls_into(*REFERENCE_ATTENTION, what="Exercise 1 (causal_attention)"), \
                default_device_elsewhere() if elsewhere else contextlib.nullcontext():
            got = attention_fn(q_in, k_in, v_in)
    except NotImplementedError:
        raise AssertionError("attention is not implemented yet (NotImplementedError)") from None
    except AssertionError:
        raise
    except Exception as err:
        hint = (f"{DEVICE_HINT}." if elsewhere else "Under GQA repeat each KV head for its group of query heads "
                "(query head h reads KV head h // (Hq // Hkv)).")
        raise AssertionError(f"{what}: your attention raised {type(err).__name__}: {err} for {shapes}. {hint}") from None
    for name, given, original, layout in zip("qkv", (q_in, k_in, v_in), (q, k, v), layouts):
        if (given.shape, given.stride()) != layout or not torch.equal(given, original):
            raise AssertionError(f"{what}: your attention changed its input {name} ({shapes}): the caller's tensors "
                                 "(the model's, the cache's) must stay as they were; use the out-of-place ops "
                                 "(transpose, masked_fill, ...), not the in-place ones ending in _")
    want = naive_attention(q.float(), k.float(), v.float())
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise AssertionError(f"{what}: expected an output of shape {tuple(want.shape)} (B, Hq, Tq, D) for {shapes}, got {shape}")
    if got.dtype != q.dtype:
        raise AssertionError(f"{what}: the output is {got.dtype} for {q.dtype} inputs; keep the inputs' dtype "
                             "(the model runs in bf16/fp16 on a GPU)")
    atol, rtol = (1e-5, 1e-4) if q.dtype == torch.float32 else (3e-2, 3e-2)
    if not torch.isfinite(got).all():
        raise AssertionError(f"{what}: the output has NaN/inf for {shapes}. exp() of large scores overflows: "
                             "use torch.softmax (or subtract each row's max before exp).")
    if not torch.allclose(got.float(), want, atol=atol, rtol=rtol):
        err = (got.float() - want).abs().max().item()
        hint = ""
        if Tq < Tk and torch.allclose(got.float(), _top_left(q.float(), k.float(), v.float()), atol=atol, rtol=rtol):
            hint = (" Your mask is aligned to the top-left corner (torch.tril(ones(Tq, Tk)) or SDPA's is_causal=True): "
                    f"with a cache the {Tq} queries are the LAST {Tq} of the {Tk} positions, so query i sits at "
                    "position Tk - Tq + i and sees keys j <= Tk - Tq + i.")
        elif Tq == 1:
            hint = " A single new query sits at the last position and may see every key: no mask is needed."
        raise AssertionError(f"{what}: output differs from naive_attention by up to {err:.3g} for {shapes}.{hint}")
