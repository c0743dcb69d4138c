"""Lab 02, exercises 1-3: the block pool (ref counts, OutOfBlocks unchanged), slot mapping, the chained block hash."""

from __future__ import annotations

import functools
from typing import Any, Callable

from autograder.harness import call_learner, expect_value_error, quiet
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.wire import run_where
from minigpt.cache.block_pool import BlockPool as ReferenceBlockPool
from minigpt.cache.block_pool import OutOfBlocks
from minigpt.cache.block_table import slot_of as reference_slot_of
from minigpt.cache.prefix_cache import hash_block as reference_hash_block

__all__ = ["check_block_pool", "check_slot_mapping", "check_block_hash"]

# Learner code runs through the harness; OutOfBlocks is an answer the checks inspect, not a crash.
_call = functools.partial(call_learner, passthrough=(OutOfBlocks,))


# ---------------------------------------------------------------------------------------------------
# Block pool
# ---------------------------------------------------------------------------------------------------

def _pool_state(pool: Any) -> tuple:
    return list(pool.ref_counts), sorted(pool.free_blocks())


POOL_WHAT = "Exercise 1 (BlockPool)"
POOL_METHODS = ("allocate", "incref", "fork", "free")


def check_block_pool(pool_cls: type) -> None:
    """pool_cls(num_blocks, block_size): allocate(n) -> list of ids, free(block), incref(block), fork(blocks),
    .ref_counts, free_blocks(), num_free; OutOfBlocks (unchanged) when short; ValueError on bad input."""
    own_work(pool_cls, ReferenceBlockPool, what=POOL_WHAT, methods=POOL_METHODS)
    with no_calls_into(ReferenceBlockPool, what=POOL_WHAT, allow=("BlockPool.__init__", "BlockPool.num_free",
                                                                  "BlockPool.free_blocks", "BlockPool.num_used",
                                                                  "BlockPool.is_free", "BlockPool._check_id")):
        _check_block_pool(pool_cls)


def _check_block_pool(pool_cls: type) -> None:
    pool = _call("BlockPool(num_blocks=4, block_size=2)", pool_cls, 4, 2)
    for bad in (0, -3, 2.5, "16"):
        try:
            with quiet():
                pool_cls(4, bad)
        except NotImplementedError:
            raise AssertionError("BlockPool is not implemented yet (NotImplementedError)") from None
        except ValueError:
            continue
        except Exception as err:
            raise AssertionError(f"BlockPool(4, block_size={bad!r}) should raise ValueError, got {type(err).__name__}: {err}") from None
        raise AssertionError(f"BlockPool(4, block_size={bad!r}) should raise ValueError: a block size is a positive integer")
    a = _call("allocate(2)", pool.allocate, 2)
    if not isinstance(a, list):
        raise AssertionError(f"allocate(2) must return the list of the block ids it took, got {a!r}")
    if len(a) != 2 or len(set(a)) != 2 or not all(0 <= b < 4 for b in a):
        raise AssertionError(f"allocate(2) on an empty pool of 4 must return 2 distinct ids in [0, 4), got {a!r}")
    if [pool.ref_counts[b] for b in a] != [1, 1] or pool.num_free != 2:
        raise AssertionError(f"after allocate(2): ref_counts of the blocks should be 1 and num_free 2, got "
                             f"{[pool.ref_counts[b] for b in a]} and {pool.num_free}")
    before = _pool_state(pool)
    try:
        with quiet():
            pool.allocate(3)
    except OutOfBlocks:
        pass
    except NotImplementedError:
        raise AssertionError("allocate is not implemented yet (NotImplementedError)") from None
    except Exception as err:
        raise AssertionError(f"allocate(3) with 2 free blocks must raise OutOfBlocks, got {type(err).__name__}: {err}") from None
    else:
        raise AssertionError("allocate(3) with 2 free blocks must raise OutOfBlocks, nothing was raised")
    if _pool_state(pool) != before:
        raise AssertionError(f"allocate(3) with only 2 free blocks raised but changed the pool (ref_counts, free list) "
                             f"from {before} to {_pool_state(pool)}: check that enough blocks are free BEFORE taking any")
    forked = _call("fork(blocks)", pool.fork, [a[0]])
    if forked != [a[0]]:
        raise AssertionError(f"fork([{a[0]}]) must return the forked sequence's table, the same ids [{a[0]}] (shared, "
                             f"not copied), got {forked!r}")
    if pool.ref_counts[a[0]] != 2:
        raise AssertionError(f"after fork([{a[0]}]) its ref_count should be 2, got {pool.ref_counts[a[0]]}")
    _call("free(block)", pool.free, a[0])
    if pool.ref_counts[a[0]] != 1:
        raise AssertionError(f"free() of a block held twice must decrement its ref_count to 1, got {pool.ref_counts[a[0]]}")
    if a[0] in pool.free_blocks() or pool.num_free != 2:
        raise AssertionError(f"block {a[0]} is still held by one owner but free() put it back in the free list: "
                             "a block returns to the pool only when its ref_count reaches 0")
    _call("free(block)", pool.free, a[0])
    if pool.ref_counts[a[0]] != 0 or a[0] not in pool.free_blocks() or pool.num_free != 3:
        raise AssertionError(f"freeing the last holder of block {a[0]} must set its ref_count to 0 and return it to the "
                             f"free list; got ref_count {pool.ref_counts[a[0]]}, num_free {pool.num_free}")
    try:
        with quiet():
            pool.free(a[0])
    except ValueError:
        pass
    except Exception as err:
        raise AssertionError(f"a double free should raise ValueError, got {type(err).__name__}: {err}") from None
    else:
        raise AssertionError(f"freeing block {a[0]} again (ref_count 0) must raise ValueError (double free)")
    if pool.ref_counts[a[0]] != 0 or pool.num_free != 3:
        raise AssertionError("the rejected double free changed the pool")
    rest = _call("allocate(3)", pool.allocate, 3)
    if sorted(rest + [a[1]]) != [0, 1, 2, 3] or pool.num_free != 0:
        raise AssertionError(f"allocating the 3 free blocks should hand out exactly the free ids, got {rest}")
    _check_pool_as_a_pool(pool_cls)


