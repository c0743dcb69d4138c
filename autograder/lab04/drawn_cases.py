"""Drawn cases for the Triton kernel checks of lab 04: what the fixed cases never ask for.

The fixed cases (common.ATTENTION_CASES, PAGED_CASES) use contiguous tensors, the launcher's default tiles and
scores of order one. A kernel that reads one tensor with another's strides, bounds a loop with BLOCK_N where
BLOCK_M belongs, or exponentiates scores without subtracting the running maximum passes all of them. These cases,
drawn by hypothesis with a fixed seed (autograder/checking/drawn.py), vary:

* dtype: float32, float16, bfloat16 (bfloat16 on a GPU only: Triton's interpreter miscomputes bf16 arithmetic,
  minigpt/kernels/triton_support.py, so on a CPU those cases run in float16);
* layout, drawn for q, k and v apart: contiguous, a (B, T, H, D) buffer seen as (B, H, T, D) (what a model's
  projection hands over), a slice of a longer buffer whose other elements are NaN (a kernel that reads before or
  past its tensor, or past head_dim into the next row's padding, brings NaN into the output); so the strides of q,
  k and v differ;
* tiles: block_m, block_n in {16, 32, 64} (pages_per_split and the page size for the decode kernel), with lengths
  at a tile's edges (1, a tile minus one, exactly a tile, a tile plus one, several tiles);
* for the decode kernel, every slot of the pool that no sequence owns (past a sequence's length, blocks in no
  table) is NaN, so a load that the length should have masked shows (`fenced_pool`);
* magnitude: scores of order one; queries x40, so scores reach about +-150 in log2 units and exp2 without the
  running maximum overflows float32; every score far below -1e4 (keys all ones, queries negative integers: each
  query's scores exactly equal, so rounding such large numbers cannot blur the answer), so a mask of -1e4 instead
  of -inf outweighs every real key and a running maximum that starts at -1e4 underflows every weight.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from autograder.checking.drawn import drawn_examples

__all__ = ["AttentionCase", "PagedCase", "attention_cases", "paged_cases", "DRAWN_ATTENTION", "DRAWN_PAGED",
           "runnable_on", "scaled", "tolerance", "MAGNITUDES", "ORDER_ONE", "X40", "FAR_BELOW"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (block_m, block_n), unequal first: hypothesis draws the first values more often, and equal tiles hide a bound
# written with the other tile's size
TILE_PAIRS = ((64, 16), (16, 32), (32, 64), (32, 16), (16, 16), (64, 64))
LAYOUTS = ("contiguous", "(B, T, H, D) transposed", "slice of a NaN-filled buffer")
ORDER_ONE, X40, FAR_BELOW = "order one", "queries x40", "scores far below -1e4"
MAGNITUDES = (FAR_BELOW, ORDER_ONE, X40)
DRAWN_ATTENTION = 9         # drawn cases per check: each runs in well under a second in the interpreter
DRAWN_PAGED = 9


def scaled(x: torch.Tensor, magnitude: str, role: str) -> torch.Tensor:
    """Standard normal values `x` as the queries ("q") or keys ("k") of a case of this magnitude. Far below -1e4:
    every key is all ones and every query element a negative multiple of 16 between -4080 and -2048 (exact in
    fp16 and bf16), so each dot product is an integer float32 adds exactly in any order: a query's scores are all
    equal, about -2e4 in log2 units or lower, and the answer is the mean of the values it sees."""
    if magnitude == X40:
        return x * 40 if role == "q" else x
    if magnitude == FAR_BELOW:
        return -16 * (128 + (x.abs() * 40).floor().clamp(max=127)) if role == "q" else torch.ones_like(x)
    return x


def tolerance(magnitude: str, tol: float) -> float:
    """The comparison's tolerance for a case of this magnitude: far below -1e4 a float32 LSE holds about 3
    decimals (its spacing there is about 4e-3), so splits merge to about 1e-3; the mistakes that case is for are
    off by order one or NaN."""
    return max(tol, 1e-2) if magnitude == FAR_BELOW else tol


def _laid_out(shape: tuple[int, int, int, int], layout: str, dtype: torch.dtype, g: torch.Generator,
              magnitude: str = ORDER_ONE, role: str = "v") -> torch.Tensor:
    """A (B, H, T, D) tensor in `layout`; a view's base is a contiguous buffer of its own."""
    B, H, T, D = shape
    if layout == "contiguous":
        return scaled(torch.randn(B, H, T, D, generator=g), magnitude, role).to(dtype)
    if layout == "(B, T, H, D) transposed":
        return scaled(torch.randn(B, T, H, D, generator=g), magnitude, role).to(dtype).transpose(1, 2)
    buffer = torch.full((B, H, T + 10, D), math.nan, dtype=dtype)
    buffer[:, :, 5:T + 5] = scaled(torch.randn(B, H, T, D, generator=g), magnitude, role).to(dtype)
    return buffer[:, :, 5:T + 5]


