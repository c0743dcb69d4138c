"""Lab 04 checks: the reference passes, the stub and each plausible wrong implementation fail.

Wrong Triton kernels are built by feeding the reference kernel the inputs a bug would effectively read
(K/V heads repeated with h % Hkv, keys cut at the queries for a top-left mask, garbage past the tail), so
they launch a real kernel and only their numbers are wrong.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from autograder import lab04
from minigpt.kernels.flash_attention import flash_attention_forward
from minigpt.kernels.online_softmax import online_softmax
from minigpt.kernels.paged_decode import merge_partials, paged_decode, paged_decode_partials
from minigpt.kernels.tiled_attention import tiled_attention_backward, tiled_attention_forward


def _stub(*args, **kwargs):
    raise NotImplementedError()


# --- online softmax ---------------------------------------------------------------------------------

def softmax_no_rescale(x, block_size):
    """l += sum exp(b - m_new) without multiplying the old l by exp(m_old - m_new)."""
    m = torch.full(x.shape[:-1] + (1,), -math.inf)
    l = torch.zeros_like(m)
    for s in range(0, x.shape[-1], block_size):
        b = x[..., s:s + block_size]
        m = torch.maximum(m, b.amax(-1, keepdim=True))
        l = l + torch.exp(b - m).sum(-1, keepdim=True)
    return torch.exp(x - m) / l


def softmax_no_max(x, block_size):
    """Sums exp(x) directly: overflows for large scores."""
    l = sum(torch.exp(x[..., s:s + block_size]).sum(-1, keepdim=True) for s in range(0, x.shape[-1], block_size))
    return torch.exp(x) / l


def softmax_full_blocks_only(x, block_size):
    """Drops the short last block from the denominator."""
    n = max(block_size, x.shape[-1] - x.shape[-1] % block_size)
    return online_softmax(x[..., :n], block_size) if n == x.shape[-1] else torch.exp(x - x.amax(-1, keepdim=True)) / \
        torch.exp(x[..., :n] - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)


def test_online_softmax_reference_passes():
    lab04.check_online_softmax(online_softmax)


@pytest.mark.parametrize("wrong", [_stub, softmax_no_rescale, softmax_no_max, softmax_full_blocks_only])
def test_online_softmax_rejects(wrong):
    with pytest.raises(AssertionError):
        lab04.check_online_softmax(wrong)


# --- tiled attention forward ------------------------------------------------------------------------

def _tiled(q, k, v, causal, block_k, bug=None):
    """Tiled forward with one deliberate bug (None = correct)."""
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    if bug == "h % Hkv":
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    else:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    m = torch.full((B, Hq, Tq, 1), -math.inf)
    l = torch.zeros((B, Hq, Tq, 1))
    acc = torch.zeros((B, Hq, Tq, D))
    offset = 0 if bug == "top-left" else Tk - Tq
    for s in range(0, Tk, block_k):
        sc = q @ k[:, :, s:s + block_k].transpose(-2, -1) / math.sqrt(D)
        if causal:
            i = torch.arange(Tq)[:, None]
            j = torch.arange(s, min(s + block_k, Tk))[None, :]
            sc = sc.masked_fill(j > i + offset, -math.inf)
        m_new = torch.maximum(m, sc.amax(-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - safe)
        p = torch.exp(sc - safe)
        l_new = alpha * l + p.sum(-1, keepdim=True)
        if bug == "no rescale":
            acc = acc + p @ v[:, :, s:s + block_k]
        elif bug == "divide in loop":
            acc = alpha * acc + (p @ v[:, :, s:s + block_k]) / l_new
        else:
            acc = alpha * acc + p @ v[:, :, s:s + block_k]
        l, m = l_new, m_new
    out = acc if bug == "divide in loop" else acc / l
    lse = torch.log(l) if bug == "lse without max" else m + torch.log(l)
    return out, lse.squeeze(-1)


def test_tiled_reference_passes():
    lab04.check_tiled_attention(lambda q, k, v, causal, block_k: tiled_attention_forward(q, k, v, causal=causal,
                                                                                          block_k=block_k))
    lab04.check_tiled_attention(lambda q, k, v, causal, block_k: _tiled(q, k, v, causal, block_k))


@pytest.mark.parametrize("bug", ["no rescale", "divide in loop", "top-left", "lse without max", "h % Hkv"])
def test_tiled_rejects(bug):
    with pytest.raises(AssertionError) as info:
        lab04.check_tiled_attention(lambda q, k, v, causal, block_k: _tiled(q, k, v, causal, block_k, bug))
    hint = {"top-left": "top-left", "h % Hkv": "h // ", "lse without max": "running max"}.get(bug)
    if hint:
        assert hint in str(info.value)


def test_tiled_rejects_stub():
    with pytest.raises(AssertionError, match="not implemented"):
        lab04.check_tiled_attention(_stub)


# --- backward -------------------------------------------------------------------------------------------

def backward_no_delta(q, k, v, out, lse, d_out, causal):
    """dS = P * dP, forgetting the rowsum(dO * O) term."""
    return tiled_attention_backward(q, k, v, torch.zeros_like(out), lse, d_out, causal=causal)


def backward_unnormalised_p(q, k, v, out, lse, d_out, causal):
    """Recomputes P = exp(s - max) instead of exp(s - lse): the LSE is what normalises P."""
    s = q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-2, -1) / math.sqrt(q.shape[-1])
    return tiled_attention_backward(q, k, v, out, s.amax(-1), d_out, causal=causal)


def backward_first_head_of_group(q, k, v, out, lse, d_out, causal):
    """dK, dV taken from one query head per group instead of summed over the group."""
    group = q.shape[1] // k.shape[1]
    dq, dk, dv = tiled_attention_backward(q, k, v, out, lse, d_out, causal=causal)
    if group == 1:
        return dq, dk, dv
    return dq, dk / group, dv / group


def test_backward_reference_passes():
    lab04.check_tiled_backward(lambda q, k, v, out, lse, d_out, causal:
                               tiled_attention_backward(q, k, v, out, lse, d_out, causal=causal))


@pytest.mark.parametrize("wrong", [_stub, backward_no_delta, backward_unnormalised_p, backward_first_head_of_group])
def test_backward_rejects(wrong):
    with pytest.raises(AssertionError):
        lab04.check_tiled_backward(wrong)


# --- Triton forward ----------------------------------------------------------------------------------

def flash_reference(q, k, v, causal):
    return flash_attention_forward(q, k, v, causal=causal)


def flash_gqa_modulo(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    return flash_attention_forward(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1), causal=causal)


def flash_top_left(q, k, v, causal):
    """A top-left mask lets query i see keys 0..i only: the same as dropping keys >= Tq."""
    if causal:
        return flash_attention_forward(q, k[:, :, :q.shape[2]], v[:, :, :q.shape[2]], causal=True)
    return flash_attention_forward(q, k, v, causal=False)


def flash_unmasked_tail(q, k, v, causal):
    """Reads the last key tile without a mask: garbage keys/values past Tk enter the softmax."""
    pad = -k.shape[2] % 16
    g = torch.Generator().manual_seed(0)
    junk = lambda t: torch.cat([t, torch.randn(*t.shape[:2], pad, t.shape[3], generator=g).to(t)], 2)  # noqa: E731
    if causal:          # the causal mask already hides keys past the last query's position
        return flash_attention_forward(q, k, v, causal=True)
    return flash_attention_forward(q, junk(k), junk(v), causal=False)


def flash_lse_without_max(q, k, v, causal):
    out, lse = flash_attention_forward(q, k, v, causal=causal)
    group = q.shape[1] // k.shape[1]
    s = q.float() @ k.float().repeat_interleave(group, 1).transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2]),
                          -math.inf)
    return out, lse - s.amax(-1)


def flash_in_pytorch(q, k, v, causal):
    """Correct numbers, but no Triton kernel."""
    out, lse = tiled_attention_forward(q, k, v, causal=causal)
    return out, lse


def test_flash_reference_passes():
    lab04.check_flash_forward(flash_reference, dtypes=(torch.float16,))


@pytest.mark.parametrize("wrong", [_stub, flash_gqa_modulo, flash_top_left, flash_unmasked_tail, flash_lse_without_max,
                                   flash_in_pytorch])
def test_flash_rejects(wrong):
    with pytest.raises(AssertionError):
        lab04.check_flash_forward(wrong, dtypes=(torch.float32,))


# --- merge and paged decode -------------------------------------------------------------------------------

def merge_mean(o_part, lse_part):
    return o_part.mean(-2)


def merge_unnormalised(o_part, lse_part):
    """exp(lse_s) weights without dividing by their sum."""
    return (torch.exp(lse_part - lse_part.amax(-1, keepdim=True)).unsqueeze(-1) * o_part).sum(-2)


def merge_linear_lse(o_part, lse_part):
    w = lse_part.nan_to_num(neginf=0.0)
    return (w / w.sum(-1, keepdim=True)).unsqueeze(-1).mul(o_part).sum(-2)


def test_merge_reference_passes():
    lab04.check_merge_partials(merge_partials)


@pytest.mark.parametrize("wrong", [_stub, merge_mean, merge_unnormalised, merge_linear_lse])
def test_merge_rejects(wrong):
    with pytest.raises(AssertionError):
        lab04.check_merge_partials(wrong)


def paged_merge_without_weights(q, k_pool, v_pool, tables, lens):
    o_part, lse_part = paged_decode_partials(q, k_pool, v_pool, tables, lens, pages_per_split=1)
    # splits past the end are empty (zeros): average only the real ones, still without the LSE weights
    real = torch.isfinite(lse_part).unsqueeze(-1)
    return ((o_part * real).sum(-2) / real.sum(-2)).to(q.dtype)


def paged_gqa_modulo(q, k_pool, v_pool, tables, lens):
    group = q.shape[1] // k_pool.shape[2]
    return paged_decode(q, k_pool.repeat(1, 1, group, 1), v_pool.repeat(1, 1, group, 1), tables, lens)


def paged_ignores_block_table(q, k_pool, v_pool, tables, lens):
    contiguous = torch.arange(tables.numel(), dtype=torch.int32).view_as(tables)
    return paged_decode(q, k_pool, v_pool, contiguous, lens)


def paged_whole_last_page(q, k_pool, v_pool, tables, lens):
    """No mask on the last page: every slot of it is attended, past seq_len too."""
    bs = k_pool.shape[1]
    return paged_decode(q, k_pool, v_pool, tables, ((lens + bs - 1) // bs * bs).to(torch.int32))


def test_paged_reference_passes():
    lab04.check_paged_decode(paged_decode, dtypes=(torch.float16,))


@pytest.mark.parametrize("wrong", [_stub, paged_merge_without_weights, paged_gqa_modulo, paged_ignores_block_table,
                                   paged_whole_last_page])
def test_paged_rejects(wrong):
    with pytest.raises(AssertionError):
        lab04.check_paged_decode(wrong, dtypes=(torch.float32,))


# --- interview questions ----------------------------------------------------------------------------------

def test_questions_accept_the_right_answers():
    b1, b2 = lab04.Q1_BLOCKS
    l2 = (math.exp(2 - 2) + math.exp(1 - 2)) * math.exp(2 - 4) + math.exp(4 - 4) + math.exp(0 - 4)
    assert b1 == [2.0, 1.0] and b2 == [4.0, 0.0]
    lab04.check_q1_online_state(l2)
    lab04.check_q2_naive_hbm_bytes(2 * 32 * (4 * 4096 * 128 + 4 * 4096 * 4096))
    lab04.check_q3_hbm_ratio(33.0)


@pytest.mark.parametrize("check, answer, diagnosis", [
    (lab04.check_q1_online_state, 1 + math.exp(-1) + 1 + math.exp(-4), "exp(m_old - m_new)"),
    (lab04.check_q1_online_state, math.exp(2) + math.exp(1) + math.exp(4) + 1, "without subtracting"),
    (lab04.check_q2_naive_hbm_bytes, 32 * (4 * 4096 * 128 + 4 * 4096 * 4096), "elements"),
    (lab04.check_q2_naive_hbm_bytes, 2 * 32 * 4 * 4096 * 4096, "Q, K, V"),
    (lab04.check_q2_naive_hbm_bytes, float(2 * 32 * (4 * 4096 * 128 + 4 * 4096 * 4096)), "int"),
    (lab04.check_q3_hbm_ratio, 32.0, "1 + T / D"),
    (lab04.check_q3_hbm_ratio, 1 / 33, "inverted"),
    (lab04.check_q3_hbm_ratio, None, "finite"),
])
def test_questions_reject_wrong_answers(check, answer, diagnosis):
    with pytest.raises(AssertionError, match=re.escape(diagnosis)):
        check(answer)


# --- GPU tier ------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.calibrated(lab04.FLASH_SPEED_CHECK, lab04.DECODE_SPEED_CHECK, lab04.MEMORY_CHECK)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_checks_pass_with_the_reference():
    lab04.check_flash_speed(flash_reference)
    lab04.check_paged_decode_speed(paged_decode)
    lab04.check_flash_memory(flash_reference)
