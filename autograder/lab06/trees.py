"""Lab 06, exercises 8-10: token trees. The attention inputs of a tree (tree_attention_inputs), its verification
(verify_tree: greedy exact, sampled by a distribution test) and the cache kept for the accepted path (keep_path)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from autograder.harness import call_learner, expect_value_error, quiet
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.lab06.common import (SIGNIFICANCE, TOY_VOCAB, _chi2_report, _toy_tables, drawn_seeds,
                                     three_token_tests, where_it_runs)
from minigpt.cache.contiguous import KVCache
from minigpt.config import ModelConfig
from minigpt.engine.speculative import sampling_probs
from minigpt.engine.token_tree import check_parents, keep_path, tree_attention_inputs, tree_depths, verify_tree
from minigpt.sampling import SamplingParams
from minigpt.teaching.goodness_of_fit import ChiSquareResult

TREE_SAMPLES = 1500          # emulated sequences for check_verify_tree's distribution test
DOC_TREE = [-1, 0, 0, 1, 2, 2]          # the notebook's example


def drawn_tree(g: torch.Generator, n: int) -> list[int]:
    """parents of a random tree of n nodes: each node's parent drawn among the nodes before it."""
    return [-1] + [int(torch.randint(0, i, (), generator=g)) for i in range(1, n)]


# ---------------------------------------------------------------------------------------------------
# Exercise 8: the tree attention mask and positions
# ---------------------------------------------------------------------------------------------------

def check_tree_attention_inputs(fn: Callable) -> None:
    """fn(parents, past_len) -> (mask (N, past_len + N) bool, positions (N,) int64)."""
    what = "Exercise 8 (tree_attention_inputs)"
    own_work(fn, tree_attention_inputs, what=what)
    cases = _mask_cases(fn)                     # the expected answers, made before the learner's code runs
    with no_calls_into(tree_attention_inputs, tree_depths, what=what):
        _check_tree_attention_inputs(fn, what, cases)


def _mask_cases(fn: Callable) -> list[tuple[list[int], int, str, Tensor, Tensor]]:
    g = torch.Generator().manual_seed(next(drawn_seeds(fn)) % 2 ** 31)
    cases = [(DOC_TREE, 5, "the example tree after 5 cached positions"),
             ([-1, 0, 1, 2, 3], 0, "a chain of 5 nodes and no cache (it must be the causal mask)"),
             ([-1, 0, 0, 0, 0], 3, "a root with four children after 3 cached positions"),
             ([-1], 7, "a root alone after 7 cached positions")]
    cases += [(drawn_tree(g, int(torch.randint(2, 17, (), generator=g))), int(torch.randint(0, 20, (), generator=g)),
               "a drawn tree") for _ in range(6)]
    return [(parents, past, label, *tree_attention_inputs(parents, past)) for parents, past, label in cases]