@dataclasses.dataclass(frozen=True)
class AttentionCase:
    B: int
    Hq: int
    Hkv: int
    Tq: int
    Tk: int
    D: int
    causal: bool
    dtype: torch.dtype
    layouts: tuple[str, str, str]      # of q, k, v
    block_m: int
    block_n: int
    magnitude: str

    def __str__(self) -> str:
        return (f"drawn case B={self.B}, Hq={self.Hq}, Hkv={self.Hkv}, Tq={self.Tq}, Tk={self.Tk}, D={self.D}, "
                f"causal={self.causal}, {self.dtype}, q/k/v {' / '.join(self.layouts)}, block_m={self.block_m}, "
                f"block_n={self.block_n}, {self.magnitude}")

    def tensors(self, seed: int = 11) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) on the CPU, of the case's magnitude."""
        g = torch.Generator().manual_seed(seed)
        q_layout, k_layout, v_layout = self.layouts
        return (_laid_out((self.B, self.Hq, self.Tq, self.D), q_layout, self.dtype, g, self.magnitude, "q"),
                _laid_out((self.B, self.Hkv, self.Tk, self.D), k_layout, self.dtype, g, self.magnitude, "k"),
                _laid_out((self.B, self.Hkv, self.Tk, self.D), v_layout, self.dtype, g))


def _attention_case():
    """The strategy (hypothesis is imported here, when cases are drawn, not when a notebook imports the checks)."""
    from hypothesis import strategies as st

    return st.composite(_draw_attention_case)()


def _draw_attention_case(draw) -> AttentionCase:
    from hypothesis import strategies as st

    block_m, block_n = draw(st.sampled_from(TILE_PAIRS))
    Hkv, group = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    Tq = draw(st.sampled_from((block_m + 1, 1, 2 * block_m + 3, block_m - 1, block_m)))
    Tk = Tq + draw(st.sampled_from((0, 1, block_n - 1, block_n + 1)))
    return AttentionCase(B=draw(st.sampled_from((1, 2))), Hq=Hkv * group, Hkv=Hkv, Tq=Tq, Tk=Tk,
                         D=draw(st.sampled_from((16, 24, 64))), causal=draw(st.sampled_from((True, False))),
                         dtype=draw(st.sampled_from(DTYPES)), layouts=draw(st.tuples(*[st.sampled_from(LAYOUTS)] * 3)),
                         block_m=block_m, block_n=block_n, magnitude="")


def runnable_on(case, device: str):
    """The case as `device` runs it: on a CPU (Triton's interpreter) a bfloat16 case runs in float16."""
    if device == "cuda" or case.dtype != torch.bfloat16:
        return case
    return dataclasses.replace(case, dtype=torch.float16)


def attention_cases(count: int = DRAWN_ATTENTION) -> list[AttentionCase]:
    """The drawn attention cases, the same in every process."""
    return _each_magnitude(drawn_examples(_attention_case(), count))


def _each_magnitude(cases: list) -> list:
    """The magnitudes dealt in turn (hypothesis's draws cluster, and each magnitude is there to catch its own kind of
    mistake)."""
    return [dataclasses.replace(case, magnitude=MAGNITUDES[i % len(MAGNITUDES)]) for i, case in enumerate(cases)]


@dataclasses.dataclass(frozen=True)
class PagedCase:
    Hq: int
    Hkv: int
    D: int
    page_size: int
    pages_per_split: int
    seq_lens: tuple[int, ...]
    dtype: torch.dtype
    offset_query: bool
    magnitude: str

    def __str__(self) -> str:
        return (f"drawn case seq_lens={list(self.seq_lens)}, Hq={self.Hq}, Hkv={self.Hkv}, D={self.D}, pages of "
                f"{self.page_size}, pages_per_split={self.pages_per_split}, {self.dtype}, "
                f"{'q a slice at an offset' if self.offset_query else 'q contiguous'}, {self.magnitude}")


def _paged_case():
    from hypothesis import strategies as st

    return st.composite(_draw_paged_case)()


def _draw_paged_case(draw) -> PagedCase:
    from hypothesis import strategies as st

    page = draw(st.sampled_from((8, 16, 32)))
    lengths = st.sampled_from((1, page - 1, page, page + 1, 3 * page, 5 * page - 1))
    Hkv, group = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    return PagedCase(Hq=Hkv * group, Hkv=Hkv, D=draw(st.sampled_from((16, 24, 64))), page_size=page,
                     pages_per_split=draw(st.sampled_from((1, 2, 3))),
                     seq_lens=tuple(draw(st.lists(lengths, min_size=2, max_size=4))),
                     dtype=draw(st.sampled_from(DTYPES)), offset_query=draw(st.booleans()),
                     magnitude="")


def fenced_pool(pool: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """A copy of a K or V pool (num_blocks, page, Hkv, D) with NaN in every slot no sequence owns: slots past a
    sequence's length on its last page, and blocks in no block table. Attention over the owned slots is unchanged."""
    page = pool.shape[1]
    owned = torch.zeros(pool.shape[:2], dtype=torch.bool, device=pool.device)
    for table, length in zip(block_tables.tolist(), seq_lens.tolist()):
        for index, block in enumerate(table[:math.ceil(length / page)]):
            owned[block, :max(0, min(page, length - index * page))] = True
    return pool.masked_fill(~owned[:, :, None, None], math.nan)


def paged_cases(count: int = DRAWN_PAGED) -> list[PagedCase]:
    """The drawn paged-decode cases, the same in every process; every block table is exactly full (no spare
    entry past the longest sequence's last page)."""
    return [_with_empty_splits(case) for case in _each_magnitude(drawn_examples(_paged_case(), count))]


def _with_empty_splits(case: PagedCase) -> PagedCase:
    """Far below -1e4, the batch also holds a sequence five pages long, so the shorter ones have splits with no
    key at all, whose LSE must be -inf (an empty split marked -1e4 would outweigh every real one there)."""
    if case.magnitude != FAR_BELOW:
        return case
    return dataclasses.replace(case, seq_lens=(5 * case.page_size - 1,) + case.seq_lens)
