"""Checks for Lab 02, the paged KV cache.

CPU tier (correctness):
    check_block_pool(BlockPool)                    allocate / free / incref / fork, ref counts, OutOfBlocks unchanged
    check_slot_mapping(slot_of)                    slot(p) = table[p // bs] * bs + p % bs, errors past the table
    check_block_hash(hash_block)                   deterministic, depends on the tokens AND the parent hash
    check_block_manager(make_manager, hash_fn)     the hypothesis state machine (bounded, seeded examples),
                                                   copy-on-write forks included: siblings never see each other's tokens
    check_prefix_cache(make_manager)               longest cached run, last prompt token computed, LRU, stale hashes
    check_paged_decode_attention(fn)               (B, Hq, D) decode over block tables, GQA, different lengths
    check_paged_attention(fn)                      prefill / chunk / mixed batches, bottom-right mask
    check_paged_generation(fn)                     the model on a paged cache == lab 01's contiguous cache
Interview questions: check_q1_block_waste ... check_q4_ttft_with_cache.

A manager (the learner's or `minigpt.cache.block_manager.BlockManager`) is built as
make_manager(num_blocks, block_size, enable_prefix_caching) and must offer: add_sequence(seq, prompt)
and append_tokens(seq, tokens) returning an object with .slots, .copies and .num_cached; fork(parent,
child); free(seq); .tables {seq: object with .blocks, .token_ids}; .pool with .num_blocks, .ref_counts,
free_blocks(); .prefix_cache with .block_of {hash: block} (or None). Out of blocks it raises
minigpt.cache.block_pool.OutOfBlocks and changes nothing.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from autograder.harness import call_learner, check_answer, quiet
from minigpt.attention import naive_attention
from minigpt.cache.block_pool import OutOfBlocks
from minigpt.cache.prefix_cache import hash_block as reference_hash_block
from minigpt.config import ModelConfig
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.paged_generation import generate_paged_batch
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.timing import fixed_threads

__all__ = ["check_block_pool", "check_slot_mapping", "check_block_hash", "check_block_manager",
           "check_prefix_cache", "check_paged_decode_attention", "check_paged_attention", "check_paged_generation",
           "make_state_machine", "GRADED_EXAMPLES", "check_q1_block_waste", "check_q2_paged_capacity",
           "check_q3_prefix_compute_saved", "check_q4_ttft_with_cache"]

GRADED_EXAMPLES = 60        # state-machine examples in the graded check (seeded, about 10 s on 2 cores)
STEPS_PER_EXAMPLE = 30


# Learner code runs through the harness; OutOfBlocks is an answer the checks inspect, not a crash.
_call = functools.partial(call_learner, passthrough=(OutOfBlocks,))


# ---------------------------------------------------------------------------------------------------
# Block pool
# ---------------------------------------------------------------------------------------------------

def _pool_state(pool: Any) -> tuple:
    return list(pool.ref_counts), sorted(pool.free_blocks())


def check_block_pool(pool_cls: type) -> None:
    """pool_cls(num_blocks, block_size): allocate(n) -> list of ids, free(block), incref(block), fork(blocks),
    .ref_counts, free_blocks(), num_free; OutOfBlocks (unchanged) when short; ValueError on bad input."""
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
    _call("fork(blocks)", pool.fork, [a[0]])
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


# ---------------------------------------------------------------------------------------------------
# Slot mapping and hashing
# ---------------------------------------------------------------------------------------------------

def check_slot_mapping(slot_fn: Callable[[list[int], int, int], int]) -> None:
    """slot_fn(table, position, block_size) = table[position // block_size] * block_size + position % block_size,
    ValueError for a position past the table."""
    for table, bs in (([7, 2, 5], 4), ([3], 1), ([0, 9, 1, 4], 16), ([6, 0], 3)):
        for p in range(len(table) * bs):
            got = _call(f"slot_fn({table}, {p}, {bs})", slot_fn, list(table), p, bs)
            want = table[p // bs] * bs + p % bs
            if got != want:
                edge = " (the first position of a block: check the block index p // block_size)" if p % bs == 0 else ""
                raise AssertionError(f"slot of position {p} with table {table}, block_size {bs}: expected "
                                     f"table[{p // bs}] * {bs} + {p % bs} = {want}, got {got!r}{edge}")
        p = len(table) * bs
        try:
            with quiet():
                slot_fn(list(table), p, bs)
        except ValueError:
            continue
        except Exception as err:
            raise AssertionError(f"position {p} is past a table of {len(table)} blocks of {bs}: expected ValueError, "
                                 f"got {type(err).__name__}: {err}") from None
        raise AssertionError(f"position {p} is past a table of {len(table)} blocks of {bs} (capacity {p}); it must raise "
                             "ValueError naming the problem, not return a slot in somebody else's block")


def check_block_hash(hash_fn: Callable[[int | None, list[int]], int]) -> None:
    """hash_fn(parent_hash, tokens) -> int: deterministic, changes with the tokens and with the parent."""
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


# ---------------------------------------------------------------------------------------------------
# The state machine
# ---------------------------------------------------------------------------------------------------

def make_state_machine(make_manager: Callable[[int, int, bool], Any],
                       hash_fn: Callable[[int | None, list[int]], int] = reference_hash_block) -> type:
    """A hypothesis RuleBasedStateMachine over a manager built by make_manager(num_blocks, block_size, prefix).

    A shadow of the K/V pools records, for every slot written, the whole token prefix that produced it
    (keys and values at position p depend on tokens 0..p). Invariants after every step: free and used
    blocks partition the pool; ref_count = number of tables holding the block; every sequence reads its
    own prefixes back through its table (no sibling or stale content); every cached hash names a block
    whose shadow content has that chained hash; OutOfBlocks changes nothing; freeing all leaks nothing.
    """
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

    class PagedCacheMachine(RuleBasedStateMachine):
        @initialize(num_blocks=st.integers(3, 10), block_size=st.sampled_from([1, 2, 3, 4]), prefix=st.booleans())
        def setup(self, num_blocks: int, block_size: int, prefix: bool) -> None:
            self.bs, self.prefix = block_size, prefix
            self.m = _call(f"make_manager({num_blocks}, {block_size}, {prefix})", make_manager, num_blocks, block_size, prefix)
            self.expected: dict[int, list[int]] = {}      # seq -> tokens
            self.shadow: dict[int, tuple[int, ...]] = {}  # slot -> token prefix whose K/V it holds
            self.seen: list[list[int]] = []               # prompts and sequences, for shared-prefix requests
            self.next_id = 0

        # --- helpers --------------------------------------------------------------------------
        def _snapshot(self) -> tuple:
            m = self.m
            cache = getattr(m, "prefix_cache", None)
            return (list(m.pool.ref_counts), list(m.pool.free_blocks()),
                    {s: (list(t.blocks), list(t.token_ids)) for s, t in m.tables.items()},
                    dict(cache.block_of) if cache is not None else None)

        def _apply(self, seq: int, reservation: Any, new_tokens: list[int], start: int, what: str) -> None:
            for src, dst in reservation.copies:
                for off in range(self.bs):
                    if src * self.bs + off in self.shadow:
                        self.shadow[dst * self.bs + off] = self.shadow[src * self.bs + off]
                    else:
                        self.shadow.pop(dst * self.bs + off, None)
            if len(reservation.slots) != len(new_tokens):
                raise AssertionError(f"{what}: {len(new_tokens)} tokens to write but {len(reservation.slots)} slots returned")
            full = self.expected[seq]
            for i, slot in enumerate(reservation.slots):
                self.shadow[int(slot)] = tuple(full[:start + i + 1])

        def _attempt(self, what: str, method: str, *args: Any) -> Any:
            """Call a manager method; None if it raised OutOfBlocks, after checking that it changed nothing."""
            before = self._snapshot()
            try:
                with quiet():
                    return getattr(self.m, method)(*args)
            except OutOfBlocks:
                if self._snapshot() != before:
                    raise AssertionError(f"{what}: {method} raised OutOfBlocks but changed the state (ref counts, free "
                                         "list, tables or prefix cache): count the blocks needed (new ones plus a "
                                         "copy-on-write copy) BEFORE allocating anything") from None
                return None
            except NotImplementedError:
                raise AssertionError(f"{method} is not implemented yet (NotImplementedError)") from None
            except AssertionError:
                raise
            except Exception as err:
                raise AssertionError(f"{what}: {method} raised {type(err).__name__}: {err}") from None

        def _new_seq(self, tokens: list[int], what: str) -> None:
            seq = self.next_id
            r = self._attempt(what, "add_sequence", seq, list(tokens))
            if r is None:
                return
            self.next_id += 1
            n_cached = int(r.num_cached)
            if n_cached >= len(tokens):
                raise AssertionError(f"{what}: prompt of {len(tokens)} tokens reported {n_cached} cached tokens; at least "
                                     "the last prompt token must be computed (its logits are needed)")
            if n_cached % self.bs:
                raise AssertionError(f"{what}: {n_cached} cached tokens is not a whole number of blocks of {self.bs}")
            self.expected[seq] = list(tokens)
            self._apply(seq, r, tokens[n_cached:], n_cached, what)
            self.seen.append(list(tokens))

        # --- rules ----------------------------------------------------------------------------
        @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=9))
        def new_request(self, tokens: list[int]) -> None:
            self._new_seq(tokens, f"new request {tokens}")

        @precondition(lambda self: bool(self.seen))
        @rule(data=st.data(), suffix=st.lists(st.integers(0, 2), max_size=4))
        def new_request_with_prefix(self, data: Any, suffix: list[int]) -> None:
            base = data.draw(st.sampled_from(self.seen))
            cut = data.draw(st.integers(1, len(base)))
            tokens = base[:cut] + suffix
            self._new_seq(tokens, f"new request {tokens} sharing a prefix of {cut} tokens")

        def _append(self, seq: int, tokens: list[int]) -> None:
            what = f"append {tokens} to sequence {seq} of {len(self.expected[seq])} tokens"
            r = self._attempt(what, "append_tokens", seq, list(tokens))
            if r is None:
                return
            start = len(self.expected[seq])
            self.expected[seq] = self.expected[seq] + list(tokens)
            self._apply(seq, r, tokens, start, what)
            self.seen.append(list(self.expected[seq]))

        @precondition(lambda self: bool(self.expected))
        @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=4))
        def append(self, data: Any, tokens: list[int]) -> None:
            self._append(data.draw(st.sampled_from(sorted(self.expected))), tokens)

        @precondition(lambda self: bool(self.expected))
        @rule(data=st.data(), child_tokens=st.lists(st.integers(0, 2), min_size=1, max_size=3),
              parent_tokens=st.lists(st.integers(0, 2), min_size=1, max_size=3))
        def fork_and_write(self, data: Any, child_tokens: list[int], parent_tokens: list[int]) -> None:
            """Parallel sampling: fork, then both siblings write different tokens (copy-on-write)."""
            parent = data.draw(st.sampled_from(sorted(self.expected)))
            child = self.next_id
            _call(f"fork({parent}, {child})", self.m.fork, parent, child)
            self.next_id += 1
            self.expected[child] = list(self.expected[parent])
            self._append(child, child_tokens)
            self._append(parent, parent_tokens)

        @precondition(lambda self: bool(self.expected))
        @rule(data=st.data())
        def fork(self, data: Any) -> None:
            parent = data.draw(st.sampled_from(sorted(self.expected)))
            child = self.next_id
            _call(f"fork({parent}, {child})", self.m.fork, parent, child)
            self.next_id += 1
            self.expected[child] = list(self.expected[parent])

        @precondition(lambda self: bool(self.expected))
        @rule(data=st.data())
        def free(self, data: Any) -> None:
            seq = data.draw(st.sampled_from(sorted(self.expected)))
            _call(f"free({seq})", self.m.free, seq)
            del self.expected[seq]

        @rule(data=st.data())
        def evict(self, data: Any) -> None:
            """A request of fresh tokens as long as the free space allows: it reuses (evicts) cached free blocks."""
            n_free = len(self.m.pool.free_blocks())
            if n_free == 0:
                return
            n = data.draw(st.integers(1, n_free * self.bs))
            tokens = [3 + (self.next_id + i) % 5 for i in range(n)]        # tokens never used by other rules
            self._new_seq(tokens, f"new request of {n} fresh tokens")

        # --- invariants -----------------------------------------------------------------------
        @invariant()
        def check_1_blocks_partition_the_pool(self) -> None:
            pool = self.m.pool
            free = list(pool.free_blocks())
            refs = [int(r) for r in pool.ref_counts]
            if len(set(free)) != len(free):
                raise AssertionError(f"the free list holds a block twice: {free}")
            used = {b for b in range(pool.num_blocks) if refs[b] > 0}
            if set(free) & used:
                raise AssertionError(f"blocks {sorted(set(free) & used)} are in the free list while still referenced "
                                     f"(ref_counts {refs}): a shared block went back to the pool too early")
            if set(free) | used != set(range(pool.num_blocks)):
                missing = sorted(set(range(pool.num_blocks)) - set(free) - used)
                raise AssertionError(f"blocks {missing} are neither free nor referenced: they leaked "
                                     "(a free that forgot to return them, or a ref_count that did not reach 0)")

        @invariant()
        def check_2_ref_counts_match_tables(self) -> None:
            holders = [0] * self.m.pool.num_blocks
            for t in self.m.tables.values():
                for b in t.blocks:
                    holders[b] += 1
            refs = [int(r) for r in self.m.pool.ref_counts]
            if holders != refs:
                bad = [b for b in range(len(refs)) if holders[b] != refs[b]]
                raise AssertionError(f"ref_counts {refs} differ from the number of tables holding each block {holders} "
                                     f"(blocks {bad}); free must decrement, fork must increment")

        @invariant()
        def check_3_sequences_read_their_own_tokens(self) -> None:
            if set(self.m.tables) != set(self.expected):
                raise AssertionError(f"the manager holds sequences {sorted(self.m.tables)}, expected {sorted(self.expected)}")
            for seq, tokens in self.expected.items():
                t = self.m.tables[seq]
                if list(t.token_ids) != tokens:
                    raise AssertionError(f"sequence {seq}: token_ids {list(t.token_ids)}, expected {tokens}")
                need = -(-len(tokens) // self.bs)
                if len(t.blocks) != need:
                    raise AssertionError(f"sequence {seq} of {len(tokens)} tokens holds {len(t.blocks)} blocks, expected "
                                         f"ceil({len(tokens)}/{self.bs}) = {need}")
                for p in range(len(tokens)):
                    slot = t.blocks[p // self.bs] * self.bs + p % self.bs
                    got = self.shadow.get(slot)
                    if got != tuple(tokens[:p + 1]):
                        raise AssertionError(
                            f"sequence {seq} (tokens {tokens}) reads position {p} from slot {slot}, which holds the K/V of "
                            f"prefix {got}, not of {tuple(tokens[:p + 1])}: another sequence's tokens (a write into a "
                            "shared block without copy-on-write, a stale or unchained prefix-cache hit, or a wrong slot)")

        @invariant()
        def check_4_cached_hashes_are_true(self) -> None:
            cache = getattr(self.m, "prefix_cache", None)
            if cache is None:
                return
            for h, b in cache.block_of.items():
                last = self.shadow.get(b * self.bs + self.bs - 1)
                if last is None or len(last) % self.bs:
                    raise AssertionError(f"the prefix cache maps a hash to block {b}, which holds no full block "
                                         f"(its last slot holds {last})")
                chain = None
                for i in range(0, len(last), self.bs):
                    chain = hash_fn(chain, list(last[i:i + self.bs]))
                contents = [self.shadow.get(b * self.bs + o) for o in range(self.bs)]
                if chain != h or contents != [last[:len(last) - self.bs + o + 1] for o in range(self.bs)]:
                    raise AssertionError(
                        f"the prefix cache maps hash {h} to block {b}, but that block holds the K/V of tokens "
                        f"{list(last[-self.bs:])} after prefix {list(last[:-self.bs])} (chained hash {chain}): a stale "
                        "entry left after the block was reused, a write into a shared cached block (no copy-on-write), "
                        "or a hash that is not chained")

        def teardown(self) -> None:
            if not hasattr(self, "m"):
                return
            for seq in sorted(self.expected):
                _call(f"free({seq})", self.m.free, seq)
            refs = [int(r) for r in self.m.pool.ref_counts]
            free = list(self.m.pool.free_blocks())
            if any(refs) or sorted(free) != list(range(self.m.pool.num_blocks)):
                raise AssertionError(f"after freeing every sequence, ref_counts are {refs} and the free list {sorted(free)}: "
                                     "blocks leaked")

    return PagedCacheMachine


def check_block_manager(make_manager: Callable[[int, int, bool], Any],
                        hash_fn: Callable[[int | None, list[int]], int] = reference_hash_block, *,
                        max_examples: int = GRADED_EXAMPLES, seed: int = 0, shrink: bool = False) -> int:
    """Run the state machine for `max_examples` seeded examples; returns the number run. On failure the
    AssertionError carries the failing sequence of steps (shrunk to a minimal one if `shrink`: slower)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    machine = make_state_machine(make_manager, hash_fn)
    count = {"n": 0}

    class Counted(machine):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            count["n"] += 1

    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    cfg = settings(max_examples=max_examples, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None, database=None,
                   derandomize=True, print_blob=False, report_multiple_bugs=False, phases=phases,
                   suppress_health_check=list(HealthCheck))
    import random
    state = random.getstate()
    random.seed(seed)
    try:
        with quiet():
            run_state_machine_as_test(Counted, settings=cfg)
    except AssertionError as err:
        steps = [line for note in getattr(err, "__notes__", []) for line in note.splitlines()
                 if line.startswith("state.") and not line.startswith("state.check_")]
        shown = "\n".join(steps[-25:])
        raise AssertionError(f"block manager state machine: {err}" + (f"\nSteps that led there:\n{shown}" if shown else "")) from None
    finally:
        random.setstate(state)
    return count["n"]


# ---------------------------------------------------------------------------------------------------
# Prefix cache scenarios (deterministic, with clear messages)
# ---------------------------------------------------------------------------------------------------

def _add(m: Any, seq: Any, prompt: list[int], what: str) -> int:
    r = _call(f"{what}: add_sequence({seq!r}, {len(prompt)} tokens)", m.add_sequence, seq, prompt)
    return int(r.num_cached)


def check_prefix_cache(make_manager: Callable[[int, int, bool], Any]) -> None:
    """Longest cached run of full blocks, chained (equal tokens after another prefix never match), the last
    prompt token always computed, freed blocks reusable until evicted least recently used first, and an
    evicted block's hash forgotten."""
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


# ---------------------------------------------------------------------------------------------------
# Paged attention
# ---------------------------------------------------------------------------------------------------

def _paged_case(lens: list[int], bs: int, Hkv: int, D: int, g: torch.Generator) -> tuple:
    """Random pools and scattered block tables holding sequences of lengths `lens`; also each sequence's
    dense K/V (1, Hkv, L, D) for the reference."""
    need = [-(-n // bs) for n in lens]
    num_blocks = sum(need) + 3
    k_pool, v_pool = torch.randn(num_blocks, bs, Hkv, D, generator=g), torch.randn(num_blocks, bs, Hkv, D, generator=g)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, dense, i = [], [], 0
    for n, nb in zip(lens, need):
        t = perm[i:i + nb]
        i += nb
        tables.append(t)
        k = torch.cat([k_pool[b] for b in t])[:n]                 # (n, Hkv, D)
        v = torch.cat([v_pool[b] for b in t])[:n]
        dense.append((k.transpose(0, 1)[None], v.transpose(0, 1)[None]))
    width = max(need)
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    for r, t in enumerate(tables):
        bt[r, :len(t)] = torch.tensor(t, dtype=torch.int32)
    return k_pool, v_pool, bt, torch.tensor(lens, dtype=torch.int32), dense


def check_paged_decode_attention(fn: Callable) -> None:
    """fn(q (B, Hq, D), k_pool, v_pool (num_blocks, bs, Hkv, D), block_tables (B, M) int32, seq_lens (B,) int32)
    -> (B, Hq, D): each sequence's query attends to its seq_lens[b] keys, read through its block table."""
    g = torch.Generator().manual_seed(0)
    for lens, bs, Hq, Hkv, D in (([5, 1, 12], 4, 4, 2, 8), ([16, 3], 16, 4, 4, 8), ([9, 8, 17, 2], 8, 6, 1, 16)):
        k_pool, v_pool, bt, seq_lens, dense = _paged_case(lens, bs, Hkv, D, g)
        q = torch.randn(len(lens), Hq, D, generator=g)
        what = f"lengths {lens}, block_size {bs}, {Hq} query / {Hkv} KV heads"
        got = _call(f"paged decode attention ({what})", fn, q.clone(), k_pool.clone(), v_pool.clone(), bt.clone(), seq_lens.clone())
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(q.shape):
            raise AssertionError(f"{what}: expected an output (B, Hq, D) = {tuple(q.shape)}, got "
                                 f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
        for b, (k, v) in enumerate(dense):
            want = naive_attention(q[b][None, :, None], k, v)[0, :, 0]
            if not torch.allclose(got[b].float(), want, atol=1e-5, rtol=1e-4):
                err = (got[b].float() - want).abs().max().item()
                raise AssertionError(f"{what}: sequence {b} (length {lens[b]}) differs from dense attention over its "
                                     f"{lens[b]} keys by up to {err:.3g}. Read block block_tables[b, p // bs] at offset "
                                     "p % bs, mask the slots p >= seq_lens[b], and map query head h to KV head "
                                     "h // (Hq // Hkv).")


def check_paged_attention(fn: Callable) -> None:
    """fn(q (B, Hq, Tq, D), k_pool, v_pool, block_tables, seq_lens, q_lens) -> (B, Hq, Tq, D): sequence b's
    q_lens[b] real queries are its last positions; rows past q_lens[b] are ignored."""
    g = torch.Generator().manual_seed(1)
    cases = (([6, 3, 10], [6, 3, 10], 4, 4, 2, 8, "prefill of 3 prompts"),
             ([9, 13], [1, 1], 4, 4, 2, 8, "decode of 2 sequences"),
             ([11, 7, 5], [4, 1, 5], 4, 6, 3, 8, "mixed batch: a chunk after a cached prefix, a decode, a prefill"),
             ([17], [17], 16, 4, 1, 16, "one prompt crossing a block boundary, MQA"))
    for lens, q_lens, bs, Hq, Hkv, D, what in cases:
        k_pool, v_pool, bt, seq_lens, dense = _paged_case(lens, bs, Hkv, D, g)
        Tq = max(q_lens)
        q = torch.randn(len(lens), Hq, Tq, D, generator=g)
        ql = torch.tensor(q_lens, dtype=torch.int32)
        got = _call(f"paged attention ({what})", fn, q.clone(), k_pool.clone(), v_pool.clone(), bt.clone(),
                    seq_lens.clone(), ql.clone())
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(q.shape):
            raise AssertionError(f"{what}: expected an output (B, Hq, Tq, D) = {tuple(q.shape)}, got "
                                 f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
        for b, (k, v) in enumerate(dense):
            n = q_lens[b]
            want = naive_attention(q[b:b + 1, :, :n], k, v)[0]
            if not torch.isfinite(got[b, :, :n]).all():
                raise AssertionError(f"{what}: sequence {b} has NaN/inf outputs (a query row that sees no key?)")
            if not torch.allclose(got[b, :, :n].float(), want, atol=1e-5, rtol=1e-4):
                err = (got[b, :, :n].float() - want).abs().max().item()
                raise AssertionError(f"{what}: sequence {b} (length {lens[b]}, {n} new queries) differs from dense "
                                     f"causal attention by up to {err:.3g}. Its query i sits at position "
                                     "seq_lens[b] - q_lens[b] + i and sees keys j <= that position (bottom-right mask), "
                                     "read through its block table.")


# ---------------------------------------------------------------------------------------------------
# End to end: the model on a paged cache against lab 01's contiguous cache
# ---------------------------------------------------------------------------------------------------

GEN_CONFIG = ModelConfig(vocab_size=256, max_seq_len=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)


def check_paged_generation(attention_fn: Callable, *, block_size: int = 4) -> None:
    """The reference paged engine (minigpt.engine.paged_generation) run with YOUR paged attention: greedy and
    seeded-sampling generations, alone and in a batch of different-length prompts, must equal
    minigpt.engine.cached_generation.generate_kv_cache token for token."""
    with fixed_threads(1):                  # tiny model: one thread is fastest and immune to a busy machine
        _check_paged_generation(attention_fn, block_size)


def _check_paged_generation(attention_fn: Callable, block_size: int) -> None:
    torch.manual_seed(0)
    model = GPT(GEN_CONFIG).eval()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 255, (n,), generator=g).tolist() for n in (3, 9, 14, 1)]
    for sampling in (SamplingParams(), SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7)):
        want = [generate_kv_cache(model, p, 12, sampling, stop_token_ids=()).tokens for p in prompts]
        alone = _call("generate_paged_batch with your attention (one prompt)", generate_paged_batch, model, prompts[1:2],
                      12, sampling, stop_token_ids=(), block_size=block_size, attention=attention_fn)
        if alone[0].tokens != want[1]:
            raise AssertionError(f"one prompt of {len(prompts[1])} tokens, {sampling}: the paged cache generated "
                                 f"{alone[0].tokens}, the contiguous cache {want[1]}")
        batch = _call("generate_paged_batch with your attention (4 prompts)", generate_paged_batch, model, prompts, 12,
                      sampling, stop_token_ids=(), block_size=block_size, attention=attention_fn)
        for p, out, w in zip(prompts, batch, want):
            if out.tokens != w:
                raise AssertionError(f"batch of prompts of lengths {[len(x) for x in prompts]}, {sampling}: the prompt of "
                                     f"{len(p)} tokens generated {out.tokens} in the batch, {w} with the contiguous cache. "
                                     "Padding rows or other sequences' keys leak into this sequence?")
    # Logits of one mixed step within tolerance.
    from minigpt.cache.paged import PagedKVCache
    from minigpt.cache.contiguous import KVCache
    from minigpt.engine.paged_generation import paged_forward
    with torch.inference_mode():
        cache = PagedKVCache.for_model(model, num_blocks=32, block_size=block_size)
        got = _call("paged_forward", paged_forward, model, cache, cache.prepare(list(enumerate(prompts))), attention_fn)
        for i, p in enumerate(prompts):
            want = model(torch.tensor([p]), positions=torch.arange(len(p)), kv_caches=KVCache.for_model(model))[0, -1]
            err = (got[i].float() - want.float()).abs().max().item()
            if not err <= 1e-4:
                raise AssertionError(f"prefill of a batch of prompts of lengths {[len(x) for x in prompts]}: the logits of "
                                     f"prompt {i} differ from the contiguous cache's by up to {err:.3g}")


# ---------------------------------------------------------------------------------------------------
# Interview questions
# ---------------------------------------------------------------------------------------------------

def check_q1_block_waste(answer: Any) -> None:
    """A request of 1,234 tokens in blocks of 16: token slots allocated but never used."""
    check_answer(answer, -(-1234 // 16) * 16 - 1234, "Q1 (wasted slots)",
                 {1234 % 16: "that is the fill of the last block, not its empty part.",
                  4096 - 1234: "that is the waste of max-length preallocation (4096), not of paging."},
                 unit="token slots", hint="Blocks = ceil(1234 / 16); waste = blocks * 16 - 1234.")


def check_q2_paged_capacity(answer: Any) -> None:
    """32 layers, 8 KV heads of 128, bf16; 40 GiB of cache; requests of 700 tokens; blocks of 16: how many fit?"""
    per_token = 2 * 32 * 8 * 128 * 2
    budget = 40 * 2**30
    check_answer(answer, budget // (-(-700 // 16) * 16 * per_token), "Q2 (requests that fit, paged)",
                 {budget // (700 * per_token): "a request holds whole blocks: round 700 up to a multiple of 16.",
                  (40 * 10**9) // (-(-700 // 16) * 16 * per_token): "40 GiB is 40 * 2**30 bytes, not 40e9.",
                  budget // (4096 * per_token): "that is max-length preallocation (4096 tokens per request)."},
                 unit="requests", hint="Bytes per request = ceil(700/16) * 16 tokens * bytes per token; divide the budget.")


def check_q3_prefix_compute_saved(answer: Any) -> None:
    """1,000 chat requests: the same 1,500-token system prompt + a distinct 100-token message, blocks of 16,
    the cache empty before the first: prompt tokens computed in all with prefix caching."""
    per_later = 1600 - (1500 // 16) * 16
    check_answer(answer, 1600 + 999 * per_later, "Q3 (prompt tokens computed)",
                 {1600 + 999 * 100: "only FULL blocks are cached: the system prompt's last partial block is computed again.",
                  1000 * per_later: "the first request finds an empty cache and computes all 1,600 tokens.",
                  1000 * 1600: "that is without prefix caching."},
                 unit="tokens", hint="The first request computes 1,600; each later one reuses the 1500 // 16 full blocks.")


def check_q4_ttft_with_cache(answer: Any) -> None:
    """Q3's workload, prefill time proportional to the tokens computed: TTFT speedup of a later request."""
    check_answer(answer, 1600 / (1600 - (1500 // 16) * 16), "Q4 (time-to-first-token speedup)",
                 {1600 / 100: "the cached part is whole blocks: 1500 // 16 * 16 tokens, not 1500.",
                  1500 / 100: "the speedup compares all 1,600 prompt tokens to those still computed."},
                 unit="x (a ratio)", rel=1e-3, hint="speedup = tokens computed without cache / tokens computed with it.")
