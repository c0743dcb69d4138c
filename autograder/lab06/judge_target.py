"""Lab 06, the target-calls check: a target only the judge has.

The check counts the forward calls the learner's loop makes to the target it is handed. Counting proves nothing if
the loop can get the tokens elsewhere: the course's trained target is public (`load_model("target")` works in the
kernel), so a loop that decodes on its own copy calls the judge's target zero times and shows the best count there
is. So the target handed in is the trained one with a secret perturbation of every weight, drawn in the judge,
together with a prompt drawn in the judge, until its greedy continuation differs from the public target's: the
right tokens then come only from calling the handed-in target.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Iterator

import torch

from autograder.lab06.near_ties import clear_drafts, clear_greedy
from autograder.lab06.prompts import drawn_code_prompt
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.speculative import generate_speculative
from minigpt.model import GPT
from minigpt.sampling import SamplingParams

# Each weight moves by noise of 0.1 times its tensor's standard deviation: the greedy continuation of a drawn prompt
# changes in about 3 draws of 4 (the rest are drawn again), and the model still continues code as the trained one does
# (prompt lookup keeps its acceptance, about 0.3 target calls per token).
PERTURBATION = 0.1


@dataclass(frozen=True)
class SecretTarget:
    """A perturbed copy of the trained target, the prompt drawn with it, and its greedy continuation of that prompt."""
    model: GPT
    prompt: list[int]
    tokens: list[int]


def perturbed(model: GPT, seed: int) -> GPT:
    """A copy of `model` with every weight moved by N(0, (PERTURBATION * its tensor's std)^2), drawn from `seed`."""
    moved = copy.deepcopy(model).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (PERTURBATION * p.std()))
    return moved


def secret_target(public: GPT, seeds: Iterator[int], kind: str, new_tokens: int, *, draft: GPT | None = None,
                  k: int = 0) -> SecretTarget:
    """The first seed of `seeds` (common.drawn_seeds: secrets when judged) whose perturbed target and drawn prompt of
    `kind` give a greedy continuation of `new_tokens` that differs from the public target's, with every greedy step
    clear (near_ties); with `draft`, also every greedy draft of the reference loop at k drafts a round."""
    for seed in seeds:
        prompt = drawn_code_prompt(seed, kind)
        model = perturbed(public, seed)
        tokens = generate_kv_cache(model, prompt, new_tokens, stop_token_ids=()).tokens
        if tokens == generate_kv_cache(public, prompt, new_tokens, stop_token_ids=()).tokens:
            continue
        if not clear_greedy(model, prompt, tokens):
            continue
        if draft is not None:
            run = generate_speculative(model, draft, prompt, new_tokens, SamplingParams(), k=k, stop_token_ids=())
            if not clear_drafts(draft, prompt, run.rounds):
                continue
        return SecretTarget(model, prompt, tokens)
    raise RuntimeError("the seeds ran out")
