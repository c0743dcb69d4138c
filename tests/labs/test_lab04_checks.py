"""Lab 04 checks: the solution notebook's answers pass; the stub, each plausible wrong implementation, the wrong
method (torch.softmax, full T x T attention, autograd) and the package's reference handed in (itself, a thin
wrapper, its Triton kernel behind the notebook's launcher) fail.

Wrong Triton kernels are built by feeding the solution's kernel the inputs a bug would effectively read
(K/V heads repeated with h % Hkv, keys cut at the queries for a top-left mask, garbage past the tail), so
they launch a real kernel of the notebook and only their numbers are wrong.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from autograder import lab04
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.kernels.flash_attention import flash_attention_forward
from minigpt.kernels.online_softmax import online_softmax
from minigpt.kernels.paged_decode import merge_partials, paged_decode
from minigpt.kernels.tiled_attention import tiled_attention_backward, tiled_attention_forward
from tests.labs.notebook_solutions import solution_cells

_PREAMBLE = """
import math
import torch
import minigpt.kernels
import triton
import triton.language as tl
"""
_CELLS = ("ex1_code", "ex2_code", "ex3_code", "ex4_code", "ex5_code", "ex6_code")
SOLUTION = solution_cells("04_flash_attention", *_CELLS, preamble=_PREAMBLE)
SOL_FLASH, SOL_PAGED = SOLUTION["flash_forward"], SOLUTION["paged_decode"]
MEAN_MERGE = solution_cells("04_flash_attention", *_CELLS, preamble=_PREAMBLE)     # the same kernels, a wrong merge
MEAN_MERGE["merge_partials"] = lambda o_part, lse_part: (
    (o_part * torch.isfinite(lse_part).unsqueeze(-1)).sum(-2) / torch.isfinite(lse_part).sum(-1, keepdim=True))


def sol_backward(q, k, v, out, lse, d_out, causal):
    return SOLUTION["tiled_backward"](q, k, v, out, lse, d_out, causal)


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
    xs = x[..., :n]
    m = torch.full(x.shape[:-1] + (1,), -math.inf)
    l = torch.zeros_like(m)
    for s in range(0, n, block_size):
        b = xs[..., s:s + block_size].float()
        m_new = torch.maximum(m, b.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(b - m_new).sum(-1, keepdim=True)
        m = m_new
    return (torch.exp(x.float() - m) / l).to(x.dtype)


def softmax_torch(x, block_size):
    """The right numbers by the two-pass method the exercise replaces."""
    return torch.softmax(x, -1)


def softmax_whole_row_max(x, block_size):
    """The max taken over the whole row first, then the sum block by block: not one pass."""
    m = x.float().amax(-1, keepdim=True)
    l = sum(torch.exp(x[..., s:s + block_size].float() - m).sum(-1, keepdim=True) for s in range(0, x.shape[-1], block_size))
    return (torch.exp(x.float() - m) / l).to(x.dtype)


def softmax_float32_out(x, block_size):
    """Right values, returned in float32 whatever the input's dtype."""
    return SOLUTION["online_softmax"](x.float(), block_size)


def softmax_wrapper(x, block_size):
    return online_softmax(x, block_size)


def test_online_softmax_solution_passes():
    lab04.check_online_softmax(SOLUTION["online_softmax"])


@pytest.mark.parametrize("wrong", [_stub, softmax_no_rescale, softmax_no_max, softmax_full_blocks_only, softmax_torch,
                                   softmax_whole_row_max, softmax_float32_out])
def test_online_softmax_rejects(wrong):
    with pytest.raises(AssertionError):
        lab04.check_online_softmax(wrong)


@pytest.mark.parametrize("wrong", [softmax_torch, softmax_whole_row_max])
def test_online_softmax_names_the_whole_row(wrong):
    with pytest.raises(AssertionError, match="one block at a time"):
        lab04.check_online_softmax(wrong)


@pytest.mark.parametrize("reference", [online_softmax, softmax_wrapper])
def test_online_softmax_refuses_the_reference(reference):
    with pytest.raises(ReferenceHandedIn):
        lab04.check_online_softmax(reference)


# --- tiled attention forward ------------------------------------------------------------------------

