"""Speculative decoding arithmetic (lab 06): expected tokens per round and the cost-model speedup.

With a per-token acceptance rate a (each draft accepted with probability a, independently) and k drafts
per round, a round emits the accepted prefix plus one token (resampled or bonus):

    E[tokens / round] = sum_{i=0..k} a^i = (1 - a^(k+1)) / (1 - a)          (k + 1 when a = 1)

A round costs k draft steps and one target forward over k + 1 positions:

    speedup = E[tokens / round] * t_target_step / (k * t_draft_step + t_verify(k + 1))

where t_target_step is one ordinary decode step of the target. Speculation pays only while the target's
forward over k + 1 positions costs about as much as over one (memory-bound decode) and the draft is
cheap; `break_even_alpha` and `break_even_batch` say where it stops paying.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["expected_tokens_per_round", "acceptance_rate", "round_seconds", "speculative_speedup", "best_k",
           "break_even_alpha", "roofline_step_seconds", "break_even_batch"]


def _check_alpha_k(alpha: float, k: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"the acceptance rate alpha must be in [0, 1], got {alpha}")
    if isinstance(k, bool) or int(k) != k or k < 0:
        raise ValueError(f"k (drafted tokens per round) must be an int >= 0, got {k!r}")


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha): the mean of 1 + (number of leading accepted drafts)."""
    _check_alpha_k(alpha, k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def acceptance_rate(p: Tensor, q: Tensor) -> Tensor:
    """Probability that a draft token t ~ q is accepted: E_q[min(1, p(t)/q(t))] = sum_x min(p(x), q(x)).

    p, q (..., V) distributions -> (...). Equals 1 - total-variation distance between p and q.
    """
    if p.shape != q.shape:
        raise ValueError(f"p {tuple(p.shape)} and q {tuple(q.shape)} must have the same shape")
    return torch.minimum(p, q).sum(-1)


def round_seconds(k: int, draft_step_s: float, verify_s: float) -> float:
    """One round: k draft steps, then one target forward over the k + 1 positions."""
    return k * draft_step_s + verify_s


def speculative_speedup(alpha: float, k: int, *, target_step_s: float, draft_step_s: float, verify_s: float) -> float:
    """Tokens per second with speculation / without: E[tokens/round] * t_target_step / t_round."""
    return expected_tokens_per_round(alpha, k) * target_step_s / round_seconds(k, draft_step_s, verify_s)


def best_k(alpha: float, *, target_step_s: float, draft_step_s: float,
           verify_s: Callable[[int], float] | Sequence[float], ks: Sequence[int] = range(1, 9)) -> tuple[int, float]:
    """(k, predicted speedup) maximising the speedup; verify_s(k) (or verify_s[k]) is the target's forward
    over k + 1 positions."""
    def v(k: int) -> float:
        return verify_s(k) if callable(verify_s) else verify_s[k]
    scored = [(speculative_speedup(alpha, k, target_step_s=target_step_s, draft_step_s=draft_step_s, verify_s=v(k)), k)
              for k in ks]
    speedup, k = max(scored)
    return k, speedup


def break_even_alpha(k: int, *, target_step_s: float, draft_step_s: float, verify_s: float) -> float:
    """The acceptance rate below which speculation is slower than plain decoding (speedup < 1), by bisection.

    Returns 0.0 when even a = 0 pays (a round cheaper than one target step), math.inf when even a = 1 does not.
    """
    cost = round_seconds(k, draft_step_s, verify_s) / target_step_s       # E must exceed this
    if cost <= 1.0:
        return 0.0
    if cost > k + 1:
        return math.inf
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_tokens_per_round(mid, k) < cost:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def roofline_step_seconds(tokens: int, *, memory_s: float, per_token_s: float) -> float:
    """A forward over `tokens` positions (batch x positions): max(reading the weights, the FLOPs)."""
    return max(memory_s, tokens * per_token_s)


def break_even_batch(alpha: float, k: int, *, memory_s: float, per_token_s: float, draft_fraction: float = 0.0,
                     max_batch: int = 1 << 20) -> int:
    """Smallest batch B at which speculation stops paying (speedup < 1) under a roofline step-time model.

    Plain decode step: t(B); a round: k * draft_fraction * t(B) + t(B (k + 1)); t from roofline_step_seconds.
    """
    e = expected_tokens_per_round(alpha, k)
    for b in range(1, max_batch + 1):
        t1 = roofline_step_seconds(b, memory_s=memory_s, per_token_s=per_token_s)
        round_s = k * draft_fraction * t1 + roofline_step_seconds(b * (k + 1), memory_s=memory_s, per_token_s=per_token_s)
        if e * t1 / round_s < 1.0:
            return b
    raise ValueError(f"speculation still pays at batch {max_batch}")
