"""Lab 04 reference kernels: online softmax, tiled attention forward/backward (PyTorch), the Triton
FlashAttention forward and split-KV paged decode (Triton's interpreter on a CPU), the traffic arithmetic.

Shapes are tiny on purpose: the interpreter costs ~10-30 ms per tile operation.
"""

from __future__ import annotations

import math

import pytest
import torch

import minigpt.kernels  # noqa: F401  (turns on TRITON_INTERPRET=1 on a CPU before any kernel is built)
from minigpt.attention import ATTENTION_IMPLEMENTATIONS, naive_attention
from minigpt.cache.paged_attention import paged_decode_attention
from minigpt.kernels.flash_attention import FlashAttentionFunction, flash_attention, flash_attention_forward
from minigpt.kernels.online_softmax import OnlineSoftmaxState, online_softmax, online_softmax_trace
from minigpt.kernels.paged_decode import (check_paged_inputs, gather_then_sdpa, merge_partials, paged_decode,
                                          paged_decode_partials, random_paged_inputs)
from minigpt.kernels.tiled_attention import attention_lse, tiled_attention_backward, tiled_attention_forward
from minigpt.teaching.attention_traffic import attention_flops, flash_attention_bytes, naive_attention_bytes

TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _qkv(B, Hq, Hkv, Tq, Tk, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, Tq, D, generator=g).to(dtype), torch.randn(B, Hkv, Tk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Tk, D, generator=g).to(dtype))