def _tiled(q, k, v, causal, block_k, bug=None):
    """Tiled forward with one deliberate bug (None = correct), computed in float32, returned in q's dtype."""
    dtype, (q, k, v) = q.dtype, (t.float() for t in (q, k, v))
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
    scale = 1 / D if bug == "scale 1/D" else 1 / math.sqrt(D)
    for s in range(0, Tk, block_k):
        sc = q @ k[:, :, s:s + block_k].transpose(-2, -1) * scale
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
    return out.to(dtype), lse.squeeze(-1)


def tiled_log2_lse(q, k, v, causal, block_k):
    """Right output; the LSE left in log2 units (m2 + log2 l), as an exp2 kernel computes it."""
    out, lse = _tiled(q, k, v, causal, block_k)
    return out, lse / math.log(2)


def tiled_full_attention(q, k, v, causal, block_k):
    """Right numbers from the whole (Tq x Tk) score matrix: not tiled."""
    group = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(group, 1).transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2]), -math.inf)
    return torch.softmax(s, -1) @ v.repeat_interleave(group, 1), torch.logsumexp(s, -1)


def tiled_sdpa(q, k, v, causal, block_k):
    """The output from PyTorch's fused attention, the LSE tiled."""
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2]) if causal else None
    return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask), _tiled(q, k, v, causal, block_k)[1]


def tiled_wrapper(q, k, v, causal, block_k):
    return tiled_attention_forward(q, k, v, causal=causal, block_k=block_k)


def test_tiled_solution_passes():
    lab04.check_tiled_attention(SOLUTION["tiled_attention"])
    lab04.check_tiled_attention(lambda q, k, v, causal, block_k: _tiled(q, k, v, causal, block_k))


@pytest.mark.parametrize("bug", ["no rescale", "divide in loop", "top-left", "lse without max", "h % Hkv", "scale 1/D"])
def test_tiled_rejects(bug):
    with pytest.raises(AssertionError) as info:
        lab04.check_tiled_attention(lambda q, k, v, causal, block_k: _tiled(q, k, v, causal, block_k, bug))
    hint = {"top-left": "top-left", "h % Hkv": "h // ", "lse without max": "running max", "scale 1/D": "1/D"}.get(bug)
    if hint:
        assert hint in str(info.value)


def test_tiled_names_an_lse_in_log2_units():
    with pytest.raises(AssertionError, match="log2 units"):
        lab04.check_tiled_attention(tiled_log2_lse)


@pytest.mark.parametrize("wrong, message", [(tiled_full_attention, "whole"), (tiled_sdpa, "scaled_dot_product")])
def test_tiled_rejects_untiled_methods(wrong, message):
    with pytest.raises(AssertionError, match=message):
        lab04.check_tiled_attention(wrong)


@pytest.mark.parametrize("reference", [tiled_attention_forward, tiled_wrapper])
def test_tiled_refuses_the_reference(reference):
    with pytest.raises(ReferenceHandedIn):
        lab04.check_tiled_attention(reference)


def test_tiled_rejects_stub():
    with pytest.raises(AssertionError, match="not implemented"):
        lab04.check_tiled_attention(_stub)


# --- backward -------------------------------------------------------------------------------------------

def backward_no_delta(q, k, v, out, lse, d_out, causal):
    """dS = P * dP, forgetting the rowsum(dO * O) term."""
    return sol_backward(q, k, v, torch.zeros_like(out), lse, d_out, causal)


def backward_unnormalised_p(q, k, v, out, lse, d_out, causal):
    """Recomputes P = exp(s - max) instead of exp(s - lse): the LSE is what normalises P (the row max computed
    tile by tile)."""
    kk = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = torch.stack([(q @ kk[:, :, i:i + 8].transpose(-2, -1)).amax(-1) for i in range(0, k.shape[2], 8)], -1)
    s = s.amax(-1, keepdim=True).squeeze(-1) / math.sqrt(q.shape[-1])
    return sol_backward(q, k, v, out, s.amax(-1), d_out, causal)


def backward_first_head_of_group(q, k, v, out, lse, d_out, causal):
    """dK, dV taken from one query head per group instead of summed over the group."""
    group = q.shape[1] // k.shape[1]
    dq, dk, dv = sol_backward(q, k, v, out, lse, d_out, causal)
    if group == 1:
        return dq, dk, dv
    return dq, dk / group, dv / group


