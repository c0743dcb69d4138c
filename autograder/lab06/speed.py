"""Lab 06, the speed check (CPU tier): speculative decoding against lab 01's cached generation."""

from __future__ import annotations

from typing import Any, Callable

from autograder.harness import check_speedup, quiet
from autograder.lab06.common import SPEED_CHECK, _watched
from autograder.lab06.generator import _gen
from autograder.reference_guard import own_work
from minigpt.checkpoint import load_model
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.speculative import generate_speculative
from minigpt.sampling import SamplingParams
from minigpt.timing import fixed_threads


# ---------------------------------------------------------------------------------------------------
# Speed (CPU tier)
# ---------------------------------------------------------------------------------------------------

def code_edit_prompts() -> list[list[int]]:
    """Prompts of repetitive code (argument lists, attribute assignments) whose continuation by the target repeats
    what the prompt already holds: where prompt lookup shines. (The course's small target copies little from
    a longer context, so prompts with a single earlier copy of a function do not show it.)"""
    from minigpt.tokenizer import load_tokenizer
    enc = load_tokenizer()
    args = "".join(f'parser.add_argument("--{n}", type=str, default=None)\n' for n in ("name", "path", "mode", "user"))
    attrs = "".join(f"        self.{n} = None\n" for n in ("name", "path", "mode", "user", "host"))
    return [enc.encode("import argparse\n\nparser = argparse.ArgumentParser()\n" + args + "parser.add_argument("),
            enc.encode("class Config:\n    def __init__(self):\n" + attrs + "        self.")]


def check_speculative_speedup(generate_fn: Callable, *, new_tokens: int = 24, k: int = 3, repeats: int = 5) -> dict[str, float]:
    """Greedy speculative generation with the trained draft must beat lab 01's generate_kv_cache by at least
    the calibrated fraction (SPEED_CHECK) of the reference's speedup, timed in this process."""
    own_work(generate_fn, generate_speculative, what="the speed check (generate_speculative)")
    with quiet():
        target, draft = load_model("target"), load_model("draft")
    prompt = code_edit_prompts()[0]
    kw = {"stop_token_ids": ()}
    want = generate_kv_cache(target, prompt, new_tokens, **kw)
    got = _gen(_watched(generate_fn, (generate_speculative,), "the speed check (generate_speculative)"),
               "speed check run", target, draft, list(prompt), new_tokens, SamplingParams(), k=k, **kw)
    if got.tokens != want.tokens:
        raise AssertionError("your generator's greedy output differs from generate_kv_cache's, so its speed does not count; "
                             "pass check_generate_speculative first")
    def one_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
        # models this small run as fast on one thread, and one thread is immune to a second one being starved on a
        # shared machine (spin-waits made 2-thread timings jump 10x there); all three candidates alike
        def call() -> Any:
            with fixed_threads(1):
                return fn()
        return call

    with quiet():
        return check_speedup(one_thread(lambda: generate_fn(target, draft, prompt, new_tokens, SamplingParams(), k=k, **kw)),
                             one_thread(lambda: generate_kv_cache(target, prompt, new_tokens, **kw)),
                             one_thread(lambda: generate_speculative(target, draft, prompt, new_tokens, SamplingParams(), k=k, **kw)),
                             what=f"speculative decoding (k={k}) vs cached decoding, {new_tokens} tokens",
                             check=SPEED_CHECK, repeats=repeats, warmup=1, device="cpu")
