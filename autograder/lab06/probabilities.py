"""Lab 06, exercise 2: the distributions p and q (sampling_probs)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from autograder.harness import call_learner
from autograder.lab06.common import _watched
from autograder.checking.reference_guard import own_work
from minigpt.engine.speculative import sampling_probs
from minigpt.sampling import SamplingParams


# ---------------------------------------------------------------------------------------------------
# Exercise 2: the distributions p and q
# ---------------------------------------------------------------------------------------------------

def check_sampling_probs(probs_fn: Callable) -> None:
    """probs_fn(logits (N, V), sampling) -> the (N, V) float distribution sample_next draws from."""
    what = "Exercise 2 (sampling_probs)"
    own_work(probs_fn, sampling_probs, what=what)
    _check_sampling_probs(_watched(probs_fn, (sampling_probs,), what))




def _check_sampling_probs(probs_fn: Callable) -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 50, generator=g) * 3
    cases = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=0.6),
             SamplingParams(temperature=1.5, top_k=5), SamplingParams(temperature=0.8, top_p=0.7),
             SamplingParams(temperature=0.9, top_k=10, top_p=0.9)]
    for s in cases:
        got = call_learner(f"sampling_probs(logits, {s})", probs_fn, logits.clone(), s)
        want = sampling_probs(logits, s)
        if not isinstance(got, Tensor) or got.shape != want.shape:
            raise AssertionError(f"{s}: expected a tensor of shape {tuple(want.shape)}, got "
                                 f"{getattr(got, 'shape', type(got).__name__)}")
        if not torch.allclose(got.float(), want, atol=1e-5):
            hint = (" Greedy (temperature 0) is the one-hot vector of the argmax." if s.greedy else
                    " Divide the logits by the temperature, then filter (minigpt.sampling.filter_logits), then softmax.")
            raise AssertionError(f"{s}: probabilities differ from the distribution sample_next draws from by up to "
                                 f"{(got.float() - want).abs().max().item():.3g}.{hint}")
    _check_shapes_and_dtype(probs_fn, g)


def _check_shapes_and_dtype(probs_fn: Callable, g: torch.Generator) -> None:
    """Logits (2, 3, V) in bfloat16 (a model's output): float32 probabilities over the last axis, same shape."""
    logits = (torch.randn(2, 3, 50, generator=g) * 3).bfloat16()
    for s in (SamplingParams(), SamplingParams(temperature=0.8, top_k=10)):
        what = f"sampling_probs(bfloat16 logits (2, 3, 50), {s})"
        got = call_learner(what, probs_fn, logits.clone(), s)
        want = sampling_probs(logits, s)
        if not isinstance(got, Tensor) or got.shape != want.shape or got.dtype != torch.float32:
            got_s = f"{got.dtype} {tuple(got.shape)}" if isinstance(got, Tensor) else type(got).__name__
            raise AssertionError(f"{what}: expected float32 probabilities of shape {tuple(want.shape)} (logits "
                                 f"(..., V): any leading axes, the last one the vocabulary), got {got_s}")
        if not torch.allclose(got, want, atol=1e-5):
            raise AssertionError(f"{what}: probabilities differ by up to {(got - want).abs().max().item():.3g}: work "
                                 "over the LAST axis (-1), on logits.float()")
