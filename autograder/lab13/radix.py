"""Exercises 1 and 2: the radix-tree prefix cache, run against the judge's own block pool beside a shadow.

The learner's tree gets a BlockPool of the judge's (judged: a handle that serves incref, free, ref_counts, block_size
and num_blocks; every reference it takes or drops is the judge's pool counting it). The judge plays the engine:
requests arrive (match, then incref of the hit, allocation of the rest, writing a known content into each new block),
finish (insert, then the request drops its references) and, in Exercise 2, the pool runs short (evict). A shadow
world does the same with the package's RadixCache on a pool of its own. What the verdict reads is the judge's:

* references: for every block, the pool's count minus the requests' holdings is the tree's, 0 or 1;
* content: the judge knows the token prefix whose keys and values each block holds, so the tree's blocks name a set
  of cached prefixes: no prefix twice (two requests computing the same prefix in one step cache it once), no partial
  block, and the set equal to the shadow's after every step (eviction included: least recently used leaves first);
* answers: each block `match` returns holds the prompt's prefix up to its end and is cached, as many as the shadow's;
  `insert` and `evict` return the shadow's counts; `on_evict` is told each block, with its true prefix, while the
  tree's reference is its only one.

Fixed scenarios run first with their own messages (a full-prefix hit, the same prefix computed twice in one step, a
split at a block boundary, a partial last block; for eviction: LRU order, a referenced leaf kept, an emptied leaf's
parent evictable), then a hypothesis state machine (seeded, a fixed example source: the same verdict in any process).
"""

from __future__ import annotations

import contextlib
import functools
import random
from typing import Any, Callable, Sequence

from autograder.checking.drawn import fixed_example_source
from autograder.checking.judge_services import Callback
from autograder.checking.reference_guard import ReferenceHandedIn, no_calls_into, own_work
from autograder.harness import call_learner, quiet
from minigpt.cache.block_pool import BlockPool
from minigpt.cache.radix_cache import RadixCache as ReferenceRadixCache

__all__ = ["check_radix_match_insert", "check_radix_evict", "World", "run_radix_machine", "EX1", "EX2",
           "GRADED_EXAMPLES", "STEPS_PER_EXAMPLE"]

EX1 = "Exercise 1 (RadixCache)"
EX2 = "Exercise 2 (evict)"
BS = 2
GRADED_EXAMPLES = 40
STEPS_PER_EXAMPLE = 24
PREFIXES = ((7, 7, 8, 8), (7, 7, 9, 9, 9, 9), ())      # shared system prompts the drawn requests start from


