"""CPU-tier speed of Exercise 3: the cached generator's speedup over the naive loop, relative to the reference's
speedup measured in the same run.

Judged, no course code runs in the kernel on the timed path: each timed call is one call of the learner's function
through its handle, timed here, on a prompt drawn here from a seed nobody can foresee (`secrets`), never given
twice; every output is checked afterwards against generate_naive's on the same prompt."""

from __future__ import annotations

import secrets
from typing import Any, Callable

import torch

from autograder.harness import EachCallItsOwnInput, check_speedup, quiet
from autograder.lab01.common import CACHED_SPEED_CHECK, random_prompt
from autograder.lab01.generation import GENERATE_WHAT, _check_preallocated, _run
from autograder.checking.reference_guard import own_work
from autograder.checking.wire import run_where
from minigpt.config import TARGET_CONFIG
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.generate import Generation, generate_naive
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.timing import fixed_threads


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


def target_model() -> GPT:
    """The timed model: the target's shape, random weights drawn from seed 0 (the caller's RNG left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT(TARGET_CONFIG).eval()


def on_one_thread(generate: Callable[[list[int]], Any]) -> Callable[[list[int]], Any]:
    """generate(prompt) with this process's torch on one thread. The three contenders alike: the lab's setup cell
    puts the learner's kernel on one thread too (and a sandboxed kernel starts with OMP_NUM_THREADS=1), and two
    threads on a shared machine made timings jump tenfold (spin-waits of a starved second thread)."""
    def run(prompt: list[int]) -> Any:
        with fixed_threads(1):
            return generate(prompt)
    return run


def _cached_speedup(generate_fn: Callable, prompt_len: int, new_tokens: int, repeats: int, *,
                    graded: bool) -> dict[str, float]:
    """Correctness first, on a model here (recorded: one prefill, then one token per step, a preallocated cache).
    Then the timing: each timed call is one call of the learner's generator, timed here; judged, it runs in the
    learner's kernel on the kernel's own copy of the model (a model here would cost a round trip per forward and
    per cache write, which the baselines do not pay). That copy is built there by `target_model`, an input the
    learner's code receives like the prompt: whatever the kernel hands the generator instead, its tokens are checked.
    The two baselines are timed here, unreachable from the learner's kernel."""
    model = target_model()
    prompt = random_prompt(prompt_len, TARGET_CONFIG.vocab_size, seed=3)
    kw = {"stop_token_ids": ()}
    what = f"{GENERATE_WHAT}, speed check: target-shaped model, prompt of {prompt_len} tokens, {new_tokens} new tokens"
    want, _ = _run(generate_naive, model, prompt, new_tokens, SamplingParams(), None, "naive", learner=False, **kw)
    got, rec = _run(generate_fn, model, prompt, new_tokens, SamplingParams(), None, what, learner=graded, **kw)
    if graded:
        _check_preallocated(rec, TARGET_CONFIG.n_layers, what)
    if got.tokens != want.tokens:
        raise AssertionError(f"{what}: your generator's tokens differ from generate_naive's, so its speed does not "
                             "count; pass check_generate_kv_cache first")
    timed_model = run_where(generate_fn, target_model)
    learner = on_one_thread(lambda p: generate_fn(timed_model, p, new_tokens, SamplingParams(), **kw))

    # Every timed call gets a prompt of its own, drawn from a seed drawn now, and its tokens are checked afterwards
    # against the naive loop's on that prompt: no call can hand back an answer kept from an earlier call or
    # computed ahead of the check.
    base = secrets.randbits(32)

    def prompt_of(i: int) -> list[int]:
        return random_prompt(prompt_len, TARGET_CONFIG.vocab_size, seed=base + i)

    candidate = EachCallItsOwnInput(learner, prompt_of)
    baseline = EachCallItsOwnInput(on_one_thread(lambda p: generate_naive(model, p, new_tokens, SamplingParams(), **kw)),
                                   prompt_of)
    reference = EachCallItsOwnInput(on_one_thread(lambda p: generate_kv_cache(model, p, new_tokens, SamplingParams(),
                                                                              **kw)), prompt_of)
    with quiet():
        if not _same_tokens(learner(list(prompt)), want):
            raise AssertionError(f"{what}: your generator's tokens on the timed copy of the model differ from "
                                 "generate_naive's, so its speed does not count")
        result = check_speedup(candidate, baseline, reference,
                               what=f"{GENERATE_WHAT}: cached generation of {new_tokens} tokens after a "
                                    f"{prompt_len}-token prompt",
                               check=CACHED_SPEED_CHECK, repeats=repeats, warmup=1, device="cpu")
    wrong = candidate.first_difference(baseline, _same_tokens)
    if wrong is not None:
        raise AssertionError(f"{what}: on the prompt of timed call #{wrong} your generator's tokens differ from "
                             "generate_naive's, so its speed does not count")
    return result


def _same_tokens(got: Any, want: Generation) -> bool:
    """Whether got is a Generation with want's tokens."""
    return isinstance(got, Generation) and list(got.tokens) == list(want.tokens)
