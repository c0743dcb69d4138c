"""Drawn cases for lab 05's dequantizing GEMV (exercise 9): what the fixed cases never ask for.

The fixed cases use contiguous float32 inputs, the launcher's default tiles (16 rows, 128 columns) and K <= 128, so
the loop over K runs once: a kernel that overwrites its accumulator instead of adding to it, or steps through the
packed bytes with the wrong stride, passes them. These cases, drawn by hypothesis with a fixed seed
(autograder/checking/drawn.py), vary:

* the width (INT8, INT4) and the tiles (block_n, block_k), unequal first, with K several tiles long and ragged
  (not a multiple of block_k) and N at a tile's edges (1, a tile minus one, a tile, a tile plus one, two and a bit);
* x in float32 or float16 (y comes back in x's dtype);
* the layout of each input: contiguous, a slice of a longer buffer whose other elements are NaN (x, the scales) or
  a code that is not zero (the weight codes), or a strided view (every other element of x, a window of a wider
  weight, transposed scales): a load past a row, past K or with another tensor's strides brings the fence into y.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from autograder.checking.drawn import drawn_examples

__all__ = ["GemvCase", "gemv_cases", "gemv_inputs", "DRAWN_GEMV", "EDGE_CASES"]

# (block_n, block_k), unequal first: equal tiles hide a bound written with the other tile's size
TILE_PAIRS = ((8, 64), (32, 16), (16, 32), (64, 128), (16, 16))
LAYOUTS = ("slice of a fenced buffer", "strided view", "contiguous")      # views first: drawn more often
DTYPES = (torch.float32, torch.float16)
DRAWN_GEMV = 12             # all of them run in about a second in the interpreter


@dataclasses.dataclass(frozen=True)
class GemvCase:
    bits: int
    N: int
    K: int
    group_size: int
    block_n: int
    block_k: int
    dtype: torch.dtype
    layouts: tuple[str, str, str]          # x, qweight, scale
    seed: int

    def describe(self) -> str:
        return (f"INT{self.bits}, N={self.N}, K={self.K}, group_size={self.group_size}, block_n={self.block_n}, "
                f"block_k={self.block_k}, x {str(self.dtype).removeprefix('torch.')}; x, qweight, scale: "
                f"{', '.join(self.layouts)}")


def _strategy():
    from hypothesis import strategies as st

    @st.composite
    def case(draw) -> GemvCase:
        bits = draw(st.sampled_from((4, 8)))
        block_n, block_k = draw(st.sampled_from(TILE_PAIRS))
        group = draw(st.sampled_from((16, 32, 64)))
        k_tiles = draw(st.sampled_from((2.5, 1.5, 3, 1)))       # K in tiles of block_k, ragged first
        K = max(group, math.ceil(k_tiles * block_k / group) * group)
        N = draw(st.sampled_from((block_n + 1, block_n - 1, 2 * block_n + 3, 1, block_n)))
        layouts = tuple(draw(st.sampled_from(LAYOUTS)) for _ in range(3))
        return GemvCase(bits, max(N, 1), K, group, block_n, block_k, draw(st.sampled_from(DTYPES)), layouts,
                        draw(st.integers(0, 2**16)))
    return case()


def gemv_cases(count: int = DRAWN_GEMV) -> list[GemvCase]:
    """The drawn cases: the same list in every process."""
    return drawn_examples(_strategy(), count)


_PLAIN = ("contiguous", "contiguous", "contiguous")
# Cases at the edges of the K loop that the draw (K a multiple of 16, tiles from 8) cannot reach, run after the drawn
# ones:
EDGE_CASES = (
    GemvCase(8, 5, 33, 11, 8, 16, torch.float32, _PLAIN, 3),    # the last tile holds one column (K = 2 tiles + 1)
    GemvCase(4, 2, 16, 16, 1, 2, torch.float32, _PLAIN, 0),     # the smallest tiles: one row, one packed byte
)


def _placed(t: torch.Tensor, layout: str, fence: float | int) -> torch.Tensor:
    """`t` (1-D or 2-D) in `layout`, equal in value; a view's buffer is its own and holds `fence` around it."""
    if layout == "contiguous":
        return t.clone()
    if layout == "slice of a fenced buffer":
        flat = torch.full((t.numel() + 16,), fence, dtype=t.dtype)
        flat[8:8 + t.numel()] = t.reshape(-1)
        return flat[8:8 + t.numel()].view(t.shape)
    if t.ndim == 1:                                  # every other element of a buffer twice as long
        buffer = torch.full((2 * t.numel(),), fence, dtype=t.dtype)
        buffer[::2] = t
        return buffer[::2]
    if t.dtype.is_floating_point:                    # scales: the transpose of a contiguous transpose
        return t.T.contiguous().T
    buffer = torch.full((t.shape[0], t.shape[1] + 8), fence, dtype=t.dtype)    # codes: a window of a wider matrix
    buffer[:, 4:4 + t.shape[1]] = t
    return buffer[:, 4:4 + t.shape[1]]


def gemv_inputs(case: GemvCase) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                                         tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(x, qweight, scale) twice: laid out as the case says (what the learner gets) and contiguous (for the answer).
    Codes are drawn over the whole range of the width; the fence of a code buffer is a code that is not zero."""
    g = torch.Generator().manual_seed(case.seed)
    N, K, group = case.N, case.K, case.group_size
    x = torch.randn(K, generator=g).to(case.dtype)
    scale = torch.rand(N, K // group, generator=g) * 0.1 + 0.01
    if case.bits == 8:
        qweight = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
        fence: int = 100
    else:
        qweight = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
        fence = 0x77
    laid = (_placed(x, case.layouts[0], math.nan), _placed(qweight, case.layouts[1], fence),
            _placed(scale, case.layouts[2], math.nan))
    return laid, (x, qweight, scale)
