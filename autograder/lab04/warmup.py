"""Warm-ups 1 to 3: three small Triton kernels (vector add, fused row softmax, tiled matmul), run in the
interpreter on a CPU.

Every tensor the learner's launcher gets is a view into a larger buffer: the inputs' padding holds NaN (a load past
the end that reaches the result turns it NaN) and the output's padding a sentinel (a store past the end changes it),
so a missing mask shows as a wrong number or an overwritten sentinel, never as memory the check does not own.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

import minigpt.kernels  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before any kernel is built)
from autograder.lab04.triton_kernels import call_launcher
from autograder.checking.reference_guard import own_work
from minigpt.kernels import warmup as ref

WARMUP_ADD = "Warm-up 1 (vector add)"
WARMUP_SOFTMAX = "Warm-up 2 (row softmax)"
WARMUP_MATMUL = "Warm-up 3 (tiled matmul)"
PAD = 1024                  # elements of padding after every tensor (more than any block a launcher uses)
SENTINEL = 1234.5


def _device() -> str:
    """Where the kernels run: the GPU when there is one, else the CPU (Triton's interpreter)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _guarded(shape: tuple[int, ...], fill: float,
             values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(view of `shape`, its buffer): the buffer has PAD extra columns on the last dimension and PAD extra elements
    at the end, all `fill`; the view holds `values` (if given)."""
    *lead, last = shape
    rows = math.prod(lead) if lead else 1
    buf = torch.full((rows * (last + PAD) + PAD,), fill, device=_device())
    view = buf[:rows * (last + PAD)].view(rows, last + PAD)[:, :last]
    view = view.reshape(shape) if lead else view[0]
    if values is not None:
        view.copy_(values.to(view.device))
    return view, buf


def _untouched(buf: torch.Tensor, view: torch.Tensor) -> bool:
    """True when every element of `buf` outside `view` still holds SENTINEL."""
    buf = buf.cpu()
    outside = torch.ones_like(buf, dtype=torch.bool)
    idx = torch.arange(buf.numel()).as_strided(view.shape, view.stride(), view.storage_offset())
    outside[idx.flatten()] = False
    return bool((buf[outside] == SENTINEL).all())


def _run(what: str, fn: Callable, refs: tuple, args: tuple, context: str, first: bool, **kwargs: Any) -> None:
    """Call fn(*args, **kwargs) counting its Triton launches; refuse no launch, a launch of the package's kernel and
    a load or store past a tensor's end (guard pages); the first case also refuses a call into the reference's
    launcher."""
    _, launches = call_launcher(what, fn, *args, exercise=what, context=context, watch=refs if first else (),
                                guard_pages=True, **kwargs)
    if not launches:
        raise AssertionError(f"{what} ({context}): no Triton kernel was launched; write the kernel with @triton.jit "
                             "and launch it over a grid: kernel[grid](...)")


def check_vector_add(fn: Callable) -> None:
    """fn(x, y, out) writes x + y into out (1-D float32), through a Triton kernel of the notebook's; lengths that are
    not a multiple of the block, and no write past the end of out."""
    refs = (ref.add,)       # a launch of ref.add_kernel is refused by call_launcher
    own_work(fn, refs, what=WARMUP_ADD)
    g = torch.Generator().manual_seed(11)
    for i, n in enumerate((1000, 1, 512, 1025)):
        x, _ = _guarded((n,), math.nan, torch.randn(n, generator=g))
        y, _ = _guarded((n,), math.nan, torch.randn(n, generator=g))
        out, out_buf = _guarded((n,), SENTINEL)
        _run(WARMUP_ADD, fn, refs, (x, y, out), f"n = {n}", i == 0)
        if not _untouched(out_buf, out):
            raise AssertionError(f"{WARMUP_ADD}, n = {n}: the kernel wrote past the end of out. The last program's "
                                 "offsets run past n: store (and load) with mask=offs < n.")
        out, want = out.cpu(), (x + y).cpu()
        if not torch.equal(out, want):
            bad = int((out != want).sum())
            raise AssertionError(f"{WARMUP_ADD}, n = {n}: {bad} of {n} elements differ from x + y. Program i covers "
                                 "offsets i * BLOCK + tl.arange(0, BLOCK).")


def check_row_softmax(fn: Callable) -> None:
    """fn(x, out) writes softmax(x, dim=-1) into out (2-D float32, rows contiguous, row stride larger than the row)
    through a Triton kernel of the notebook's: rows shorter than the block, scores near +1000 and -10000."""
    refs = (ref.row_softmax,)       # a launch of ref.row_softmax_kernel is refused by call_launcher
    own_work(fn, refs, what=WARMUP_SOFTMAX)
    g = torch.Generator().manual_seed(12)
    cases = [((4, 10), 0.0, 1.0, "rows of 10 (the block is 16: 6 padding columns)"),
             ((3, 64), 0.0, 1.0, "rows of 64"),
             ((2, 1), 0.0, 1.0, "rows of 1"),
             ((3, 37), 1000.0, 5.0, "scores near +1000: exp overflows to inf without subtracting the row max"),
             ((2, 20), -1e4, 5.0, "scores near -10000: exp underflows to 0 without subtracting the row max")]
    for i, (shape, shift, scale, what) in enumerate(cases):
        values = torch.randn(*shape, generator=g) * scale + shift
        x, _ = _guarded(shape, math.nan, values)
        out, out_buf = _guarded(shape, SENTINEL)
        _run(WARMUP_SOFTMAX, fn, refs, (x, out), what, i == 0)
        if not _untouched(out_buf, out):
            raise AssertionError(f"{WARMUP_SOFTMAX}, {what}: the kernel wrote past the end of a row of out; store "
                                 "with mask=cols < n_cols.")
        out, want = out.cpu(), torch.softmax(values.double(), -1)
        if torch.allclose(out.double(), want, atol=1e-6, rtol=1e-5):
            continue
        hint = ""
        if not torch.isfinite(out).all():
            hint = (" The result has inf / NaN: subtract the row max before tl.exp (exp(x - max) <= 1), and load the "
                    "padding columns with mask=cols < n_cols, other=float('-inf'), so they add exp(-inf) = 0.")
        else:
            wide = torch.cat([values.double(), torch.zeros(shape[0], triton_block(shape[1]) - shape[1],
                                                           dtype=torch.float64)], 1)
            if torch.allclose(out.double(), torch.softmax(wide, -1)[:, :shape[1]], atol=1e-6, rtol=1e-5):
                hint = (" The padding columns count as score 0: load them with other=float('-inf'), not 0, so they "
                        "add nothing to the max and the sum.")
        err = (out.double() - want).abs().nan_to_num(math.inf).max().item()
        raise AssertionError(f"{WARMUP_SOFTMAX}, {what}: max abs error {err:.3g} against torch.softmax.{hint}")


def triton_block(n: int) -> int:
    """The power of two a one-block-per-row kernel uses for a row of n (triton.next_power_of_2)."""
    return 1 << max(0, (n - 1).bit_length())


def check_tiled_matmul(fn: Callable) -> None:
    """fn(a (M, K), b (K, N), out (M, N)) writes a @ b into out (float32, strided views) through a Triton kernel of
    the notebook's: M, N, K not multiples of the tile, and K smaller and larger than one tile."""
    refs = (ref.matmul,)       # a launch of ref.matmul_kernel is refused by call_launcher
    own_work(fn, refs, what=WARMUP_MATMUL)
    g = torch.Generator().manual_seed(13)
    cases = [((M, K, N), {}) for M, K, N in ((16, 16, 16), (37, 45, 29), (5, 70, 3), (1, 1, 1), (20, 8, 33))]
    cases += [((37, 45, 29), dict(zip(("block_m", "block_n", "block_k"), tiles)))      # tiles of three sizes: a
              for tiles in ((16, 32, 64), (32, 64, 16), (64, 16, 32))]                # swapped name shows
    for i, ((M, K, N), tiles) in enumerate(cases):
        what = f"M = {M}, K = {K}, N = {N}" + "".join(f", {k} = {v}" for k, v in tiles.items())
        a_vals, b_vals = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
        a, _ = _guarded((M, K), math.nan, a_vals)
        b_t, _ = _guarded((N, K), math.nan, b_vals.T)          # b as a transposed view: column-major strides
        b = b_t.T
        out, out_buf = _guarded((M, N), SENTINEL)
        _run(WARMUP_MATMUL, fn, refs, (a, b, out), what, i == 0, **tiles)
        if not _untouched(out_buf, out):
            raise AssertionError(f"{WARMUP_MATMUL}, {what}: the kernel wrote outside out; store the tile with "
                                 "mask=(rows < M)[:, None] & (cols < N)[None, :].")
        out, want = out.cpu(), a_vals.double() @ b_vals.double()
        if torch.allclose(out.double(), want, atol=1e-4, rtol=1e-4):
            continue
        hint = " Use the strides you are given (b here is a transposed view), and accumulate in float32."
        whole = K - K % 16
        if not torch.isfinite(out).all():
            hint = (" The result has NaN: a load read past the edge of a or b, or a masked load without other= (its "
                    "masked lanes are undefined: NaN in the course's interpreter, as a GPU may leave them). Mask the "
                    "K tail (ks < K) as well as the rows (< M) and columns (< N), with other=0.")
        elif tiles:
            hint = (" With tiles of three different sizes the result is wrong: rows come in tiles of BLOCK_M, columns "
                    "of BLOCK_N, and K in steps of BLOCK_K (the accumulator is (BLOCK_M, BLOCK_N)); check that each "
                    "size goes where its name says.")
        elif whole < K and torch.allclose(out.double(), a_vals[:, :whole].double() @ b_vals[:whole].double(),
                                          atol=1e-4, rtol=1e-4):
            hint = (f" The last {K - whole} values of K are missing: loop over range(0, K, BLOCK_K) (the last step "
                    "is partial, masked with ks < K), not over the whole tiles only.")
        err = (out.double() - want).abs().nan_to_num(math.inf).max().item()
        raise AssertionError(f"{WARMUP_MATMUL}, {what}: max abs error {err:.3g} against a @ b.{hint}")
