"""Checks for Lab 06, speculative decoding.

Each check takes the learner's function, runs it on seeded inputs and raises AssertionError saying what
is wrong. The sampler is graded statistically: a chi-square goodness-of-fit test at a fixed significance
(SIGNIFICANCE) of the first emitted token and of the first two emitted tokens against the target's exact
distribution, on toy models with a 6-token vocabulary, with sample sizes chosen so that each wrong
implementation listed in tests/labs/test_lab06_checks.py fails (see the margins printed there).

CPU tier:
    check_truncate_cache(fn)             cache rollback: lengths, kept data, clear errors
    check_sampling_probs(fn)             temperature / top-k / top-p / greedy distributions
    check_verify_draft(fn)               accept min(1, p/q), normalised residual, bonus token; distribution test
    check_generate_speculative(fn)       greedy == target greedy (trained models); cache contents after
                                         rejections; bonus token; distribution test end to end
    check_ngram_propose(fn)              prompt-lookup proposals
    check_acceptance_stats(rate_fn, tokens_fn)   sum min(p, q) and (1 - a^(k+1)) / (1 - a)
    check_speculative_speedup(fn)        speed vs lab 01's cached generation, relative to the reference
Interview questions: check_q1_acceptance ... check_q4_break_even_batch.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
from torch import Tensor, nn

from autograder.harness import call_learner, check_answer, check_speedup, quiet
from autograder.reference_guard import no_calls_into, own_work
from minigpt.cache.contiguous import KVCache
from minigpt.cache.rollback import truncate_cache
from minigpt.checkpoint import load_model
from minigpt.config import ModelConfig
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.ngram_draft import ngram_propose
from minigpt.engine.speculative import generate_speculative, sampling_probs, verify_draft
from minigpt.generate import Generation
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.teaching.goodness_of_fit import ChiSquareResult, chi_square_test
from minigpt.teaching.speculative_calculator import (acceptance_rate, break_even_alpha, break_even_batch,
                                                     expected_tokens_per_round)
from minigpt.timing import fixed_threads

__all__ = ["check_truncate_cache", "check_sampling_probs", "check_verify_draft", "check_generate_speculative",
           "check_ngram_propose", "check_acceptance_stats", "check_speculative_speedup", "check_q1_acceptance",
           "check_q2_tokens_per_round", "check_q3_break_even_alpha", "check_q4_break_even_batch",
           "SIGNIFICANCE", "VERIFY_SAMPLES", "ENGINE_SAMPLES", "SPEED_CHECK", "BigramLM", "toy_pair",
           "verify_distribution_test", "engine_distribution_test", "code_edit_prompts"]

SIGNIFICANCE = 1e-3          # reject "same distribution" when the p-value is below this
VERIFY_SAMPLES = 1500        # emulated sequences for check_verify_draft's test
ENGINE_SAMPLES = 1000        # generate_speculative calls for the end-to-end test
TOY_VOCAB = 6
# Far from T = 1 (a temperature bug shows) and a top-k that drops 27% of the target's mass after the prompt's last
# token (a target distribution that ignores top-k shows; top_k=4 at T = 0.4 dropped 0.0%).
TOY_SAMPLING = SamplingParams(temperature=3.0, top_k=3)

# The learner's speedup over generate_kv_cache must reach a fraction of the reference's speedup measured in the same
# run, calibrated per device class by `make calibrate` (autograder/calibrate.py) between the reference's ratio and that
# of a generator that re-runs the whole context every step (no cache).
SPEED_CHECK = "lab06_speculative_speedup"


# ---------------------------------------------------------------------------------------------------
# Exercise 1: cache rollback
# ---------------------------------------------------------------------------------------------------

def check_truncate_cache(truncate_fn: Callable) -> None:
    """truncate_fn(cache: KVCache, length) keeps positions [0, length) in every layer; the next write lands at
    `length`; a length outside [0, cache.length] raises ValueError and changes nothing."""
    what = "Exercise 1 (truncate_cache)"
    own_work(truncate_fn, truncate_cache, what=what)
    with no_calls_into(truncate_cache, what=what):
        _check_truncate_cache(truncate_fn)


def _check_truncate_cache(truncate_fn: Callable) -> None:
    cfg = ModelConfig(vocab_size=32, max_seq_len=16, d_model=16, n_layers=3, n_heads=2, n_kv_heads=1, d_ff=32)
    cache = KVCache.for_model(cfg)
    g = torch.Generator().manual_seed(0)

    def write(T: int) -> list[Tensor]:
        ks = [torch.randn(1, T, 1, cfg.head_dim, generator=g) for _ in range(cfg.n_layers)]
        for layer, k in zip(cache, ks):
            layer.update(k, -k)
        return ks

    first = write(7)
    call_learner("truncate_cache(cache, 4)", truncate_fn, cache, 4)
    lengths = [layer.length for layer in cache]
    if lengths != [4] * cfg.n_layers:
        raise AssertionError(f"after truncate_cache(cache, 4) on a cache of 7 positions every layer's length should be 4, "
                             f"got {lengths}; set the length of EVERY layer (the model attends to [0, length) per layer)")
    second = write(2)
    for i, layer in enumerate(cache):
        want = torch.cat([first[i][:, :4], second[i]], 1)
        if not torch.equal(layer.k[:, :6], want) or not torch.equal(layer.v[:, :6], -want):
            raise AssertionError(f"layer {i}: after truncating to 4 and writing 2 positions, positions [0, 6) should hold the "
                                 "first 4 old positions then the 2 new ones; truncation must keep the data before `length`")
    for bad in (7, -1):
        before = [layer.length for layer in cache]
        try:
            with quiet():
                truncate_fn(cache, bad)
        except NotImplementedError:
            raise AssertionError("truncate_cache is not implemented yet (NotImplementedError)") from None
        except ValueError as err:
            if str(cache.length) not in str(err):
                raise AssertionError(f"truncate_cache(cache, {bad}) raised ValueError, good, but the message should name the "
                                     f"cache's length ({cache.length}); got {err!r}") from None
        except Exception as err:
            raise AssertionError(f"truncate_cache(cache, {bad}) on a cache of 6 positions should raise ValueError, got "
                                 f"{type(err).__name__}: {err}") from None
        else:
            raise AssertionError(f"truncate_cache(cache, {bad}) on a cache of 6 positions must raise ValueError (a cache "
                                 "cannot grow by truncation, and lengths are >= 0); nothing was raised")
        if [layer.length for layer in cache] != before:
            raise AssertionError(f"the rejected truncate_cache(cache, {bad}) changed the lengths; check before changing state")
    call_learner("truncate_cache(cache, 0)", truncate_fn, cache, 0)
    if [layer.length for layer in cache] != [0] * cfg.n_layers:
        raise AssertionError("truncate_cache(cache, 0) should empty every layer")


# ---------------------------------------------------------------------------------------------------
# Exercise 2: the distributions p and q
# ---------------------------------------------------------------------------------------------------

def check_sampling_probs(probs_fn: Callable) -> None:
    """probs_fn(logits (N, V), sampling) -> the (N, V) float distribution sample_next draws from."""
    what = "Exercise 2 (sampling_probs)"
    own_work(probs_fn, sampling_probs, what=what)
    _check_sampling_probs(_watched(probs_fn, (sampling_probs,), what))


def _watched(fn: Callable, references: tuple, what: str) -> Callable:
    """fn, refusing (ReferenceHandedIn) a call that enters the reference's code while fn runs (the check's own calls
    of the reference, between the learner's calls, are not watched)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        with no_calls_into(*references, what=what):
            return fn(*args, **kwargs)
    return call


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


