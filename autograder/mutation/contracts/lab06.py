"""Lab 06 (speculative decoding): the exercises' contracts for the differential tests (equivalence.py).

ex1 truncate_cache, ex2 sampling_probs, ex3 verify_draft, ex4 generate_speculative, ex5 ngram_propose; part two:
ex7 draft_chain, ex8 tree_attention_inputs, ex9 verify_tree, ex10 keep_path. Random
draws are compared with the same seed on both sides (a seeded torch.Generator, SamplingParams.seed), so a mutant
that draws differently, or consumes a draw the solution does not, is told apart on the tokens.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
from types import FunctionType
from typing import Any

import torch
from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised, call_with

_INF = float("inf")


# ---------------------------------------------------------------------------------------------------
# Exercise 1: truncate_cache(cache, length) -> None; ValueError, changing nothing, unless length is an int (not a
# bool) in [0, cache.length]
# ---------------------------------------------------------------------------------------------------

def _cache(layers: int, capacity: int, filled: int, seed: int):
    from minigpt.cache.contiguous import KVCache, LayerKVCache

    g = torch.Generator().manual_seed(seed)
    cache = KVCache([LayerKVCache(1, capacity, 1, 2) for _ in range(layers)])
    for layer in cache:
        layer.update(torch.randn(1, filled, 1, 2, generator=g), torch.randn(1, filled, 1, 2, generator=g))
    return cache


@st.composite
def _truncations(draw):
    layers, capacity = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    filled = draw(st.integers(0, capacity))
    length = draw(st.one_of(st.integers(-2, capacity + 2), st.booleans(), st.sampled_from([0.0, 1.0, float(filled)]),
                            st.none(), st.just(str(filled))))
    return layers, capacity, filled, draw(st.integers(0, 99)), length


def _run_truncate(fn, value):
    layers, capacity, filled, seed, length = value
    cache = _cache(layers, capacity, filled, seed)
    out = call_with(fn, (cache, length))
    # what the cache holds afterwards: every layer's length and buffers (a rejected call changes nothing)
    return out, [(layer.length, layer.k.clone(), layer.v.clone()) for layer in cache]


EX1 = Contract("truncate_cache", lambda ns: _truncations(), run=_run_truncate,
               corners=lambda ns: [(2, 4, 3, 0, 0), (2, 4, 3, 0, 3), (2, 4, 3, 0, 4), (2, 4, 3, 0, -1),
                                   (2, 4, 3, 0, True), (2, 4, 3, 0, False), (2, 4, 3, 0, 1.0), (1, 1, 0, 0, 0),
                                   (1, 1, 0, 0, 1)])


# ---------------------------------------------------------------------------------------------------
# Exercise 2: sampling_probs(logits (..., V), sampling) -> float32 (..., V): one-hot argmax when greedy, else
# softmax(filter_logits(logits / T, top_k, top_p)). Logits of any leading shape (1-D, 2-D, 3-D), float32 / float16 /
# bfloat16 (a model's output) / float64, on any device (meta stands for "not the CPU").
# ---------------------------------------------------------------------------------------------------

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@st.composite
def _sampling(draw, vocab: int):
    from minigpt.sampling import SamplingParams

    if draw(st.booleans()):
        return SamplingParams()
    return SamplingParams(temperature=draw(st.sampled_from([0.05, 0.6, 1.0, 1.5, 3.0])),
                          top_k=draw(st.one_of(st.none(), st.integers(1, vocab + 2))),
                          top_p=draw(st.one_of(st.none(), st.sampled_from([0.05, 0.5, 0.9, 1.0]))),
                          seed=draw(st.integers(0, 9)))


@st.composite
def _logits(draw):
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    vocab = draw(st.integers(1, 12))
    n = math.prod(lead) * vocab
    scale = draw(st.sampled_from([0.5, 3.0, 30.0]))
    if draw(st.booleans()):         # ties (integer logits): the argmax's first index
        values = draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n))
    else:
        values = draw(st.lists(st.floats(-1, 1, allow_nan=False), min_size=n, max_size=n))
    logits = (torch.tensor(values, dtype=torch.float64) * scale).reshape(*lead, vocab)
    logits = logits.to(draw(st.sampled_from(_FLOATS)))
    return logits, draw(_sampling(vocab))


def _probs_corners(ns):
    from minigpt.sampling import SamplingParams

    g = torch.Generator().manual_seed(3)
    base = torch.randn(2, 3, 50, generator=g) * 3
    cases = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=10),
             SamplingParams(temperature=0.9, top_k=10, top_p=0.9), SamplingParams(temperature=0.8, top_p=0.7)]
    out = []
    for s in cases:
        out += [(base[0, 0].clone(), s), (base[0].clone(), s), (base.clone(), s), (base.bfloat16(), s),
                (base.half(), s), (base.to("meta"), s), (base[0].to("meta"), s)]
    return out + [(torch.zeros(1), SamplingParams()), (torch.zeros(2, 1), SamplingParams(temperature=1.0, top_k=1))]


EX2 = Contract("sampling_probs", lambda ns: _logits(), corners=_probs_corners)


# ---------------------------------------------------------------------------------------------------
# Exercise 3: verify_draft(draft_tokens (k), q (k, V), p (k + 1, V), generator) -> (emitted, accept_probs (k,)).
# q and p are float32 distributions as sampling_probs makes them: softmax of logits far apart (probabilities down to
# 1e-30 and below, exact zeros where top-k / top-p / greedy cut a token); each t_i is a token q_i can draw (q_i(t) > 0).
# Every random number comes from `generator`: both sides get one seeded alike.
# ---------------------------------------------------------------------------------------------------

@st.composite
def _distribution(draw, vocab: int):
    logits = draw(st.lists(st.one_of(st.floats(-80, 10, allow_nan=False), st.just(-_INF)), min_size=vocab,
                           max_size=vocab))
    if all(x == -_INF for x in logits):
        logits[draw(st.integers(0, vocab - 1))] = 0.0
    return torch.softmax(torch.tensor(logits, dtype=torch.float32), -1)


@st.composite
def _verifications(draw):
    k, vocab = draw(st.integers(0, 4)), draw(st.integers(1, 6))
    q = [draw(_distribution(vocab)) for _ in range(k)]
    p = [draw(_distribution(vocab)) for _ in range(k + 1)]
    if k and draw(st.booleans()):            # drafts often agree with the target: some rows of p equal to q's
        p = [q[i].clone() if i < k and draw(st.booleans()) else row for i, row in enumerate(p)]
    tokens = [draw(st.sampled_from(torch.nonzero(row > 0).flatten().tolist())) for row in q]
    q_t = torch.stack(q) if q else torch.zeros(0, vocab)
    return tokens, q_t, torch.stack(p), draw(st.integers(0, 2**32 - 1))


def _run_verify(fn, value):
    tokens, q, p, seed = value
    return call_with(fn, (list(tokens), q, p, torch.Generator().manual_seed(seed)))


def _verify_corners(ns):
    soft = lambda *rows: torch.softmax(torch.tensor(rows, dtype=torch.float32), -1)   # noqa: E731
    out = []
    # u == min(1, p/q) exactly: "accept if u < it" rejects (torch.rand's first draw of seed s is u; p(t) = u q(t))
    for seed in (0, 1, 2):
        u = float(torch.rand(1, generator=torch.Generator().manual_seed(seed))[0])
        q = torch.tensor([[0.5, 0.5]])
        p = torch.tensor([[u * 0.5, 1 - u * 0.5], [0.25, 0.75]])
        out.append(([0], q, p, seed))
    # the residual max(0, p - q) is exactly 0 at a rejection: float32 rounding (q(1) = 2e-9 next to a 1.0), p(t) = 0
    out.append(([1], soft([0.0, -20.0]), soft([0.0, -_INF], [0.0, 0.0]), 0))
    out.append(([1, 0], soft([0.0, -20.0], [0.0, 0.0]), soft([0.0, -_INF], [0.0, 0.0], [0.0, 0.0]), 5))
    # a residual whose whole mass is tiny (1e-30): normalised it is one-hot on token 3
    q = soft([0.0, 0.0, -69.0, -_INF])
    p = soft([0.0, 0.0, -_INF, -69.0], [0.0, 0.0, 0.0, 0.0])
    out.append(([2], q, p, 0))
    # greedy (one-hot rows), k = 0, k = 1, every draft accepted
    eye = torch.eye(5)
    out += [([1, 2, 3], eye[[1, 2, 3]], eye[[1, 4, 0, 0]], 0), ([], torch.zeros(0, 5), eye[[3]], 0),
            ([], torch.zeros(0, 8), torch.full((1, 8), 1 / 8), 11), ([0], torch.tensor([[0.8, 0.2]]),
                                                                     torch.tensor([[0.4, 0.6], [0.5, 0.5]]), 7)]
    probs = soft([0.1, 0.2, 0.3], [1.0, 0.0, 0.0], [0.0, 0.0, 2.0])
    out.append(([2, 0], probs[:2].clone(), probs.clone(), 3))
    return out


EX3 = Contract("verify_draft", lambda ns: _verifications(), run=_run_verify,
               corners=_verify_corners)


# ---------------------------------------------------------------------------------------------------
# Exercise 4: generate_speculative(target, draft, prompt, max_new_tokens, sampling, *, k, stop_token_ids,
# stop_strings, tokenizer) -> Generation. Graded like its check: the loop alone, with the package's truncate_cache and
# sampling_probs, and the package's verify_draft held to the interface exercise 3 states for every k, 0 included
# (q (k, V), p (k + 1, V): a correct verify_draft may index q even when k = 0). Compared: the Generation and every
# forward each model is given (the tokens fed, their positions, the cache's length), i.e. what the models see.
# Models: the bigram toy pair (V = 6), the check's tiny random GPT pair, a draft identical to the target (every draft
# accepted), the trained pair, a target or draft whose context is far longer than the request (a long-context model:
# lab 01's cache is sized for prompt + new tokens, not for the model's whole context), and a pair on the meta device
# (not the CPU: the generator belongs on the model's device, make_generator(sampling, target.device)).
# ---------------------------------------------------------------------------------------------------

_LONG = 2 ** 40         # a context no cache of that many positions fits in memory (the allocation fails at once)


def _strict_verify_draft(draft_tokens, q, p, generator=None):
    from minigpt.engine.speculative import verify_draft

    k = len(draft_tokens)
    if p.ndim != 2 or p.shape[0] != k + 1 or tuple(q.shape) != (k, p.shape[1]):
        raise ValueError(f"verify_draft: {k} draft tokens need q of shape ({k}, V) and p of shape ({k + 1}, V); "
                         f"got q {tuple(q.shape)}, p {tuple(p.shape)}")
    return verify_draft(draft_tokens, q, p, generator)


def _graded_alone(fn):
    """fn rebuilt over a copy of its globals with the package's pieces (as common.with_reference_pieces)."""
    from minigpt.cache.rollback import truncate_cache
    from minigpt.engine.speculative import sampling_probs

    inner = inspect.unwrap(fn)
    if not isinstance(inner, FunctionType):
        return fn
    names = dict(inner.__globals__)
    names.update(truncate_cache=truncate_cache, sampling_probs=sampling_probs, verify_draft=_strict_verify_draft)
    rebuilt = FunctionType(inner.__code__, names, inner.__name__, inner.__defaults__, inner.__closure__)
    rebuilt.__kwdefaults__ = inner.__kwdefaults__
    return rebuilt