def backward_autograd(q, k, v, out, lse, d_out, causal):
    """Right gradients from autograd of naive attention: not the backward pass by hand."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    with torch.enable_grad():
        o, _ = tiled_full_attention(q, k, v, causal, k.shape[2])
        return torch.autograd.grad(o, (q, k, v), d_out)


def backward_full_p(q, k, v, out, lse, d_out, causal):
    """Right gradients with the whole (Tq x Tk) P recomputed at once: not tiled."""
    return SOLUTION["tiled_backward"](q, k, v, out, lse, d_out, causal, block_k=k.shape[2])


def backward_wrapper(q, k, v, out, lse, d_out, causal):
    return tiled_attention_backward(q, k, v, out, lse, d_out, causal=causal)


def test_backward_solution_passes():
    lab04.check_tiled_backward(SOLUTION["tiled_backward"])


@pytest.mark.parametrize("wrong", [_stub, backward_no_delta, backward_unnormalised_p, backward_first_head_of_group,
                                   backward_autograd, backward_full_p])
def test_backward_rejects(wrong):
    with pytest.raises(AssertionError):
        lab04.check_tiled_backward(wrong)


@pytest.mark.parametrize("wrong, message", [(backward_autograd, "autograd"), (backward_full_p, "whole")])
def test_backward_names_the_wrong_method(wrong, message):
    with pytest.raises(AssertionError, match=message):
        lab04.check_tiled_backward(wrong)


@pytest.mark.parametrize("reference", [tiled_attention_backward, backward_wrapper])
def test_backward_refuses_the_reference(reference):
    with pytest.raises(ReferenceHandedIn):
        lab04.check_tiled_backward(reference)


# --- Triton forward ----------------------------------------------------------------------------------

def flash_reference(q, k, v, causal):
    """A thin wrapper: the package's kernel behind the notebook's signature."""
    return flash_attention_forward(q, k, v, causal=causal)


def flash_gqa_modulo(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    return SOL_FLASH(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1), causal)


def flash_top_left(q, k, v, causal):
    """A top-left mask lets query i see keys 0..i only: the same as dropping keys >= Tq."""
    if causal:
        return SOL_FLASH(q, k[:, :, :q.shape[2]], v[:, :, :q.shape[2]], True)
    return SOL_FLASH(q, k, v, False)


def flash_unmasked_tail(q, k, v, causal):
    """Reads the last key tile without a mask: garbage keys/values past Tk enter the softmax."""
    pad = -k.shape[2] % 16
    g = torch.Generator().manual_seed(0)
    junk = lambda t: torch.cat([t, torch.randn(*t.shape[:2], pad, t.shape[3], generator=g).to(t)], 2)  # noqa: E731
    if causal:          # the causal mask already hides keys past the last query's position
        return SOL_FLASH(q, k, v, True)
    return SOL_FLASH(q, junk(k), junk(v), False)


def flash_lse_without_max(q, k, v, causal):
    out, lse = SOL_FLASH(q, k, v, causal)
    group = q.shape[1] // k.shape[1]
    s = q.float() @ k.float().repeat_interleave(group, 1).transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2]),
                          -math.inf)
    return out, lse - s.amax(-1)


def flash_in_pytorch(q, k, v, causal):
    """Correct numbers, but no Triton kernel."""
    out, lse = SOLUTION["tiled_attention"](q, k, v, causal, 16)
    return out, lse


def _one_change(old: str, new: str) -> dict:
    """The solution's kernels with one line changed (a wrong implementation the fixed cases cannot see)."""
    return solution_cells("04_flash_attention", *_CELLS, preamble=_PREAMBLE, replace={old: new})


