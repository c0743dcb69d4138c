"""Lab 13's checks: a learner's copy of each reference passes; the stub, the reference handed in, a wrapper around
it and plausible wrong implementations fail, each with the message that names its mistake. Wrong implementations
are the reference's source with one plausible edit (`as_learner`'s edits), compiled as notebook code."""

from __future__ import annotations

import pytest

from autograder import lab13
from autograder.checking.reference_guard import ReferenceHandedIn
from learner_copy import as_learner
from minigpt.cache.cache_aware import admission_order
from minigpt.cache.host_loader import restore_prefix
from minigpt.cache.radix_cache import RadixCache
from minigpt.costmodel import offload
from minigpt.costmodel.offload import crossover_tokens


def _stub(*args, **kwargs):
    raise NotImplementedError


def _wrapper(fn):
    def learner(*args, **kwargs):
        return fn(*args, **kwargs)
    return learner


def _own_crossover(**edits_of):
    """crossover_tokens with the learner's own should_load / load_seconds / recompute_seconds (the notebook's)."""
    load = as_learner(offload.load_seconds, *edits_of.get("load", ()))
    recompute = as_learner(offload.recompute_seconds, *edits_of.get("recompute", ()))
    should = as_learner(offload.should_load, *edits_of.get("should", ()), load_seconds=load, recompute_seconds=recompute)
    return as_learner(crossover_tokens, *edits_of.get("crossover", ()), should_load=should)


class _Stub:
    def __init__(self, pool):
        self.pool = pool

    def match(self, tokens):
        raise NotImplementedError

    def insert(self, tokens, blocks):
        raise NotImplementedError

    def evict(self, n_blocks, on_evict=None):
        raise NotImplementedError


class _Subclass(RadixCache):
    pass


def test_a_learners_copy_passes():
    mine = as_learner(RadixCache)
    assert lab13.check_radix_match_insert(mine) > 0
    assert lab13.check_radix_evict(mine) > 0
    lab13.check_admission_order(as_learner(admission_order))
    lab13.check_crossover_tokens(_own_crossover())


def test_evict_alone_on_the_packages_tree():
    """Exercise 1 failed: the notebook says to subclass the package's RadixCache and write evict alone."""
    class Evicting(RadixCache):
        evict = as_learner(RadixCache).evict
    assert lab13.check_radix_evict(Evicting) > 0
    with pytest.raises(ReferenceHandedIn):
        lab13.check_radix_match_insert(Evicting)


def test_the_stub_the_reference_and_a_wrapper_fail():
    for check in (lab13.check_radix_match_insert, lab13.check_radix_evict):
        with pytest.raises(AssertionError, match="not implemented"):
            check(_Stub)
        with pytest.raises(AssertionError, match="reference|package|comes from"):
            check(RadixCache)
        with pytest.raises(AssertionError, match="reference|package|comes from"):
            check(_Subclass)
    for check, reference in ((lab13.check_admission_order, admission_order),
                             (lab13.check_crossover_tokens, crossover_tokens)):
        with pytest.raises(AssertionError, match="not implemented"):
            check(_stub)
        with pytest.raises(AssertionError, match="reference"):
            check(reference)
        with pytest.raises(AssertionError, match="reference"):
            check(_wrapper(reference))


# --- Exercise 1 ----------------------------------------------------------------------------------

WRONG_TREES = {
    "match-increfs": ([("        now = next(self._clock)\n        for node, _ in path:",
                        "        now = next(self._clock)\n        for b in blocks:\n            self.pool.incref(b)\n"
                        "        for node, _ in path:")], "match takes none"),
    "no-split": ([("                child = self._split(child, n)", "                break")],
                 "blocks added|other prefixes|the tree holds 2"),
    "partial-block-cached": ([("        full = min(len(tokens) // bs, len(blocks))",
                               "        full = min(-(-len(tokens) // bs), len(blocks))")], "partial block"),
    "duplicate-incref": ([("        if at == full:\n            return 0\n",
                           "        if at == full:\n            for b in blocks[:full]:\n                "
                           "self.pool.incref(b)\n            return 0\n")], "the tree holds 2|two blocks|holds"),
    "whole-edges-only": ([("            blocks += child.blocks[:n]", "            blocks += child.blocks[:n] if n == "
                                                                      "len(child.blocks) else []")],
                         "blocks matched"),
    "insert-counts-all": ([("        return len(new)\n", "        return full\n")], "blocks added"),
    "match-stamps-nothing": ([("        for node, _ in path:\n            node.last_used = now\n", "")], "another order"),
    "split-stamps-the-lower-part": ([("                child = self._split(child, n)      # the part this prompt "
                                      "shares is used now, the rest is not\n            child.last_used = now\n",
                                      "                child.last_used = now\n                child = "
                                      "self._split(child, n)\n            else:\n                child.last_used = "
                                      "now\n")], "another order"),
    "new-leaf-unstamped": ([("new, node, {}, now)", "new, node, {}, 0)")], "another order"),
}


