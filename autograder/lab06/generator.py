"""Lab 06, exercise 4: the speculative generator (generate_speculative), end to end."""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from autograder.checking.call_conditions import DEVICE_HINT, default_device_elsewhere
from autograder.checking.models import LetterTokenizer
from autograder.checking.remote import is_remote, run_where
from autograder.harness import at_least, call_learner, quiet, token_list_checked, within
from autograder.lab06.common import (ENGINE_SAMPLES, SIGNIFICANCE, TOY_SAMPLING, TOY_VOCAB, _chi2_report,
                                     _exact_three, _toy_tables, drawn_seeds, toy_pair, watch_forward, where_it_runs,
                                     with_reference_pieces)
from autograder.lab06.near_ties import clear_drafts, clear_greedy
from autograder.checking.reference_guard import no_calls_into, own_work
from minigpt.checkpoint import load_model
from minigpt.config import ModelConfig
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.speculative import generate_speculative
from minigpt.generate import Generation
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.teaching.goodness_of_fit import ChiSquareResult, chi_square_test
from minigpt.timing import fixed_threads


# ---------------------------------------------------------------------------------------------------
# Exercise 4: the whole generator
# ---------------------------------------------------------------------------------------------------

class _CacheTracer:
    """Follows what every KV cache holds: the token written at each position, per cache object.

    Before each forward call with a cache, the positions must start at the cache's length; and at the start
    of each round (every target call, and the first draft call after it) every position already in the cache
    must hold the token of the final sequence (a rejected draft left in a cache would be attended to). Records violations instead of raising, so the learner's code finishes.
    """

    def __init__(self, models: dict[str, nn.Module]) -> None:
        self.contents: dict[int, list[int]] = {}
        self.calls: dict[str, int] = {name: 0 for name in models}
        self.positions: dict[str, int] = {name: 0 for name in models}         # positions fed, summed over calls
        self.snapshots: list[tuple[str, list[int], int]] = []      # (model, cache prefix, call index)
        self.errors: list[str] = []
        self.stops = [watch_forward(m, self._hook(name)) for name, m in models.items()]

    def _hook(self, name: str) -> Callable[[tuple, dict], None]:
        def hook(args: tuple, kwargs: dict) -> None:
            tokens = args[0] if args else kwargs.get("tokens")
            positions = args[1] if len(args) > 1 else kwargs.get("positions")
            caches = args[2] if len(args) > 2 else kwargs.get("kv_caches")
            self.calls[name] += 1
            self.positions[name] += int(tokens.shape[-1])
            if caches is None:
                return
            length = caches[0].length
            content = self.contents.setdefault(id(caches), [])
            pos = positions.reshape(-1)[-tokens.shape[-1]:].tolist()
            if pos[0] != length and not self.errors:
                self.errors.append(f"the {name} model's call #{self.calls[name]} passed positions starting at {pos[0]} but "
                                   f"its cache holds {length} positions: positions must be cache.next_positions(T)")
            del content[length:]
            self.snapshots.append((name, list(content), self.calls[name]))
            content.extend(tokens[0].tolist())
        return hook

    def close(self) -> None:
        for stop in reversed(self.stops):
            stop()

    def check_prefixes(self, sequence: list[int], what: str) -> None:
        if self.errors:
            raise AssertionError(f"{what}: {self.errors[0]}")
        previous = "target"
        for name, prefix, call in self.snapshots:
            round_start, previous = previous == "target", name
            if name == "draft" and not round_start:
                continue                # inside a round the draft's cache holds its own unverified proposals
            bad = next((j for j, t in enumerate(prefix) if j >= len(sequence) or t != sequence[j]), None)
            if bad is not None:
                raise AssertionError(
                    f"{what}: before the {name} model's call #{call}, its cache still held a token at position {bad} that is "
                    f"not part of the output (a rejected draft): roll the {name} cache back after each round "
                    f"({'keep the context and the accepted drafts' if name == 'target' else 'keep at most the context and the accepted drafts it has seen'}"
                    "), e.g. truncate_cache(cache, length)")


def _gen(fn: Callable, what: str, *args: Any, **kwargs: Any) -> Generation:
    out = call_learner(what, fn, *args, **kwargs)
    if not isinstance(out, Generation):
        raise AssertionError(f"{what}: return a minigpt.generate.Generation (tokens, finish_reason, prompt_tokens), got "
                             f"{type(out).__name__}")
    return token_list_checked(out, what)