# Kernels right on the fixed cases (contiguous tensors, the default tiles, scores of order one) and wrong elsewhere:
# the drawn cases (autograder/lab04/drawn_cases.py) must catch each.
FLASH_UNSEEN = {
    "causal bound with BLOCK_N": ("hi = tl.minimum(k_len, start_m + BLOCK_M + offset)",
                                  "hi = tl.minimum(k_len, start_m + BLOCK_N + offset)"),
    "K read with q's strides": ("cols[None, :] * stride_kt + offs_d[:, None] * stride_kd",
                                "cols[None, :] * stride_qt + offs_d[:, None] * stride_qd"),
    "exp2 without the running maximum": ('s = tl.where(visible, s, float("-inf"))\n        m_new = tl.maximum(m_i, tl.max(s, 1))',
                                         's = tl.where(visible, s, float("-inf"))\n        m_new = tl.maximum(m_i, 0.0 * tl.max(s, 1))'),
    "mask of -1e4": ('s = tl.where(visible, s, float("-inf"))', "s = tl.where(visible, s, -1e4)"),
    "running maximum starts at -1e4": ('m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)',
                                       "m_i = tl.full((BLOCK_M,), -1e4, dtype=tl.float32)"),
}
PAGED_UNSEEN = {
    "an empty split's LSE -1e4": ('tl.where(empty, float("-inf"), m_i', "tl.where(empty, -1e4, m_i"),
    "mask of -1e4": ('qk_scale, float("-inf"))', "qk_scale, -1e4)"),
    "running maximum starts at -1e4": ('m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)',
                                       "m_i = tl.full((BLOCK_H,), -1e4, dtype=tl.float32)"),
    "V read past seq_len (the page's slots unmasked)": (
        "+ offs_d[None, :] * stride_vd, mask=t_ok[:, None] & d_ok[None, :], other=0.0)",
        "+ offs_d[None, :] * stride_vd, mask=(offs_t[:, None] < PAGE_SIZE) & d_ok[None, :], other=0.0)"),
    "q read as contiguous": ("Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd",
                             "Q + b * stride_qb + heads[:, None] * HEAD_DIM + offs_d[None, :]"),
    "two pages per split hard-coded": ("last = tl.minimum(first + PAGES_PER_SPLIT,", "last = tl.minimum(first + 2,"),
    "output left in float32": ("return (merge or merge_partials)(o_part, lse_part).to(q.dtype)",
                               "return (merge or merge_partials)(o_part, lse_part)"),
}


def test_flash_solution_passes():
    lab04.check_flash_forward(SOL_FLASH, dtypes=(torch.float16,))


@pytest.mark.parametrize("change", list(FLASH_UNSEEN), ids=list(FLASH_UNSEEN))
def test_flash_drawn_cases_catch_what_the_fixed_ones_cannot(change, monkeypatch):
    wrong = _one_change(*FLASH_UNSEEN[change])["flash_forward"]
    monkeypatch.setattr(lab04.triton_kernels, "attention_cases", lambda: [])
    lab04.check_flash_forward(wrong, dtypes=(torch.float32,))                  # the fixed cases alone pass it
    monkeypatch.undo()
    with pytest.raises(AssertionError, match="drawn case"):
        lab04.check_flash_forward(wrong, dtypes=(torch.float32,))


def test_flash_load_one_row_past_the_queries_is_caught_at_a_guard_page():
    """q's load masked with offs_m <= q_len reads one row past the last query of the last head: its values are never
    stored, so no output differs; the drawn cases run again with each tensor ending at an unreadable page."""
    wrong = _one_change("mask=(offs_m[:, None] < q_len) & d_ok[None, :], other=0.0)",
                        "mask=(offs_m[:, None] <= q_len) & d_ok[None, :], other=0.0)")["flash_forward"]
    with pytest.raises(AssertionError, match="read or wrote past the end of a tensor"):
        lab04.check_flash_forward(wrong, dtypes=(torch.float32,))


@pytest.mark.parametrize("reference", [flash_attention_forward, flash_reference])
def test_flash_refuses_the_reference(reference):
    with pytest.raises(ReferenceHandedIn):
        lab04.check_flash_forward(reference, dtypes=(torch.float16,))


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


def merge_wrapper(o_part, lse_part):
    return merge_partials(o_part, lse_part)


def test_merge_solution_passes():
    lab04.check_merge_partials(SOLUTION["merge_partials"])


@pytest.mark.parametrize("reference", [merge_partials, merge_wrapper])
def test_merge_refuses_the_reference(reference):
    with pytest.raises(ReferenceHandedIn):
        lab04.check_merge_partials(reference)


@pytest.mark.parametrize("wrong", [_stub, merge_mean, merge_unnormalised, merge_linear_lse])
def test_merge_rejects(wrong):
    with pytest.raises(AssertionError):
        lab04.check_merge_partials(wrong)


def paged_merge_without_weights(q, k_pool, v_pool, tables, lens):
    """The notebook's kernel, its splits averaged (the real ones) without the LSE weights (a launcher that takes no
    `merge`, so the check cannot hand it the package's)."""
    return MEAN_MERGE["paged_decode"](q, k_pool, v_pool, tables, lens, pages_per_split=1)


def test_paged_grades_only_the_kernel_not_a_wrong_merge():
    """Exercise 6's check passes the package's merge_partials to the launcher: a wrong Exercise 5 does not fail it."""
    lab04.check_paged_decode(MEAN_MERGE["paged_decode"], dtypes=(torch.float32,))