# ---------------------------------------------------------------------------------------------------
# Toy models with a 6-token vocabulary: exact distributions are cheap
# ---------------------------------------------------------------------------------------------------

def _toy_tables(seed: int = 0) -> tuple[Tensor, Tensor]:
    """Bigram logit tables (V, V): row a = logits of the next token after token a, for a target and a draft
    that disagree often (per-token acceptance around 0.6)."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(TOY_VOCAB, TOY_VOCAB, generator=g) * 1.6
    draft = target + torch.randn(TOY_VOCAB, TOY_VOCAB, generator=g) * 1.6
    return target, draft


class BigramLM(GPT):
    """A GPT-shaped toy: logits(next | context) = table[last token], so exact distributions are one table lookup.

    It speaks the model protocol (tokens, positions, kv_caches) and writes one dummy key/value per position
    into the cache, so cache lengths and positions behave as with a real model.
    """

    def __init__(self, table: Tensor, max_seq_len: int = 64) -> None:
        nn.Module.__init__(self)
        V = table.shape[0]
        self.config = ModelConfig(vocab_size=V, max_seq_len=max_seq_len, d_model=2, n_layers=1, n_heads=1,
                                  n_kv_heads=1, d_ff=2)
        self.tok_emb = nn.Embedding(V, 2)            # only for .device and .dtype
        self.register_buffer("table", table.float().clone())

    def forward(self, tokens: Tensor, positions: Tensor | None = None, kv_caches: Any = None) -> Tensor:
        B, T = tokens.shape
        if kv_caches is not None:
            if positions is None:
                raise ValueError("pass `positions` with `kv_caches`")
            zeros = torch.zeros(B, T, 1, 2)
            for layer in kv_caches:
                layer.update(zeros, zeros)
        return self.table[tokens]


def toy_pair(seed: int = 0) -> tuple[BigramLM, BigramLM]:
    target, draft = _toy_tables(seed)
    return BigramLM(target).eval(), BigramLM(draft).eval()


def _chi2_report(res: ChiSquareResult, what: str) -> str:
    return f"{what}: chi-square {res.statistic:.1f} on {res.dof} degrees of freedom, p-value {res.p_value:.2g}, n = {res.n}"


def _exact_three(table: Tensor, first: int, sampling: SamplingParams) -> tuple[Tensor, Tensor, Tensor]:
    """Exact target distributions after a context ending in `first`: of the first token, of the first two tokens,
    and of the second and third tokens (the third is a round's bonus token when both k = 2 drafts are accepted)."""
    P = sampling_probs(table, sampling)                 # (V, V): row a = p(. | last token a)
    p1 = P[first]
    p12 = p1[:, None] * P                               # joint p(x1) p(x2 | x1)
    p2 = p12.sum(0)
    return p1, p12.flatten(), (p2[:, None] * P).flatten()      # p(x2) p(x3 | x2)


# ---------------------------------------------------------------------------------------------------
# Exercise 3: the accept / resample rule
# ---------------------------------------------------------------------------------------------------

def verify_distribution_test(verify_fn: Callable, n: int = VERIFY_SAMPLES, k: int = 2, seed: int = 0
                             ) -> tuple[ChiSquareResult, ChiSquareResult, ChiSquareResult]:
    """Emulate speculative sampling on the bigram toy with verify_fn as the accept/resample rule, n times, and
    test the first emitted token, the first two, and the second and third (the first round's bonus token when
    both drafts are accepted) against the target's exact distribution."""
    t_table, d_table = _toy_tables(seed)
    s = SamplingParams(temperature=1.0)
    P, Q = sampling_probs(t_table, s), sampling_probs(d_table, s)
    start = 2
    V = TOY_VOCAB
    g = torch.Generator().manual_seed(1000 + seed)
    first = torch.zeros(V, dtype=torch.long)
    pairs = torch.zeros(V * V, dtype=torch.long)
    later = torch.zeros(V * V, dtype=torch.long)
    for _ in range(n):
        context = [start]
        while len(context) < 4:
            last = context[-1]
            drafted, q_rows = [], []
            for _ in range(k):
                q = Q[last]
                t = int(torch.multinomial(q, 1, generator=g))
                drafted.append(t)
                q_rows.append(q)
                last = t
            p = P[torch.tensor([context[-1]] + drafted)]          # p rows at the k + 1 positions
            out = verify_fn(list(drafted), torch.stack(q_rows), p, g)
            emitted = out[0] if isinstance(out, tuple) else out
            emitted = [int(x) for x in emitted]
            if not 1 <= len(emitted) <= k + 1:
                raise AssertionError(f"verify_draft returned {len(emitted)} tokens for {k} drafts; it must return the "
                                     f"accepted drafts plus exactly one more token (1 to {k + 1} tokens)")
            context += emitted
        first[context[1]] += 1
        pairs[context[1] * V + context[2]] += 1
        later[context[2] * V + context[3]] += 1
    p1, p12, p23 = _exact_three(t_table, start, s)
    return chi_square_test(first, p1), chi_square_test(pairs, p12), chi_square_test(later, p23)


def check_verify_draft(verify_fn: Callable) -> None:
    """verify_fn(draft_tokens (k ints), q (k, V), p (k + 1, V), generator) -> (emitted tokens, accept_probs (k,))."""
    what = "Exercise 3 (verify_draft)"
    own_work(verify_fn, verify_draft, what=what)
    with no_calls_into(verify_draft, what=what):
        _check_verify_draft(verify_fn)


def _residual_hint(err: BaseException) -> str | None:
    """torch's multinomial error on a negative or zero-sum row, as the mistake that causes it here."""
    text = str(err)
    if "probability tensor contains" in text or "invalid multinomial distribution" in text:
        return ("verify_draft drew from a row that is not a distribution (torch: " + text.splitlines()[0][:120] + "). "
                "At a rejection draw from the residual max(0, p - q), clipped at 0 (p - q alone has negative "
                "entries), divided by its sum.")
    return None


def _verify_call(verify_fn: Callable, what: str, *args: Any) -> Any:
    try:
        with quiet():
            return verify_fn(*args)
    except NotImplementedError:
        raise AssertionError("verify_draft is not implemented yet (NotImplementedError)") from None
    except AssertionError:
        raise
    except Exception as err:
        hint = _residual_hint(err)
        if hint is None:
            raise AssertionError(f"{what} raised {type(err).__name__}: {str(err)[:300]}") from None
        raise AssertionError(f"{what}: {hint}") from None


def _check_verify_draft(verify_fn: Callable) -> None:
    g = torch.Generator().manual_seed(5)
    # 1. p == q: every draft is accepted, and a bonus token follows.
    V, k = 7, 3
    probs = torch.softmax(torch.randn(k + 1, V, generator=g), -1)
    drafted = [int(torch.multinomial(probs[i], 1, generator=g)) for i in range(k)]
    out = _verify_call(verify_fn, "verify_draft", drafted, probs[:k].clone(), probs.clone(), g)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise AssertionError(f"verify_draft must return a tuple (emitted_tokens, accept_probs), got {type(out).__name__}")
    emitted, accept = out
    emitted = [int(t) for t in emitted]
    if emitted[:k] != drafted or len(emitted) != k + 1:
        raise AssertionError(f"with p == q every draft must be accepted (min(1, p/q) = 1) and a bonus token drawn from "
                             f"p[k] appended: expected {drafted} + [one token], got {emitted}."
                             + (" The bonus token is missing: when all k drafts are accepted, the target's distribution at "
                                "position k + 1 is already computed, so one more token comes for free."
                                if emitted == drafted else ""))
    accept = torch.as_tensor(accept, dtype=torch.float32)
    if accept.shape != (k,) or not torch.allclose(accept, torch.ones(k)):
        raise AssertionError(f"with p == q accept_probs should be {k} ones, got {accept.tolist()}")
    # 2. accept_probs = min(1, p/q): clipped.
    q = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]])
    p = torch.tensor([[0.4, 0.3, 0.3], [0.2, 0.6, 0.2], [0.3, 0.3, 0.4]])
    _, accept = _verify_call(verify_fn, "verify_draft", [0, 1], q.clone(), p.clone(), torch.Generator().manual_seed(0))
    accept = torch.as_tensor(accept, dtype=torch.float32).flatten().tolist()
    want = [1.0, 1.0]
    if len(accept) != 2 or any(abs(a - b) > 1e-6 for a, b in zip(accept, want)):
        hint = ""
        if len(accept) == 2 and abs(accept[0] - 4.0) < 1e-5:
            hint = " p/q = 0.4/0.1 = 4 is not a probability: clip it, min(1, p/q)."
        elif len(accept) == 2 and abs(accept[0] - 0.25) < 1e-5:
            hint = " You used q/p: the ratio is target over draft, p/q."
        raise AssertionError(f"draft tokens [0, 1] with p(t)/q(t) = 0.4/0.1 and 0.6/0.25: accept_probs should be "
                             f"min(1, p/q) = {want}, got {accept}.{hint}")
    _, accept = _verify_call(verify_fn, "verify_draft", [1, 0], q.clone(), p.clone(), torch.Generator().manual_seed(0))
    accept = torch.as_tensor(accept, dtype=torch.float32).flatten().tolist()
    want = [0.5, 0.4]
    if len(accept) != 2 or any(abs(a - b) > 1e-6 for a, b in zip(accept, want)):
        raise AssertionError(f"draft tokens [1, 0] with p/q = 0.3/0.6 and 0.2/0.5: accept_probs should be {want}, got {accept}")
    # 3. Greedy: one-hot p and q.
    eye = torch.eye(5)
    out = _verify_call(verify_fn, "verify_draft", [1, 2, 3], eye[[1, 2, 3]], eye[[1, 4, 0, 0]], torch.Generator().manual_seed(0))
    if [int(t) for t in out[0]] != [1, 4]:
        raise AssertionError(f"greedy (one-hot p and q): drafts [1, 2, 3], target argmaxes [1, 4, 0, 0]: the first draft "
                             f"matches, the second does not and is replaced by the target's argmax 4, so [1, 4] is emitted; "
                             f"got {[int(t) for t in out[0]]}")
    # 4. k = 0: one token from p[0].
    out = _verify_call(verify_fn, "verify_draft with no drafts", [], torch.zeros(0, 5), eye[[3]], torch.Generator().manual_seed(0))
    if [int(t) for t in out[0]] != [3]:
        raise AssertionError(f"with no draft tokens verify_draft should return one token drawn from p[0] (here one-hot on "
                             f"3), got {out[0]}")
    # 5. The same generator state gives the same tokens (every draw from the generator passed in).
    p_rows, q_rows = torch.full((3, 4), 0.25), torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1]])
    runs = [_verify_call(verify_fn, "verify_draft", [0, 1], q_rows.clone(), p_rows.clone(),
                         torch.Generator().manual_seed(s)) for s in (11, 11)]
    tokens = [[int(t) for t in out[0]] for out in runs]
    if tokens[0] != tokens[1]:
        raise AssertionError(f"verify_draft called twice with generators seeded alike gave {tokens[0]} and {tokens[1]}: draw "
                             "every random number (the acceptance test and the residual sample) from the `generator` "
                             "argument, e.g. torch.rand(1, generator=generator)")
    # 6. The distribution.
    r1, r2, r3 = call_learner("verify_draft", verify_distribution_test, _explained(verify_fn),
                              context="in the distribution test")
    for res, what in ((r1, "first emitted token"), (r2, "first two emitted tokens"),
                      (r3, "second and third emitted tokens (the third is the bonus token when both drafts are accepted)")):
        if not res.p_value >= SIGNIFICANCE:
            raise AssertionError(
                f"the {what} do not follow the target's distribution ({_chi2_report(res, what)}, below the significance "
                f"{SIGNIFICANCE}). Accept t with probability min(1, p(t)/q(t)) (target over draft); at the first rejection "
                "draw from the residual max(0, p - q) normalised to sum 1 (not from p); verify draft i with p[i], the "
                "target's distribution at the SAME position; draw the bonus token from p[k], the position after the "
                "last draft.")


