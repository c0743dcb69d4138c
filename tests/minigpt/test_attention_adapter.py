"""A course suite in the style of Stanford CS336's assignment 2 reaches the lab 04 Functions through an adapter that
only returns the classes: no wrapper. The suite calls `Function.apply(q, k, v, is_causal)` on (batch, seq, head_dim)
tensors, reads the one saved (batch, Nq) LSE from the autograd graph, and compares with its own mask (top-left,
built with tril(): the same as the course's bottom-right one when Nq = Nk, the only causal shape the Functions take).
Triton runs in its interpreter on a CPU; about 5 s on a quiet 2-core machine."""

from __future__ import annotations

import math

import pytest
import torch

import minigpt.kernels  # noqa: F401  (TRITON_INTERPRET=1 on a CPU before any kernel is built)


# --- the adapter, as a suite's adapters module would write it ---------------------------------------------------

def get_flashattention_autograd_function_pytorch() -> type:
    from minigpt.kernels.tiled_attention import TiledAttentionFunction
    return TiledAttentionFunction


def get_flashattention_autograd_function_triton() -> type:
    from minigpt.kernels.flash_attention import FlashAttentionFunction
    return FlashAttentionFunction


ADAPTERS = [get_flashattention_autograd_function_pytorch, get_flashattention_autograd_function_triton]


# --- the suite's side ------------------------------------------------------------------------------------------

def _inputs(batch: int, n_queries: int, n_keys: int, dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, n, dim, generator=g, requires_grad=True) for n in (n_queries, n_keys, n_keys)]


def _suite_reference(q, k, v, is_causal: bool):
    """(out, lse) of plain attention with a top-left causal mask."""
    s = torch.einsum("bqd,bkd->bqk", q, k) / math.sqrt(q.shape[-1])
    if is_causal:
        s = s.masked_fill(~torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.__name__)
@pytest.mark.parametrize("is_causal", [False, True])
def test_forward_and_saved_lse_through_the_adapter(adapter, is_causal):
    q, k, v = _inputs(3, 24, 24, 16, seed=11)
    out = adapter().apply(q, k, v, is_causal)
    want, want_lse = _suite_reference(q, k, v, is_causal)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    lse = [t for t in out.grad_fn.saved_tensors if t.shape == (3, 24)]
    assert len(lse) == 1
    torch.testing.assert_close(lse[0], want_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.__name__)
def test_backward_through_the_adapter(adapter):
    q, k, v = _inputs(2, 20, 20, 16, seed=12)
    adapter().apply(q, k, v, True).pow(2).sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    _suite_reference(q2, k2, v2, True)[0].pow(2).sum().backward()
    for got, want in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.__name__)
def test_non_causal_with_different_query_and_key_counts(adapter):
    q, k, v = _inputs(1, 5, 13, 8, seed=13)
    torch.testing.assert_close(adapter().apply(q, k, v, False), _suite_reference(q, k, v, False)[0],
                               atol=1e-4, rtol=1e-4)