def paged_skewed_lse(q, k_pool, v_pool, tables, lens, merge=None):
    """A kernel whose split LSEs are off by the split's index (what reaches the merge is wrong)."""
    return SOL_PAGED(q, k_pool, v_pool, tables, lens,
                     merge=lambda o_part, lse_part: merge(o_part, lse_part + torch.arange(lse_part.shape[-1])))


def test_paged_kernel_with_wrong_partials_fails_even_with_the_package_merge():
    with pytest.raises(AssertionError, match="merged by the package"):
        lab04.check_paged_decode(paged_skewed_lse, dtypes=(torch.float32,))


def paged_gqa_modulo(q, k_pool, v_pool, tables, lens):
    group = q.shape[1] // k_pool.shape[2]
    return SOL_PAGED(q, k_pool.repeat(1, 1, group, 1), v_pool.repeat(1, 1, group, 1), tables, lens)


def paged_ignores_block_table(q, k_pool, v_pool, tables, lens):
    contiguous = torch.arange(tables.numel(), dtype=torch.int32).view_as(tables)
    return SOL_PAGED(q, k_pool, v_pool, contiguous, lens)


def paged_whole_last_page(q, k_pool, v_pool, tables, lens):
    """No mask on the last page: every slot of it is attended, past seq_len too."""
    bs = k_pool.shape[1]
    return SOL_PAGED(q, k_pool, v_pool, tables, ((lens + bs - 1) // bs * bs).to(torch.int32))


def paged_wrapper(q, k_pool, v_pool, tables, lens):
    return paged_decode(q, k_pool, v_pool, tables, lens)


def test_paged_solution_passes():
    lab04.check_paged_decode(SOL_PAGED, dtypes=(torch.float16,))


@pytest.mark.parametrize("change", list(PAGED_UNSEEN), ids=list(PAGED_UNSEEN))
def test_paged_drawn_cases_catch_what_the_fixed_ones_cannot(change, monkeypatch):
    wrong = _one_change(*PAGED_UNSEEN[change])["paged_decode"]
    if change != "output left in float32":       # the dtype of the result is checked in every case now
        monkeypatch.setattr(lab04.triton_kernels, "paged_cases", lambda: [])
        lab04.check_paged_decode(wrong, dtypes=(torch.float32,))
        monkeypatch.undo()
    with pytest.raises(AssertionError, match="drawn case" if change != "output left in float32" else "dtype"):
        lab04.check_paged_decode(wrong, dtypes=(torch.float32,))


@pytest.mark.parametrize("reference", [paged_decode, paged_wrapper])
def test_paged_refuses_the_reference(reference):
    with pytest.raises(ReferenceHandedIn):
        lab04.check_paged_decode(reference, dtypes=(torch.float16,))


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
    naive_4096, tiled_4096 = lab04.peak_bytes_naive_and_tiled(4096)
    lab04.check_q3_peak_ratio(naive_4096 / tiled_4096 * 4)     # naive 4x per doubling of T, tiled 2x: two doublings


def test_q3_measurement_matches_a_real_cpu_run():
    """The meta-device count the check uses equals the bytes a real CPU run allocates (at a small T)."""
    assert lab04.peak_bytes_naive_and_tiled(512) == lab04.peak_bytes_naive_and_tiled(512, device="cpu")


@pytest.mark.parametrize("check, answer, diagnosis", [
    (lab04.check_q1_online_state, 1 + math.exp(-1) + 1 + math.exp(-4), "exp(m_old - m_new)"),
    (lab04.check_q1_online_state, math.exp(2) + math.exp(1) + math.exp(4) + 1, "without subtracting"),
    (lab04.check_q2_naive_hbm_bytes, 32 * (4 * 4096 * 128 + 4 * 4096 * 4096), "elements"),
    (lab04.check_q2_naive_hbm_bytes, 2 * 32 * 4 * 4096 * 4096, "Q, K, V"),
    (lab04.check_q2_naive_hbm_bytes, float(2 * 32 * (4 * 4096 * 128 + 4 * 4096 * 4096)), "int"),
    (lab04.check_q3_peak_ratio, 7.64, "the ratio at T = 4096"),
    (lab04.check_q3_peak_ratio, 7.64 * 16, "not constant in T"),
    (lab04.check_q3_peak_ratio, None, "finite"),
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
