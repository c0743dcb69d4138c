"""Lab 02, exercise 4: the block manager against a hypothesis state machine with a shadow of the K/V pools."""

from __future__ import annotations

import contextlib
import functools
import random
from typing import Any, Callable

from autograder.harness import call_learner, quiet
from autograder.checking.reference_guard import ReferenceHandedIn, no_calls_into, own_work
from autograder.checking.wire import Callback, class_of, del_attribute, is_class, is_remote, vars_of
from minigpt.cache.block_manager import BlockManager as ReferenceBlockManager
from minigpt.cache.block_pool import BlockPool as ReferenceBlockPool
from minigpt.cache.block_pool import OutOfBlocks
from minigpt.cache.prefix_cache import hash_block as reference_hash_block

__all__ = ["make_state_machine", "check_block_manager", "run_state_machine", "manager_class", "fixed_example_source",
           "exercise_4_alone", "GRADED_EXAMPLES",
           "STEPS_PER_EXAMPLE", "MANAGER_WHAT", "MANAGER_METHODS"]

MANAGER_WHAT = "Exercise 4 (BlockManager)"
MANAGER_METHODS = ("add_sequence", "append_tokens", "fork", "free")

GRADED_EXAMPLES = 60        # state-machine examples in the graded check (seeded, about 10 s on 2 cores)
STEPS_PER_EXAMPLE = 30

_call = functools.partial(call_learner, passthrough=(OutOfBlocks,))


EARLIER_PIECES = ("pool_class", "hash_fn")      # the notebook's BlockManager: exercises 1 and 3


@contextlib.contextmanager
def exercise_4_alone(manager: type | Callable[[int, int, bool], Any]) -> Any:
    """Yield make_manager(num_blocks, block_size, prefix) for the learner's manager, graded on its own: given the
    notebook's class, its `pool_class` and `hash_fn` (the learner's exercises 1 and 3) are the package's BlockPool and
    hash_block for the duration, and the learner's are put back afterwards. A factory is used as it is."""
    if not is_class(manager):
        yield manager
        return
    own = vars_of(manager)
    saved = {name: own[name] for name in EARLIER_PIECES if name in own}
    # Judged, BlockPool arrives in the kernel as the package's class (by path); the hash as a wire.Callback, so the
    # kernel's manager calls back here for each hash (the judge's own hash_block, which the kernel cannot patch).
    manager.pool_class = ReferenceBlockPool
    manager.hash_fn = Callback(reference_hash_block) if is_remote(manager) else staticmethod(reference_hash_block)
    try:
        yield lambda num_blocks, block_size, prefix: manager(num_blocks, block_size, enable_prefix_caching=prefix)
    finally:
        for name in EARLIER_PIECES:
            if name in saved:
                setattr(manager, name, saved[name])
            else:
                del_attribute(manager, name)


def manager_class(make_manager: Callable[[int, int, bool], Any]) -> type:
    """The class of the learner's manager (built once, small), checked against the package's BlockManager."""
    manager = _call("make_manager(4, 2, True)", make_manager, 4, 2, True)
    own_work(class_of(manager), ReferenceBlockManager, what=MANAGER_WHAT, methods=MANAGER_METHODS,
             given=EARLIER_PIECES)
    return class_of(manager)


@contextlib.contextmanager
def fixed_example_source() -> Any:
    """Hypothesis with derandomize=True still mixes into its examples the constants it finds in the source of every
    loaded local module (hypothesis.internal.conjecture.providers, 6.1xx), so a notebook kernel and a script draw
    different examples. Inside this block it draws from its fixed global constants only; the Python `random`
    state is seeded and restored."""
    from hypothesis.internal.conjecture import providers

    empty = providers.Constants()
    saved_get, saved_state = providers._get_local_constants, random.getstate()
    providers.CONSTANTS_CACHE.cache.clear()
    providers._get_local_constants = lambda: empty
    random.seed(0)
    try:
        yield
    finally:
        providers._get_local_constants = saved_get
        providers.CONSTANTS_CACHE.cache.clear()
        random.setstate(saved_state)


def _reports_failure(fn: Callable) -> Callable:
    """Mark the machine as failed when a rule or invariant raises, so the teardown's leak check does not replace
    the error that actually happened."""
    @functools.wraps(fn)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except BaseException:
            self.failed = True
            raise
    return run


# ---------------------------------------------------------------------------------------------------
# The state machine
# ---------------------------------------------------------------------------------------------------