@pytest.mark.parametrize("name", WRONG_TREES)
def test_wrong_trees_are_named(name):
    edits, message = WRONG_TREES[name]
    with pytest.raises(AssertionError, match=message):
        lab13.check_radix_match_insert(as_learner(RadixCache, *edits))


# --- Exercise 2 ----------------------------------------------------------------------------------

WRONG_EVICTIONS = {
    "most-recent-first": ([("heap = [(leaf.last_used, id(leaf), leaf)", "heap = [(-leaf.last_used, id(leaf), leaf)")],
                          "blocks freed|other prefixes"),
    "ignores-references": ([("self.pool.ref_counts[leaf.blocks[-1]] == 1:", "True:")],
                           "a request still holds|no reference left|the tree holds"),
    "head-first": ([("on_evict(self.prefix_of(leaf), leaf.blocks[-1])\n                self.pool.free(leaf.blocks.pop())",
                     "on_evict(self.prefix_of(leaf)[:len(self.prefix_of(leaf)) - self.block_size * "
                     "(len(leaf.blocks) - 1)], leaf.blocks[0])\n                self.pool.free(leaf.blocks.pop(0))")],
                   "without its parent|other prefixes|blocks freed"),
    "parent-never-a-leaf": ([("            if parent is not self.root and not parent.children:",
                              "            if False:")], "blocks freed"),
    "prefix-of-the-parent": ([("on_evict(self.prefix_of(leaf), leaf.blocks[-1])",
                               "on_evict(self.prefix_of(leaf.parent), leaf.blocks[-1])")], "on_evict was told prefix"),
    "on-evict-not-told": ([("                if on_evict is not None:\n", "                if False:\n")],
                          "told on_evict of 0"),
}


@pytest.mark.parametrize("name", WRONG_EVICTIONS)
def test_wrong_evictions_are_named(name):
    edits, message = WRONG_EVICTIONS[name]
    with pytest.raises(AssertionError, match=message):
        lab13.check_radix_evict(as_learner(RadixCache, *edits))


def test_an_on_evict_complaint_cannot_be_swallowed():
    wrong = as_learner(RadixCache, ("                    on_evict(self.prefix_of(leaf), leaf.blocks[-1])\n",
                                "                    try:\n                        on_evict((), leaf.blocks[-1])\n"
                                "                    except AssertionError:\n                        pass\n"))
    with pytest.raises(AssertionError, match="on_evict was told prefix"):
        lab13.check_radix_evict(wrong)


# --- Exercise 3 ----------------------------------------------------------------------------------

WRONG_ORDERS = {
    "shortest-first": ([("key=lambda item: (-cached(item[1]), item[0])", "key=lambda item: (cached(item[1]), item[0])")],
                       "MOST cached"),
    "ties-by-id": ([("key=lambda item: (-cached(item[1]), item[0])", "key=lambda item: (-cached(item[1]), item[1])")],
                   "arrival order"),
    "strictly-longer": ([("waited(r) >= max_wait]", "waited(r) > max_wait]"),
                         ("waited(r) < max_wait]", "waited(r) <= max_wait]")], ">="),
    "starving-by-cache": ([("    return starving + [r for _, r in rest]",
                            "    starving.sort(key=lambda r: -cached(r))\n    return starving + [r for _, r in rest]")],
                          "arrival order"),
    "no-starvation-bound": ([("    starving = [r for r in waiting if waited(r) >= max_wait]",
                              "    starving = []"),
                             ("waited(r) < max_wait]", "True]")], "max_wait"),
    "no-validation": ([("        raise ValueError", "        pass  #")], "max_wait"),
}


@pytest.mark.parametrize("name", WRONG_ORDERS)
def test_wrong_orders_are_named(name):
    edits, message = WRONG_ORDERS[name]
    with pytest.raises(AssertionError, match=message):
        lab13.check_admission_order(as_learner(admission_order, *edits))


