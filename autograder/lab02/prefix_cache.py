"""Lab 02, exercise 4 (prefix caching): deterministic scenarios with exact cached-token counts."""

from __future__ import annotations

import functools
from typing import Any, Callable

from autograder.harness import call_learner
from autograder.lab02.state_machine import MANAGER_WHAT, exercise_4_alone, manager_class
from autograder.checking.reference_guard import no_calls_into
from minigpt.cache.block_manager import BlockManager as ReferenceBlockManager
from minigpt.cache.block_pool import OutOfBlocks

__all__ = ["check_prefix_cache"]

_call = functools.partial(call_learner, passthrough=(OutOfBlocks,))


# ---------------------------------------------------------------------------------------------------
# Prefix cache scenarios (deterministic, with clear messages)
# ---------------------------------------------------------------------------------------------------

def _add(m: Any, seq: Any, prompt: list[int], what: str) -> int:
    r = _call(f"{what}: add_sequence({seq!r}, {len(prompt)} tokens)", m.add_sequence, seq, prompt)
    return int(r.num_cached)


def _state(m: Any) -> tuple:
    return (list(m.pool.ref_counts), list(m.pool.free_blocks()),
            {s: (list(t.blocks), list(t.token_ids)) for s, t in m.tables.items()}, dict(m.prefix_cache.block_of))


def check_prefix_cache(manager: type | Callable[[int, int, bool], Any]) -> None:
    """Longest cached run of full blocks, chained (equal tokens after another prefix never match), the last
    prompt token always computed, freed blocks reusable until evicted least recently used first (a sequence's
    tail block before its head), an evicted block's hash forgotten, and admission that counts the cached blocks
    it revives from the free queue (near a full pool). `manager`: the notebook's class (graded alone, over the
    package's pool and hash) or a factory."""
    with exercise_4_alone(manager) as make_manager:
        manager_class(make_manager)
        with no_calls_into(ReferenceBlockManager, what=MANAGER_WHAT):
            _check_prefix_cache(make_manager)
            _check_eviction_within_a_sequence(make_manager)
            _check_admission_near_a_full_pool(make_manager)


def _check_eviction_within_a_sequence(make_manager: Callable[[int, int, bool], Any]) -> None:
    """A freed sequence's blocks are evicted tail first: its head block (the prefix other requests share) last."""
    m = _call("make_manager(4, 2, True)", make_manager, 4, 2, True)
    a = [1, 2, 3, 4, 5, 6]                                    # 3 full blocks: head, middle, tail
    _add(m, "a", a, "eviction within one sequence")
    _call("free('a')", m.free, "a")
    _add(m, "fresh", [20, 21, 22, 23], "eviction within one sequence: 2 fresh blocks, one of them evicted")
    _call("free('fresh')", m.free, "fresh")
    if (n := _add(m, "a2", a[:4] + [9], "eviction within one sequence: a's first 2 blocks again")) != 4:
        raise AssertionError(f"a request of 3 blocks was freed, then a fresh request needed its one never-used block "
                             f"and one cached block: the evicted one should be a's TAIL block, keeping its first two "
                             f"(a prefix later requests share), but a's first 4 tokens then found {n} cached tokens "
                             "instead of 4. Free a sequence's blocks last to first, so the tail is evicted first.")


