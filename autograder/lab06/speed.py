"""Lab 06, the speed grades (CPU tier): speculative decoding where it wins on a laptop, prompt lookup.

The learner's generate_speculative (exercise 4, run with the package's pieces of exercises 1-3) drafts with
`PromptLookupModel`, prompt lookup behind the model protocol, so the loop written for a draft model runs unchanged.
Two grades, greedy, on prompts of repetitive code drawn for each call (prompts.drawn_code_prompt):

    check_target_calls          deterministic: target forward calls per generated token, with prompt lookup (k =
                                LOOKUP_K) and with the trained draft model (k = DRAFT_K), below plain decoding's 1, at
                                most the reference's + 1 and at least what the tokens need (k + 1 a call)
    check_speculative_speedup   fewer target calls than plain decoding in its correctness run (counted on the judge's
                                target, as check_target_calls does: deterministic), then wall clock: a speedup over
                                generate_kv_cache above MIN_OVER_PLAIN (1x; medians, interleaved) and at least the
                                calibrated fraction of the reference's (harness.check_speedup)

Judged (the learner's function is a `Remote` in the judge process), the counted target is the judge's: each forward
the learner's loop makes is a request to the judge, counted there, and it is the trained target with a secret
perturbation (judge_target.py), so the tokens the check wants come from no copy of the course's target. Drafters, and
every model whose calls are not counted, are built in the kernel (`where_it_runs`): the speed check times one request
per generation, run in full in the kernel, against baselines run in the judge. Every timed or counted call gets a
prompt of its own, drawn in the judge from a secret seed (common.drawn_seeds), which no call can foresee.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

from autograder.harness import EachCallItsOwnInput, check_speedup, quiet
from autograder.lab06.common import (MIN_OVER_PLAIN, SPEED_CHECK, _watched, drawn_seeds, watch_forward, where_it_runs,
                                     with_reference_pieces)
from autograder.lab06.generator import _gen, trained_pair
from autograder.lab06.judge_target import secret_target
from autograder.lab06.near_ties import same_greedy
from autograder.lab06.prompts import ARGPARSE, CONFIG, drawn_code_prompt, fresh_prompts
from autograder.checking.reference_guard import own_work
from autograder.checking.wire import is_remote, run_where
from minigpt.checkpoint import load_model
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.ngram_draft import PromptLookupModel
from minigpt.engine.speculative import generate_speculative
from minigpt.generate import Generation
from minigpt.sampling import SamplingParams
from minigpt.timing import fixed_threads

LOOKUP_K = 4
DRAFT_K = 3
NEW_TOKENS = 32


def _learners(generate_fn: Callable, what: str, allow_reference: bool = False) -> tuple[Callable, Callable]:
    """The learner's generator, refused if it is the reference, graded alone (the package's pieces of exercises 1-3):
    (watched for calls into the reference, for correctness runs; unwatched, for timing: the watch costs a profiler
    call per Python call). allow_reference: calibration measures the reference itself."""
    if allow_reference:
        return generate_fn, generate_fn
    own_work(generate_fn, generate_speculative, what=what)
    alone = with_reference_pieces(generate_fn)
    return _watched(alone, (generate_speculative,), what), alone


@contextlib.contextmanager
def forward_work(*models: Any) -> Iterator[list[dict[str, int]]]:
    """Inside the block, for each model: how many times its forward runs ("calls"), whichever way it is called, and
    how many token positions those calls feed it in all ("positions")."""
    work = [{"calls": 0, "positions": 0} for _ in models]

    def counter(record: dict[str, int]) -> Callable[[tuple, dict], None]:
        def count(args: tuple, kwargs: dict) -> None:
            tokens = args[0] if args else kwargs.get("tokens")
            record["calls"] += 1
            record["positions"] += int(tokens.shape[-1]) if hasattr(tokens, "shape") else 0
        return count
    stops = [watch_forward(model, counter(record)) for model, record in zip(models, work)]
    try:
        yield work
    finally:
        for stop in reversed(stops):
            stop()


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
    the trained draft model (k = DRAFT_K), on the judge's target (the trained one, secretly perturbed: judge_target.py)
    and a prompt drawn for the call: the tokens must be that target's greedy continuation, and the calls below plain
    decoding's one per token, at most one more than the reference makes with the same drafter, and at least what the
    tokens need (a call emits at most k + 1); with the draft model, at most twice the reference's token positions fed
    to the draft (its KV cache used). Deterministic. Returns {drafter: {"learner", "reference", "plain"}}, calls per
    token, and for the draft model {"draft_positions", "reference_draft_positions"} per token."""
    what = "the target-calls check (generate_speculative)"
    fn, _ = _learners(generate_fn, what)
    public, draft = trained_pair()
    vocab = public.config.vocab_size
    their_lookup = where_it_runs(generate_fn, PromptLookupModel, vocab, here=PromptLookupModel(vocab))
    seeds = drawn_seeds(generate_fn)
    # (drafter here, drafter where the learner's code runs, prompt kind, k): the counted target is always this side's
    # (judged: a handle, so every forward the learner's loop makes is a request here and is counted here); the draft
    # model is this side's too, so the positions it is fed are counted here: with a KV cache a draft step feeds one
    # new token, without one the whole context again (the reference: about 4 positions a token, no cache about 150)
    setups = {"prompt lookup": (PromptLookupModel(vocab), their_lookup, CONFIG, LOOKUP_K),
              "draft model": (draft, draft, ARGPARSE, DRAFT_K)}
    out: dict[str, dict[str, float]] = {}
    with fixed_threads(1):
        for name, (drafter, their_drafter, kind, k) in setups.items():
            label = f"{what}, {name}, k={k}"
            secret = secret_target(public, seeds, kind, NEW_TOKENS, draft=draft if drafter is draft else None, k=k)
            target, prompt = secret.model, secret.prompt
            kw = dict(k=k, stop_token_ids=())
            with forward_work(target, drafter) as (learner, learner_draft):
                got = _gen(fn, label, target, their_drafter, list(prompt), NEW_TOKENS, SamplingParams(), **kw)
            if list(got.tokens) != secret.tokens:
                raise AssertionError(
                    f"{label}: your generator's greedy output differs from the greedy output of the target it was "
                    "handed, so its calls do not count: decode with the `target` argument itself (every token comes "
                    "from its logits), and pass check_generate_speculative first")
            with forward_work(target, drafter) as (reference, reference_draft):
                generate_speculative(target, drafter, list(prompt), NEW_TOKENS, SamplingParams(), **kw)
            with forward_work(target) as (plain,):
                generate_kv_cache(target, list(prompt), NEW_TOKENS, stop_token_ids=())
            calls = {"learner": learner["calls"], "reference": reference["calls"], "plain": plain["calls"]}
            out[name] = {key: value / NEW_TOKENS for key, value in calls.items()}
            _check_calls(label, k, **calls)
            if drafter is draft:
                out[name].update(_check_draft_positions(label, learner_draft["positions"],
                                                        reference_draft["positions"], learner["calls"]))
    return out