def _check_tree_attention_inputs(fn: Callable, what: str, cases: list) -> None:
    for parents, past, label, want_mask, want_pos in cases:
        call = f"{what}: tree_attention_inputs({parents}, past_len={past}) ({label})"
        out = call_learner(call, fn, list(parents), past)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise AssertionError(f"{call}: return (mask, positions), got {type(out).__name__}")
        mask, positions = out
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != tuple(want_mask.shape):
            raise AssertionError(f"{call}: the mask must be a bool tensor of shape {tuple(want_mask.shape)} (one row per "
                                 f"node, one column per key: the cache, then the nodes), got "
                                 f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
        if not isinstance(positions, Tensor) or positions.dtype != torch.long or tuple(positions.shape) != tuple(want_pos.shape):
            raise AssertionError(f"{call}: positions must be an int64 tensor of shape {tuple(want_pos.shape)}, got "
                                 f"{getattr(positions, 'dtype', type(positions).__name__)} {tuple(getattr(positions, 'shape', ()))}")
        if not torch.equal(positions, want_pos):
            raise AssertionError(f"{call}: positions {positions.tolist()}, expected {want_pos.tolist()}: node i sits at "
                                 "past_len + depth(i) (siblings share a position), not at past_len + i")
        if not torch.equal(mask[:, :past], want_mask[:, :past]):
            raise AssertionError(f"{call}: every node must see every cached position (mask[:, :past_len] all True)")
        if not torch.equal(mask, want_mask):
            i, j = (mask != want_mask).nonzero()[0].tolist()
            node = j - past
            relation = ("itself" if node == i else "its ancestor" if _is_ancestor(parents, node, i) else
                        "not its ancestor (a sibling, a cousin or a later node)")
            raise AssertionError(f"{call}: mask[{i}, {j}] is {bool(mask[i, j])}: key {j} is node {node}, {relation} of "
                                 f"node {i}; a node sees exactly its ancestors and itself among the nodes")
    for bad, why in (([0, 0], "the root (node 0) must have parent -1"), ([-1, 1], "node 1 names itself as its parent"),
                     ([-1, 0, 3, 0], "node 2's parent comes after it")):
        expect_value_error(f"{what}: tree_attention_inputs({bad}, 0) ({why})", fn, bad, 0, naming=("parent",))


def _is_ancestor(parents: list[int], a: int, node: int) -> bool:
    while node > 0:
        node = parents[node]
        if node == a:
            return True
    return False


# ---------------------------------------------------------------------------------------------------
# Exercise 9: verifying a tree
# ---------------------------------------------------------------------------------------------------

def _toy_tree(P_or_Q: Tensor, start: int, g: torch.Generator, branch: int = 2, depth: int = 2) -> tuple[list[int], list[int]]:
    """A tree below token `start`: every node above `depth` gets `branch` children drawn independently from the draft
    table's row of its token."""
    tokens, parents, frontier = [start], [-1], [0]
    for _ in range(depth):
        nxt = []
        for node in frontier:
            for t in torch.multinomial(P_or_Q[tokens[node]], branch, replacement=True, generator=g).tolist():
                tokens.append(int(t))
                parents.append(node)
                nxt.append(len(tokens) - 1)
        frontier = nxt
    return tokens, parents


def tree_distribution_test(verify_fn: Callable, n: int = TREE_SAMPLES, seed: int = 0
                           ) -> tuple[ChiSquareResult, ChiSquareResult, ChiSquareResult]:
    """Emulate tree speculation on the bigram toy (a tree of depth 2, two children a node, drawn from the draft) with
    verify_fn as the verification, n times, and test the first emitted token, the first two, and the second and third
    against the target's exact distribution."""
    t_table, d_table = _toy_tables(seed)
    s = SamplingParams(temperature=1.0)
    P, Q = sampling_probs(t_table, s), sampling_probs(d_table, s)
    g = torch.Generator().manual_seed(2000 + seed)
    contexts = []
    for _ in range(n):
        context = [2]
        while len(context) < 4:
            tokens, parents = _toy_tree(Q, context[-1], g)
            idx = torch.tensor(tokens)
            q = Q[idx].clone()
            q[[i for i in range(len(tokens)) if i not in parents]] = 0.0        # leaves are never expanded
            out = _run(verify_fn, "Exercise 9 (verify_tree)", list(tokens), list(parents), P[idx], q, greedy=False,
                       generator=g)
            context += _path_and_tokens(out, tokens, parents, "Exercise 9 (verify_tree)")[1]
        contexts.append(context)
    return three_token_tests(contexts, t_table, s)


def _run(fn: Callable, what: str, *args: Any, **kwargs: Any) -> Any:
    try:
        with quiet():
            return fn(*args, **kwargs)
    except NotImplementedError:
        raise AssertionError(f"{what} is not implemented yet (NotImplementedError)") from None
    except AssertionError:
        raise
    except Exception as err:
        text = str(err)
        hint = (" At a rejection the residual is max(0, r - q), clipped at 0 and divided by its sum."
                if "probability tensor contains" in text or "invalid multinomial" in text else "")
        raise AssertionError(f"{what} raised {type(err).__name__}: {text[:300]}{hint}") from None


def _path_and_tokens(out: Any, tokens: list[int], parents: list[int], what: str) -> tuple[list[int], list[int]]:
    """(path, emitted) as ints, checked: the path goes down the tree from the root, the emitted tokens are its tokens
    and exactly one more."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise AssertionError(f"{what}: return (path, emitted), got {type(out).__name__}")
    try:
        path, emitted = [int(i) for i in out[0]], [int(t) for t in out[1]]
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError(f"{what}: path and emitted must be lists of ints, got {out!r:.200}") from None
    node = 0
    for i in path:
        if not 0 < i < len(parents) or parents[i] != node:
            raise AssertionError(f"{what}: path {path} does not go down the tree {parents} from the root: node {i} is not "
                                 f"a child of node {node}")
        node = i
    if len(emitted) != len(path) + 1 or emitted[:-1] != [tokens[i] for i in path]:
        raise AssertionError(f"{what}: emitted {emitted} must be the tokens of the accepted path "
                             f"{[tokens[i] for i in path]} followed by exactly one more token")
    return path, emitted


def check_verify_tree(fn: Callable) -> None:
    """fn(tokens, parents, p, q, greedy=..., generator=...) -> (path, emitted)."""
    what = "Exercise 9 (verify_tree)"
    own_work(fn, verify_tree, what=what)
    cases = _greedy_cases(fn)                   # the expected answers, made before the learner's code runs
    with no_calls_into(verify_tree, what=what):
        _check_verify_tree(fn, what, cases)


def _greedy_case(g: torch.Generator, parents: list[int], V: int, follow: int) -> tuple[list[int], Tensor]:
    """Tokens and target rows where the target's argmax goes down `follow` levels of the tree (through the last
    child of each node on the way, so that a walk that checks only the first child stops early)."""
    n = len(parents)
    logits = torch.randn(n, V, generator=g)
    tokens = [int(torch.randint(0, V, (), generator=g)) for _ in range(n)]
    kids: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        kids[parents[i]].append(i)
    for i in range(n):                          # siblings distinct, as greedy children are
        seen = set()
        for c in kids[i]:
            while tokens[c] in seen:
                tokens[c] = (tokens[c] + 1) % V
            seen.add(tokens[c])
    node = 0
    for _ in range(follow):
        if not kids[node]:
            break
        nxt = kids[node][-1]
        logits[node, tokens[nxt]] = logits[node].max() + 3.0
        node = nxt
    if kids[node]:                              # stop here: the argmax is no child's token
        best = int(logits[node].argmax())
        for c in kids[node]:
            if tokens[c] == best:
                logits[node, best] -= 10.0
    return tokens, torch.softmax(logits, -1)


def _greedy_cases(fn: Callable) -> list[tuple[list[int], list[int], Tensor, list[int], list[int]]]:
    g = torch.Generator().manual_seed(next(drawn_seeds(fn)) % 2 ** 31)
    V = 12
    shapes = [DOC_TREE, [-1, 0, 1, 2], [-1, 0, 0, 0], [-1, 0, 0, 1, 1, 2, 2, 3, 5]]
    shapes += [drawn_tree(g, int(torch.randint(3, 14, (), generator=g))) for _ in range(4)]
    cases = []
    for parents in shapes:
        for follow in range(0, 4):
            tokens, p = _greedy_case(g, parents, V, follow)
            cases.append((tokens, parents, p, *verify_tree(tokens, parents, p, greedy=True)))
    return cases


def _check_verify_tree(fn: Callable, what: str, cases: list) -> None:
    for tokens, parents, p, want_path, want in cases:
        if True:
            call = f"{what}: greedy, tree parents {parents}, tokens {tokens}"
            out = _run(fn, call, list(tokens), list(parents), p, None, greedy=True, generator=None)
            path, emitted = _path_and_tokens(out, tokens, parents, call)
            if path != want_path or emitted != want:
                raise AssertionError(f"{call}: got path {path} and tokens {emitted}, expected path {want_path} and tokens "
                                     f"{want} (the target's argmax after each accepted node picks the child to follow, "
                                     "whichever sibling holds it; where no child holds it, the argmax is emitted)")
    _check_sampled_corners(fn, what)
    results = tree_distribution_test(fn, seed=0)
    labels = ("the first emitted token", "the first two tokens", "the second and third tokens")
    for res, label in zip(results, labels):
        if res.p_value < SIGNIFICANCE:
            raise AssertionError(
                f"{what}: sampled verification does not keep the target's distribution; "
                + _chi2_report(res, label) + ". At each node try the children in order: accept child x with probability "
                "min(1, r(x) / q(x)), r starting as the target's p at the node; after a rejection r becomes "
                "max(0, r - q) normalised; when every child is rejected draw from r; at an accepted leaf draw from p")


def _check_sampled_corners(fn: Callable, what: str) -> None:
    """A residual that rounds to nothing is not divided by its zero sum; the same generator seed gives the same walk
    (the draws come from `generator`, not from torch's global generator, which the check moves between the calls)."""
    soft = lambda *rows: torch.softmax(torch.tensor(rows, dtype=torch.float32), -1)     # noqa: E731
    p, q = soft([0.0, -float("inf")], [0.0, 0.0]), soft([0.0, -20.0], [0.0, 0.0])      # q(1) = 2e-9: 1 - q(0) is 0
    call = f"{what}: sampled, p = [1, 0] at the root, q = [1 - 2e-9, 2e-9], the child drafted token 1"
    path, emitted = _path_and_tokens(_run(fn, call, [0, 1], [-1, 0], p, q, greedy=False,
                                          generator=torch.Generator().manual_seed(0)), [0, 1], [-1, 0], call)
    if emitted != [0]:
        raise AssertionError(f"{call}: emitted {emitted}; token 1 has target probability 0, so it is rejected and the "
                             "token drawn must be 0. max(0, r - q) rounds to all zeros here: where the residual sums to "
                             "0, keep r (a rejection had probability ~0)")
    g = torch.Generator().manual_seed(7)
    t_table, d_table = _toy_tables(3)
    s = SamplingParams(temperature=1.0)
    P, Q = sampling_probs(t_table, s), sampling_probs(d_table, s)
    for trial in range(12):
        tokens, parents = _toy_tree(Q, trial % TOY_VOCAB, g)
        idx = torch.tensor(tokens)
        outs = []
        with torch.random.fork_rng(devices=[]):         # the learner's global generator is left as it was
            for global_seed in (trial, trial + 1000):
                torch.manual_seed(global_seed)
                call = f"{what} (sampled, tree parents {parents})"
                out = _run(fn, call, list(tokens), list(parents), P[idx], Q[idx], greedy=False,
                           generator=torch.Generator().manual_seed(100 + trial))
                outs.append(_path_and_tokens(out, tokens, parents, call)[1])
        if outs[0] != outs[1]:
            raise AssertionError(f"{what}: the same generator seed gave two different walks of one tree "
                                 f"({outs[0]} and {outs[1]}): draw every uniform and the last token with "
                                 "generator=generator, not from torch's global generator")


# ---------------------------------------------------------------------------------------------------
# Exercise 10: keeping the accepted path in the cache
# ---------------------------------------------------------------------------------------------------

def check_keep_path(fn: Callable) -> None:
    """fn(cache, start, nodes): the positions start + nodes[j] moved to start + j, length start + len(nodes)."""
    what = "Exercise 10 (keep_path)"
    own_work(fn, keep_path, what=what)
    with no_calls_into(keep_path, what=what):
        _check_keep_path(fn, what)


KEEP_CONFIG = ModelConfig(vocab_size=32, max_seq_len=24, d_model=16, n_layers=3, n_heads=2, n_kv_heads=1, d_ff=32)


def filled_cache(seed: int, positions: int) -> KVCache:
    """A cache of KEEP_CONFIG's shape holding `positions` positions of seeded keys k and values 2k in every layer
    (the same on either side of the wire: the check builds one where the learner's code runs, one here)."""
    cache = KVCache.for_model(KEEP_CONFIG)
    g = torch.Generator().manual_seed(seed)
    for layer in cache:
        k = torch.randn(1, positions, 1, KEEP_CONFIG.head_dim, generator=g)
        layer.update(k, 2 * k)
    return cache


def _check_keep_path(fn: Callable, what: str) -> None:
    """The cache is built where fn runs (judged: in the kernel, since keep_path writes into its buffers in place, and
    the judge's tensors reach the kernel as copies); what it holds afterwards is read back and compared here."""
    seed = next(drawn_seeds(fn)) % 2 ** 31
    for start, n, nodes in ((5, 7, [0, 2, 5]), (3, 6, [0]), (0, 4, [0, 1, 2, 3]), (8, 9, [0, 1, 4, 8]), (6, 5, [])):
        here = filled_cache(seed, start + n)
        ks = [layer.k[:, :start + n].clone() for layer in here]
        cache = where_it_runs(fn, filled_cache, seed, start + n, here=here)
        call = f"{what}: keep_path(cache, start={start}, nodes={nodes}) on a cache of {start + n} positions"
        call_learner(call, fn, cache, start, list(nodes))
        layers = list(cache)
        lengths = [layer.length for layer in layers]
        if lengths != [start + len(nodes)] * KEEP_CONFIG.n_layers:
            raise AssertionError(f"{call}: every layer's length should be {start + len(nodes)} (start + the nodes kept), "
                                 f"got {lengths}")
        for i, (layer, k) in enumerate(zip(layers, ks)):
            want = torch.cat([k[:, :start], k[:, [start + j for j in nodes]]], 1)
            got, got_v = layer.k[:, :start + len(nodes)], layer.v[:, :start + len(nodes)]
            if not torch.equal(got, want) or not torch.equal(got_v, 2 * want):
                bad = next(j for j in range(want.shape[1])
                           if not torch.equal(got[:, j], want[:, j]) or not torch.equal(got_v[:, j], 2 * want[:, j]))
                raise AssertionError(f"{call}: layer {i}, position {bad} does not hold what it should "
                                     f"({'the cached context must stay' if bad < start else f'node {nodes[bad - start]} written at ' + str(start + nodes[bad - start])})"
                                     "; keys and values both move")
        seed += 1
    for node in (4, 5):                       # position 6 is one past the last of 6 positions, 7 further still
        cache = where_it_runs(fn, filled_cache, seed, 6, here=filled_cache(seed, 6))
        expect_value_error(f"{what}: keep_path(cache, 2, [0, {node}]) on a cache of 6 positions (node {node} would be "
                           f"position {2 + node})", fn, cache, 2, [0, node], naming=("6",))
        if [layer.length for layer in list(cache)] != [6] * KEEP_CONFIG.n_layers:
            raise AssertionError(f"{what}: the refused keep_path changed the cache's lengths; check before changing "
                                 "anything")
