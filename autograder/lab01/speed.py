"""CPU-tier speed of Exercise 3: the cached generator's speedup over the naive loop, relative to the reference's
speedup measured in the same run."""

from __future__ import annotations

from typing import Callable

import torch

from autograder.harness import check_speedup, quiet
from autograder.lab01.common import CACHED_SPEED_CHECK, random_prompt
from autograder.lab01.generation import GENERATE_WHAT, _check_preallocated, _run
from autograder.reference_guard import own_work
from minigpt.config import TARGET_CONFIG
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.generate import generate_naive
from minigpt.model import GPT
from minigpt.sampling import SamplingParams

def check_cached_speedup(generate_fn: Callable, *, prompt_len: int = 128, new_tokens: int = 32,
                         repeats: int = 3) -> dict[str, float]:
    """The learner's cached generator must beat generate_naive by at least the calibrated fraction
    (CACHED_SPEED_CHECK) of the reference generator's speedup, on the target model's shape (random weights),
    timed in this process."""
    own_work(generate_fn, (generate_kv_cache, generate_naive), what=GENERATE_WHAT)
    return _cached_speedup(generate_fn, prompt_len, new_tokens, repeats, graded=True)


def time_cached_speedup(generate_fn: Callable, *, prompt_len: int = 128, new_tokens: int = 32,
                        repeats: int = 3) -> dict[str, float]:
    """check_cached_speedup's measurement alone, for calibration on trusted implementations (the reference and its
    slow twin generate_naive, which the graded check refuses as answers)."""
    return _cached_speedup(generate_fn, prompt_len, new_tokens, repeats, graded=False)


def _cached_speedup(generate_fn: Callable, prompt_len: int, new_tokens: int, repeats: int, *,
                    graded: bool) -> dict[str, float]:
    torch.manual_seed(0)
    model = GPT(TARGET_CONFIG).eval()
    prompt = random_prompt(prompt_len, TARGET_CONFIG.vocab_size, seed=3)
    kw = {"stop_token_ids": ()}
    what = f"target-shaped model, prompt of {prompt_len} tokens, {new_tokens} new tokens"
    want, _ = _run(generate_naive, model, prompt, new_tokens, SamplingParams(), None, "naive", learner=False, **kw)
    got, rec = _run(generate_fn, model, prompt, new_tokens, SamplingParams(), None, what, learner=graded, **kw)
    if graded:
        _check_preallocated(rec, TARGET_CONFIG.n_layers, what)
    if got.tokens != want.tokens:
        raise AssertionError(f"{what}: your generator's tokens differ from generate_naive's, so its speed does not "
                             "count; pass check_generate_kv_cache first")
    with quiet():
        return check_speedup(lambda: generate_fn(model, prompt, new_tokens, SamplingParams(), **kw),
                             lambda: generate_naive(model, prompt, new_tokens, SamplingParams(), **kw),
                             lambda: generate_kv_cache(model, prompt, new_tokens, SamplingParams(), **kw),
                             what=f"cached generation of {new_tokens} tokens after a {prompt_len}-token prompt",
                             check=CACHED_SPEED_CHECK, repeats=repeats, warmup=1, device="cpu")