def engine_distribution_test(generate_fn: Callable, n: int = ENGINE_SAMPLES, k: int = 2, seed: int = 0,
                             sampling: SamplingParams = TOY_SAMPLING
                             ) -> tuple[ChiSquareResult, ChiSquareResult, ChiSquareResult]:
    """n seeded runs of generate_fn(target, draft, prompt, 3, sampling, k=k) on the bigram toy pair: chi-square tests
    of the first token, the first two, and the second and third (the first round's bonus token when both drafts are
    accepted) against the target's exact distribution. The toy models are built where generate_fn runs (judged: in
    the kernel, so a sample is one request); the counts and the test are made here."""
    target, draft = where_it_runs(generate_fn, toy_pair, seed)
    prompt = [1, 4, 2]
    V = TOY_VOCAB
    first = torch.zeros(V, dtype=torch.long)
    pairs = torch.zeros(V * V, dtype=torch.long)
    later = torch.zeros(V * V, dtype=torch.long)
    for i in range(n):
        s = SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, seed=seed * 100_000 + i)
        out = generate_fn(target, draft, list(prompt), 3, s, k=k, stop_token_ids=())   # 3: the first round drafts k = 2
        if len(out.tokens) != 3:
            raise AssertionError(f"asked for 3 new tokens (no stop token), got {len(out.tokens)}: {out.tokens}")
        first[out.tokens[0]] += 1
        pairs[out.tokens[0] * V + out.tokens[1]] += 1
        later[out.tokens[1] * V + out.tokens[2]] += 1
    p1, p12, p23 = _exact_three(_toy_tables(seed)[0], prompt[-1], sampling)
    return chi_square_test(first, p1), chi_square_test(pairs, p12), chi_square_test(later, p23)