def allocate_hearing_reuse(pool_cls: type, n: int) -> tuple[list, list]:
    """Run where the learner's pool lives (the judge hands over no callable of its own): a new pool of n blocks of
    size 1 whose on_reuse records what it hears, then allocate(n): (the blocks taken, the blocks heard)."""
    heard: list[int] = []
    pool = call_learner(f"BlockPool(num_blocks={n}, block_size=1)", pool_cls, n, 1)
    pool.on_reuse = heard.append
    taken = call_learner(f"allocate({n})", pool.allocate, n)
    return [int(b) for b in taken] if isinstance(taken, list) else taken, heard


def _check_pool_as_a_pool(pool_cls: type) -> None:
    """The pool's order and sharing, which a scheduler and the prefix cache rely on: blocks are taken from the front
    of the free queue (0, 1, 2, ... at first) and on_reuse hears each one; a freed block goes to the front (reused
    first) unless kept for the prefix cache (keep=True: to the back, evicted last); incref takes a free block back
    (a prefix-cache hit) or adds a holder; fork adds a holder to each block and refuses a free one; OutOfBlocks says
    how many were needed and how many were free."""
    pool = _call("BlockPool(num_blocks=4, block_size=1)", pool_cls, 4, 1)
    taken = _call("allocate(4)", pool.allocate, 4)                     # observed here
    if taken != [0, 1, 2, 3]:
        raise AssertionError(f"allocate(4) on a new pool of 4 must take the free queue from its front: [0, 1, 2, 3], "
                             f"got {taken!r}")
    # on_reuse is a callback inside the learner's process: what it heard is recorded there (the one figure of this
    # check reported by the kernel, not observed by the judge)
    _, heard = run_where(pool_cls, allocate_hearing_reuse, pool_cls, 4)
    if heard != taken:
        raise AssertionError(f"on_reuse must be called with each block taken, in order: expected {taken}, heard {heard}")
    try:
        with quiet():
            pool.allocate(1)
    except OutOfBlocks as err:       # (an OutOfBlocks raised in the learner's kernel reaches a judged check without
        # its attributes: they are checked where they arrive)
        if hasattr(err, "needed") and (getattr(err, "needed", None), getattr(err, "free", None)) != (1, 0):
            raise AssertionError(f"OutOfBlocks should carry needed=1 and free=0 (OutOfBlocks(n, free blocks)), got "
                                 f"needed={getattr(err, 'needed', None)!r}, free={getattr(err, 'free', None)!r}") from None
    _call("free(block, keep=True)", pool.free, 1, keep=True)
    _call("free(block)", pool.free, 2)
    _call("free(block, keep=True)", pool.free, 3, keep=True)
    _call("free(block)", pool.free, 0)
    if pool.free_blocks() != [0, 2, 1, 3]:
        raise AssertionError("free(1, keep=True), free(2), free(3, keep=True), free(0) must leave the free queue "
                             f"[0, 2, 1, 3] (a plain free goes to the front, reused first; a kept block to the back, "
                             f"evicted last), got {pool.free_blocks()}")
    _call("incref(block)", pool.incref, 1)                  # a prefix-cache hit on a free, kept block
    if pool.ref_counts[1] != 1 or 1 in pool.free_blocks() or pool.num_free != 3:
        raise AssertionError(f"incref of free block 1 (a prefix-cache hit) must take it off the free queue with "
                             f"ref_count 1; got ref_count {pool.ref_counts[1]}, free queue {pool.free_blocks()}")
    _call("incref(block)", pool.incref, 1)
    _call("fork(blocks)", pool.fork, [1])
    if pool.ref_counts[1] != 3:
        raise AssertionError(f"after allocate-by-incref, incref and fork block 1 has 3 holders, got {pool.ref_counts[1]}")
    for _ in range(3):
        _call("free(block)", pool.free, 1)
    if pool.ref_counts[1] != 0 or pool.free_blocks()[0] != 1:
        raise AssertionError(f"three frees of a block with three holders must return it to the front of the free "
                             f"queue, got ref_count {pool.ref_counts[1]}, free queue {pool.free_blocks()}")
    expect_value_error("fork([2]) of a free block", pool.fork, [2], naming=("free",),
                       hint="a free block has no contents to share")
    expect_value_error("free(2) of a free block", pool.free, 2, naming=("free",), hint="a double free")