def _long_context(model):
    from minigpt.model import GPT

    with torch.random.fork_rng(devices=[]):         # its own initial draws leave the global RNG as it was
        long = GPT(dataclasses.replace(model.config, max_seq_len=_LONG)).eval()
    long.load_state_dict(model.state_dict())
    return long


def _models(kind: str, seed: int, trained: Any = None):
    from autograder.lab06 import _tiny_pair, toy_pair

    if kind == "toy":
        return toy_pair(seed)
    if kind == "trained":
        return trained                       # the input's own copy (the differential test copies every input)
    target, draft = _tiny_pair(seed)
    if kind == "twin":
        return target, copy.deepcopy(target)
    if kind == "long_target":
        return _long_context(target), draft
    if kind == "long_draft":
        return target, _long_context(draft)
    if kind == "long_both":
        return _long_context(target), _long_context(draft)
    if kind == "meta":
        return target.to("meta"), draft.to("meta")
    return target, draft


def _run_generate(fn, value):
    from autograder.checking.models import LetterTokenizer
    from autograder.lab06.common import watch_forward

    kind, seed, prompt, n, sampling, k, stops, stop_strings, trained = value
    target, draft = _models(kind, seed, trained)
    seen: list[tuple] = []

    def hook(name):
        def record(args, kwargs):
            tokens = args[0] if args else kwargs.get("tokens")
            positions = args[1] if len(args) > 1 else kwargs.get("positions")
            caches = args[2] if len(args) > 2 else kwargs.get("kv_caches")
            seen.append((name, tuple(tokens.shape), tokens.tolist() if tokens.device.type != "meta" else None,
                         None if positions is None or positions.device.type == "meta" else positions.tolist(),
                         None if caches is None else caches[0].length))
        return record

    stops_watch = [watch_forward(target, hook("target")), watch_forward(draft, hook("draft"))]
    try:
        kwargs = dict(k=k, stop_token_ids=stops)
        if stop_strings:
            kwargs.update(stop_strings=stop_strings, tokenizer=LetterTokenizer())
        with torch.inference_mode():
            out = call_with(_graded_alone(fn), ((target, draft, list(prompt), n, sampling), kwargs))
    finally:
        for stop in reversed(stops_watch):
            stop()
    if not isinstance(out, Raised):
        out = (type(out).__name__, list(out.tokens), out.finish_reason, out.prompt_tokens)
    return out, seen


