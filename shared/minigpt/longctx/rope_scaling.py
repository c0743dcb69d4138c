"""RoPE frequency transforms for running a model past its trained context.

    inv_freq = scaled_inv_freq(64, 10_000.0, factor=8.0, method="yarn", original_max_len=512)

RoPE rotates pair i of every query and key by angle p * f_i, f_i = theta^(-2i/D), i = 0..D/2-1. Pair 0 turns
fastest (wavelength 2*pi); the last pairs turn so slowly that in a trained context of L tokens they cover less
than one turn, so a longer context shows them angles never seen in training. With a scale factor s:

* "none": f_i unchanged.
* "pi" (position interpolation, Chen et al. 2023): f_i / s for every i; all positions squeezed into the trained
  range, but neighbouring tokens become s times harder to tell apart in the fast pairs.
* "ntk" (NTK-aware, bloc97 2023): theta' = theta * s^(D/(D-2)); the fastest pair is unchanged, the slowest
  is divided by exactly s, the ones between by less.
* "yarn" (Peng et al. 2023, "NTK-by-parts" + temperature): with r_i = L / (2*pi/f_i) the turns pair i makes in
  the trained context, and ramp g_i = clamp((r_i - alpha) / (beta - alpha), 0, 1), alpha=1, beta=32:
  f_i' = (1 - g_i) * f_i / s + g_i * f_i. Pairs that turn more than beta times are kept, pairs that turn less
  than once are interpolated, a linear blend between; and the attention logits are multiplied by
  (0.1 ln s + 1)^2 (`yarn_logit_scale`).

  Two ramps are in use. The paper's (`ramp="turns"`, the default here) is linear in r_i. Hugging Face
  Transformers' `_compute_yarn_parameters` (and vLLM, and DeepSeek's reference code, which mirror it) ramps linearly
  over the pair INDEX between the correction dimensions d(beta) = D ln(L / (2 pi beta)) / (2 ln theta), floored,
  and d(alpha), ceiled (`ramp="index"`): the same pairs are kept and fully interpolated, but the blended pairs get
  other frequencies (for D=64, theta=10^4, L=512: pairs 3..16 ramp; pair 7 keeps weight 0.32 of
  its frequency by turns, 0.69 by index).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["METHODS", "RAMPS", "base_inv_freq", "scaled_inv_freq", "yarn_logit_scale", "rotations_in_context",
           "correction_dim"]

METHODS = ("none", "pi", "ntk", "yarn")
RAMPS = ("turns", "index")


def base_inv_freq(head_dim: int, theta: float) -> Tensor:
    """f_i = theta^(-2i/D), i = 0..D/2-1, float64 (D/2,)."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got {head_dim}")
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def rotations_in_context(inv_freq: Tensor, context_len: int) -> Tensor:
    """How many full turns each pair makes over `context_len` positions: context_len * f_i / (2*pi)."""
    return context_len * inv_freq / (2 * math.pi)


def correction_dim(turns: float, head_dim: int, theta: float, context_len: int) -> float:
    """The (fractional) pair index i whose pair makes `turns` turns in `context_len` positions."""
    return head_dim * math.log(context_len / (2 * math.pi * turns)) / (2 * math.log(theta))


def scaled_inv_freq(head_dim: int, theta: float, factor: float, method: str, original_max_len: int,
                    *, beta_fast: float = 32.0, beta_slow: float = 1.0, ramp: str = "turns") -> Tensor:
    """The RoPE frequencies (D/2,) float64 for running `factor` times past `original_max_len` with `method`;
    `ramp` picks YaRN's blend ("turns": the paper's, "index": Transformers' and vLLM's)."""
    if method not in METHODS:
        raise ValueError(f"unknown RoPE scaling method {method!r}; choose one of {METHODS}")
    if ramp not in RAMPS:
        raise ValueError(f"unknown YaRN ramp {ramp!r}; choose one of {RAMPS}")
    if not factor >= 1.0:
        raise ValueError(f"factor must be >= 1 (it stretches the context), got {factor}")
    f = base_inv_freq(head_dim, theta)
    if method == "none" or factor == 1.0:
        return f
    if method == "pi":
        return f / factor
    if method == "ntk":
        return base_inv_freq(head_dim, theta * factor ** (head_dim / (head_dim - 2)))
    if ramp == "turns":
        turns = rotations_in_context(f, original_max_len)
        keep = ((turns - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)   # 1: high frequency, kept
    else:
        low = max(math.floor(correction_dim(beta_fast, head_dim, theta, original_max_len)), 0)
        high = min(math.ceil(correction_dim(beta_slow, head_dim, theta, original_max_len)), head_dim - 1)
        high = high if high > low else low + 1e-3
        i = torch.arange(head_dim // 2, dtype=torch.float64)
        keep = 1.0 - ((i - low) / (high - low)).clamp(0.0, 1.0)
    return (1.0 - keep) * f / factor + keep * f


def yarn_logit_scale(factor: float) -> float:
    """YaRN's attention temperature as a multiplier of q.k: (0.1 ln s + 1)^2 (1 for s <= 1)."""
    return 1.0 if factor <= 1.0 else (0.1 * math.log(factor) + 1.0) ** 2