# ---------------------------------------------------------------------------------------------------
# Slot mapping and hashing
# ---------------------------------------------------------------------------------------------------

def check_slot_mapping(slot_fn: Callable[[list[int], int, int], int]) -> None:
    """slot_fn(table, position, block_size) = table[position // block_size] * block_size + position % block_size,
    ValueError for a position past the table."""
    own_work(slot_fn, reference_slot_of, what="Exercise 2 (slot_of)")
    with no_calls_into(reference_slot_of, what="Exercise 2 (slot_of)"):
        _check_slot_mapping(slot_fn)


def _check_slot_mapping(slot_fn: Callable[[list[int], int, int], int]) -> None:
    for table, bs in (([7, 2, 5], 4), ([3], 1), ([0, 9, 1, 4], 16), ([6, 0], 3)):
        for p in range(len(table) * bs):
            got = _call(f"slot_fn({table}, {p}, {bs})", slot_fn, list(table), p, bs)
            want = table[p // bs] * bs + p % bs
            if got != want:
                edge = " (the first position of a block: check the block index p // block_size)" if p % bs == 0 else ""
                raise AssertionError(f"slot of position {p} with table {table}, block_size {bs}: expected "
                                     f"table[{p // bs}] * {bs} + {p % bs} = {want}, got {got!r}{edge}")
        p = len(table) * bs
        expect_value_error(f"position {p}, past a table of {len(table)} blocks of {bs} (capacity {p}),", slot_fn,
                           list(table), p, bs, hint=", not return a slot in somebody else's block")


def check_block_hash(hash_fn: Callable[[int | None, list[int]], int]) -> None:
    """hash_fn(parent_hash, tokens) -> int: deterministic, changes with the tokens and with the parent."""
    own_work(hash_fn, reference_hash_block, what="Exercise 3 (hash_block)")
    with no_calls_into(reference_hash_block, what="Exercise 3 (hash_block)"):
        _check_block_hash(hash_fn)


def _check_block_hash(hash_fn: Callable[[int | None, list[int]], int]) -> None:
    h = _call("hash_block(None, [1, 2, 3, 4])", hash_fn, None, [1, 2, 3, 4])
    if not isinstance(h, int) or isinstance(h, bool):
        raise AssertionError(f"hash_block must return an int, got {type(h).__name__}")
    if _call("hash_block", hash_fn, None, [1, 2, 3, 4]) != h:
        raise AssertionError("hash_block(None, [1, 2, 3, 4]) gave two different values: it must be deterministic")
    if _call("hash_block", hash_fn, None, [1, 2, 4, 3]) == h:
        raise AssertionError("hash_block must depend on the order of the tokens")
    child_a = _call("hash_block", hash_fn, h, [5, 6, 7, 8])
    other = _call("hash_block", hash_fn, None, [9, 9, 9, 9])
    child_b = _call("hash_block", hash_fn, other, [5, 6, 7, 8])
    if child_a == child_b or child_a == _call("hash_block", hash_fn, None, [5, 6, 7, 8]):
        raise AssertionError("the same block tokens [5, 6, 7, 8] after different prefixes got the same hash: the hash "
                             "must be chained (include the parent block's hash), since keys and values depend on "
                             "every earlier token")
