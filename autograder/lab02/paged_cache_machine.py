"""Lab 02, exercise 4: the hypothesis state machine over a block manager, with a shadow of the K/V pools.

A shadow of the K/V pools records, for every slot written, the whole token prefix that produced it (keys and values
at position p depend on tokens 0..p). Invariants after every step: free and used blocks partition the pool;
ref_count = number of tables holding the block; every sequence reads its own prefixes back through its table (no
sibling or stale content); every cached hash names a block whose shadow content has that chained hash; OutOfBlocks
changes nothing; freeing all leaks nothing. `machine_for(make_manager, hash_fn, watch)` is the machine for one run
(autograder/lab02/state_machine.py runs it; importing this module imports hypothesis, so that one imports it late).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from autograder.harness import call_learner, expect_value_error, quiet
from minigpt.cache.block_pool import OutOfBlocks

__all__ = ["PagedCacheMachine", "machine_for", "manager_state", "check_copy_on_write_at_exhaustion"]

_call = functools.partial(call_learner, passthrough=(OutOfBlocks,))


def _reports_failure(fn: Callable) -> Callable:
    """Mark the machine as failed when a rule or invariant raises, so the teardown's leak check does not replace
    the error that actually happened. A step that breaks while reading the manager's state (a table whose blocks
    are None, a block size that is not an int: what the learner's manager holds) fails the check saying so, as a
    wrong answer does, instead of breaking it."""
    @functools.wraps(fn)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except (TypeError, IndexError, AttributeError, KeyError) as err:
            self.failed = True
            raise AssertionError(
                f"{fn.__name__.replace('_', ' ')}: reading the manager's state failed with {type(err).__name__}: "
                f"{str(err)[:200]}. After each call, manager.tables[seq] should be a BlockTable of the manager's "
                "block_size whose .blocks lists the sequence's block ids and .token_ids its tokens, and manager.pool "
                "the BlockPool they come from") from None
        except BaseException:
            self.failed = True
            raise
    return run


def _reservation(result: Any, what: str, method: str) -> Any:
    """`result` when it reads as a reservation (slots of ints, copies of (src, dst) pairs, add_sequence's
    num_cached an int); an AssertionError saying what it returned otherwise (a None from a missing `return`)."""
    needs = ("slots", "copies", "num_cached") if method == "add_sequence" else ("slots", "copies")
    try:
        fine = (all(hasattr(result, name) for name in needs) and all(isinstance(int(s), int) for s in result.slots)
                and all(len(tuple(c)) == 2 for c in result.copies)
                and (method != "add_sequence" or isinstance(result.num_cached, int)))
    except (TypeError, ValueError):
        fine = False
    if not fine:
        raise AssertionError(f"{what}: {method} returned {result!r:.120}; it should return its reservation: "
                             f"{', '.join(needs)} (Reservation in minigpt.cache.block_manager)")
    return result


def manager_state(m: Any) -> tuple:
    """What OutOfBlocks must leave as it was: ref counts, the free queue, every table, the prefix cache's map."""
    cache = getattr(m, "prefix_cache", None)
    return (list(m.pool.ref_counts), list(m.pool.free_blocks()),
            {s: (list(t.blocks), list(t.token_ids)) for s, t in m.tables.items()},
            dict(cache.block_of) if cache is not None else None)


@dataclass(frozen=True)
class ManagerView:
    """The manager's state, read once after each call into it: judged, every attribute read is a round trip to the
    learner's kernel, so a step's snapshots and invariants share one reading (it is read again after the next call).
    tables: seq -> (block_size, blocks, token_ids); cached: the prefix cache's hash -> block, None without one."""
    num_blocks: Any
    refs: list[int]
    free: list[Any]
    tables: dict[Any, tuple[Any, list[Any], list[Any]]]
    cached: dict | None

    @classmethod
    def read(cls, m: Any) -> "ManagerView":
        pool, cache = m.pool, getattr(m, "prefix_cache", None)
        return cls(pool.num_blocks, [int(r) for r in pool.ref_counts], list(pool.free_blocks()),
                   {s: (t.block_size, list(t.blocks), list(t.token_ids)) for s, t in m.tables.items()},
                   dict(cache.block_of) if cache is not None else None)

    def snapshot(self) -> tuple:
        """What OutOfBlocks (or a refused fork) must leave as it was (manager_state's figures)."""
        return self.refs, self.free, {s: (b, t) for s, (_, b, t) in self.tables.items()}, self.cached