def _full_attention(q, k, v, causal):
    """float64 reference, causal bottom-right or none."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = q.double() @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        Tq, Tk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq).logical_not(), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


# --- online softmax ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n, block", [(1, 4), (10, 3), (64, 16), (7, 7)])
def test_online_softmax_matches_softmax(n, block):
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(n)) * 20
    torch.testing.assert_close(online_softmax(x, block), torch.softmax(x, -1))


def test_online_softmax_state_and_trace():
    x = torch.tensor([1.0, 3.0, 2.0, 5.0, 0.0])
    state = OnlineSoftmaxState()
    for start in range(0, 5, 2):
        state = state.update(x[start:start + 2])
    assert state.m == 5.0
    assert math.isclose(state.l, float(torch.exp(x.double() - 5).sum()), rel_tol=1e-12)
    assert math.isclose(state.lse, float(torch.logsumexp(x, 0)), rel_tol=1e-6)
    trace = online_softmax_trace(x, 2)
    assert [r["m"] for r in trace] == [3.0, 5.0, 5.0] and trace[-1]["l"] == pytest.approx(state.l)
    assert trace[1]["rescale"] == pytest.approx(math.exp(3 - 5)) and trace[2]["rescale"] == 1.0


# --- tiled attention in PyTorch ---------------------------------------------------------------------

CASES = [  # B, Hq, Hkv, Tq, Tk, D, causal
    (1, 2, 2, 1, 1, 8, True),        # T = 1
    (2, 4, 4, 37, 37, 16, True),     # T not a multiple of the tile, MHA (group 1)
    (1, 4, 2, 5, 29, 8, True),       # Tq < Tk, bottom-right, group 2
    (1, 8, 1, 3, 40, 16, True),      # group 8 (MQA)
    (2, 4, 2, 20, 33, 24, False),    # non-causal, D not a power of two
]


@pytest.mark.parametrize("case", CASES)
def test_tiled_forward_matches_full_attention(case):
    *shape, causal = case
    q, k, v = _qkv(*shape)
    out, lse = tiled_attention_forward(q, k, v, causal=causal, block_k=16)
    want, want_lse = _full_attention(q, k, v, causal)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attention_lse(q, k, v, causal=causal).double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_tiled_backward_matches_autograd(case):
    *shape, causal = case
    q, k, v = (t.double().requires_grad_() for t in _qkv(*shape))
    want, _ = _full_attention(q, k, v, causal)
    d_out = torch.randn_like(want)
    want.backward(d_out)
    out, lse = tiled_attention_forward(q.detach(), k.detach(), v.detach(), causal=causal, block_k=8)
    grads = tiled_attention_backward(q.detach(), k.detach(), v.detach(), out, lse, d_out, causal=causal,
                                     block_q=4, block_k=8)
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, atol=1e-9, rtol=1e-7)


def test_tiled_rejects_bad_shapes():
    q, k, v = _qkv(1, 3, 2, 4, 4, 8)
    with pytest.raises(ValueError, match="grouped"):
        tiled_attention_forward(q, k, v)
    q, k, v = _qkv(1, 2, 2, 5, 3, 8)
    with pytest.raises(ValueError, match="keys"):
        tiled_attention_forward(q, k, v, causal=True)


# --- Triton forward (interpreter on CPU) --------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[3], CASES[4], CASES[0]])
def test_triton_forward_matches_reference(case, dtype):
    *shape, causal = case
    q, k, v = _qkv(*shape, dtype=dtype)
    out, lse = flash_attention_forward(q, k, v, causal=causal, block_m=16, block_n=16)
    want, want_lse = _full_attention(q, k, v, causal)
    assert out.dtype == dtype and lse.shape == q.shape[:3]
    torch.testing.assert_close(out.double(), want, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-4)


def test_every_autotune_tile_shape_is_correct():
    """The GPU autotuner picks among these tiles; each must give the same numbers (checked in the interpreter,
    where num_warps / num_stages have no effect)."""
    from minigpt.kernels.flash_attention import AUTOTUNE_CONFIGS

    q, k, v = _qkv(1, 2, 1, 70, 150, 64, dtype=torch.float16)
    want, want_lse = _full_attention(q, k, v, True)
    for bm, bn in sorted({(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in AUTOTUNE_CONFIGS}):
        out, lse = flash_attention_forward(q, k, v, causal=True, block_m=bm, block_n=bn)
        torch.testing.assert_close(out.double(), want, atol=3e-3, rtol=3e-3, msg=f"BLOCK_M={bm}, BLOCK_N={bn}")
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-4)


def test_triton_forward_accepts_strided_inputs():
    q, k, v = _qkv(1, 2, 2, 20, 20, 16)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)     # (B, H, T, D) view of a (B, T, H, D) tensor
    out, _ = flash_attention_forward(qt, k, v, causal=True)
    torch.testing.assert_close(out, flash_attention_forward(q, k, v, causal=True)[0])


def test_triton_registers_as_model_attention():
    assert ATTENTION_IMPLEMENTATIONS["triton"] is flash_attention
    q, k, v = _qkv(1, 4, 2, 6, 9, 8)
    torch.testing.assert_close(flash_attention(q, k, v), naive_attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_autograd_function_saves_lse_and_matches_autograd():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 19, 16, generator=g, requires_grad=True) for _ in range(3))
    out = FlashAttentionFunction.apply(q, k, v, True)
    saved = [t for t in out.grad_fn.saved_tensors if t.shape == (2, 19)]
    assert len(saved) == 1, "exactly one (batch, seq) tensor, the LSE, is saved"
    ref, ref_lse = _full_attention(q[:, None].detach(), k[:, None].detach(), v[:, None].detach(), True)
    torch.testing.assert_close(saved[0].double(), ref_lse[:, 0], atol=1e-5, rtol=1e-5)
    d_out = torch.randn_like(out)
    out.backward(d_out)
    q2, k2, v2 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want, _ = _full_attention(q2[:, None], k2[:, None], v2[:, None], True)
    want[:, 0].backward(d_out.double())
    for got, t in zip((q.grad, k.grad, v.grad), (q2, k2, v2)):
        torch.testing.assert_close(got.double(), t.grad, atol=1e-5, rtol=1e-4)


# --- paged decode ---------------------------------------------------------------------------------------

def _paged(B, Hq, Hkv, D, block_size, lens, dtype=torch.float32):
    return random_paged_inputs(lens, n_heads=Hq, n_kv_heads=Hkv, head_dim=D, block_size=block_size, dtype=dtype,
                               extra_blocks=1, num_blocks=48)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("B, Hq, Hkv, D, block_size, lens, pages_per_split", [
    (3, 4, 2, 16, 16, [1, 37, 70], 2),      # T = 1, partial last pages, empty splits for short sequences
    (2, 8, 1, 32, 8, [5, 100], 3),          # group 8, page of 8
    (2, 2, 2, 8, 16, [16, 33], 1),          # group 1, exactly one full page, one split per page
])
def test_paged_decode_matches_gather_reference(B, Hq, Hkv, D, block_size, lens, pages_per_split, dtype):
    args = _paged(B, Hq, Hkv, D, block_size, lens, dtype)
    got = paged_decode(*args, pages_per_split=pages_per_split)
    want = paged_decode_attention(*(a.double() if a.is_floating_point() else a for a in args))
    assert got.shape == (B, Hq, D) and got.dtype == dtype
    torch.testing.assert_close(got.double(), want, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(gather_then_sdpa(*(a.float() if a.is_floating_point() else a for a in args)).double(),
                               want, atol=1e-5, rtol=1e-5)


def test_merge_needs_the_lse_weights():
    args = _paged(1, 2, 1, 16, 16, [70])
    o_part, lse_part = paged_decode_partials(*args, pages_per_split=1)
    want = paged_decode_attention(*args)
    torch.testing.assert_close(merge_partials(o_part, lse_part), want, atol=1e-5, rtol=1e-5)
    unweighted = o_part.mean(-2)
    assert not torch.allclose(unweighted, want, atol=1e-3)


def test_paged_decode_rejects_bad_inputs():
    q, k_pool, v_pool, tables, lens = _paged(2, 3, 2, 8, 16, [4, 5])
    with pytest.raises(ValueError, match="multiple"):
        check_paged_inputs(q, k_pool, v_pool, tables, lens)


# --- traffic arithmetic ---------------------------------------------------------------------------------

def test_traffic_arithmetic():
    # B=1, H=32, T=4096, D=128, fp16: naive 2*32*(4*4096*128 + 4*4096^2), flash 2*32*4*4096*128 (+ LSE)
    assert naive_attention_bytes(1, 32, 4096, 128, 2) == 2 * 32 * (4 * 4096 * 128 + 4 * 4096 ** 2)
    assert flash_attention_bytes(1, 32, 4096, 128, 2, with_lse=False) == 2 * 32 * 4 * 4096 * 128
    assert flash_attention_bytes(1, 1, 10, 4, 2, flash_kv_passes=3) == 2 * 10 * 4 * (2 + 6) + 40
    assert attention_flops(1, 1, 8, 4, causal=False) == 4 * 8 * 8 * 4 == 2 * attention_flops(1, 1, 8, 4, causal=True)


# --- the stepper widget's numbers ---------------------------------------------------------------------------

def test_stepper_rows_end_at_the_softmax_weighted_value():
    from minigpt.teaching.flash_stepper import OnlineSoftmaxStepper, example_scores, stepper_rows

    scores, values = example_scores()
    p = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
    exact = float((p * torch.tensor(values, dtype=torch.float64)).sum())
    for block in (1, 3, 5, 24):
        rows = stepper_rows(scores, values, block)
        assert len(rows) == math.ceil(len(scores) / block) and rows[-1]["out"] == pytest.approx(exact, rel=1e-12)
        assert rows[-1]["m"] == max(scores) and rows[0]["rescale"] == 0.0
    s = OnlineSoftmaxStepper(block=4)
    s.step.value = 3
    assert s.state() == stepper_rows(scores, values, 4)[2] and "after tile 3 of 6" in s.readout.value
    s.block.value = 24                       # fewer tiles: the step slider is clamped
    assert s.step.value == 1 and "after tile 1 of 1" in s.readout.value
    with pytest.raises(ValueError):
        stepper_rows([1.0], [1.0, 2.0], 1)


# --- properties: any split of the keys, merged by LSE, gives the same softmax -----------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), block=st.integers(1, 45), scale=st.floats(0.1, 60.0), seed=st.integers(0, 2**16))
def test_online_softmax_any_block_size(n, block, scale, seed):
    x = torch.randn(2, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    torch.testing.assert_close(online_softmax(x, block), torch.softmax(x, -1))


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(1, 29), max_size=6), seed=st.integers(0, 2**16))
def test_merge_of_any_split_equals_full_attention(cuts, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(3, 30, generator=g, dtype=torch.float64) * 4             # 3 query heads, 30 keys
    v = torch.randn(30, 5, generator=g, dtype=torch.float64)
    bounds = [0, *sorted(set(cuts)), 30]
    o_part = torch.stack([torch.softmax(s[:, a:b], -1) @ v[a:b] for a, b in zip(bounds, bounds[1:])], 1)
    lse_part = torch.stack([torch.logsumexp(s[:, a:b], -1) for a, b in zip(bounds, bounds[1:])], 1)
    torch.testing.assert_close(merge_partials(o_part, lse_part), torch.softmax(s, -1) @ v)