def _explained(verify_fn: Callable) -> Callable:
    """verify_fn, with torch's multinomial error on a bad residual turned into the mistake's name."""
    def call(*args: Any) -> Any:
        return _verify_call(verify_fn, "verify_draft (in the distribution test)", *args)
    return call


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
        self.snapshots: list[tuple[str, list[int], int]] = []      # (model, cache prefix, call index)
        self.errors: list[str] = []
        self.handles = [m.register_forward_pre_hook(self._hook(name), with_kwargs=True) for name, m in models.items()]

    def _hook(self, name: str) -> Callable:
        def hook(module, args, kwargs):
            tokens = args[0] if args else kwargs.get("tokens")
            positions = args[1] if len(args) > 1 else kwargs.get("positions")
            caches = args[2] if len(args) > 2 else kwargs.get("kv_caches")
            self.calls[name] += 1
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
        for h in self.handles:
            h.remove()

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
    return out


def engine_distribution_test(generate_fn: Callable, n: int = ENGINE_SAMPLES, k: int = 2, seed: int = 0,
                             sampling: SamplingParams = TOY_SAMPLING
                             ) -> tuple[ChiSquareResult, ChiSquareResult, ChiSquareResult]:
    """n seeded runs of generate_fn(target, draft, prompt, 3, sampling, k=k) on the bigram toy pair: chi-square tests
    of the first token, the first two, and the second and third (the first round's bonus token when both drafts are
    accepted) against the target's exact distribution."""
    target, draft = toy_pair(seed)
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
    p1, p12, p23 = _exact_three(target.table, prompt[-1], sampling)
    return chi_square_test(first, p1), chi_square_test(pairs, p12), chi_square_test(later, p23)