# --- Exercise 4 ----------------------------------------------------------------------------------

WRONG_CROSSOVERS = {
    "no-latency": ({"load": [("return link.latency + tokens", "return tokens")]}, "pays the link's latency"),
    "last-losing": ({"crossover": [("    return hi", "    return lo")]}, "shortest prefix at which loading WINS"),
    "k-only": ({"load": [("tokens * kv_bytes_per_token(shape, bytes_per_element)",
                          "tokens * kv_bytes_per_token(shape, bytes_per_element) / 2")]}, "K and V"),
    "peak-not-mfu": ({"recompute": [("(accelerator.peak(precision) * mfu)", "accelerator.peak(precision)")]},
                     "expected"),
    "never-none": ({"crossover": [("        return None", "        return limit")]}, "return None"),
}


@pytest.mark.parametrize("name", WRONG_CROSSOVERS)
def test_wrong_crossovers_are_named(name):
    edits, message = WRONG_CROSSOVERS[name]
    with pytest.raises(AssertionError, match=message):
        lab13.check_crossover_tokens(_own_crossover(**edits))


# --- Interview questions -------------------------------------------------------------------------

QUESTIONS = [
    (lab13.check_q1_load_speedup, lab13.questions._ratio(**lab13.questions.Q1)),
    (lab13.check_q2_mha_from_nvme, lab13.questions._ratio(**lab13.questions.Q2)),
    (lab13.check_q3_radix_nodes, lab13.questions._nodes()),
]


@pytest.mark.parametrize("check, right", QUESTIONS, ids=["q1", "q2", "q3"])
def test_questions_accept_the_answer_and_name_mistakes(check, right):
    check(right)
    with pytest.raises(AssertionError):
        check(right * 1.5 if isinstance(right, float) else right + 1)
    with pytest.raises(AssertionError, match="not|answer|GQA|K AND V|split|RUN|node"):
        check(None)


# --- Exercise 5 ----------------------------------------------------------------------------------

WRONG_RESTORES = {
    "past-the-hole": ([("    while n < len(keys) and loader.has(keys[n]):\n        n += 1\n",
                        "    n = sum(1 for key in keys if loader.has(key))\n")], "no tier holds|expected|copies started"),
    "no-cost-model": ([("    if n and not worth_loading(n * block_size):\n        n = 0\n", "")], "worth_loading was asked"),
    "asks-in-blocks": ([("worth_loading(n * block_size)", "worth_loading(n)")], "asked|does not pay|expected"),
    "waits-before-other-work": ([("    events = [loader.load(key, block) for key, block in zip(keys[:n], blocks)]\n"
                                  "    other_work()\n    for event in events:\n        loader.wait(event)\n",
                                  "    for key, block in zip(keys[:n], blocks):\n        "
                                  "loader.wait(loader.load(key, block))\n    other_work()\n")], "overlap"),
    "never-waits": ([("    for event in events:\n        loader.wait(event)\n", "")], "before its copy landed"),
    "waits-for-the-first-only": ([("    for event in events:\n        loader.wait(event)\n",
                                   "    for event in events[:1]:\n        loader.wait(event)\n")],
                                 "before its copy landed"),
    "blocks-swapped": ([("zip(keys[:n], blocks)", "zip(keys[:n], blocks[::-1])")], "copies started"),
    "prefill-first": ([("    other_work()\n    for event in events:\n        loader.wait(event)\n    prefill(blocks, n)\n",
                        "    for event in events:\n        loader.wait(event)\n    prefill(blocks, n)\n"
                        "    other_work()\n")], "had been waited for|prefill ran before other_work"),
}


def test_a_learners_restore_passes_and_the_reference_is_refused():
    lab13.check_restore_prefix(as_learner(restore_prefix))
    with pytest.raises(AssertionError, match="not implemented"):
        lab13.check_restore_prefix(_stub)
    with pytest.raises(AssertionError, match="reference"):
        lab13.check_restore_prefix(restore_prefix)
    with pytest.raises(AssertionError, match="reference"):
        lab13.check_restore_prefix(_wrapper(restore_prefix))


@pytest.mark.parametrize("name", WRONG_RESTORES)
def test_wrong_restores_are_named(name):
    edits, message = WRONG_RESTORES[name]
    with pytest.raises(AssertionError, match=message):
        lab13.check_restore_prefix(as_learner(restore_prefix, *edits))
