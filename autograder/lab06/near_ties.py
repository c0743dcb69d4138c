"""Lab 06 checks: near ties, greedy steps whose top two logits are too close for two float paths to agree.

A speculative loop computes the target's logits k + 1 positions at a time, plain decoding one at a time (and a learner's
kernel may use another thread count): the same logits differ in the last bits, about 1e-5 on the course's models. Where
the top two logits of a greedy step are closer than that, the two paths may pick different tokens, and a correct loop
would fail a check that compares them. The checks either draw their inputs again until every greedy step they compare
is clear (`clear_greedy`, `clear_drafts`: a gap of at least NEAR_TIE = 1e-3, about 60 times the float noise), or forgive
a first difference that falls on a near tie (`same_greedy`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from autograder.checking.models import NEAR_TIE
from minigpt.engine.speculative import Round
from minigpt.model import GPT


def greedy_gaps(model: GPT, prompt: Sequence[int], tokens: Sequence[int]) -> Tensor:
    """The gap between the top two logits of `model` at each position that predicts one of `tokens` after `prompt`
    (one forward over the whole sequence, no cache)."""
    prompt, tokens = list(prompt), list(tokens)
    if not tokens:
        return torch.zeros(0)
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens]))[0, len(prompt) - 1:len(prompt) + len(tokens) - 1]
    top = logits.float().topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


def clear_greedy(model: GPT, prompt: Sequence[int], tokens: Sequence[int]) -> bool:
    """Every step that chose one of `tokens` had its top two logits at least NEAR_TIE apart (NaN is not clear)."""
    return bool((greedy_gaps(model, prompt, tokens) >= NEAR_TIE).all())


def clear_drafts(draft: GPT, prompt: Sequence[int], rounds: Sequence[Round]) -> bool:
    """Every greedy draft of a speculative run (its `rounds`, from minigpt's generate_speculative) was a clear choice of
    `draft`: round r drafted its tokens after the prompt and what rounds before it emitted."""
    context = list(prompt)
    for r in rounds:
        if r.drafted and not clear_greedy(draft, context, r.drafted):
            return False
        context += list(r.emitted)
    return True


def same_greedy(model: GPT, prompt: Sequence[int], got: Sequence[int], want: Sequence[int]) -> bool:
    """`got` is `model`'s greedy continuation `want` of `prompt`, or leaves it first at a near tie (a step whose top
    two logits are within NEAR_TIE: another float path's choice, and all that follows from it)."""
    got, want = list(got), list(want)
    if got == want:
        return True
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if first is None:                       # one is a prefix of the other: a length, not a choice
        return False
    return bool(greedy_gaps(model, prompt, want[:first + 1])[first] < NEAR_TIE)          # NaN: not a near tie