def _tiny_pair(seed: int = 0) -> tuple[GPT, GPT]:
    """Two small random GPTs with peaked logits that agree on roughly 60% of greedy drafts (whatever the seed)."""
    cfg = ModelConfig(vocab_size=48, max_seq_len=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                      tie_embeddings=False)
    with torch.random.fork_rng(devices=[]):         # the global RNG is left as it was
        torch.manual_seed(seed)
        target = GPT(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(30)
        draft = copy.deepcopy(target)
        g = torch.Generator().manual_seed(seed + 1)
        draft.lm_head.weight.add_(torch.randn(draft.lm_head.weight.shape, generator=g) * 0.3)
    return target, draft


def trained_pair() -> tuple[GPT, GPT]:
    """The course's trained target and draft (load_model), quietly."""
    with quiet():
        return load_model("target"), load_model("draft")


def _val_prompts(n: int, length: int) -> list[list[int]]:
    from minigpt.training.data import load_tokens
    val = load_tokens("val")
    step = (len(val) - length) // n
    return [val[i * step:i * step + length].tolist() for i in range(n)]


def check_generate_speculative(generate_fn: Callable, *, n_prompts: int = 4, new_tokens: int = 16) -> None:
    """generate_fn(target, draft, prompt, max_new_tokens, sampling, *, k, stop_token_ids, ...) -> Generation:
    greedy output equal to the target's on the trained pair; caches rolled back; a bonus token when every draft
    is accepted; stop tokens; and the output distribution (chi-square test on the bigram toy pair). Graded alone: the
    loop runs with the package's truncate_cache, sampling_probs and verify_draft (with_reference_pieces)."""
    what = "Exercise 4 (generate_speculative)"
    own_work(generate_fn, generate_speculative, what=what)
    generate_fn = with_reference_pieces(generate_fn)
    seed, kernel_seed = tiny_pair_seeds(generate_fn)
    with fixed_threads(1):
        work = reference_work(seed)          # before the guard below: the reference runs here, counted
    with fixed_threads(1), no_calls_into(generate_speculative, what=what):                  # small models: one thread is fast enough and immune to a busy machine
        _check_greedy_trained(generate_fn, n_prompts, new_tokens)
        _check_generate(generate_fn, seed, work, kernel_seed=kernel_seed)


def _check_greedy_trained(generate_fn: Callable, n_prompts: int, new_tokens: int) -> None:
    # 1. Greedy equality with the trained pair, on validation prompts (only outputs compared: the learner's loop runs
    # the models built where it runs, the expected tokens come from this side's).
    target, draft = trained_pair()
    their_target, their_draft = where_it_runs(generate_fn, trained_pair, here=(target, draft))
    for i, prompt in enumerate(_val_prompts(n_prompts, 24)):
        k = 2 + i % 3
        want = generate_kv_cache(target, prompt, new_tokens, stop_token_ids=())
        what = f"trained target/draft, validation prompt #{i} (24 tokens), {new_tokens} new tokens, greedy, k={k}"
        got = _gen(generate_fn, what, their_target, their_draft, list(prompt), new_tokens, SamplingParams(), k=k,
                   stop_token_ids=())
        if got.tokens != want.tokens:
            step = next((j for j, (a, b) in enumerate(zip(got.tokens, want.tokens)) if a != b),
                        min(len(got.tokens), len(want.tokens)))
            raise AssertionError(f"{what}: output differs from the target's greedy output at new token {step}: expected "
                                 f"{want.tokens[step:step + 4]}..., got {got.tokens[step:step + 4]}.... Greedy speculative "
                                 "decoding must reproduce it exactly: accept a draft only if it is the target's argmax at its "
                                 "position (verify draft i with the target logits that PREDICT position i), and replace the "
                                 "first mismatch by that argmax.")
        if got.finish_reason != "length":
            raise AssertionError(f"{what}: finish_reason should be 'length', got {got.finish_reason!r}")


def _check_edges(generate_fn: Callable, tiny_target: GPT, their_target: Any, their_draft: Any, prompt: list[int],
                 free: list[int]) -> None:
    """What the other cases never ask: zero and one new token, and a stop string (with a tokenizer built where the loop
    runs); `free` is the target's greedy output without stops."""
    got = _gen(generate_fn, "max_new_tokens=0", their_target, their_draft, list(prompt), 0, SamplingParams(), k=3,
               stop_token_ids=())
    if (list(got.tokens), got.finish_reason) != ([], "length"):
        raise AssertionError(f"max_new_tokens=0: expected no tokens and finish_reason 'length' (like "
                             f"generate_kv_cache), got {got.tokens} and {got.finish_reason!r}")
    got = _gen(generate_fn, "max_new_tokens=1", their_target, their_draft, list(prompt), 1, SamplingParams(), k=3,
               stop_token_ids=())
    if (list(got.tokens), got.finish_reason) != (free[:1], "length"):
        raise AssertionError(f"max_new_tokens=1 (greedy): expected the target's first token {free[:1]} and "
                             f"finish_reason 'length', got {got.tokens} and {got.finish_reason!r}: with one token left "
                             "a round drafts nothing (k = 0) and emits the target's token")
    stop = LetterTokenizer.decode(free[6:8])
    want = generate_kv_cache(tiny_target, prompt, 30, stop_token_ids=(), stop_strings=(stop,),
                             tokenizer=LetterTokenizer())
    what = f"greedy with stop_strings=({stop!r},) and a tokenizer"
    got = _gen(generate_fn, what, their_target, their_draft, list(prompt), 30, SamplingParams(), k=3,
               stop_token_ids=(), stop_strings=(stop,), tokenizer=run_where(generate_fn, LetterTokenizer))
    if (got.tokens, got.finish_reason) != (want.tokens, want.finish_reason):
        raise AssertionError(f"{what}: expected {want.tokens} ({want.finish_reason!r}), got {got.tokens} "
                             f"({got.finish_reason!r}); pass stop_strings and tokenizer on to minigpt.generate.StopRule")


@dataclass(frozen=True)
class WorkRun:
    """A run of parts 2 and 3 whose greedy forward work is compared with the reference's (greedy: the rounds are the
    same in any correct loop); `twin`: the draft is a copy of the target."""
    label: str
    twin: bool
    k: int
    new_tokens: int
    prompt: tuple[int, ...]


TINY_RUN = WorkRun("tiny random pair", False, 3, 30, (5, 9, 2, 7, 1))
TWIN_RUN = WorkRun("draft identical to the target", True, 3, 24, (3, 1, 4))
WORK_RUNS = (TINY_RUN, TWIN_RUN)


def clear_tiny_pair(seed: int) -> bool:
    """Whether every greedy step the check compares on the tiny pair of `seed` is clear (near_ties: top two logits at
    least NEAR_TIE apart): the target's along the greedy output of each of WORK_RUNS (which holds the twin's drafts,
    and parts 4 and 5, prefixes of TINY_RUN's), and the draft's at every draft the reference loop makes in TINY_RUN.
    On such a pair every correct loop emits the target's greedy tokens in the reference's rounds, whatever float path
    it takes (k + 1 positions at a time, one at a time, another thread count: they differ by about 1e-5 here)."""
    target, draft = _tiny_pair(seed)
    for run in WORK_RUNS:
        tokens = generate_kv_cache(target, list(run.prompt), run.new_tokens, stop_token_ids=()).tokens
        if not clear_greedy(target, run.prompt, tokens):
            return False
    spec = generate_speculative(target, draft, list(TINY_RUN.prompt), TINY_RUN.new_tokens, SamplingParams(),
                                k=TINY_RUN.k, stop_token_ids=())
    return clear_drafts(draft, TINY_RUN.prompt, spec.rounds)


def tiny_pair_seed(generate_fn: Callable) -> int:
    """A seed of the tiny models, the first clear one (clear_tiny_pair) of common.drawn_seeds: judged, a secret drawn
    here, so that the kernel cannot build its own copy of the judge's target (and call it where the judge does not
    count) yet get the target's outputs, nor foresee the outputs of the models built where it runs; in one process
    (the package's tests), the same seed every run. The verdict does not depend on it (tests/labs/test_lab06_checks.py)."""
    with fixed_threads(1):
        return next(seed for seed in drawn_seeds(generate_fn) if clear_tiny_pair(seed))


def tiny_pair_seeds(generate_fn: Callable) -> tuple[int, int]:
    """(seed of the judge's tiny pair, seed of the pair built where the learner's code runs): judged, two secrets drawn
    apart, so that what the kernel is sent for the one tells it nothing of the other; in one process, one seed twice."""
    seed = tiny_pair_seed(generate_fn)
    return seed, tiny_pair_seed(generate_fn) if is_remote(generate_fn) else seed


def _traced_run(generate_fn: Callable, target: GPT, draft: GPT, prompt: list[int], n: int, params: SamplingParams,
                k: int, what: str, models: dict[str, GPT]) -> tuple[Generation, _CacheTracer]:
    tracer = _CacheTracer(models)
    try:
        got = _gen(generate_fn, what, target, draft, list(prompt), n, params, k=k, stop_token_ids=())
    finally:
        tracer.close()
    return got, tracer


def reference_work(seed: int) -> dict[str, dict[str, int]]:
    """Positions the reference loop feeds the target and the draft in each of WORK_RUNS (the tiny pair of `seed`)."""
    target, draft = _tiny_pair(seed)
    work = {}
    for run in WORK_RUNS:
        other = copy.deepcopy(target) if run.twin else draft
        _, tracer = _traced_run(generate_speculative, target, other, list(run.prompt), run.new_tokens, SamplingParams(),
                                run.k, run.label, {"target": target, "draft": other})
        work[run.label] = dict(tracer.positions)
    return work


def _check_work(tracer: _CacheTracer, reference: dict[str, int], k: int, what: str) -> None:
    """Each model is fed at most the reference's positions plus k (a loop may size its last round differently):
    more means positions computed again (a model run without its cache, or a rollback that dropped accepted
    tokens)."""
    for name in ("target", "draft"):
        if not within(tracer.positions[name], reference[name] + k):
            raise AssertionError(f"{what}: the {name} model was fed {tracer.positions[name]} positions, the reference "
                                 f"loop {reference[name]}: positions were computed again, by a model run without its "
                                 "KV cache or after a rollback that dropped accepted tokens. Feed each model only what "
                                 "its cache lacks, and keep context + accepted drafts: truncate_cache(cache, "
                                 "len(context) + n) with n the accepted drafts (for the draft, at most what it has "
                                 "seen)")


LONG_CONTEXT = 2 ** 40        # positions: no cache that long fits in memory (its allocation fails at once)


def _check_long_context(generate_fn: Callable, seed: int) -> None:
    """The tiny pair with a context of 2**40 positions: each cache is sized for the request (prompt + new tokens, as
    lab 01's), not for the model's whole context."""
    target, draft = _tiny_pair(seed)
    for model in (target, draft):
        model.config = dataclasses.replace(model.config, max_seq_len=LONG_CONTEXT)
    prompt, n = [5, 9, 2], 4
    what = f"tiny random models with a context of 2**40 positions, prompt {prompt}, {n} new tokens, greedy, k=3"
    try:
        got = _gen(generate_fn, what, target, draft, list(prompt), n, SamplingParams(), k=3, stop_token_ids=())
    except AssertionError as err:
        raise AssertionError(f"{str(err).rstrip('.')}. Size each cache for the request (len(prompt) + "
                             "max_new_tokens positions, as lab 01 does), not for the model's whole context.") from None
    want = generate_kv_cache(target, prompt, n, stop_token_ids=()).tokens
    if got.tokens != want:
        raise AssertionError(f"{what}: expected {want}, got {got.tokens}")


def _check_default_device_elsewhere(generate_fn: Callable, target: GPT, draft: GPT) -> None:
    """The loop with torch's default device moved off the models': its caches, token tensors and sampling generator
    must follow target.device (greedy: the target's tokens; sampled: n tokens, no error)."""
    prompt, n, k = list(TINY_RUN.prompt), 12, 3
    for params in (SamplingParams(), SamplingParams(temperature=1.0, seed=5)):
        what = (f"tiny random models, prompt {prompt}, {n} new tokens, {params}, k={k}, with torch's default device "
                "moved off the models'")
        try:
            with default_device_elsewhere():
                got = _gen(generate_fn, what, target, draft, list(prompt), n, params, k=k, stop_token_ids=())
        except AssertionError as err:
            raise AssertionError(f"{str(err).rstrip('.')}. {DEVICE_HINT}.") from None
        want = generate_kv_cache(target, prompt, n, stop_token_ids=()).tokens if params.greedy else None
        if len(got.tokens) != n or (want is not None and got.tokens != want):
            raise AssertionError(f"{what}: expected {want if want is not None else f'{n} tokens'}, got {got.tokens}. "
                                 f"{DEVICE_HINT}.")


def _check_generate(generate_fn: Callable, seed: int | None = None,
                    work: dict[str, dict[str, int]] | None = None, *, kernel_seed: int | None = None) -> None:
    # 2. Caches rolled back: what each cache holds is always part of the final sequence (tiny random GPTs). Parts 2
    # and 3 trace and count every forward, so the models are this side's (judged: handles, each forward a request
    # here, and weights from a seed the kernel is never sent: it has to call them).
    if seed is None:
        seed, kernel_seed = tiny_pair_seeds(generate_fn)
    if kernel_seed is None:         # a seed given (the package's tests): judged, the kernel's pair has a secret of its own
        kernel_seed = tiny_pair_seed(generate_fn) if is_remote(generate_fn) else seed
    work = reference_work(seed) if work is None else work
    tiny_target, tiny_draft = _tiny_pair(seed)
    prompt, n, k = list(TINY_RUN.prompt), TINY_RUN.new_tokens, TINY_RUN.k
    for params in (SamplingParams(), SamplingParams(temperature=1.0, seed=3)):
        what = f"tiny random models, prompt {prompt}, {n} new tokens, {params}, k={k}"
        got, tracer = _traced_run(generate_fn, tiny_target, tiny_draft, prompt, n, params, k, what,
                                  {"target": tiny_target, "draft": tiny_draft})
        if len(got.tokens) != n:
            raise AssertionError(f"{what}: expected exactly {n} new tokens, got {len(got.tokens)}; a round must never "
                                 "emit more than the tokens still allowed (draft fewer near the end)")
        tracer.check_prefixes(prompt + got.tokens, what)
        if params.greedy:
            want = generate_kv_cache(tiny_target, prompt, n, stop_token_ids=())
            if got.tokens != want.tokens:
                raise AssertionError(f"{what}: greedy output differs from the target's greedy output")
            _check_work(tracer, work[TINY_RUN.label], k, what)
        if tracer.calls["target"] >= n:
            raise AssertionError(f"{what}: the target model was called {tracer.calls['target']} times for {n} tokens; "
                                 "it should verify all k drafts of a round in ONE forward call over k + 1 positions")
    # 3. The bonus token: a draft identical to the target has every draft accepted, so each round emits k + 1.
    twin = copy.deepcopy(tiny_target)
    k, n = TWIN_RUN.k, TWIN_RUN.new_tokens
    for params in (SamplingParams(), SamplingParams(temperature=0.8, seed=1)):
        what = f"draft identical to the target (every draft accepted), {n} new tokens, k={k}, {params}"
        got, tracer = _traced_run(generate_fn, tiny_target, twin, list(TWIN_RUN.prompt), n, params, k, what,
                                  {"target": tiny_target, "draft": twin})
        if params.greedy:
            _check_work(tracer, work[TWIN_RUN.label], k, what)
        rounds = math.ceil(n / (k + 1))
        if tracer.calls["target"] != rounds:
            hint = (" Looks like no bonus token: when all k drafts are accepted, also emit a token from the target's "
                    "distribution at position k + 1 (already computed by the verify pass)."
                    if tracer.calls["target"] == math.ceil(n / k) else "")
            raise AssertionError(f"{what}: each round should emit k + 1 = {k + 1} tokens, so the target should run {rounds} "
                                 f"times; it ran {tracer.calls['target']} times.{hint}")
    _check_default_device_elsewhere(generate_fn, tiny_target, tiny_draft)
    _check_long_context(generate_fn, seed)
    # 4. A stop token ends generation like the target would (4-6 compare outputs only: the models where it runs, from a
    # seed of their own, drawn apart from the judge's: the kernel is sent that one, never the seed of parts 2 and 3).
    kernel_target, kernel_draft = _tiny_pair(kernel_seed)          # this side's copy, for the outputs to expect
    their_target, their_draft = where_it_runs(generate_fn, _tiny_pair, kernel_seed, here=(kernel_target, kernel_draft))
    prompt = list(TINY_RUN.prompt)
    ref = generate_kv_cache(kernel_target, prompt, 30, stop_token_ids=())
    stop = ref.tokens[6]
    want = generate_kv_cache(kernel_target, prompt, 30, stop_token_ids=(stop,))
    got = _gen(generate_fn, "stop token", their_target, their_draft, list(prompt), 30, SamplingParams(), k=3,
               stop_token_ids=(stop,))
    if (got.tokens, got.finish_reason) != (want.tokens, want.finish_reason):
        raise AssertionError(f"greedy with stop_token_ids=({stop},): expected {want.tokens} ({want.finish_reason!r}), got "
                             f"{got.tokens} ({got.finish_reason!r}); feed every emitted token to minigpt.generate.StopRule "
                             "and stop at the first one that ends generation")
    if got.prompt_tokens != len(prompt):
        raise AssertionError(f"greedy with a stop token: Generation.prompt_tokens should be the prompt's length "
                             f"{len(prompt)}, got {got.prompt_tokens!r}")
    _check_edges(generate_fn, kernel_target, their_target, their_draft, prompt, ref.tokens)
    # 5. The same seed twice gives the same tokens; another seed other tokens.
    params = SamplingParams(temperature=1.0, seed=7)
    runs = [_gen(generate_fn, f"sampling with {p}", their_target, their_draft, list(prompt), 20, p, k=3,
                 stop_token_ids=()).tokens for p in (params, params)]
    if runs[0] != runs[1]:
        raise AssertionError(f"two runs with the same {params} gave different tokens ({runs[0][:8]}... and "
                             f"{runs[1][:8]}...): draw every random number (drafts, acceptance, residual, bonus) from the "
                             "generator made from sampling.seed (minigpt.sampling.make_generator), never the global RNG")
    # 6. The distribution, end to end (sampling with temperature and top-k).
    r1, r2, r3 = call_learner("generate_speculative", engine_distribution_test, generate_fn,
                              context="in the distribution test")
    for res, what in ((r1, "first token"), (r2, "first two tokens"),
                      (r3, "second and third tokens (the third is the bonus token when both drafts are accepted)")):
        if not at_least(res.p_value, SIGNIFICANCE):
            raise AssertionError(
                f"sampling with {TOY_SAMPLING}: the {what} do not follow the target's distribution ({_chi2_report(res, what)}, "
                f"below the significance {SIGNIFICANCE}). Apply the same temperature / top-k / top-p to the draft's logits "
                "(the q in min(1, p/q) must be the distribution the draft token was drawn from) and to the target's; "
                "verify draft i with the target logits at the position that predicts it; draw the bonus token from the "
                "target's distribution after the last draft.")