def _check_calls(label: str, k: int, learner: int, reference: int, plain: int, new_tokens: int = NEW_TOKENS) -> None:
    """Fewer target calls than plain decoding, at most one more than the reference, and at least ceil(new_tokens / (k
    + 1)): no call can emit more than its k drafts and a bonus token."""
    least = math.ceil(new_tokens / (k + 1))
    if learner < least:
        raise AssertionError(
            f"{label}: your generator called the target it was handed {learner} times for {new_tokens} tokens, and at "
            f"k={k} a call emits at most k + 1 = {k + 1} tokens, so at least {least} calls are needed: the tokens came "
            "from somewhere else (another copy of the model, or more than k drafts a round). Draft k tokens, verify "
            "them with one call of the `target` argument, and emit from its logits.")
    if not (learner < plain and learner <= reference + 1):
        raise AssertionError(
            f"{label}: your generator called the target {learner} times for {new_tokens} tokens "
            f"({learner / new_tokens:.2f} per token); plain decoding calls it {plain} times and the reference "
            f"{reference} times with the same drafter. Verify all k drafts of a round in ONE target call over "
            "k + 1 positions (it doubles as the prefill in the first round), and keep every accepted draft "
            "plus the bonus token.")


def _check_draft_positions(label: str, learner: int, reference: int, target_calls: int) -> dict[str, float]:
    """The token positions fed to the draft model handed in, the learner's loop against the reference's (same prompt,
    greedy): at least one per accepted draft (NEW_TOKENS less one token per target call: each call emits its accepted
    drafts and one token of its own), and at most twice the reference's, or the draft model runs without its KV cache.
    Returns both per generated token."""
    accepted = NEW_TOKENS - target_calls
    if learner < accepted:
        raise AssertionError(
            f"{label}: your loop fed the draft model it was handed {learner} token positions, yet its {target_calls} "
            f"target calls emitted {NEW_TOKENS} tokens, so at least {accepted} were accepted drafts, each drafted by a "
            "forward of the draft model: draft with the `draft` argument (not another copy of the model).")
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
    generate_kv_cache: fewer target calls than it in a correctness run on this side's target (counted here:
    _check_calls), then a speedup of at least MIN_OVER_PLAIN and the calibrated fraction (SPEED_CHECK) of the
    reference's speedup, timed interleaved in this process. Calibration only: `require_real_speedup=False` drops the
    call count and the floor, `allow_reference=True` measures the reference itself.

    Judged (generate_fn is a `Remote`), the learner's generator runs in the kernel on the kernel's own copy of the
    models (a forward of a model passed from here would be a round trip, which the baselines do not pay): each timed
    call is one request, timed here; the baselines run here, interleaved with it, on this side's models."""
    what = "the speed check (generate_speculative)"
    fn, timed_fn = _learners(generate_fn, what, allow_reference)
    target, lookup = speed_models()
    their_target, their_lookup = where_it_runs(generate_fn, speed_models, here=(target, lookup))
    if is_remote(generate_fn):
        timed_fn = run_where(generate_fn, one_thread_alone, generate_fn)
    seeds = drawn_seeds(generate_fn)
    prompt = drawn_code_prompt(next(seeds), CONFIG)
    kw = {"stop_token_ids": ()}
    # The correctness run decodes with this side's target (judged: a handle, each forward a request counted here), so
    # the target calls it makes are counted where no learner code runs: the deterministic half of "beats plain decoding"
    with fixed_threads(1):
        with forward_work(target) as (plain,):
            want = generate_kv_cache(target, prompt, new_tokens, **kw)
        with forward_work(target) as (learner,):
            got = _gen(fn, "speed check run", target, their_lookup, list(prompt), new_tokens, SamplingParams(), k=k,
                       **kw)
    if not same_greedy(target, prompt, got.tokens, want.tokens):
        raise AssertionError("your generator's greedy output differs from generate_kv_cache's, so its speed does not count; "
                             "pass check_generate_speculative first")
    if require_real_speedup:
        with fixed_threads(1), forward_work(target) as (reference_calls,):
            generate_speculative(target, lookup, list(prompt), new_tokens, SamplingParams(), k=k, **kw)
        _check_calls(f"{what}, prompt lookup, k={k}", k, learner["calls"], reference_calls["calls"], plain["calls"],
                     new_tokens)

    label = f"speculative decoding with prompt lookup (k={k}) vs cached decoding, {new_tokens} tokens"
    # Each timed call gets a prompt of its own, drawn from a seed drawn here (secret when judged): no call can hand back
    # an answer kept from an earlier one or computed beforehand; the tokens of each are checked against cached
    # decoding's afterwards (the baseline keeps its prompt with its output for that).
    prompts = fresh_prompts(seeds, CONFIG)
    candidate = EachCallItsOwnInput(one_thread_call(lambda p: timed_fn(their_target, their_lookup, p, new_tokens,
                                                                       SamplingParams(), k=k, **kw)), prompts)
    baseline = EachCallItsOwnInput(one_thread_call(lambda p: (p, generate_kv_cache(target, p, new_tokens, **kw))),
                                   prompts)
    reference = EachCallItsOwnInput(one_thread_call(lambda p: generate_speculative(target, lookup, p, new_tokens,
                                                                                   SamplingParams(), k=k, **kw)), prompts)
    try:
        with quiet():
            result = check_speedup(candidate, baseline, reference, what=label, check=SPEED_CHECK, repeats=repeats,
                                   warmup=1, device="cpu", min_speedup=MIN_OVER_PLAIN if require_real_speedup else 0.0)
    except AssertionError as err:
        raise AssertionError(f"{err} Speculation must beat plain decoding, and come near the reference: look for "
                             "per-round work that grows with the context (re-feeding tokens a cache already holds, "
                             "copying caches) or extra target calls.") from None
    with fixed_threads(1):
        wrong = candidate.first_difference(baseline, lambda got, want: isinstance(got, Generation) and same_greedy(
            target, want[0], got.tokens, want[1].tokens))
    if wrong is not None:
        raise AssertionError(f"{label}: on timed call #{wrong} (a prompt of its own) your generator's greedy output "
                             "differs from generate_kv_cache's, so its speed does not count")
    return result