def _tiny_pair() -> tuple[GPT, GPT]:
    """Two small random GPTs with peaked logits that agree on roughly 60% of greedy drafts."""
    cfg = ModelConfig(vocab_size=48, max_seq_len=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                      tie_embeddings=False)
    with torch.random.fork_rng(devices=[]):         # the global RNG is left as it was
        torch.manual_seed(0)
        target = GPT(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(30)
        draft = copy.deepcopy(target)
        g = torch.Generator().manual_seed(1)
        draft.lm_head.weight.add_(torch.randn(draft.lm_head.weight.shape, generator=g) * 0.3)
    return target, draft


def _val_prompts(n: int, length: int) -> list[list[int]]:
    from minigpt.training.data import load_tokens
    val = load_tokens("val")
    step = (len(val) - length) // n
    return [val[i * step:i * step + length].tolist() for i in range(n)]


def check_generate_speculative(generate_fn: Callable, *, n_prompts: int = 4, new_tokens: int = 16) -> None:
    """generate_fn(target, draft, prompt, max_new_tokens, sampling, *, k, stop_token_ids, ...) -> Generation:
    greedy output equal to the target's on the trained pair; caches rolled back; a bonus token when every draft
    is accepted; stop tokens; and the output distribution (chi-square test on the bigram toy pair)."""
    what = "Exercise 4 (generate_speculative)"
    own_work(generate_fn, generate_speculative, what=what)
    with fixed_threads(1), no_calls_into(generate_speculative, what=what):                  # small models: one thread is fast enough and immune to a busy machine
        _check_greedy_trained(generate_fn, n_prompts, new_tokens)
        _check_generate(generate_fn)


def _check_greedy_trained(generate_fn: Callable, n_prompts: int, new_tokens: int) -> None:
    # 1. Greedy equality with the trained pair, on validation prompts.
    with quiet():
        target, draft = load_model("target"), load_model("draft")
    for i, prompt in enumerate(_val_prompts(n_prompts, 24)):
        k = 2 + i % 3
        want = generate_kv_cache(target, prompt, new_tokens, stop_token_ids=())
        what = f"trained target/draft, validation prompt #{i} (24 tokens), {new_tokens} new tokens, greedy, k={k}"
        got = _gen(generate_fn, what, target, draft, list(prompt), new_tokens, SamplingParams(), k=k, stop_token_ids=())
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


def _check_generate(generate_fn: Callable) -> None:
    # 2. Caches rolled back: what each cache holds is always part of the final sequence (tiny random GPTs).
    tiny_target, tiny_draft = _tiny_pair()
    for params in (SamplingParams(), SamplingParams(temperature=1.0, seed=3)):
        prompt = [5, 9, 2, 7, 1]
        what = f"tiny random models, prompt {prompt}, 30 new tokens, {params}, k=3"
        tracer = _CacheTracer({"target": tiny_target, "draft": tiny_draft})
        try:
            got = _gen(generate_fn, what, tiny_target, tiny_draft, list(prompt), 30, params, k=3, stop_token_ids=())
        finally:
            tracer.close()
        if len(got.tokens) != 30:
            raise AssertionError(f"{what}: expected exactly 30 new tokens, got {len(got.tokens)}; a round must never emit "
                                 "more than the tokens still allowed (draft fewer near the end)")
        tracer.check_prefixes(prompt + got.tokens, what)
        if params.greedy:
            want = generate_kv_cache(tiny_target, prompt, 30, stop_token_ids=())
            if got.tokens != want.tokens:
                raise AssertionError(f"{what}: greedy output differs from the target's greedy output")
        if tracer.calls["target"] >= 30:
            raise AssertionError(f"{what}: the target model was called {tracer.calls['target']} times for 30 tokens; it "
                                 "should verify all k drafts of a round in ONE forward call over k + 1 positions")
    # 3. The bonus token: a draft identical to the target has every draft accepted, so each round emits k + 1.
    twin = copy.deepcopy(tiny_target)
    for params in (SamplingParams(), SamplingParams(temperature=0.8, seed=1)):
        k, n = 3, 24
        what = f"draft identical to the target (every draft accepted), {n} new tokens, k={k}, {params}"
        tracer = _CacheTracer({"target": tiny_target})
        try:
            got = _gen(generate_fn, what, tiny_target, twin, [3, 1, 4], n, params, k=k, stop_token_ids=())
        finally:
            tracer.close()
        rounds = math.ceil(n / (k + 1))
        if tracer.calls["target"] != rounds:
            hint = (" Looks like no bonus token: when all k drafts are accepted, also emit a token from the target's "
                    "distribution at position k + 1 (already computed by the verify pass)."
                    if tracer.calls["target"] == math.ceil(n / k) else "")
            raise AssertionError(f"{what}: each round should emit k + 1 = {k + 1} tokens, so the target should run {rounds} "
                                 f"times; it ran {tracer.calls['target']} times.{hint}")
    # 4. A stop token ends generation like the target would.
    prompt = [5, 9, 2, 7, 1]
    ref = generate_kv_cache(tiny_target, prompt, 30, stop_token_ids=())
    stop = ref.tokens[6]
    want = generate_kv_cache(tiny_target, prompt, 30, stop_token_ids=(stop,))
    got = _gen(generate_fn, "stop token", tiny_target, tiny_draft, list(prompt), 30, SamplingParams(), k=3,
               stop_token_ids=(stop,))
    if (got.tokens, got.finish_reason) != (want.tokens, want.finish_reason):
        raise AssertionError(f"greedy with stop_token_ids=({stop},): expected {want.tokens} ({want.finish_reason!r}), got "
                             f"{got.tokens} ({got.finish_reason!r}); feed every emitted token to minigpt.generate.StopRule "
                             "and stop at the first one that ends generation")
    # 5. The same seed twice gives the same tokens; another seed other tokens.
    params = SamplingParams(temperature=1.0, seed=7)
    runs = [_gen(generate_fn, f"sampling with {p}", tiny_target, tiny_draft, [5, 9, 2, 7, 1], 20, p, k=3,
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
        if not res.p_value >= SIGNIFICANCE:
            raise AssertionError(
                f"sampling with {TOY_SAMPLING}: the {what} do not follow the target's distribution ({_chi2_report(res, what)}, "
                f"below the significance {SIGNIFICANCE}). Apply the same temperature / top-k / top-p to the draft's logits "
                "(the q in min(1, p/q) must be the distribution the draft token was drawn from) and to the target's; "
                "verify draft i with the target logits at the position that predicts it; draw the bonus token from the "
                "target's distribution after the last draft.")


# ---------------------------------------------------------------------------------------------------
# Exercise 5: prompt lookup
# ---------------------------------------------------------------------------------------------------

_NGRAM_CASES: list[tuple[list[int], int, int, str]] = [
    ([1, 2, 3, 4, 1, 2], 2, 3, "the last 2 tokens [1, 2] occurred at the start, followed by 3, 4"),
    ([7, 1, 2, 9, 1, 2, 5, 5, 1, 2], 3, 3, "[1, 2] occurs twice earlier: copy after the MOST RECENT one"),
    ([4, 5, 6, 8, 5, 6, 7, 9, 4, 5, 6], 3, 3, "the longest match wins: [4, 5, 6] (n = 3) over [5, 6] (n = 2)"),
    ([1, 2, 3], 4, 3, "no earlier occurrence of any suffix: no proposal"),
    ([3, 3, 3, 3], 4, 3, "repeats: the continuation may overlap the suffix"),
    ([9, 8, 7, 1, 8, 7], 5, 3, "copy at most what follows, here 2 tokens, even if k is larger"),
    ([5, 1, 5], 2, 3, "a single-token match (n = 1)"),
    ([1, 2, 1, 2, 1, 2], 0, 3, "k = 0: nothing to propose"),
]


def check_ngram_propose(propose_fn: Callable) -> None:
    """propose_fn(context, k, max_n=3) -> up to k tokens that followed the most recent earlier occurrence of the
    longest suffix (n = max_n down to 1) of the context."""
    what = "Exercise 5 (ngram_propose)"
    own_work(propose_fn, ngram_propose, what=what)
    propose_fn = _watched(propose_fn, (ngram_propose,), what)
    for context, k, max_n, why in _NGRAM_CASES:
        got = call_learner(f"ngram_propose({context}, k={k}, max_n={max_n})", propose_fn, list(context), k, max_n)
        want = ngram_propose(context, k, max_n)
        got = [int(t) for t in got] if got is not None else got
        if got != want:
            raise AssertionError(f"ngram_propose({context}, k={k}, max_n={max_n}) should return {want} ({why}), got {got}")


# ---------------------------------------------------------------------------------------------------
# Exercise 6: acceptance statistics
# ---------------------------------------------------------------------------------------------------

def check_acceptance_stats(rate_fn: Callable, tokens_fn: Callable) -> None:
    """rate_fn(p, q) -> (...) acceptance probability sum_x min(p, q); tokens_fn(alpha, k) -> (1 - a^(k+1)) / (1 - a)."""
    what = "Exercise 6 (acceptance_rate, expected_tokens_per_round)"
    own_work(rate_fn, acceptance_rate, what=what)
    own_work(tokens_fn, expected_tokens_per_round, what=what)
    rate_fn = _watched(rate_fn, (acceptance_rate, expected_tokens_per_round), what)
    tokens_fn = _watched(tokens_fn, (acceptance_rate, expected_tokens_per_round), what)
    g = torch.Generator().manual_seed(9)
    p = torch.softmax(torch.randn(5, 11, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(5, 11, generator=g) * 2, -1)
    got = call_learner("acceptance_rate(p, q)", rate_fn, p.clone(), q.clone())
    want = acceptance_rate(p, q)
    got_t = torch.as_tensor(got, dtype=torch.float32)
    if got_t.shape != want.shape or not torch.allclose(got_t, want, atol=1e-5):
        hint = ""
        if got_t.shape == want.shape and torch.allclose(got_t, torch.ones_like(want), atol=1e-4):
            hint = " You get 1: that is E_q[p/q] without the clip; the acceptance probability is E_q[min(1, p/q)]."
        raise AssertionError(f"acceptance_rate on 5 random (p, q) pairs over 11 tokens: expected {want.tolist()}, got "
                             f"{got_t.tolist() if got_t.numel() < 20 else got_t.shape}.{hint}")
    for alpha, k in [(0.0, 3), (0.5, 1), (0.62, 3), (0.8, 4), (0.95, 8), (1.0, 5)]:
        got = call_learner(f"expected_tokens_per_round({alpha}, {k})", tokens_fn, alpha, k)
        check_answer(got, expected_tokens_per_round(alpha, k), f"expected_tokens_per_round({alpha}, {k})",
                     {expected_tokens_per_round(alpha, k) - 1: "that is the accepted drafts only; a round also emits one "
                                                              "token of its own (resampled or bonus).",
                      expected_tokens_per_round(alpha, k - 1) if k else -1: "off by one: the sum runs over i = 0..k "
                                                                           "(k + 1 terms)."},
                     unit="tokens", rel=1e-6, reveal=True,
                     hint="A round emits 1 + (number of leading accepted drafts): sum_{i=0..k} a^i; at a = 1 that is k + 1.")


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


# ---------------------------------------------------------------------------------------------------
# Interview questions
# ---------------------------------------------------------------------------------------------------

Q1_P = [0.5, 0.3, 0.2, 0.0]
Q1_Q = [0.1, 0.6, 0.2, 0.1]


def check_q1_acceptance(answer: Any) -> None:
    """p = Q1_P, q = Q1_Q: probability that the drafted token is accepted."""
    expected = sum(min(a, b) for a, b in zip(Q1_P, Q1_Q))
    check_answer(answer, expected, "Q1 (acceptance probability)",
                 {1.0: "E_q[p/q] without the clip is always 1; the acceptance probability of token x is min(1, p(x)/q(x)).",
                  sum(min(1, a / b) for a, b in zip(Q1_P, Q1_Q)) / 4: "that is the plain average of min(1, p/q) over the "
                                                                     "tokens; weight each token by q(x), the chance it is drafted.",
                  sum(max(0.0, a - b) for a, b in zip(Q1_P, Q1_Q)): "that is the rejection probability sum max(0, p - q)."},
                 unit="probability", rel=1e-6,
                 hint="P(accept) = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x)).")


def check_q2_tokens_per_round(answer: Any) -> None:
    """alpha = 0.8, k = 4: expected tokens per round."""
    a, k = 0.8, 4
    check_answer(answer, expected_tokens_per_round(a, k), "Q2 (expected tokens per round)",
                 {expected_tokens_per_round(a, k) - 1: "that counts the accepted drafts only; every round also emits the "
                                                       "resampled or bonus token.",
                  expected_tokens_per_round(a, k - 1): "off by one: sum a^i for i = 0..k has k + 1 terms.",
                  a * k + 1: "the drafts are accepted only while no earlier one was rejected: not a * k."},
                 unit="tokens", rel=1e-4, hint="E = sum_{i=0..k} a^i = (1 - a^(k+1)) / (1 - a).")


Q3 = {"k": 3, "target_step_ms": 10.0, "draft_step_ms": 2.0, "verify_ms": 12.0}


def check_q3_break_even_alpha(answer: Any) -> None:
    """k = 3, target decode step 10 ms, draft step 2 ms, target verify of 4 positions 12 ms: the acceptance rate
    below which speculation is slower than plain decoding."""
    expected = break_even_alpha(Q3["k"], target_step_s=Q3["target_step_ms"], draft_step_s=Q3["draft_step_ms"],
                                verify_s=Q3["verify_ms"])
    check_answer(answer, expected, "Q3 (break-even acceptance rate)",
                 {break_even_alpha(3, target_step_s=10.0, draft_step_s=0.0, verify_s=12.0):
                      "you left out the 3 draft steps of each round.",
                  break_even_alpha(3, target_step_s=10.0, draft_step_s=2.0, verify_s=10.0):
                      "the verify pass costs 12 ms here, not one decode step."},
                 unit="probability", rel=2e-3,
                 hint="Speculation pays when E[tokens/round] * t_target > k t_draft + t_verify; solve "
                      "(1 - a^(k+1)) / (1 - a) = (k t_draft + t_verify) / t_target for a (bisection is fine).")


Q4 = {"alpha": 0.8, "k": 4, "memory_ms": 10.0, "per_token_ms": 0.05}


def check_q4_break_even_batch(answer: Any) -> None:
    """Roofline step time t(n) = max(10 ms, n * 0.05 ms) for n token positions; prompt lookup (free drafts),
    alpha = 0.8, k = 4: the smallest batch at which speculation is slower than plain decoding."""
    expected = break_even_batch(Q4["alpha"], Q4["k"], memory_s=Q4["memory_ms"], per_token_s=Q4["per_token_ms"])
    check_answer(answer, expected, "Q4 (break-even batch size)",
                 {200: "that is where plain decode becomes compute-bound; speculation already lost before, once the "
                       "verify pass over B (k + 1) positions costs more than E plain steps.",
                  40: "that is where the verify pass of B (k + 1) positions leaves the memory-bound regime; the speedup "
                      "is still E there, it drops below 1 later.",
                  expected - 1: "off by one: at that batch the speedup is still >= 1; give the first batch where it is < 1."},
                 unit="sequences",
                 hint="speedup(B) = E * t(B) / t(B (k + 1)); find the first integer B with speedup < 1.")
