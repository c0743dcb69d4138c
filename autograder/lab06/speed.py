"""Lab 06, the speed grades (CPU tier): speculative decoding where it wins on a laptop, prompt lookup.

The learner's generate_speculative (exercise 4, run with the package's pieces of exercises 1-3) drafts with
`PromptLookupModel`, prompt lookup behind the model protocol, so the loop written for a draft model runs unchanged.
Two grades, on `code_edit_prompts()[LOOKUP_PROMPT]`, greedy, k = LOOKUP_K:

    check_target_calls          deterministic: target forward calls per generated token, with prompt lookup and with the
                                trained draft model (k = DRAFT_K), below plain decoding's 1 and at most the reference's + 1
    check_speculative_speedup   wall clock: speedup over generate_kv_cache > 1 (medians, interleaved, one process) and at
                                least the calibrated fraction of the reference's speedup (harness.check_speedup)

Judged (the learner's function is a `Remote` in the judge process), the counted target is the judge's: each forward
the learner's loop makes is a request to the judge, counted there. Drafters, and every model whose calls are not
counted, are built in the kernel (`where_it_runs`): the speed check times one request per generation, run in full
in the kernel, against baselines run in the judge.
"""

from __future__ import annotations

from typing import Any, Callable

from autograder.harness import EachCallItsOwnInput, call_learner, check_speedup, quiet
from autograder.lab06.common import SPEED_CHECK, _watched, where_it_runs, with_reference_pieces
from autograder.lab06.generator import _gen, trained_pair
from autograder.checking.reference_guard import own_work
from autograder.checking.wire import is_remote, run_where
from minigpt.checkpoint import load_model
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.ngram_draft import PromptLookupModel
from minigpt.engine.speculative import generate_speculative
from minigpt.sampling import SamplingParams
from minigpt.timing import fixed_threads

LOOKUP_PROMPT = 1        # the Config class: its continuation repeats the attribute lines of the prompt
LOOKUP_K = 4
DRAFT_PROMPT = 0         # the argparse prompt, for the draft model's call count
DRAFT_K = 3
NEW_TOKENS = 32


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


def _learners(generate_fn: Callable, what: str, allow_reference: bool = False) -> tuple[Callable, Callable]:
    """The learner's generator, refused if it is the reference, graded alone (the package's pieces of exercises 1-3):
    (watched for calls into the reference, for correctness runs; unwatched, for timing: the watch costs a profiler
    call per Python call). allow_reference: calibration measures the reference itself."""
    if allow_reference:
        return generate_fn, generate_fn
    own_work(generate_fn, generate_speculative, what=what)
    alone = with_reference_pieces(generate_fn)
    return _watched(alone, (generate_speculative,), what), alone


def _same_greedy_output(fn: Callable, target: Any, their_target: Any, their_draft: Any, prompt: list[int], k: int,
                        what: str) -> None:
    """fn's greedy tokens (on the models where it runs) equal generate_kv_cache's with this side's target."""
    want = generate_kv_cache(target, prompt, NEW_TOKENS, stop_token_ids=())
    got = _gen(fn, what, their_target, their_draft, list(prompt), NEW_TOKENS, SamplingParams(), k=k, stop_token_ids=())
    if got.tokens != want.tokens:
        raise AssertionError(f"{what}: your generator's greedy output differs from generate_kv_cache's, so its speed does "
                             "not count; pass check_generate_speculative first")


def _forward_work(model: Any, run: Callable[[], Any]) -> dict[str, int]:
    """How many times run() calls model's forward, and how many token positions those calls feed it in all."""
    work = {"calls": 0, "positions": 0}

    def count(module: Any, args: Any, kwargs: Any) -> None:
        tokens = args[0] if args else kwargs.get("tokens")
        work["calls"] += 1
        work["positions"] += int(tokens.shape[-1]) if hasattr(tokens, "shape") else 0
    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return work


def _target_calls(target: Any, run: Callable[[], Any]) -> int:
    """How many times run() calls target's forward."""
    return _forward_work(target, run)["calls"]