class World:
    """A pool, a tree over it (the learner's or the shadow's) and the engine's bookkeeping the judge keeps itself:
    `content[b]` the token prefix whose KV block b holds (up to the block's end, shorter for a partial block),
    `requests[rid]` (tokens, block table)."""

    def __init__(self, make_tree: Callable[[BlockPool], Any], num_blocks: int, what: str,
                 learner: bool, watch: Callable[[], Any] = contextlib.nullcontext) -> None:
        self.pool = BlockPool(num_blocks, BS)
        self.what, self.learner, self.watch = what, learner, watch
        self.content: dict[int, tuple[int, ...]] = {}
        self.requests: dict[Any, tuple[tuple[int, ...], list[int]]] = {}
        self.evicted: list[tuple[tuple[int, ...], int]] = []
        self.tree = self._call("RadixCache(pool)", make_tree, self.pool)

    def _call(self, what: str, fn: Callable, *args: Any) -> Any:
        if not self.learner:
            return fn(*args)
        with self.watch():
            return call_learner(f"{self.what}: {what}", fn, *args)

    # -- the engine's operations ----------------------------------------------------------------------------------

    def arrive(self, rid: Any, tokens: Sequence[int], *, evict: bool) -> tuple[int, bool]:
        """match, incref the hit (the request holds it from now on, so eviction cannot take it), evict what is
        missing (when `evict`), allocate the rest; not admitted, the request lets its hit go. Returns (blocks hit,
        admitted)."""
        tokens = tuple(tokens)
        hit = self._call(f"match({list(tokens)})", self.tree.match, list(tokens))
        hit = self._blocks(hit, f"match({list(tokens)}) returned {hit!r:.80}: a list of block ids")
        self._check_hit(tokens, hit)
        for b in hit:
            self.pool.incref(b)
        self.requests[rid] = (tokens, list(hit))
        need = -(-len(tokens) // BS) - len(hit)
        if need > self.pool.num_free and evict:
            self.evict(need - self.pool.num_free)
        if need > self.pool.num_free:
            for b in self.requests.pop(rid)[1]:
                self.pool.free(b)
            return len(hit), False
        new = self.pool.allocate(need)
        for i, b in enumerate(new, len(hit)):
            self.content[b] = tokens[:min((i + 1) * BS, len(tokens))]
        self.requests[rid] = (tokens, hit + new)
        return len(hit), True

    def finish(self, rid: Any) -> int:
        """insert the request's tokens and table, then drop the request's references. Returns insert's count."""
        tokens, table = self.requests.pop(rid)
        added = self._call(f"insert({list(tokens)}, {table})", self.tree.insert, list(tokens), list(table))
        if isinstance(added, bool) or not isinstance(added, int):
            raise AssertionError(f"{self.what}: insert({list(tokens)}, ...) returned {added!r:.60}; it should return "
                                 "the number of blocks it added to the tree (an int)")
        for b in table:
            if self.pool.ref_counts[b] < 1:
                raise AssertionError(f"{self.what}: after insert({list(tokens)}, {table}), block {b} of the request's "
                                     "table has no reference left: the tree freed a block a request still holds")
            self.pool.free(b)
        return added

    def evict(self, n: int) -> int:
        """evict(n, on_evict): what the tree frees, each block told to on_evict first. A complaint of the judge's
        on_evict is raised here too, whatever the learner's code did with it in between."""
        told: list[tuple[tuple[int, ...], int]] = []
        complaints: list[str] = []
        freed = self._call(f"evict({n}, on_evict)", self.tree.evict, n,
                           Callback(functools.partial(self._told, told, complaints)))
        if complaints:
            raise AssertionError(complaints[0])
        if isinstance(freed, bool) or not isinstance(freed, int):
            raise AssertionError(f"{self.what}: evict({n}, on_evict) returned {freed!r:.60}; it should return the "
                                 "number of blocks it freed (an int)")
        if len(told) != freed:
            raise AssertionError(f"{self.what}: evict({n}) returned {freed} but told on_evict of {len(told)} blocks: "
                                 "call on_evict(prefix, block) once for each block, just before freeing it")
        for _, b in told:
            if self.pool.ref_counts[b] != 0:
                raise AssertionError(f"{self.what}: evict({n}) told on_evict of block {b} but did not free it (its "
                                     f"reference count is {self.pool.ref_counts[b]})")
        self.evicted += told
        return freed

    def _told(self, told: list, complaints: list, prefix: Any, block: Any) -> None:
        """The judge's on_evict: the block must be the tree's alone, and `prefix` what it holds."""
        try:
            b = self._blocks([block], f"on_evict was given block {block!r:.40}: a block id")[0]
            if not self._tree_holds(b) or self._request_refs(b):
                raise AssertionError(f"{self.what}: evict told on_evict of block {b}, which "
                                     + ("a request still holds: only blocks whose one reference is the tree's can go"
                                        if self._request_refs(b) else "the tree does not hold"))
            try:
                got = tuple(int(t) for t in prefix)
            except (TypeError, ValueError):
                raise AssertionError(f"{self.what}: on_evict was given prefix {prefix!r:.60}: a sequence of token "
                                     "ids") from None
            if got != self.content.get(b):
                raise AssertionError(f"{self.what}: on_evict was told prefix {list(got)[:12]} for block {b}, which "
                                     f"holds the keys and values of prefix {list(self.content.get(b, ()))[:12]}: pass "
                                     "the tokens from the root to the end of that block")
        except AssertionError as err:
            complaints.append(str(err))
            raise
        told.append((got, b))

    # -- what the judge reads -------------------------------------------------------------------------------------

    def _blocks(self, got: Any, what: str) -> list[int]:
        try:
            blocks = [int(b) for b in got]
        except (TypeError, ValueError):
            raise AssertionError(f"{self.what}: {what}") from None
        if any(not 0 <= b < self.pool.num_blocks for b in blocks):
            raise AssertionError(f"{self.what}: {what} of this pool (0..{self.pool.num_blocks - 1}), got {blocks}")
        return blocks

    def _request_refs(self, b: int) -> int:
        return sum(table.count(b) for _, table in self.requests.values())

    def _tree_holds(self, b: int) -> bool:
        return self.pool.ref_counts[b] - self._request_refs(b) == 1

    def _check_hit(self, tokens: tuple[int, ...], hit: list[int]) -> None:
        for i, b in enumerate(hit):
            if self.content.get(b) != tokens[:(i + 1) * BS] or len(self.content[b]) != (i + 1) * BS:
                raise AssertionError(f"{self.what}: match({list(tokens)}) returned {hit}, but block {b} (position {i}) "
                                     f"holds the keys and values of {list(self.content.get(b, ()))}, not of "
                                     f"{list(tokens[:(i + 1) * BS])}")
            tree_refs = self.pool.ref_counts[b] - self._request_refs(b)
            if tree_refs > 1:
                raise AssertionError(f"{self.what}: after match({list(tokens)}) block {b} has {tree_refs} references "
                                     "besides the requests': match takes none (the request increfs what it reuses), "
                                     "and the tree holds one on each block it caches")
            if tree_refs < 1:
                raise AssertionError(f"{self.what}: match({list(tokens)}) returned block {b}, which the tree holds no "
                                     "reference on (freed or never inserted): a matched block must be cached")

    def edges(self) -> dict[tuple[int, ...], int]:
        """The tree's edges, each named by the prefix it ends at, with the rank of its last-use stamp among the tree's
        stamps (0 the oldest; equal stamps, equal ranks): read through the tree's nodes() and prefix_of(node) and each
        node's last_used (the notebook's RadixNode)."""
        try:
            nodes = list(self._call("nodes()", self.tree.nodes))
            stamps = {}
            for node in nodes:
                prefix = self._call("prefix_of(node)", self.tree.prefix_of, node)
                stamps[tuple(int(t) for t in prefix)] = int(node.last_used)
        except (AttributeError, TypeError, ValueError) as err:
            raise AssertionError(f"{self.what}: reading the tree's edges failed ({type(err).__name__}: "
                                 f"{str(err)[:120]}): keep the given nodes() and prefix_of(node), and RadixNode's "
                                 "last_used") from None
        rank = {stamp: i for i, stamp in enumerate(sorted(set(stamps.values())))}
        return {prefix: rank[stamp] for prefix, stamp in stamps.items()}

    def cached(self) -> list[tuple[int, ...]]:
        """The prefixes the tree's blocks hold (checked: references, no partial block, no duplicate, prefix-closed)."""
        out = []
        for b in range(self.pool.num_blocks):
            tree_refs = self.pool.ref_counts[b] - self._request_refs(b)
            if tree_refs not in (0, 1):
                raise AssertionError(
                    f"{self.what}: block {b} has {self.pool.ref_counts[b]} references and requests hold "
                    f"{self._request_refs(b)} of them, so the tree holds {tree_refs}: "
                    + ("the tree takes one reference on each block it adds (pool.incref), none on blocks it already "
                       "had, and match takes none (the request increfs what it reuses)" if tree_refs > 1 else
                       "something freed a block it did not hold"))
            if tree_refs and b not in self.content:
                raise AssertionError(f"{self.what}: the tree took a reference on block {b}, which no request ever "
                                     "computed: the tree takes references only on the blocks insert is given")
            if tree_refs:
                out.append(self.content[b])
        partial = [p for p in out if len(p) % BS]
        if partial:
            raise AssertionError(f"{self.what}: the tree holds a partial block ({list(partial[0])}, block size {BS}): "
                                 "cache full blocks only (a partial block's keys and values are still being written)")
        if len(set(out)) != len(out):
            twice = next(p for p in out if out.count(p) > 1)
            raise AssertionError(f"{self.what}: the tree holds two blocks with the same prefix {list(twice)}: a block "
                                 "whose tokens are already cached at that place is not added again (the request's "
                                 "copy stays its own and is freed with it)")
        orphans = [p for p in out if len(p) > BS and p[:-BS] not in set(out)]
        if orphans:
            raise AssertionError(f"{self.what}: the tree holds prefix {list(orphans[0])} without its parent prefix")
        return sorted(out)


def _same(learner: World, shadow: World, what: str, got: Any, want: Any) -> None:
    mine, theirs = learner.cached(), shadow.cached()           # the learner's state read (and checked) first
    if got != want:
        raise AssertionError(f"{learner.what}: {what}: got {got}, expected {want}")
    if mine != theirs:
        extra = [list(p) for p in mine if p not in theirs][:3]
        missing = [list(p) for p in theirs if p not in mine][:3]
        raise AssertionError(f"{learner.what}: after {what}, the tree caches other prefixes than it should"
                             + (f"; it holds {extra} it should not" if extra else "")
                             + (f"; it lacks {missing}" if missing else ""))


def _same_edges(learner: World, shadow: World, when: str) -> None:
    """The learner's edges end where the shadow's do, and their last uses come in the same order."""
    mine, theirs = learner.edges(), shadow.edges()
    if set(mine) != set(theirs):
        extra = [list(p) for p in mine if p not in theirs][:2]
        missing = [list(p) for p in theirs if p not in mine][:2]
        raise AssertionError(f"{learner.what}: {when}, the tree's edges end at other places than they should"
                             + (f"; an edge of yours ends after {extra}" if extra else "")
                             + (f"; none ends after {missing}, where the reference splits" if missing else "")
                             + ": split an edge exactly where a prompt leaves it, and nowhere else")
    order = sorted(theirs, key=lambda p: (theirs[p], p))
    for a, b in zip(order, order[1:]):
        if (theirs[a] < theirs[b]) != (mine[a] < mine[b]) or (theirs[a] == theirs[b]) != (mine[a] == mine[b]):
            raise AssertionError(
                f"{learner.what}: {when}, the edges ending after {list(a)} and after {list(b)} were last used in "
                f"another order than the reference's ({'the same tick' if theirs[a] == theirs[b] else 'the first one earlier'} "
                "there): one tick per match and per insert, given to every node on the path walked (a match's edge "
                "left part way too), to an insert's new leaf and to the upper part of a split, not to the part below "
                "it; eviction takes leaves in this order")


class Pair:
    """The learner's world and the shadow's, driven by the same operations and compared after each one."""

    def __init__(self, make_tree: Callable, num_blocks: int, what: str, watch: Callable[[], Any]) -> None:
        self.learner = World(make_tree, num_blocks, what, True, watch)
        self.shadow = World(ReferenceRadixCache, num_blocks, what, False)
        self.n = 0

    def arrive(self, tokens: Sequence[int], *, evict: bool, what: str = "") -> bool:
        self.n += 1
        rid = self.n
        got = self.learner.arrive(rid, tokens, evict=evict)
        want = self.shadow.arrive(rid, tokens, evict=evict)
        label = what or f"a request for {list(tokens)}: blocks matched"
        _same(self.learner, self.shadow, label, got[0], want[0])
        if got[1] != want[1]:
            raise AssertionError(f"{self.learner.what}: {label}: the request was "
                                 + ("not admitted though eviction should have made room for it" if want[1] else
                                    "admitted though the pool should have had no room for it"))
        return want[1]

    def finish(self, rid: int, what: str = "") -> None:
        tokens = self.shadow.requests[rid][0]
        want = self.shadow.finish(rid)
        got = self.learner.finish(rid)
        _same(self.learner, self.shadow, what or f"insert of request {list(tokens)}: blocks added", got, want)

    def evict(self, n: int, what: str = "") -> None:
        want = self.shadow.evict(n)
        got = self.learner.evict(n)
        _same(self.learner, self.shadow, what or f"evict({n}): blocks freed", got, want)


def _match_insert_scenarios(pair_of: Callable[[int], Pair]) -> None:
    p = pair_of(16)
    a = [1, 1, 2, 2, 3, 3]
    p.arrive(a, evict=False, what="a first request (empty tree): blocks matched")
    p.finish(1, what="its insert (3 full blocks): blocks added")
    p.arrive(a, evict=False, what="the same prompt again (a full-prefix hit): blocks matched")
    p.finish(2, what="inserting a prompt whose blocks are all cached: blocks added")
    b = [1, 1, 2, 2, 4, 4, 5]
    p.arrive(b, evict=False, what="a prompt sharing 2 of the cached edge's 3 blocks: blocks matched")
    p.finish(3, what="its insert, splitting the edge after 2 blocks, its partial last block left out: blocks added")
    p.arrive(a[:4], evict=False, what="the 2 blocks both prompts share, after the split: blocks matched")
    p.finish(4)
    p.arrive([9], evict=False, what="a prompt shorter than one block: blocks matched")
    p.finish(5, what="its insert (no full block to cache): blocks added")
    _same_edges(p.learner, p.shadow, "after a full-prefix hit and a split")
    r = pair_of(24)
    for i, prompt in enumerate(([1, 1, 2, 2, 3, 3, 4, 4], [1, 1, 2, 2, 3, 3, 5, 5]), 1):   # an edge with 2 children
        r.arrive(prompt, evict=False)
        r.finish(i)
    r.arrive([1, 1, 2, 2, 4, 4, 6], evict=False, what="a prompt leaving an edge after 2 of its 3 blocks, its next "
                                                      "block equal to a child's first (cached after the whole edge, "
                                                      "not after the 2): blocks matched")
    r.finish(3, what="its insert: blocks added")
    _same_edges(r.learner, r.shadow, "after a prompt left an edge part way")
    q = pair_of(16)
    c = [6, 6, 7, 7]
    q.arrive(c, evict=False, what="request 1 of 2 with the same uncached prompt in one step: blocks matched")
    q.arrive(c, evict=False, what="request 2 of 2 with the same uncached prompt in one step: blocks matched")
    q.finish(1, what="request 1's insert: blocks added")
    q.finish(2, what="request 2's insert of the same prefix, computed into blocks of its own: blocks added")
    _same_edges(q.learner, q.shadow, "after the same prefix was computed twice in one step")


def _evict_scenarios(pair_of: Callable[[int], Pair]) -> None:
    p = pair_of(12)
    for i, prompt in enumerate(([1, 1, 2, 2, 3, 3], [4, 4], [1, 1, 5, 5]), 1):
        p.arrive(prompt, evict=False)
        p.finish(i)
    p.evict(2, what="evict(2) after three requests finished (LRU leaves first, each leaf from its end): blocks freed")
    p.evict(1, what="evict(1) next: blocks freed")
    _same_edges(p.learner, p.shadow, "after evicting least recently used leaves")
    q = pair_of(12)
    for i, prompt in enumerate(([1, 1, 2, 2], [1, 1, 3, 3]), 1):       # an edge [1, 1] with two children
        q.arrive(prompt, evict=False)
        q.finish(i)
    q.arrive([1, 1, 2, 2, 9], evict=False, what="a request reusing [1, 1, 2, 2] and still running: blocks matched")
    q.evict(5, what="evict(5) while a request holds one leaf's blocks (only the other leaf can go): blocks freed")
    q.finish(3)
    q.evict(5, what="evict(5) once nobody holds them (an emptied leaf makes its parent a leaf): blocks freed")


def _machine(make_tree: Callable, *, evict: bool, watch: Callable[[], Any], what: str) -> type:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

    tokens = st.builds(lambda base, tail: list(PREFIXES[base]) + tail, st.integers(0, len(PREFIXES) - 1),
                       st.lists(st.integers(0, 2), max_size=7)).filter(bool)

    class RadixMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.pair = Pair(make_tree, 10 if evict else 64, what, watch)
            self.running: list[int] = []
            self.failed = False

        def _step(self, fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except BaseException:
                self.failed = True           # reported as it is, not replaced by teardown's comparison
                raise

        def teardown(self) -> None:
            if not self.failed:
                _same_edges(self.pair.learner, self.pair.shadow, "at the end of the drawn requests")

        @rule(prompt=tokens)
        def arrive(self, prompt: list[int]) -> None:
            if self._step(lambda: self.pair.arrive(prompt, evict=evict)):
                self.running.append(self.pair.n)

        @precondition(lambda self: self.running)
        @rule(i=st.integers(0, 7))
        def finish(self, i: int) -> None:
            self._step(lambda: self.pair.finish(self.running.pop(i % len(self.running))))

        if evict:
            @rule(n=st.integers(1, 6))
            def evict_some(self, n: int) -> None:
                self._step(lambda: self.pair.evict(n))

    return RadixMachine


def run_radix_machine(make_tree: Callable, *, evict: bool, what: str, max_examples: int = GRADED_EXAMPLES,
                      watch: Callable[[], Any] = contextlib.nullcontext, seed: int = 0) -> int:
    """The drawn part: requests from shared prefixes arrive and finish (and the pool runs short, with `evict`), the
    learner's tree beside the shadow's. Returns the number of examples run."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    machine = _machine(make_tree, evict=evict, watch=watch, what=what)
    count = {"n": 0}

    class Counted(machine):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            count["n"] += 1

    cfg = settings(max_examples=max_examples, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None, database=None,
                   derandomize=True, print_blob=False, report_multiple_bugs=False,
                   phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    try:
        with quiet(), fixed_example_source():
            random.seed(seed)
            run_state_machine_as_test(Counted, settings=cfg)
    except ReferenceHandedIn:
        raise
    except AssertionError as err:
        steps = [line for note in getattr(err, "__notes__", []) for line in note.splitlines()
                 if line.startswith("state.")]
        shown = "\n".join(steps[-20:])
        raise AssertionError(f"{err}" + (f"\nSteps that led there (drawn requests):\n{shown}" if shown else "")) from None
    return count["n"]


def check_radix_match_insert(cls: Any) -> int:
    """The learner's RadixCache class: match and insert (no eviction) on the judge's pool against the shadow, fixed
    scenarios then drawn requests. Returns the number of drawn examples run."""
    own_work(cls, ReferenceRadixCache, what=EX1, methods=("match", "insert"))
    watch = lambda: no_calls_into(ReferenceRadixCache, what=EX1)          # noqa: E731
    _match_insert_scenarios(lambda n: Pair(cls, n, EX1, watch))
    return run_radix_machine(cls, evict=False, what=EX1, watch=watch)


def check_radix_evict(cls: Any) -> int:
    """The learner's class with `evict` (a subclass of their RadixCache, or of the package's if Exercise 1 is not
    done): LRU eviction of unreferenced leaves on the judge's pool against the shadow, fixed scenarios then drawn
    requests on a pool that runs short. Returns the number of drawn examples run."""
    own_work(cls, ReferenceRadixCache, what=EX2, methods=("evict",))
    watch = lambda: no_calls_into(ReferenceRadixCache.evict, what=EX2)    # noqa: E731
    _evict_scenarios(lambda n: Pair(cls, n, EX2, watch))
    return run_radix_machine(cls, evict=True, what=EX2, watch=watch)
