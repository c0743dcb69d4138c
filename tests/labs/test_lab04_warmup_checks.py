"""Lab 04 warm-up checks (vector add, row softmax, tiled matmul in Triton): the solution notebook's kernels pass; the
stub, the package's reference (itself, a thin wrapper, its kernel behind the notebook's launcher), a launcher that
runs no kernel, and each plausible wrong kernel below fail with a message naming the mistake. About 10 s on a CPU
(the interpreter)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from autograder import lab04
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.kernels import warmup
from tests.labs.notebook_solutions import solution_cells

_PREAMBLE = "import math\nimport torch\nimport minigpt.kernels\nimport triton\nimport triton.language as tl\n"
SOLUTION = solution_cells("04_flash_attention", "warmup1_code", "warmup2_code", "warmup3_code", preamble=_PREAMBLE)


def _stub(*args, **kwargs):
    raise NotImplementedError()


# --- wrong kernels, each launched like the notebook's -------------------------------------------------------------

@triton.jit
def _add_no_mask(X, Y, OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + offs, tl.load(X + offs) + tl.load(Y + offs))


def add_no_mask(x, y, out):
    _add_no_mask[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
    return out


@triton.jit
def _add_store_mask_only(X, Y, OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + offs, tl.load(X + offs) + tl.load(Y + offs), mask=offs < n)


def add_store_mask_only(x, y, out):
    _add_store_mask_only[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
    return out


@triton.jit
def _softmax_no_max(X, OUT, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + tl.program_id(0) * stride_x + cols, mask=ok, other=float("-inf"))
    e = tl.exp(x)
    tl.store(OUT + tl.program_id(0) * stride_out + cols, e / tl.sum(e, 0), mask=ok)


@triton.jit
def _softmax_zero_padding(X, OUT, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + tl.program_id(0) * stride_x + cols, mask=ok, other=0.0)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(OUT + tl.program_id(0) * stride_out + cols, e / tl.sum(e, 0), mask=ok)


def _softmax_with(kernel):
    def row_softmax(x, out):
        kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(x.shape[1]))
        return out
    return row_softmax


@triton.jit
def _matmul_whole_k_tiles(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K - K % BLOCK_K, BLOCK_K):            # the partial last step of K is dropped
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(A + rows[:, None] * stride_am + ks[None, :] * stride_ak, mask=rows[:, None] < M, other=0.0)
        b = tl.load(B + ks[:, None] * stride_bk + cols[None, :] * stride_bn, mask=cols[None, :] < N, other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(C + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _matmul_no_k_mask(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):                           # the last step reads past K, unmasked
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(A + rows[:, None] * stride_am + ks[None, :] * stride_ak, mask=rows[:, None] < M, other=0.0)
        b = tl.load(B + ks[:, None] * stride_bk + cols[None, :] * stride_bn, mask=cols[None, :] < N, other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(C + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _matmul_slip(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 ROWS_BY_BLOCK_N: tl.constexpr, A_WITHOUT_OTHER: tl.constexpr):
    """The solution's kernel with one slip (issue 57: both survived): row tiles placed BLOCK_N apart (equal tiles in
    the launcher hid it), or a's masked load without other= (its masked lanes undefined: zeros in Triton's own
    interpreter, NaN in the course's)."""
    if ROWS_BY_BLOCK_N:
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_M)
    else:
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a_ptrs = A + rows[:, None] * stride_am + ks[None, :] * stride_ak
        a_mask = (rows[:, None] < M) & (ks[None, :] < K)
        if A_WITHOUT_OTHER:
            a = tl.load(a_ptrs, mask=a_mask)
        else:
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        b = tl.load(B + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(C + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def _matmul_with(kernel, **slips):
    def matmul(a, b, out, block_m=16, block_n=16, block_k=16):
        M, K = a.shape
        N = b.shape[1]
        kernel[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](
            a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride(), BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_K=block_k, **slips)
        return out
    return matmul


# --- the solution passes; the reference and the stub do not ------------------------------------------------------

def test_solution_kernels_pass():
    lab04.check_vector_add(SOLUTION["add"])
    lab04.check_row_softmax(SOLUTION["row_softmax"])
    lab04.check_tiled_matmul(SOLUTION["matmul"])


@pytest.mark.parametrize("check, reference", [(lab04.check_vector_add, warmup.add),
                                              (lab04.check_row_softmax, warmup.row_softmax),
                                              (lab04.check_tiled_matmul, warmup.matmul)])
def test_reference_and_thin_wrapper_are_refused(check, reference):
    with pytest.raises(ReferenceHandedIn):
        check(reference)
    with pytest.raises(AssertionError, match="reference"):
        check(lambda *args: reference(*args))


def test_package_kernel_behind_the_notebooks_launcher_is_refused():
    def add(x, y, out):
        warmup.add_kernel[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
        return out
    with pytest.raises(ReferenceHandedIn):
        lab04.check_vector_add(add)


def test_stub_is_not_implemented():
    with pytest.raises(AssertionError, match="not implemented yet"):
        lab04.check_vector_add(_stub)


def test_plain_torch_without_a_kernel_fails():
    with pytest.raises(AssertionError, match="no Triton kernel"):
        lab04.check_vector_add(lambda x, y, out: out.copy_(x + y))


# --- the plausible mistakes ---------------------------------------------------------------------------------------

def test_add_without_the_tail_mask_fails():
    with pytest.raises(AssertionError, match="past the end"):
        lab04.check_vector_add(add_no_mask)


def test_add_with_only_the_store_masked_fails():
    """Its loads read past the end of x and y (values the masked store then drops): seen at a guard page."""
    with pytest.raises(AssertionError, match="read or wrote past the end of a tensor"):
        lab04.check_vector_add(add_store_mask_only)


def test_softmax_without_the_max_overflows():
    with pytest.raises(AssertionError, match=r"\+1000.*subtract the row max"):
        lab04.check_row_softmax(_softmax_with(_softmax_no_max))


def test_softmax_padding_read_as_zero_fails():
    with pytest.raises(AssertionError, match="other=float"):
        lab04.check_row_softmax(_softmax_with(_softmax_zero_padding))


def test_matmul_that_drops_the_k_tail_fails():
    with pytest.raises(AssertionError, match="values of K are missing"):
        lab04.check_tiled_matmul(_matmul_with(_matmul_whole_k_tiles))


def test_matmul_without_the_k_mask_fails():
    with pytest.raises(AssertionError, match="Mask the K tail"):
        lab04.check_tiled_matmul(_matmul_with(_matmul_no_k_mask))


def test_warm_up_labels_name_the_exercise():
    from autograder.checking.learner_errors import _label
    assert _label("warmup2_check") == "Warm-up 2"


def test_matmul_with_a_tile_name_swapped_fails_on_unequal_tiles():
    with pytest.raises(AssertionError, match="each size goes where its name says"):
        lab04.check_tiled_matmul(_matmul_with(_matmul_slip, ROWS_BY_BLOCK_N=True, A_WITHOUT_OTHER=False))


def test_matmul_with_a_masked_load_without_other_fails():
    """Triton leaves a masked load's lanes undefined; the course's interpreter fills them with NaN
    (minigpt.kernels.triton_support.undefined_lanes_as_nan), so the zero padding this kernel relies on is not there."""
    with pytest.raises(AssertionError, match="masked load without other="):
        lab04.check_tiled_matmul(_matmul_with(_matmul_slip, ROWS_BY_BLOCK_N=False, A_WITHOUT_OTHER=True))