def one_thread_call(run: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """run(x) on one torch thread: models this small run as fast on one thread, and one thread is immune to a second
    one being starved on a shared machine (spin-waits made 2-thread timings jump 10x there); all three contenders
    alike."""
    def timed(x: Any) -> Any:
        with fixed_threads(1):
            return run(x)
    return timed


def check_target_calls(generate_fn: Callable) -> dict[str, dict[str, float]]:
    """Target forward calls per generated token (greedy, NEW_TOKENS tokens) with prompt lookup (k = LOOKUP_K) and with
    the trained draft model (k = DRAFT_K): below plain decoding's one call per token, and at most one call more than
    the reference makes with the same drafter; with the draft model, at most twice the reference's token positions
    fed to the draft (its KV cache used). Deterministic. Returns {drafter: {"learner", "reference", "plain"}}, calls
    per token, and for the draft model {"draft_positions", "reference_draft_positions"} per token."""
    what = "the target-calls check (generate_speculative)"
    fn, _ = _learners(generate_fn, what)
    target, draft = trained_pair()
    their_target, _ = where_it_runs(generate_fn, trained_pair, here=(target, draft))
    their_lookup = where_it_runs(generate_fn, PromptLookupModel, target.config.vocab_size,
                                 here=PromptLookupModel(target.config.vocab_size))
    prompts = code_edit_prompts()
    # (drafter here, drafter where the learner's code runs, prompt, k): the counted target is always this side's
    # (judged: a handle, so every forward the learner's loop makes is a request here and is counted here)
    # the draft model is this side's too, so the positions it is fed are counted here: with a KV cache a draft step
    # feeds one new token, without one the whole context again (the reference: 129 positions for 32 tokens, a draft
    # without a cache 4,732)
    setups = {"prompt lookup": (PromptLookupModel(target.config.vocab_size), their_lookup, prompts[LOOKUP_PROMPT],
                                LOOKUP_K),
              "draft model": (draft, draft, prompts[DRAFT_PROMPT], DRAFT_K)}
    out: dict[str, dict[str, float]] = {}
    with fixed_threads(1):
        for name, (drafter, their_drafter, prompt, k) in setups.items():
            label = f"{what}, {name}, k={k}"
            _same_greedy_output(fn, target, their_target, their_drafter, prompt, k, label)
            kw = dict(k=k, stop_token_ids=())
            learner = _target_calls(target, lambda: call_learner(label, fn, target, their_drafter, list(prompt),
                                                                 NEW_TOKENS, SamplingParams(), **kw))
            reference = _target_calls(target, lambda: generate_speculative(target, drafter, list(prompt), NEW_TOKENS,
                                                                           SamplingParams(), **kw))
            plain = _target_calls(target, lambda: generate_kv_cache(target, list(prompt), NEW_TOKENS, stop_token_ids=()))
            out[name] = {"learner": learner / NEW_TOKENS, "reference": reference / NEW_TOKENS, "plain": plain / NEW_TOKENS}
            if name == "draft model":
                out[name].update(_draft_positions(fn, target, drafter, prompt, k, label))
            if not (learner < plain and learner <= reference + 1):
                raise AssertionError(
                    f"{label}: your generator called the target {learner} times for {NEW_TOKENS} tokens "
                    f"({learner / NEW_TOKENS:.2f} per token); plain decoding calls it {plain} times and the reference "
                    f"{reference} times with the same drafter. Verify all k drafts of a round in ONE target call over "
                    "k + 1 positions (it doubles as the prefill in the first round), and keep every accepted draft "
                    "plus the bonus token.")
    return out


def _draft_positions(fn: Callable, target: Any, draft: Any, prompt: list[int], k: int, label: str) -> dict[str, float]:
    """The token positions fed to the draft model per generated token, the learner's loop against the reference's
    (same prompt, greedy): at most twice the reference's, or the draft model runs without its KV cache."""
    kw = dict(k=k, stop_token_ids=())
    learner = _forward_work(draft, lambda: call_learner(label, fn, target, draft, list(prompt), NEW_TOKENS,
                                                        SamplingParams(), **kw))["positions"]
    reference = _forward_work(draft, lambda: generate_speculative(target, draft, list(prompt), NEW_TOKENS,
                                                                  SamplingParams(), **kw))["positions"]
    if learner > 2 * reference:
        raise AssertionError(
            f"{label}: your loop fed the draft model {learner} token positions for {NEW_TOKENS} tokens "
            f"({learner / NEW_TOKENS:.1f} per token); the reference feeds it {reference} ({reference / NEW_TOKENS:.1f} per "
            "token). Give the draft model its own KV cache: each draft step feeds only the token drafted last (after "
            "the first), and after verification roll the draft cache back to the accepted length instead of "
            "starting it over.")
    return {"draft_positions": learner / NEW_TOKENS, "reference_draft_positions": reference / NEW_TOKENS}


def speed_models() -> tuple[Any, PromptLookupModel]:
    """The speed check's target and prompt-lookup drafter (built where the learner's generator runs: run_where)."""
    with quiet():
        target = load_model("target")
    return target, PromptLookupModel(target.config.vocab_size)


def one_thread_alone(generate_fn: Callable) -> Callable:
    """generate_fn graded alone (with_reference_pieces) and on one thread: what the speed check times. Judged, this
    is built in the kernel (run_where), so a timed call is one request and the generation runs there in full."""
    alone = with_reference_pieces(generate_fn)

    def timed(*args: Any, **kwargs: Any) -> Any:
        with fixed_threads(1):
            return alone(*args, **kwargs)
    return timed


def check_speculative_speedup(generate_fn: Callable, *, new_tokens: int = NEW_TOKENS, k: int = LOOKUP_K,
                              repeats: int = 5, require_real_speedup: bool = True,
                              allow_reference: bool = False) -> dict[str, float]:
    """Greedy speculative generation drafting by prompt lookup (PromptLookupModel) must beat lab 01's
    generate_kv_cache: a speedup above 1 and at least the calibrated fraction (SPEED_CHECK) of the reference's
    speedup, timed interleaved in this process. Calibration only: `require_real_speedup=False` drops the first bar,
    `allow_reference=True` measures the reference itself.

    Judged (generate_fn is a `Remote`), the learner's generator runs in the kernel on the kernel's own copy of the
    models (a forward of a model passed from here would be a round trip, which the baselines do not pay): each timed
    call is one request, timed here; the baselines run here, interleaved with it, on this side's models."""
    what = "the speed check (generate_speculative)"
    fn, timed_fn = _learners(generate_fn, what, allow_reference)
    target, lookup = speed_models()
    their_target, their_lookup = where_it_runs(generate_fn, speed_models, here=(target, lookup))
    if is_remote(generate_fn):
        timed_fn = run_where(generate_fn, one_thread_alone, generate_fn)
    prompt = code_edit_prompts()[LOOKUP_PROMPT]
    kw = {"stop_token_ids": ()}
    with fixed_threads(1):
        want = generate_kv_cache(target, prompt, new_tokens, **kw)
        got = _gen(fn, "speed check run", their_target, their_lookup, list(prompt), new_tokens, SamplingParams(), k=k,
                   **kw)
    if got.tokens != want.tokens:
        raise AssertionError("your generator's greedy output differs from generate_kv_cache's, so its speed does not count; "
                             "pass check_generate_speculative first")

    label = f"speculative decoding with prompt lookup (k={k}) vs cached decoding, {new_tokens} tokens"
    # Each timed call continues the prompt from its own point (the last i tokens dropped), so no call can hand back
    # an answer kept from an earlier one; the tokens of each are checked against cached decoding's afterwards.
    prompts = [list(prompt[:len(prompt) - i]) for i in range(1 + repeats)]
    candidate = EachCallItsOwnInput(one_thread_call(lambda p: timed_fn(their_target, their_lookup, p, new_tokens,
                                                                       SamplingParams(), k=k, **kw)), prompts)
    baseline = EachCallItsOwnInput(one_thread_call(lambda p: generate_kv_cache(target, p, new_tokens, **kw)), prompts)
    reference = EachCallItsOwnInput(one_thread_call(lambda p: generate_speculative(target, lookup, p, new_tokens,
                                                                                   SamplingParams(), k=k, **kw)), prompts)
    with quiet():
        result = check_speedup(candidate, baseline, reference, what=label, check=SPEED_CHECK, repeats=repeats,
                               warmup=1, device="cpu")
    wrong = candidate.first_difference(baseline, lambda got, want: list(got.tokens) == list(want.tokens))
    if wrong is not None:
        raise AssertionError(f"{label}: on timed call #{wrong} (the prompt less its last {wrong} tokens) your "
                             "generator's greedy output differs from generate_kv_cache's, so its speed does not count")
    if require_real_speedup and not result["speedup"] > 1.0:
        raise AssertionError(f"{label}: your generator is {result['speedup']:.2f}x plain decoding (medians of {repeats} "
                             f"interleaved runs; the reference reaches {result['reference_speedup']:.2f}x): speculation must "
                             "beat plain decoding, not only approach the reference. Look for per-round work that grows with "
                             "the context (re-feeding tokens a cache already holds, copying caches) or extra target calls.")
    return result