def _check_admission_near_a_full_pool(make_manager: Callable[[int, int, bool], Any]) -> None:
    """Reusing a cached block that waits in the free queue takes it out of the queue: admission must count it."""
    m = _call("make_manager(5, 2, True)", make_manager, 5, 2, True)
    a = [1, 2, 3, 4, 9]                                       # 2 full cached blocks + 1 partial
    _add(m, "a", a, "near-full pool")
    _call("free('a')", m.free, "a")
    _add(m, "fresh", [20, 21, 22, 23], "near-full pool: 2 fresh blocks")      # 3 free left, a's 2 cached among them
    what = "near-full pool: 3 free blocks, 2 of them a's cached ones"
    if (n := _add(m, "b", a[:4] + [7], what + "; a request reusing both and needing 1 new")) != 4:
        raise AssertionError(f"{what}: a request sharing a's first 2 blocks and needing 1 more should reuse 4 cached "
                             f"tokens (it fits: 2 revived + 1 new = 3 free blocks), got {n}")
    _call("free('b')", m.free, "b")
    before = _state(m)
    prompt = a[:4] + [7, 8, 6]
    try:
        r = _call(f"{what}: add_sequence('c', {len(prompt)} tokens)", m.add_sequence, "c", prompt)
    except OutOfBlocks:
        after = _state(m)
        if after != before:
            raise AssertionError(f"{what}: a request reusing a's 2 cached blocks and needing 2 new raised OutOfBlocks "
                                 f"(right) but changed the state on the way (ref counts {before[0]} -> {after[0]}, "
                                 f"free list {before[1]} -> {after[1]}): count the blocks it needs, including the "
                                 "cached ones it takes out of the free queue, BEFORE taking any") from None
        return
    raise AssertionError(f"{what}: a request reusing a's 2 cached blocks and needing 2 new blocks cannot fit (the 2 "
                         "cached ones leave the free queue when reused, leaving 1 block for 2 new ones), yet "
                         f"add_sequence returned {r!r}: the free queue's cached blocks count against the free space.")


def _check_prefix_cache(make_manager: Callable[[int, int, bool], Any]) -> None:
    bs = 4
    m = _call("make_manager(16, 4, True)", make_manager, 16, bs, True)
    a = list(range(100, 110))                                   # 10 tokens: 2 full blocks + 2
    if (n := _add(m, "a", a, "first request")) != 0:
        raise AssertionError(f"the first request found {n} cached tokens in an empty cache")
    _call("free('a')", m.free, "a")
    b = a[:8] + [7, 7, 7]
    if (n := _add(m, "b", b, "request sharing 8 tokens (2 full blocks) with a freed one")) != 8:
        raise AssertionError(f"a request whose first 8 tokens (2 full blocks of 4) equal a freed request's should reuse "
                             f"8 cached tokens, got {n}: freed blocks that carry a hash stay reusable until evicted")
    c = a[:8]
    if (n := _add(m, "c", c, "request whose whole 8-token prompt is cached")) != 4:
        hint = (" It reused the whole prompt and would compute zero tokens: the last prompt token must be computed, "
                "since its logits give the first new token; reuse at most (len(prompt) - 1) // block_size blocks."
                if n == 8 else "")
        raise AssertionError(f"an 8-token prompt cached to its end should reuse 4 tokens (1 block) and compute the "
                             f"last block, got {n}.{hint}")
    d = a[4:8] + a[4:8] + [9]
    if (n := _add(m, "d", d, "request whose 2nd block equals a cached block after a different 1st block")) != 0:
        raise AssertionError(f"tokens {d[:4]} are cached after prefix {a[:4]}, not at the start; the request should "
                             f"reuse 0 tokens, got {n}: hash each block together with its parent's hash (chained)")
    # LRU eviction and forgetting: 5 blocks of 2.
    m = _call("make_manager(5, 2, True)", make_manager, 5, 2, True)
    x, y, z = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12, 13, 14]
    for seq, prompt in (("x", x), ("y", y), ("z", z)):       # z needs 3 of the 5 blocks: evicts x's (freed first)
        _add(m, seq, prompt, "LRU scenario")
        _call(f"free({seq!r})", m.free, seq)
    if (n := _add(m, "y2", y + [1], "LRU scenario: y again after z evicted 2 blocks")) != 4:
        raise AssertionError(f"x then y were freed, then z took 3 of the 5 blocks: x's blocks (least recently used) "
                             f"should have been evicted and y's kept, but y's prompt found {n} cached tokens instead of 4")
    _call("free('y2')", m.free, "y2")
    if (n := _add(m, "x2", x + [1], "LRU scenario: x again after its blocks were reused by z")) != 0:
        raise AssertionError(f"x's blocks were reused for z's tokens, yet x's prompt found {n} cached tokens: a block "
                             "taken for new content must drop its old hash (a stale entry points at z's keys and values)")