def make_state_machine(make_manager: Callable[[int, int, bool], Any],
                       hash_fn: Callable[[int | None, list[int]], int] = reference_hash_block,
                       watch: Callable[[], Any] = contextlib.nullcontext) -> type:
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
        @_reports_failure
        def setup(self, num_blocks: int, block_size: int, prefix: bool) -> None:
            self.bs, self.prefix = block_size, prefix
            with watch():
                self.m = _call(f"make_manager({num_blocks}, {block_size}, {prefix})", make_manager, num_blocks,
                               block_size, prefix)
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
                    with watch():
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
            r = self._attempt(what, "append_tokens", seq, list(tokens))
            if r is None:
                return
            start = len(self.expected[seq])
            self.expected[seq] = self.expected[seq] + list(tokens)
            self._apply(seq, r, tokens, start, what)
            self.seen.append(list(self.expected[seq]))

        @precondition(lambda self: bool(self.expected))
        @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=4))
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
            with watch():
                _call(f"fork({parent}, {child})", self.m.fork, parent, child)
            self.next_id += 1
            self.expected[child] = list(self.expected[parent])
            return parent, child

        @precondition(lambda self: bool(self.expected))
        @rule(data=st.data())
        @_reports_failure
        def free(self, data: Any) -> None:
            seq = data.draw(st.sampled_from(sorted(self.expected)))
            with watch():
                _call(f"free({seq})", self.m.free, seq)
            del self.expected[seq]

        @rule(data=st.data())
        @_reports_failure
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
        @_reports_failure
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
        @_reports_failure
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
        @_reports_failure
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
        @_reports_failure
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
            if not hasattr(self, "m") or getattr(self, "failed", False):
                return                  # a step already failed: that error is the one to report
            for seq in sorted(self.expected):
                with watch():
                    _call(f"free({seq}) at the end of the run", self.m.free, seq)
            refs = [int(r) for r in self.m.pool.ref_counts]
            free = list(self.m.pool.free_blocks())
            if any(refs) or sorted(free) != list(range(self.m.pool.num_blocks)):
                held = [b for b, r in enumerate(refs) if r]
                raise AssertionError(f"after freeing every sequence, blocks {held} still have ref_counts "
                                     f"{[refs[b] for b in held]} and the free list is {sorted(free)}: blocks leaked "
                                     "(free must decrement each block of the table and return it at 0)")

    return PagedCacheMachine


def check_block_manager(manager: type | Callable[[int, int, bool], Any],
                        hash_fn: Callable[[int | None, list[int]], int] = reference_hash_block, *,
                        max_examples: int = GRADED_EXAMPLES, seed: int = 0, shrink: bool = False) -> int:
    """Run the state machine for `max_examples` seeded examples; returns the number run. `manager`: the notebook's
    BlockManager class (graded alone: see exercise_4_alone) or a factory make_manager(num_blocks, block_size, prefix).
    On failure the AssertionError carries the failing sequence of steps (shrunk to a minimal one if `shrink`:
    slower). The package's BlockManager is refused (itself, a subclass inheriting the methods, a wrapper calling it)."""
    with exercise_4_alone(manager) as make_manager:
        manager_class(make_manager)
        return run_state_machine(make_manager, hash_fn, max_examples=max_examples, seed=seed, shrink=shrink,
                                 watch=lambda: no_calls_into(ReferenceBlockManager, what=MANAGER_WHAT))


def run_state_machine(make_manager: Callable[[int, int, bool], Any],
                      hash_fn: Callable[[int | None, list[int]], int] = reference_hash_block, *,
                      max_examples: int = GRADED_EXAMPLES, seed: int = 0, shrink: bool = False,
                      watch: Callable[[], Any] = contextlib.nullcontext) -> int:
    """The state machine alone: the package's own tests run it on the package's BlockManager. `watch()`: a context
    around every call into the manager (the graded check refuses calls into the reference there, not during
    hypothesis's own work, which a profiler would slow down twofold). Returns the number of examples run."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    machine = make_state_machine(make_manager, hash_fn, watch)
    count = {"n": 0}

    class Counted(machine):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            count["n"] += 1

    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    cfg = settings(max_examples=max_examples, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None, database=None,
                   derandomize=True, print_blob=False, report_multiple_bugs=False, phases=phases,
                   suppress_health_check=list(HealthCheck))
    try:
        with quiet(), fixed_example_source():
            random.seed(seed)
            run_state_machine_as_test(Counted, settings=cfg)
    except ReferenceHandedIn:
        raise                   # the refusal's own message, not a state-machine failure
    except AssertionError as err:
        steps = [line for note in getattr(err, "__notes__", []) for line in note.splitlines()
                 if line.startswith("state.") and not line.startswith("state.check_")]
        shown = "\n".join(steps[-25:])
        raise AssertionError(f"block manager state machine: {err}" + (f"\nSteps that led there:\n{shown}" if shown else "")) from None
    return count["n"]
