"""Pearson's chi-square goodness-of-fit test: do observed counts follow a known distribution?

    X^2 = sum_cells (observed - expected)^2 / expected,   expected = n * probability

Under the null hypothesis X^2 follows a chi-square law with (cells - 1) degrees of freedom when every
expected count is large enough (>= 5 here: cells below that are pooled into one). The p-value is
P(chi2_dof >= X^2) = Q(dof / 2, X^2 / 2), the regularised upper incomplete gamma function.

A wrong sampler whose distribution q differs from p is rejected with a power that grows with
n * sum (q - p)^2 / p (the non-centrality), so the sample size sets which mistakes the test can see.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ChiSquareResult", "chi_square_test", "chi2_sf"]


@dataclass(frozen=True)
class ChiSquareResult:
    statistic: float
    dof: int
    p_value: float
    n: int
    cells: int          # after pooling the cells whose expected count is below min_expected


def chi2_sf(x: float, dof: int) -> float:
    """P(chi2_dof >= x)."""
    if dof < 1:
        raise ValueError(f"a chi-square law needs dof >= 1, got {dof}")
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(max(x, 0.0) / 2, dtype=torch.float64)))


def chi_square_test(counts: Tensor, probs: Tensor, *, min_expected: float = 5.0) -> ChiSquareResult:
    """Test counts (C,) of n draws against cell probabilities probs (C,) (summing to 1).

    A count in a cell of probability 0 makes the statistic infinite (p-value 0): that outcome is impossible.
    """
    counts = torch.as_tensor(counts, dtype=torch.float64).flatten()
    probs = torch.as_tensor(probs, dtype=torch.float64).flatten()
    if counts.shape != probs.shape:
        raise ValueError(f"counts {tuple(counts.shape)} and probs {tuple(probs.shape)} must have the same number of cells")
    if (probs < 0).any() or abs(float(probs.sum()) - 1.0) > 1e-6:
        raise ValueError(f"probs must be a distribution (non-negative, sum 1), sum is {float(probs.sum()):.6g}")
    n = int(counts.sum())
    if n == 0:
        raise ValueError("no observations")
    if bool(((probs == 0) & (counts > 0)).any()):
        return ChiSquareResult(float("inf"), max(int((probs > 0).sum()) - 1, 1), 0.0, n, int((probs > 0).sum()))
    expected = n * probs
    big = expected >= min_expected
    obs = counts[big].tolist()
    exp = expected[big].tolist()
    small_exp = float(expected[~big].sum())
    if small_exp > 0:
        obs.append(float(counts[~big].sum()))
        exp.append(small_exp)
    obs_t, exp_t = torch.tensor(obs, dtype=torch.float64), torch.tensor(exp, dtype=torch.float64)
    stat = float(((obs_t - exp_t) ** 2 / exp_t).sum())
    dof = max(len(obs) - 1, 1)
    return ChiSquareResult(stat, dof, chi2_sf(stat, dof), n, len(obs))