@st.composite
def _generations(draw):
    from minigpt.sampling import SamplingParams

    kind = draw(st.sampled_from(["toy", "tiny", "tiny", "twin"]))
    seed = draw(st.integers(0, 2))
    vocab = 6 if kind == "toy" else 48
    prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=6))
    n = draw(st.integers(0, 12))
    if draw(st.booleans()):
        sampling = SamplingParams()
    else:
        sampling = SamplingParams(temperature=draw(st.sampled_from([0.7, 1.0, 3.0])),
                                  top_k=draw(st.sampled_from([None, 1, 3])), top_p=draw(st.sampled_from([None, 0.9])),
                                  seed=draw(st.integers(0, 10**6)))
    k = draw(st.integers(0, 5))
    stops = tuple(draw(st.lists(st.integers(0, vocab - 1), max_size=1)))
    stop_strings = tuple(draw(st.lists(st.sampled_from(["a", "bc", "ab", "zz"]), max_size=1)))
    return kind, seed, prompt, n, sampling, k, stops, stop_strings, None


def _generate_corners(ns):
    from minigpt.sampling import SamplingParams

    greedy, hot = SamplingParams(), SamplingParams(temperature=1.0, seed=3)
    trained = (ns["target"], ns["draft"])
    out = []
    for n in (0, 1, 2, 5):
        for s in (greedy, hot):
            out.append(("tiny", 0, [5, 9, 2, 7, 1], n, s, 3, (), (), None))
            out.append(("meta", 0, [5, 9, 2], n, s, 3, (), (), None))
    for kind in ("long_target", "long_draft", "long_both"):
        out += [(kind, 0, [5, 9, 2, 7, 1], 6, greedy, 3, (), (), None), (kind, 0, [5, 9, 2], 4, hot, 2, (), (), None)]
    out += [("tiny", 0, [5, 9, 2, 7, 1], 30, greedy, 3, (), (), None),
            ("tiny", 0, [5, 9, 2, 7, 1], 30, hot, 3, (), (), None),
            ("tiny", 1, [5, 9, 2, 7, 1], 12, greedy, 0, (), (), None),
            ("tiny", 1, [5, 9, 2, 7, 1], 12, greedy, 1, (), (), None),
            ("twin", 0, [3, 1, 4], 24, greedy, 3, (), (), None),
            ("twin", 0, [3, 1, 4], 24, SamplingParams(temperature=0.8, seed=1), 3, (), (), None),
            ("toy", 0, [1, 4, 2], 3, SamplingParams(temperature=3.0, top_k=3, seed=11), 2, (), (), None),
            ("tiny", 0, [5, 9, 2, 7, 1], 30, greedy, 3, (), ("ab",), None),
            ("trained", 0, [17, 300, 41, 9], 8, greedy, 3, (), (), trained),
            ("trained", 0, [17, 300, 41, 9], 8, SamplingParams(temperature=0.8, top_p=0.9, seed=5), 4, (), (), trained)]
    return out


