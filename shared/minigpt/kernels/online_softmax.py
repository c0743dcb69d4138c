"""Online softmax: softmax of a vector seen one block at a time, in one pass (lab 04).

The state after the first n scores x_1..x_n is two numbers,

    m_n = max_i x_i                      (running max, for numerical safety)
    l_n = sum_i exp(x_i - m_n)           (running denominator, relative to the running max)

and a new block b updates it with

    m_new = max(m_old, max(b))
    l_new = l_old * exp(m_old - m_new) + sum_j exp(b_j - m_new)

so softmax(x)_i = exp(x_i - m) / l and logsumexp(x) = m + log(l) come out of a single pass. In attention
the same rescaling factor exp(m_old - m_new) is applied to the output accumulator (see tiled_attention.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["OnlineSoftmaxState", "online_softmax", "online_softmax_trace"]


@dataclass(frozen=True)
class OnlineSoftmaxState:
    """Running max `m` and running denominator `l` = sum exp(x - m) of the scores seen so far."""

    m: float = -math.inf
    l: float = 0.0

    def update(self, block: Tensor) -> "OnlineSoftmaxState":
        """The state after also seeing the scores in `block` (1-D)."""
        m_new = max(self.m, float(block.max()))
        scale = math.exp(self.m - m_new) if self.m != -math.inf else 0.0
        return OnlineSoftmaxState(m_new, self.l * scale + float(torch.exp(block.double() - m_new).sum()))

    @property
    def lse(self) -> float:
        """log(sum exp(x)) of the scores seen so far: m + log(l)."""
        return self.m + math.log(self.l)


def online_softmax(x: Tensor, block_size: int) -> Tensor:
    """softmax(x) over the last dimension of x (..., N), reading x in blocks of `block_size` columns.

    First pass: the running (m, l) recurrence over the blocks. Second step: exp(x - m) / l.
    Equal to torch.softmax(x, -1) up to rounding, for any N (the last block may be short).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    xf = x.to(torch.promote_types(x.dtype, torch.float32))           # float32 math (float64 kept)
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=xf.dtype, device=x.device)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], block_size):
        block = xf[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(-1, keepdim=True)
        m = m_new
    return (torch.exp(xf - m) / l).to(x.dtype)


def online_softmax_trace(x: Tensor, block_size: int) -> list[dict[str, object]]:
    """The state after each block of a 1-D score vector, for teaching (the lab's stepper widget).

    Returns one dict per block: {"block": (start, stop), "m", "l", "rescale" (= exp(m_old - m_new),
    the factor the old denominator and accumulator are multiplied by), "lse"}.
    """
    if x.ndim != 1:
        raise ValueError(f"online_softmax_trace takes a 1-D vector, got shape {tuple(x.shape)}")
    state, rows = OnlineSoftmaxState(), []
    for start in range(0, x.shape[0], block_size):
        new = state.update(x[start:start + block_size])
        rescale = math.exp(state.m - new.m) if state.m != -math.inf else 0.0
        rows.append({"block": (start, min(start + block_size, x.shape[0])), "m": new.m, "l": new.l,
                     "rescale": rescale, "lse": new.lse})
        state = new
    return rows
