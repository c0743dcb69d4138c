"""Exercise 1: the online softmax on a vector, block by block."""

from __future__ import annotations

from typing import Callable

import torch

import minigpt.kernels  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before any kernel is built)
from autograder.harness import call_learner
from autograder.lab04.common import _close, _err
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.tensor_trace import TensorTrace
from minigpt.kernels import online_softmax as ref_online

# ---------------------------------------------------------------------------------------------------
# Online softmax on a vector
# ---------------------------------------------------------------------------------------------------

ONLINE_SOFTMAX = "Exercise 1 (online_softmax)"
# Reductions a block-by-block pass may only apply to one block (at most block_size columns) at a time.
_REDUCTIONS = ("amax", "max", "sum", "nansum", "mean", "logsumexp", "softmax", "log_softmax", "special_logsumexp",
               "cumsum", "sort", "topk", "amin", "min", "norm", "prod")


def check_online_softmax(fn: Callable) -> None:
    """fn(x (..., N), block_size) -> softmax(x, -1), computed with the running max / denominator: every reduction
    (max, sum, softmax, logsumexp, ...) it applies sees at most block_size columns."""
    own_work(fn, ref_online.online_softmax, what=ONLINE_SOFTMAX)
    g = torch.Generator().manual_seed(1)
    cases = [((4, 10), 3, 1.0, "N = 10 in blocks of 3 (short last block)"),
             ((2, 64), 16, 1.0, "N = 64 in blocks of 16"),
             ((3, 1), 4, 1.0, "N = 1"),
             ((2, 33), 8, 100.0, "large scores (|x| up to ~300): exp overflows without the running max"),
             ((1, 12), 4, 1.0, "increasing scores: the max changes in every block"),
             ((2, 40), 8, 1.0, "very negative scores (about -1e5, far below -1e4): exp underflows to 0 without the "
                               "running max, and a max that starts at -1e4 instead of -inf never moves"),
             ((2, 16), 4, 1.0, "rows about +100 and -100: each row needs its own max (one max for the whole tensor "
                               "underflows the low row)"),
             ((2, 3, 20), 8, 1.0, "a 3-D input (2, 3, 20): every reduction over the last dimension only"),
             ((3, 24), 8, 1.0, "float16 input: the result in float16")]
    for shape, block, scale, what in cases:
        x = torch.randn(*shape, generator=g) * scale
        if what.startswith("increasing"):
            x = torch.arange(12.0)[None] * 2
        if what.startswith("very negative"):
            x = x - 1e5
        if what.startswith("rows about"):
            x = x + torch.tensor([[100.0], [-100.0]])
        if what.startswith("float16"):
            x = x.half()
        with TensorTrace() as trace, no_calls_into(ref_online.online_softmax, ref_online.OnlineSoftmaxState,
                                                   ref_online.online_softmax_trace, what=ONLINE_SOFTMAX):
            got = call_learner("online_softmax", fn, x.clone(), block, context=what)
        want = torch.softmax(x.double(), -1)
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{what}: expected a tensor, got {type(got).__name__}")
        if got.dtype != x.dtype:
            raise AssertionError(f"{what}: the result must be in the input's dtype {x.dtype}, got {got.dtype}")
        whole = [c for c in trace.calls_named(*_REDUCTIONS) if c.inputs and c.inputs[0] and c.inputs[0][-1] > block]
        if whole:
            raise AssertionError(f"{what}: {whole[0].name} ran on a tensor of shape {whole[0].inputs[0]}, wider than one "
                                 f"block ({block} columns): the online softmax reads x one block at a time, keeping "
                                 "only the running max m and denominator l between blocks (torch.softmax, or a max "
                                 "over the whole row, is the two-pass method the exercise replaces)")
        if not _close(got, want, 1e-5 if x.dtype == torch.float32 else 1e-3):
            hint = ""
            if not torch.isfinite(got).all():
                hint = " Subtract the running max before exp (m_new = max(m_old, max(block)))."
            elif got.shape == want.shape and not torch.allclose(got.double().sum(-1), torch.ones(shape[:-1],
                                                                dtype=torch.float64), atol=1e-4):
                hint = (" The rows do not sum to 1: when the max grows, multiply the old denominator by "
                        "exp(m_old - m_new) before adding the new block's sum; and cover the short last block.")
            raise AssertionError(f"{what}: {_err(got, want)} against torch.softmax.{hint}")