EX4 = Contract("generate_speculative", lambda ns: _generations(), run=_run_generate,
               corners=_generate_corners, examples=40)


# ---------------------------------------------------------------------------------------------------
# Exercise 5: ngram_propose(context, k, max_n=3) -> up to k tokens after the most recent earlier occurrence of the
# longest suffix (n = max_n .. 1); [] when none or k == 0.
# ---------------------------------------------------------------------------------------------------

@st.composite
def _proposals(draw):
    context = draw(st.lists(st.integers(0, draw(st.integers(0, 3))), max_size=12))
    if draw(st.booleans()):
        context = tuple(context)
    return context, draw(st.integers(0, 6)), draw(st.integers(1, 5))


EX5 = Contract("ngram_propose", lambda ns: _proposals(),
               corners=lambda ns: [([5, 5], 1, 3), ([5, 5], 3, 3), ([], 2, 3), ([7], 2, 3), ([3, 3, 3], 2, 3),
                                   ([3, 3, 3, 3], 4, 3), ([1, 2, 1, 2], 2, 1), ([1, 2, 3, 4, 1, 2], 2, 3),
                                   ([5, 1, 5], 2, 3), ([1, 2, 1, 2, 1, 2], 0, 3), ([4, 4], 2, 1)])


# ---------------------------------------------------------------------------------------------------
# Exercise 6: acceptance_rate(p, q) (..., V) -> (...) = sum over the last axis of min(p, q); expected_tokens_per_round(
# alpha, k) = (1 - alpha^(k+1)) / (1 - alpha), k + 1 at alpha = 1. The cell defines both: the subject is
# acceptance_rate, expected_tokens_per_round is read from the same cell's namespace.
# ---------------------------------------------------------------------------------------------------