def check_copy_on_write_at_exhaustion(make_manager: Callable[[int, int, bool], Any], watch: Callable[[], Any]) -> None:
    """A corner the drawn steps reach only by chance: a write into a shared, partial last block that also opens a
    new block needs two blocks (the copy and the new one). With one free block: OutOfBlocks, nothing changed; with
    two: the copy and two slots. Prefix caching off, then on (the fork's block hashes are then read and extended).
    (Pool of 4 blocks of 2: "a" holds [1, 2, 3], "b" its fork, "c" one block.)"""
    for prefix in (False, True):
        _copy_on_write_at_exhaustion(make_manager, watch, prefix)


def _copy_on_write_at_exhaustion(make_manager: Callable[[int, int, bool], Any], watch: Callable[[], Any],
                                 prefix: bool) -> None:
    what = ("Exercise 4 (BlockManager), copy-on-write with the pool nearly full"
            + (", prefix caching on" if prefix else ""))
    with watch():
        m = _call(f"make_manager(4, 2, {prefix})", make_manager, 4, 2, prefix)
        _reservation(_call(f"{what}: add_sequence(0, [1, 2, 3])", m.add_sequence, 0, [1, 2, 3]), what, "add_sequence")
        _call(f"{what}: fork(0, 1)", m.fork, 0, 1)
        _reservation(_call(f"{what}: add_sequence(2, [5])", m.add_sequence, 2, [5]), what, "add_sequence")
        before = manager_state(m)
        try:
            with quiet():
                result = m.append_tokens(1, [7, 8])
        except OutOfBlocks:
            result = None
        if result is not None or manager_state(m) != before:
            raise AssertionError(
                f"{what}: sequence 1 shares its partial last block with sequence 0 and writes 2 tokens, which need a "
                "copy of that block and one new block; with 1 block free append_tokens must raise OutOfBlocks and "
                "change nothing, but it " + ("returned a reservation" if result is not None else
                                             "changed the state before raising") + ": count the copy-on-write copy "
                "with the new blocks BEFORE allocating anything")
        _call(f"{what}: free(2)", m.free, 2)
        result = _reservation(_call(f"{what}: append_tokens(1, [7, 8])", m.append_tokens, 1, [7, 8]), what, "append_tokens")
        if len(result.copies) != 1 or len(result.slots) != 2:
            raise AssertionError(f"{what}: with 2 blocks free, writing 2 tokens into sequence 1 (its partial last "
                                 "block shared) should copy that block once and return 2 slots, got copies "
                                 f"{list(result.copies)} and slots {list(result.slots)}")


