"""Lab 13's contracts (the KV cache hierarchy): the differential tests that show a mutant equivalent.

ex1_code  RadixCache(pool) with match and insert: a pool of 12 to 48 blocks of 1 to 3 tokens; 1 to 14 operations,
          each a request (tokens 0 to 2 from a shared start or not, 1 to 9 of them: match, the hit increfed, the rest
          allocated, insert) or the release of a running request. Compared after every operation: what match returned,
          what insert returned, the pool's reference counts; at the end the tree's edges (prefix_of of each node) with
          the order of their last_used stamps.
ex2_code  EvictingRadixCache.evict: the same operations on a pool of 6 to 16 blocks, the pool running short (evict
          asked for the blocks missing) and explicit evict(1..6) calls. Compared as ex1, and what evict returned and
          each on_evict(prefix, block) call.
ex3_code  admission_order(waiting, cached, waited, max_wait): 0 to 9 requests, cached 0 to 48 tokens in steps of 16,
          waited 0 to 8 steps, max_wait 0 to 9 or refused (-1, 2.5, True, "3"). Compared: the order, or the
          exception's type.
ex4_code  crossover_tokens(shape, link, accelerator, mfu, limit): the calculator's presets, links of 1 to 100 GB/s
          and 1 us to 1 ms, every accelerator, mfu 0.1 to 1, limits 1 to 2**20. Compared: the crossover (or None).
ex5_code  restore_prefix(keys, loader, allocate, other_work, prefill, worth_loading, block_size): 0 to 8 keys, the
          tier holding each with probability 0.7 (and others), loading paying from 1 to 32 tokens, on the check's own
          judge (autograder/lab13/restore.py: copies land only when waited for). Compared: the return value, every
          call of the four functions with its argument and what the loader had done by then, the loader's log of
          copies started and waited for, and what the prefill found.
"""

from __future__ import annotations

from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised
from minigpt.cache.block_pool import BlockPool
from minigpt.costmodel.calculators import PRESETS
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.costmodel.offload import Link

# -- ex1 / ex2: the tree -------------------------------------------------------------------------------------------

_STARTS = ((), (1, 1, 2, 2), (1, 1, 2, 0, 0, 1))