@st.composite
def _acceptance(draw):
    if draw(st.booleans()):
        return "tokens", draw(st.one_of(st.floats(0, 1), st.sampled_from([0.0, 0.5, 1.0]))), draw(st.integers(0, 10))
    lead, vocab = draw(st.lists(st.integers(1, 3), max_size=2)), draw(st.integers(1, 8))
    dtype, device = draw(st.sampled_from(_FLOATS[:3])), draw(st.sampled_from(["cpu", "cpu", "meta"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    p, q = (torch.softmax(torch.randn(*lead, vocab, generator=g) * 2, -1).to(dtype).to(device) for _ in range(2))
    return "rate", p, q


def _run_acceptance(rate_fn, value):
    if value[0] == "tokens":
        return call_with(rate_fn.__globals__["expected_tokens_per_round"], value[1:])
    return call_with(rate_fn, value[1:])


EX6 = Contract("acceptance_rate", lambda ns: _acceptance(), run=_run_acceptance,
               corners=lambda ns: [("tokens", a, k) for a in (0.0, 0.5, 0.62, 1.0) for k in (0, 1, 3)]
               + [("rate", torch.eye(3), torch.eye(3)[[1, 2, 0]]), ("rate", torch.full((4,), 0.25), torch.eye(4)[0])])


# ---------------------------------------------------------------------------------------------------
# Exercise 7: draft_chain(head, target, cache, features, tokens, k) -> k greedy drafts; the head's cache after
# ---------------------------------------------------------------------------------------------------

@st.composite
def _chains(draw):
    length = draw(st.integers(2, 12))
    read = draw(st.integers(1, length - 1))
    return draw(st.integers(0, 2 ** 20)), length, read, draw(st.integers(0, 5))


def _run_chain(fn, value):
    from autograder.lab06.head_chain import tiny_target_and_head
    from minigpt.engine.draft_head import head_cache, target_features

    seed, length, read, k = value
    target, head = tiny_target_and_head(seed)
    prompt = torch.randint(0, target.config.vocab_size, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    before = length - 1 - read
    with torch.inference_mode():
        f, _ = target_features(target, torch.tensor([prompt]))
        cache = head_cache(head, 32)
        if before:
            head(f[:, :before], torch.tensor([prompt[1:1 + before]]), target, torch.arange(1, 1 + before), cache)
    out = call_with(fn, (head, target, cache, f[0, before:length - 1].clone(), list(prompt[1 + before:]), k))
    return out[0], cache.length, cache[0].k[:, :cache.length].clone()


EX7 = Contract("draft_chain", lambda ns: _chains(), run=_run_chain,
               corners=lambda ns: [(0, 2, 1, 0), (0, 2, 1, 1), (1, 9, 3, 4), (2, 12, 1, 5), (3, 6, 5, 3)], examples=30)


# ---------------------------------------------------------------------------------------------------
# Exercise 8: tree_attention_inputs(parents, past_len) -> (mask, positions); ValueError for what is not a tree
# ---------------------------------------------------------------------------------------------------

@st.composite
def _trees(draw, n_max: int = 10):
    n = draw(st.integers(1, n_max))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]


@st.composite
def _tree_inputs(draw):
    parents = draw(_trees())
    if draw(st.integers(0, 9)) == 0:            # sometimes not a tree
        parents = draw(st.sampled_from([[0], [], [-1, 1], [-1, 0, 3], [-1, -1], [0, 0]]))
    return parents, draw(st.integers(0, 6))


EX8 = Contract("tree_attention_inputs", lambda ns: _tree_inputs(),
               corners=lambda ns: [([-1], 0), ([-1], 3), ([-1, 0, 1, 2], 0), ([-1, 0, 0, 1, 2, 2], 2), ([-1, 0, 0, 0], 1),
                                   ([0, 0], 0), ([-1, 1], 0), ([-1, 0, 3, 0], 0), ([], 0)])


# ---------------------------------------------------------------------------------------------------
# Exercise 9: verify_tree(tokens, parents, p, q, *, greedy, generator) -> (path, emitted), same seed both sides
# ---------------------------------------------------------------------------------------------------

@st.composite
def _tree_verifications(draw):
    parents = draw(_trees(8))
    n, vocab = len(parents), draw(st.integers(2, 5))
    q = torch.stack([draw(_distribution(vocab)) for _ in range(n)])
    p = torch.stack([draw(_distribution(vocab)) for _ in range(n)])
    if draw(st.booleans()):                  # drafts that often agree with the target
        p = torch.where(torch.tensor([draw(st.booleans()) for _ in range(n)])[:, None], q, p)
    greedy = draw(st.booleans())
    tokens = [0] * n
    for i in range(1, n):
        row = p[parents[i]] if greedy and draw(st.booleans()) else q[parents[i]]
        tokens[i] = draw(st.sampled_from(torch.nonzero(row > 0).flatten().tolist()))
    return tokens, parents, p, q, greedy, draw(st.integers(0, 2 ** 32 - 1))


def _run_tree_verify(fn, value):
    tokens, parents, p, q, greedy, seed = value
    return call_with(fn, ((list(tokens), list(parents), p, q), {"greedy": greedy,
                                                                "generator": torch.Generator().manual_seed(seed)}))


def _tree_verify_corners(ns):
    one_hot = lambda *ids: torch.nn.functional.one_hot(torch.tensor(ids), 4).float()   # noqa: E731
    out = []
    # greedy: the argmax in the second sibling; an accepted leaf's bonus; no child holds it
    out.append(([0, 1, 2, 3], [-1, 0, 0, 2], one_hot(2, 0, 3, 1), one_hot(0, 0, 0, 0), True, 0))
    out.append(([0, 1, 2], [-1, 0, 0], one_hot(3, 0, 0), one_hot(0, 0, 0), True, 0))
    # sampled: a sibling rejected, then the next tried against the residual; q(t) = p(t) exactly
    soft = lambda *rows: torch.softmax(torch.tensor(rows, dtype=torch.float32), -1)   # noqa: E731
    for seed in (0, 1, 2, 3):
        out.append(([0, 1, 2, 0], [-1, 0, 0, 1], soft([0.0, 1.0, -1.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]),
                    soft([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]), False, seed))
    out.append(([0, 1], [-1, 0], soft([0.0, -_INF], [0.0, 0.0]), soft([0.0, -20.0], [0.0, 0.0]), False, 5))
    return out


EX9 = Contract("verify_tree", lambda ns: _tree_verifications(), run=_run_tree_verify, corners=_tree_verify_corners)


# ---------------------------------------------------------------------------------------------------
# Exercise 10: keep_path(cache, start, nodes): nodes' positions moved down, length set; ValueError changing nothing
# ---------------------------------------------------------------------------------------------------

@st.composite
def _paths(draw):
    layers, filled = draw(st.integers(1, 3), ), draw(st.integers(1, 8))
    start = draw(st.integers(0, filled - 1))
    nodes, node = [0], 0
    while node < filled - start - 1 and draw(st.booleans()):
        node = draw(st.integers(node + 1, filled - start - 1))
        nodes.append(node)
    if draw(st.integers(0, 7)) == 0:
        nodes = nodes + [filled - start + draw(st.integers(0, 2))]          # past the cache's end
    if draw(st.integers(0, 7)) == 0:
        nodes = []
    return layers, filled, draw(st.integers(0, 99)), start, nodes


def _run_keep(fn, value):
    layers, filled, seed, start, nodes = value
    cache = _cache(layers, 10, filled, seed)
    out = call_with(fn, (cache, start, list(nodes)))
    return out, [(layer.length, layer.k.clone(), layer.v.clone()) for layer in cache]


EX10 = Contract("keep_path", lambda ns: _paths(), run=_run_keep,
                corners=lambda ns: [(2, 8, 0, 3, [0, 2, 4]), (1, 4, 0, 0, [0, 1, 2, 3]), (2, 5, 0, 4, [0]),
                                    (2, 5, 0, 2, [0, 3]), (1, 3, 0, 1, []), (3, 8, 1, 1, [0, 1, 6])])


CONTRACTS = {"ex1_code": EX1, "ex2_code": EX2, "ex3_code": EX3, "ex4_code": EX4, "ex5_code": EX5, "ex6_code": EX6,
             "ex7_code": EX7, "ex8_code": EX8, "ex9_code": EX9, "ex10_code": EX10}