class PagedCacheMachine(RuleBasedStateMachine):
    """A manager built by make_manager(num_blocks, block_size, prefix) against a shadow of the K/V pools; the three
    class attributes are set by `machine_for` (each graded run gets a subclass of its own)."""

    make_manager: Callable[[int, int, bool], Any]
    hash_fn: Callable[[int | None, list[int]], int]
    watch: Callable[[], Any]

    @initialize(num_blocks=st.integers(3, 10), block_size=st.sampled_from([1, 2, 3, 4]), prefix=st.booleans())
    @_reports_failure
    def setup(self, num_blocks: int, block_size: int, prefix: bool) -> None:
        self.bs, self.prefix = block_size, prefix
        self._state: ManagerView | None = None
        with self._calling():
            self.m = _call(f"make_manager({num_blocks}, {block_size}, {prefix})", self.make_manager, num_blocks,
                           block_size, prefix)
        self.expected: dict[int, list[int]] = {}      # seq -> tokens
        self.shadow: dict[int, tuple[int, ...]] = {}  # slot -> token prefix whose K/V it holds
        self.seen: list[list[int]] = []               # prompts and sequences, for shared-prefix requests
        self.next_id = 0

    # --- helpers --------------------------------------------------------------------------
    @contextlib.contextmanager
    def _calling(self) -> Iterator[None]:
        """Around every call into the manager: watched, and the state read before it is stale after it."""
        self._state = None
        try:
            with self.watch():
                yield
        finally:
            self._state = None

    def _view(self) -> ManagerView:
        if self._state is None:
            self._state = ManagerView.read(self.m)
        return self._state

    def _snapshot(self) -> tuple:
        return self._view().snapshot()

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
        """Call a manager method; None if it raised OutOfBlocks, after checking that it changed nothing; otherwise
        its reservation, which must have `slots` (ints), `copies` ((src, dst) pairs) and, from add_sequence,
        `num_cached` (an int)."""
        before = self._snapshot()
        try:
            with quiet():
                with self._calling():
                    result = getattr(self.m, method)(*args)
            return _reservation(result, what, method)
        except OutOfBlocks as err:
            needed, free = getattr(err, "needed", None), getattr(err, "free", None)
            if hasattr(err, "needed") and not (isinstance(needed, int) and isinstance(free, int) and 0 <= free <= len(before[1]) and needed > free):
                raise AssertionError(f"{what}: OutOfBlocks(needed={needed!r}, free={free!r}) with {len(before[1])} "
                                     "blocks in the free queue: it should say how many blocks the call needed and how "
                                     "many it could have had (needed > free)") from None
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
    @_reports_failure
    def new_request(self, tokens: list[int]) -> None:
        self._new_seq(tokens, f"new request {tokens}")

    @precondition(lambda self: bool(self.seen))
    @rule(data=st.data(), suffix=st.lists(st.integers(0, 2), max_size=4))
    @_reports_failure
    def new_request_with_prefix(self, data: Any, suffix: list[int]) -> None:
        base = data.draw(st.sampled_from(self.seen))
        cut = data.draw(st.integers(1, len(base)))
        tokens = base[:cut] + suffix
        self._new_seq(tokens, f"new request {tokens} sharing a prefix of {cut} tokens")

    def _append(self, seq: int, tokens: list[int]) -> None:
        what = f"append {tokens} to sequence {seq} of {len(self.expected[seq])} tokens"
        if not tokens:                        # zero new tokens: no slots, no copies, nothing changed
            before = self._snapshot()
            r = self._attempt(what, "append_tokens", seq, [])
            if r is None or list(r.slots) != [] or list(r.copies) != [] or self._snapshot() != before:
                raise AssertionError(f"{what}: expected an empty reservation (slots [], copies []) and no change; "
                                     f"got {'OutOfBlocks' if r is None else (list(r.slots), r.copies)}")
            return
        view = self._view()
        blocks = view.tables[seq][1]
        last = blocks[-1] if blocks else None
        partly_filled_and_shared = (last is not None and len(self.expected[seq]) % self.bs != 0
                                    and view.refs[last] > 1)
        r = self._attempt(what, "append_tokens", seq, list(tokens))
        if r is None:
            return
        copies = list(r.copies)
        if not partly_filled_and_shared and copies:
            raise AssertionError(f"{what}: copied {copies} although its last block "
                                 f"{'is full' if len(self.expected[seq]) % self.bs == 0 else 'is not shared'}: "
                                 "copy-on-write copies only a partly filled block that another sequence also holds")
        if partly_filled_and_shared and len(copies) != 1:
            raise AssertionError(f"{what}: its last block {last} is partly filled and shared, so exactly one "
                                 f"copy-on-write copy (old, new) is due; got copies {copies}")
        start = len(self.expected[seq])
        self.expected[seq] = self.expected[seq] + list(tokens)
        self._apply(seq, r, tokens, start, what)
        self.seen.append(list(self.expected[seq]))

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=0, max_size=4))
    @_reports_failure
    def append(self, data: Any, tokens: list[int]) -> None:
        self._append(data.draw(st.sampled_from(sorted(self.expected))), tokens)

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data(), child_tokens=st.lists(st.integers(0, 2), min_size=1, max_size=3),
          parent_tokens=st.lists(st.integers(0, 2), min_size=1, max_size=3))
    @_reports_failure
    def fork_and_write(self, data: Any, child_tokens: list[int], parent_tokens: list[int]) -> None:
        """Parallel sampling: fork, then both siblings write different tokens (copy-on-write)."""
        parent, child = self._fork_one(data)
        self._append(child, child_tokens)
        self._append(parent, parent_tokens)

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data())
    @_reports_failure
    def fork(self, data: Any) -> None:
        self._fork_one(data)

    def _fork_one(self, data: Any) -> tuple[int, int]:
        """Fork a live sequence (drawn from data) into the next id; the child expects the parent's tokens."""
        parent = data.draw(st.sampled_from(sorted(self.expected)))
        child = self.next_id
        with self._calling():
            _call(f"fork({parent}, {child})", self.m.fork, parent, child)
        self.next_id += 1
        self.expected[child] = list(self.expected[parent])
        return parent, child

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data())
    @_reports_failure
    def fork_into_a_live_sequence(self, data: Any) -> None:
        """Forking into a sequence that exists must raise ValueError and change nothing (it would leak that
        sequence's blocks)."""
        parent = data.draw(st.sampled_from(sorted(self.expected)))
        child = data.draw(st.sampled_from(sorted(self.expected)))
        what = f"fork({parent}, {child}) into sequence {child}, which exists"
        before = self._snapshot()
        with self._calling():
            expect_value_error(what, self.m.fork, parent, child, hint=" (that sequence already exists)")
        if self._snapshot() != before:
            raise AssertionError(f"{what}: raised ValueError but changed the state (ref counts, free list, tables or "
                                 "prefix cache): check that the child is new BEFORE changing anything")

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data())
    @_reports_failure
    def free(self, data: Any) -> None:
        seq = data.draw(st.sampled_from(sorted(self.expected)))
        with self._calling():
            _call(f"free({seq})", self.m.free, seq)
        del self.expected[seq]

    @rule(data=st.data())
    @_reports_failure
    def evict(self, data: Any) -> None:
        """A request of fresh tokens as long as the free space allows: it reuses (evicts) cached free blocks."""
        n_free = len(self._view().free)
        if n_free == 0:
            return
        n = data.draw(st.integers(1, n_free * self.bs))
        tokens = [3 + (self.next_id + i) % 5 for i in range(n)]        # tokens never used by other rules
        self._new_seq(tokens, f"new request of {n} fresh tokens")

    # --- invariants -----------------------------------------------------------------------
    @invariant()
    @_reports_failure
    def check_1_blocks_partition_the_pool(self) -> None:
        view = self._view()
        free, refs = view.free, view.refs
        if len(set(free)) != len(free):
            raise AssertionError(f"the free list holds a block twice: {free}")
        used = {b for b in range(view.num_blocks) if refs[b] > 0}
        if set(free) & used:
            raise AssertionError(f"blocks {sorted(set(free) & used)} are in the free list while still referenced "
                                 f"(ref_counts {refs}): a shared block went back to the pool too early")
        if set(free) | used != set(range(view.num_blocks)):
            missing = sorted(set(range(view.num_blocks)) - set(free) - used)
            raise AssertionError(f"blocks {missing} are neither free nor referenced: they leaked "
                                 "(a free that forgot to return them, or a ref_count that did not reach 0)")

    @invariant()
    @_reports_failure
    def check_2_ref_counts_match_tables(self) -> None:
        view = self._view()
        holders = [0] * view.num_blocks
        for seq, (block_size, blocks, _) in view.tables.items():
            if block_size != self.bs:
                raise AssertionError(f"sequence {seq}'s BlockTable has block_size {block_size!r}, the manager "
                                     f"{self.bs}: a table is made with the manager's block size (whoever reads the "
                                     "table maps positions to slots with it)")
            for b in blocks:
                holders[b] += 1
        refs = view.refs
        if holders != refs:
            bad = [b for b in range(len(refs)) if holders[b] != refs[b]]
            raise AssertionError(f"ref_counts {refs} differ from the number of tables holding each block {holders} "
                                 f"(blocks {bad}); free must decrement, fork must increment")

    @invariant()
    @_reports_failure
    def check_3_sequences_read_their_own_tokens(self) -> None:
        tables = self._view().tables
        if set(tables) != set(self.expected):
            raise AssertionError(f"the manager holds sequences {sorted(tables)}, expected {sorted(self.expected)}")
        for seq, tokens in self.expected.items():
            _, blocks, token_ids = tables[seq]
            if token_ids != tokens:
                raise AssertionError(f"sequence {seq}: token_ids {token_ids}, expected {tokens}")
            need = -(-len(tokens) // self.bs)
            if len(blocks) != need:
                raise AssertionError(f"sequence {seq} of {len(tokens)} tokens holds {len(blocks)} blocks, expected "
                                     f"ceil({len(tokens)}/{self.bs}) = {need}")
            for p in range(len(tokens)):
                slot = blocks[p // self.bs] * self.bs + p % self.bs
                got = self.shadow.get(slot)
                if got != tuple(tokens[:p + 1]):
                    raise AssertionError(
                        f"sequence {seq} (tokens {tokens}) reads position {p} from slot {slot}, which holds the K/V of "
                        f"prefix {got}, not of {tuple(tokens[:p + 1])}: another sequence's tokens (a write into a "
                        "shared block without copy-on-write, a stale or unchained prefix-cache hit, or a wrong slot)")

    @invariant()
    @_reports_failure
    def check_4_cached_hashes_are_true(self) -> None:
        cached = self._view().cached
        if cached is None:
            return
        for h, b in cached.items():
            last = self.shadow.get(b * self.bs + self.bs - 1)
            if last is None or len(last) % self.bs:
                raise AssertionError(f"the prefix cache maps a hash to block {b}, which holds no full block "
                                     f"(its last slot holds {last})")
            chain = None
            for i in range(0, len(last), self.bs):
                chain = self.hash_fn(chain, list(last[i:i + self.bs]))
            contents = [self.shadow.get(b * self.bs + o) for o in range(self.bs)]
            if chain != h or contents != [last[:len(last) - self.bs + o + 1] for o in range(self.bs)]:
                raise AssertionError(
                    f"the prefix cache maps hash {h} to block {b}, but that block holds the K/V of tokens "
                    f"{list(last[-self.bs:])} after prefix {list(last[:-self.bs])} (chained hash {chain}): a stale "
                    "entry left after the block was reused, a write into a shared cached block (no copy-on-write), "
                    "or a hash that is not chained")

    def teardown(self) -> None:
        if not hasattr(self, "m") or getattr(self, "failed", False):
            return                  # a step already failed: that error is the one to report
        for seq in sorted(self.expected):
            with self._calling():
                _call(f"free({seq}) at the end of the run", self.m.free, seq)
        view = self._view()
        refs, free = view.refs, view.free
        if any(refs) or sorted(free) != list(range(view.num_blocks)):
            held = [b for b, r in enumerate(refs) if r]
            raise AssertionError(f"after freeing every sequence, blocks {held} still have ref_counts "
                                 f"{[refs[b] for b in held]} and the free list is {sorted(free)}: blocks leaked "
                                 "(free must decrement each block of the table and return it at 0)")


def machine_for(make_manager: Callable[[int, int, bool], Any], hash_fn: Callable[[int | None, list[int]], int],
                watch: Callable[[], Any]) -> type[PagedCacheMachine]:
    """PagedCacheMachine over managers from make_manager, chaining block hashes with hash_fn, every call into the
    manager inside watch()."""
    return type("PagedCacheMachine", (PagedCacheMachine,), {"make_manager": staticmethod(make_manager),
                                                            "hash_fn": staticmethod(hash_fn),
                                                            "watch": staticmethod(watch)})
