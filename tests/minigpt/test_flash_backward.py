"""Lab 04 part two: the Triton FlashAttention-2 backward, the causal fast path of the forward kernel, and both
autograd Functions in the (B, T, D) / (B, H, T, D) interface with one saved LSE. Triton's interpreter on a CPU;
tiny shapes (about 15 s on a quiet 2-core machine)."""

from __future__ import annotations

import math

import pytest
import torch

import minigpt.kernels  # noqa: F401  (turns on TRITON_INTERPRET=1 on a CPU before any kernel is built)
from minigpt.kernels.flash_attention import FlashAttentionFunction, flash_attention_forward
from minigpt.kernels.flash_backward import attention_delta, flash_attention_backward
from minigpt.kernels.tiled_attention import TiledAttentionFunction

TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}
FUNCTIONS = [TiledAttentionFunction, FlashAttentionFunction]


def _qkv(B, Hq, Hkv, Tq, Tk, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, Tq, D, generator=g).to(dtype), torch.randn(B, Hkv, Tk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Tk, D, generator=g).to(dtype))


def _naive(q, k, v, causal):
    """float64 attention, causal bottom-right or none, differentiable."""
    group = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(group, 1).transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        Tq, Tk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq).logical_not(), -math.inf)
    return torch.softmax(s, -1) @ v.repeat_interleave(group, 1)


def _autograd_grads(q, k, v, d_out, causal):
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    _naive(*leaves, causal).backward(d_out.double())
    return [t.grad for t in leaves]


@pytest.mark.parametrize("B, Hq, Hkv, Tq, Tk, D, causal", [
    (1, 2, 2, 1, 1, 8, True),          # T = 1
    (2, 2, 2, 37, 37, 16, True),       # tail: 37 = 32 + 5
    (1, 4, 2, 5, 29, 8, True),         # Tq < Tk, bottom-right, GQA group 2
    (1, 8, 1, 3, 40, 16, True),        # GQA group 8
    (1, 4, 2, 20, 33, 24, False),      # non-causal, head_dim 24
])
def test_triton_backward_matches_autograd_of_naive_attention(B, Hq, Hkv, Tq, Tk, D, causal):
    q, k, v = _qkv(B, Hq, Hkv, Tq, Tk, D, seed=Tq)
    d_out = torch.randn(B, Hq, Tq, D, generator=torch.Generator().manual_seed(1))
    out, lse = flash_attention_forward(q, k, v, causal=causal)
    got = flash_attention_backward(q, k, v, out, lse, d_out, causal=causal)
    for g_, w in zip(got, _autograd_grads(q, k, v, d_out, causal)):
        torch.testing.assert_close(g_.double(), w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_backward_in_half_precision_returns_the_input_dtypes(dtype):
    q, k, v = _qkv(1, 4, 2, 21, 21, 16, dtype=dtype)
    d_out = torch.randn(1, 4, 21, 16, generator=torch.Generator().manual_seed(2)).to(dtype)
    out, lse = flash_attention_forward(q, k, v, causal=True)
    got = flash_attention_backward(q, k, v, out, lse, d_out, causal=True)
    assert [t.dtype for t in got] == [dtype] * 3
    for g_, w in zip(got, _autograd_grads(q, k, v, d_out, True)):
        torch.testing.assert_close(g_.double(), w, atol=TOL[dtype] * 3, rtol=TOL[dtype] * 3)


def test_delta_is_rowsum_of_d_out_times_out():
    out, d_out, _ = _qkv(2, 3, 3, 37, 37, 24, seed=4)
    torch.testing.assert_close(attention_delta(out, d_out), (out * d_out).sum(-1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("Tq, Tk, block_m, block_n", [(37, 37, 16, 32), (37, 37, 32, 16), (5, 40, 16, 16),
                                                      (1, 1, 16, 16)])
def test_causal_fast_path_equals_the_single_loop(Tq, Tk, block_m, block_n):
    q, k, v = _qkv(1, 2, 1, Tq, Tk, 16, seed=5)
    fast = flash_attention_forward(q, k, v, causal=True, block_m=block_m, block_n=block_n)
    single = flash_attention_forward(q, k, v, causal=True, block_m=block_m, block_n=block_n, causal_split=False)
    for a, b in zip(fast, single):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fast[0].double(), _naive(q.double(), k.double(), v.double(), True),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("Function", FUNCTIONS, ids=lambda f: f.__name__)
def test_function_on_batch_seq_dim_saves_one_lse_and_matches_autograd(Function):
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 19, 16, generator=g, requires_grad=True) for _ in range(3))
    out = Function.apply(q, k, v, is_causal=True)
    assert out.shape == q.shape
    saved = [t for t in out.grad_fn.saved_tensors if t.shape == (2, 19)]
    assert len(saved) == 1 and saved[0].dtype == torch.float32, "exactly one (batch, Nq) tensor, the LSE"
    d_out = torch.randn(out.shape, generator=g)
    out.backward(d_out)
    want = _autograd_grads(q.detach()[:, None], k.detach()[:, None], v.detach()[:, None], d_out[:, None], True)
    for got, w in zip((q.grad, k.grad, v.grad), want):
        torch.testing.assert_close(got.double(), w[:, 0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("Function", FUNCTIONS, ids=lambda f: f.__name__)
def test_function_on_heads_with_gqa_and_positional_is_causal(Function):
    q, k, v = (t.requires_grad_() for t in _qkv(1, 4, 2, 9, 9, 8, seed=7))
    out = Function.apply(q, k, v, False)
    assert [tuple(t.shape) for t in out.grad_fn.saved_tensors if t.shape == (1, 4, 9)] == [(1, 4, 9)]
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(8))
    out.backward(d_out)
    for got, w in zip((q.grad, k.grad, v.grad), _autograd_grads(q.detach(), k.detach(), v.detach(), d_out, False)):
        torch.testing.assert_close(got.double(), w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("Function", FUNCTIONS, ids=lambda f: f.__name__)
def test_function_refuses_causal_with_fewer_queries_than_keys(Function):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, 8, generator=g), torch.randn(1, 7, 8, generator=g),
               torch.randn(1, 7, 8, generator=g))
    with pytest.raises(ValueError, match="bottom-right.*top-left.*Tq = Tk"):
        Function.apply(q, k, v, True)
    assert Function.apply(q, k, v, False).shape == (1, 3, 8)      # non-causal: no convention to choose