def _tree_inputs(evicting: bool):
    def inputs(ns: dict):
        def build(draw):
            bs = draw(st.integers(1, 3))
            blocks = draw(st.integers(6, 16) if evicting else st.integers(12, 48))
            ops = []
            for _ in range(draw(st.integers(1, 14))):
                kind = draw(st.sampled_from(["request", "request", "release"] + (["evict"] if evicting else [])))
                if kind == "request":
                    start = draw(st.sampled_from(_STARTS))
                    tail = draw(st.lists(st.integers(0, 2), max_size=9 - len(start) // 2))
                    ops.append(("request", (list(start) + tail) or [0]))
                else:
                    ops.append((kind, draw(st.integers(0, 6))))
            return bs, blocks, ops
        return st.composite(lambda draw: build(draw))()
    return inputs


def _tree_corners(evicting: bool):
    def corners(ns: dict) -> list:
        same_step = [("request", [6, 6, 7, 7]), ("request", [6, 6, 7, 7]), ("release", 0), ("release", 0)]
        split = [("request", [1, 1, 2, 2, 3, 3]), ("release", 0), ("request", [1, 1, 2, 2, 4, 4, 5]),
                 ("release", 0), ("request", [1, 1, 2, 2, 3, 3]), ("release", 0), ("request", [4, 4])]
        out = [(2, 16, same_step), (2, 16, split), (1, 16, [("request", [1, 2, 3, 4, 5]), ("request", [1, 2, 3, 7]),
                                                        ("request", [1, 2, 9])])]
        if evicting:
            out += [(2, 8, split + [("release", 0), ("evict", 2), ("evict", 5)]),
                    (2, 6, [("request", [1, 1, 2, 2]), ("release", 0), ("request", [1, 1, 3, 3]), ("release", 0),
                            ("request", [1, 1, 2, 2, 9]), ("evict", 5), ("release", 0), ("evict", 5)])]
        return out
    return corners


def _edges(tree) -> dict:
    stamps = {tuple(tree.prefix_of(node)): node.last_used for node in tree.nodes()}
    rank = {s: i for i, s in enumerate(sorted(set(stamps.values())))}
    return {p: rank[s] for p, s in stamps.items()}


def _tree_run(evicting: bool):
    def run(cls, value):
        bs, num_blocks, ops = value
        log: list = []
        try:
            pool = BlockPool(num_blocks, bs)
            tree = cls(pool)
            running: list[list[int]] = []

            def told(prefix, block):
                log.append(("on_evict", tuple(prefix), block))
            for kind, arg in ops:
                if kind == "request":
                    hit = list(tree.match(arg))
                    log.append(("match", hit))
                    for b in hit:
                        pool.incref(b)
                    need = -(-len(arg) // bs) - len(hit)
                    if need > pool.num_free and evicting:
                        log.append(("evict", tree.evict(need - pool.num_free, told)))
                    if need > pool.num_free:
                        for b in hit:
                            pool.free(b)
                        log.append(("refused",))
                    else:
                        table = hit + pool.allocate(need)
                        log.append(("insert", tree.insert(arg, table)))
                        running.append(table)
                elif kind == "release" and running:
                    for b in running.pop(arg % len(running)):
                        pool.free(b)
                elif kind == "evict":
                    log.append(("evict", tree.evict(arg, told)))
                log.append(("refs", list(pool.ref_counts)))
            log.append(("edges", _edges(tree)))
        except Exception as err:                    # noqa: BLE001  (the same kind of failure at the same point)
            log.append(Raised(type(err).__name__))
        return log
    return run


# -- ex3: admission_order ------------------------------------------------------------------------------------------

def _order_inputs(ns: dict):
    def build(draw):
        n = draw(st.integers(0, 9))
        return ([f"r{i}" for i in draw(st.permutations(range(n)))],
                draw(st.lists(st.sampled_from([0, 16, 32, 48]), min_size=n, max_size=n)),
                draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)),
                draw(st.one_of(st.integers(0, 9), st.sampled_from([-1, 2.5, True, "3"]))))
    return st.composite(lambda draw: build(draw))()


def _order_corners(ns: dict) -> list:
    return [(["a", "b", "c"], [0, 48, 16], [3, 3, 3], 0), (["x", "y", "z"], [8, 0, 24], [2, 5, 1], 5),
            (["r7", "r2", "r9", "r4"], [16, 16, 48, 16], [0, 0, 0, 0], 10), ([], [], [], 4), (["a"], [0], [0], -1)]


def _order_run(fn, value):
    ids, cached, waited, max_wait = value
    c, w = dict(zip(ids, cached)), dict(zip(ids, waited))
    try:
        return list(fn(list(ids), c.__getitem__, w.__getitem__, max_wait))
    except Exception as err:                        # noqa: BLE001
        return Raised(type(err).__name__)


# -- ex4: crossover_tokens -----------------------------------------------------------------------------------------

def _crossover_inputs(ns: dict):
    def build(draw):
        link = Link("drawn", draw(st.floats(1e9, 1e11)), draw(st.floats(1e-6, 1e-3)), "drawn")
        return (PRESETS[draw(st.sampled_from(sorted(PRESETS)))], link,
                ACCELERATORS[draw(st.sampled_from(sorted(ACCELERATORS)))], draw(st.floats(0.1, 1.0)),
                draw(st.one_of(st.integers(1, 64), st.integers(1, 2**20))))
    return st.composite(lambda draw: build(draw))()


def _crossover_corners(ns: dict) -> list:
    from minigpt.costmodel.offload import LINKS
    h100 = ACCELERATORS["H100-SXM"]
    return [(PRESETS[m], LINKS[k], h100, 0.5, limit) for m in ("minigpt-target", "Llama-2-7B (MHA)", "Llama-3-8B")
            for k in LINKS for limit in (1, 8192, 2**20)]


def _crossover_run(fn, value):
    shape, link, acc, mfu, limit = value
    try:
        return fn(shape, link, acc, mfu=mfu, limit=limit)
    except Exception as err:                        # noqa: BLE001
        return Raised(type(err).__name__)


# -- ex5: restore_prefix -------------------------------------------------------------------------------------------

def _restore_inputs(ns: dict):
    def build(draw):
        keys = draw(st.lists(st.integers(0, 12), max_size=8, unique=True))
        held = [k for k in keys if draw(st.integers(0, 9)) < 7] + draw(st.lists(st.integers(13, 20), max_size=2))
        return keys, held, draw(st.integers(1, 32)), draw(st.integers(0, 2**16))
    return st.composite(lambda draw: build(draw))()


def _restore_corners(ns: dict) -> list:
    return [([], [1], 1, 0), ([1, 2, 3], [1, 2, 3], 1, 1), ([1, 2, 3, 4], [1, 2, 4], 1, 2), ([1, 2], [2], 1, 3),
            ([1, 2, 3], [1, 2, 3], 13, 4), ([1, 2, 3], [1, 2, 3], 12, 5)]


def _restore_run(fn, value):
    from autograder.lab13.restore import BS, _Judge

    keys, held, threshold, seed = value
    j = _Judge(keys, held, threshold, seed)
    try:
        got = fn(list(keys), j.loader, j.allocate, j.other_work, j.prefill, j.worth, BS)
        return (got, [(kind, repr(arg), at) for kind, arg, at in j.calls],
                [(kind, event, repr(arg)) for kind, event, arg in j.loader.log], repr(j.prefilled))
    except Exception as err:                        # noqa: BLE001
        return Raised(type(err).__name__)
    finally:
        j.close()


CONTRACTS = {
    "ex1_code": Contract("RadixCache", _tree_inputs(False), run=_tree_run(False), corners=_tree_corners(False),
                         examples=200),
    "ex2_code": Contract("EvictingRadixCache", _tree_inputs(True), run=_tree_run(True), corners=_tree_corners(True),
                         examples=200),
    "ex3_code": Contract("admission_order", _order_inputs, run=_order_run, corners=_order_corners, examples=200),
    "ex4_code": Contract("crossover_tokens", _crossover_inputs, run=_crossover_run, corners=_crossover_corners,
                         examples=150),
    "ex5_code": Contract("restore_prefix", _restore_inputs, run=_restore_run, corners=_restore_corners, examples=150),
}
