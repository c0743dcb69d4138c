"""Generated tokens with their log-probabilities, for tests that compare a generation with a reference (imported by
name in tests/minigpt, like minigpt_fixtures; as tests.minigpt.recorded_logprobs elsewhere). A small random model
mostly repeats its last token whatever came before, so equal greedy tokens do not show K/V read from the wrong block
or position; the log-probabilities do: the sampled token's moves by 1e-5 to 1e-2, the whole vocabulary's about ten
times more, where correct variants agree to 1e-6."""

from __future__ import annotations

import math

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

import pytest
import torch
from torch import Tensor

from minigpt.sampling import SamplingParams, sample_next

if TYPE_CHECKING:
    from minigpt.serving.outputs import Completion

Outputs = list[list[tuple[int, float]]]          # per request: (token, its log-probability) per step
Steps = list[tuple[int, Tensor]]                   # per step: (token, the vocabulary's log-probabilities at that step)


def with_logprobs(logits: Tensor, tokens: Sequence[int]) -> Steps:
    """Each token with the log-probabilities of its row of `logits` (n, V), one row per token."""
    return list(zip([int(t) for t in tokens], torch.log_softmax(logits.float(), dim=-1), strict=True))


def record_sampling(monkeypatch: pytest.MonkeyPatch, *modules: object) -> list[Steps]:
    """`sample_next` in each of `modules` made to record what it samples: a list per generator (one per generation,
    or per sequence of a batch), in the order they first sample, of each token with the log-probabilities of the raw
    logits it was sampled from. The lists fill as the generations run."""
    runs: list[Steps] = []
    generators: list = []                         # held, so that a later generator never takes a freed one's place

    def recording(logits: Tensor, params, generator=None) -> Tensor:
        tokens = sample_next(logits, params, generator)
        run = next((i for i, g in enumerate(generators) if g is generator), None)
        if run is None:
            generators.append(generator)
            runs.append([])
        runs[-1 if run is None else run] += with_logprobs(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
        return tokens
    for module in modules:
        monkeypatch.setattr(module, "sample_next", recording)
    return runs


def record_results(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list:
    """`module.name` (a function that returns logits) made to keep what it returns: a list, filling as it runs."""
    results: list = []
    function = getattr(module, name)

    def recording(*args, **kwargs):
        results.append(function(*args, **kwargs))
        return results[-1]
    monkeypatch.setattr(module, name, recording)
    return results


def assert_same_steps(found: list[Steps], expected: list[Steps], what: str) -> None:
    """The same tokens, and at each step the log-probabilities of the whole vocabulary equal to rounding (1e-4)."""
    tokens, want = [[t for t, _ in r] for r in found], [[t for t, _ in r] for r in expected]
    assert tokens == want, f"{what} changed the tokens: {tokens} against {want}"
    gaps = [float((a - b).abs().max()) for r, e in zip(found, expected) for (_, a), (_, b) in zip(r, e)]
    _assert_within_rounding(gaps, what)


def assert_same_outputs(found: Outputs, expected: Outputs, what: str) -> None:
    """The same greedy tokens, and log-probabilities equal to rounding (1e-4). The tokens alone are not enough: this
    small random model mostly repeats its last token whatever came before, so K/V read from the wrong block (or
    never loaded) leaves the tokens unchanged; it moves their log-probabilities by about 5e-3."""
    assert [[t for t, _ in r] for r in found] == [[t for t, _ in r] for r in expected], \
        f"{what} changed greedy tokens: {found} against {expected}"
    _assert_within_rounding([abs(a - b) for r, e in zip(found, expected) for (_, a), (_, b) in zip(r, e)], what)


def _assert_within_rounding(gaps: list[float], what: str) -> None:
    """Every log-probability gap at most 1e-4; a NaN gap (a NaN on either side) fails too, and is reported."""
    worst = max(gaps, key=lambda g: math.inf if math.isnan(g) else g, default=0.0)
    assert all(g <= 1e-4 for g in gaps), \
        f"{what} changed log-probabilities by up to {worst:.2e}: some K/V was read wrong"


def chosen(steps: Steps) -> list[tuple[int, float]]:
    """Each token with its own log-probability (what a serving engine reports with SamplingParams(logprobs=0))."""
    return [(t, float(logprobs[t])) for t, logprobs in steps]


def generate_with_logprobs(engine, prompts: Sequence, sampling: SamplingParams = SamplingParams(),
                           max_tokens: int | Sequence[int] = 16) -> tuple[list[Completion], list[list[tuple]]]:
    """`engine.generate` (any serving engine), and each completion's tokens with their log-probabilities, read from
    the outputs of the steps it runs (compare them with `assert_same_outputs`)."""
    logprobs: dict = {}
    step = engine.step

    def step_and_keep() -> list:
        outputs = step()
        for out in outputs:
            logprobs.setdefault(out.request_id, []).extend(lp.logprob for lp in out.logprobs or ())
        return outputs
    engine.step = step_and_keep
    try:
        completions = engine.generate(prompts, replace(sampling, logprobs=0), max_tokens)
    finally:
        del engine.step
    by_index = {request_id[1]: found for request_id, found in logprobs.items()}     # generate's ids: ("generate", i)
    return completions, [list(zip(c.token_ids, by_index.get(c.request_id, []), strict=True)) for c in completions]
