"""Lab 02's contracts (the paged KV cache): what each exercise promises, as its markdown and its checks
(autograder/lab02/) say, for the differential tests of autograder/mutation/equivalence.py.

* ex1 BlockPool: driven through drawn sequences of allocate / incref / fork / free (keep or not) on pools of 1 block
  and more, with an `on_reuse` listener; the trace is every return value, every exception (its type; OutOfBlocks's
  needed/free; whether a ValueError names "free", which the check asks), and the public state after every step
  (ref_counts, free_blocks() in queue order, num_free) and the blocks on_reuse heard.
* ex2 slot_of: any table, any int position (negative and past the table included), any positive int block size
  (large ones included: Python ints are exact, and the exercise's formula is integer arithmetic).
* ex3 hash_block: what the exercise asks of the hash, not its bytes: an int (not a bool), 8 bytes of a digest (in
  [0, 2**64)), deterministic, and which (parent, tokens) inputs share a hash (chained prompts of a small vocabulary,
  so that equal blocks after equal and different prefixes occur).
* ex4 BlockManager: driven through drawn sequences of add_sequence / append_tokens / fork / free, with and without
  prefix caching, on pools of 1 block and more; the trace is every Reservation (slots, copies, num_cached), every
  exception (OutOfBlocks's needed/free), and the public state after every step (the pool's ref counts and free
  queue, each table's block_size / blocks / token_ids / capacity, the hashes, the prefix cache's hash -> block).
* ex5/ex6 paged attention: any batch, heads (GQA/MQA), head dim, block size, table width, dtype on the CPU (the
  solution builds its mask with a CPU arange: the exercise is CPU-only, "everything runs on a CPU"), pools with
  finite values (the cache allocates them zeroed), tables padded with any block id; ex6's padding query rows
  (i >= q_lens[b]) compared only for being finite: the exercise says "give them any finite output, they are ignored".
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------

def _attempt(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """fn's result, or what the contract observes of its exception: the type; OutOfBlocks's (needed, free), which
    the exercise fixes (OutOfBlocks(n, num_free)); for a ValueError whether its message names "free" (the pool's
    check asks that of a double free and of forking a free block)."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:                        # noqa: BLE001
        kind = Raised(type(err).__name__)
        if type(err).__name__ == "OutOfBlocks":
            return (kind, getattr(err, "needed", None), getattr(err, "free", None))
        if isinstance(err, ValueError):
            return (kind, "free" in str(err).lower())
        return kind


# ---------------------------------------------------------------------------------------------------
# Exercise 1: the block pool
# ---------------------------------------------------------------------------------------------------

@st.composite
def _pool_program(draw: Any) -> tuple:
    num_blocks = draw(st.integers(1, 6))
    block_size = draw(st.integers(1, 4))
    block = st.integers(0, num_blocks - 1)
    op = st.one_of(
        st.tuples(st.just("allocate"), st.integers(0, num_blocks + 1)),
        st.tuples(st.just("incref"), block),
        st.tuples(st.just("fork"), st.lists(block, max_size=3)),
        st.tuples(st.just("free"), block, st.booleans()),
        st.tuples(st.just("free_default"), block),
    )
    listen = draw(st.booleans())
    return num_blocks, block_size, listen, draw(st.lists(op, max_size=25))


def _run_pool(pool_cls: Any, program: tuple) -> list:
    num_blocks, block_size, listen, ops = program
    pool = _attempt(pool_cls, num_blocks, block_size)
    if not hasattr(pool, "allocate"):
        return [pool]
    heard: list[int] = []
    if listen:
        pool.on_reuse = heard.append
    trace: list = []
    for op in ops:
        if op[0] == "allocate":
            got = _attempt(pool.allocate, op[1])
        elif op[0] == "incref":
            got = _attempt(pool.incref, op[1])
        elif op[0] == "fork":
            got = _attempt(pool.fork, list(op[1]))
        elif op[0] == "free":
            got = _attempt(pool.free, op[1], keep=op[2])
        else:
            got = _attempt(pool.free, op[1])
        trace.append((op, got, list(pool.ref_counts), list(pool.free_blocks()), pool.num_free, list(heard)))
    return trace


def _pool_corners(ns: dict) -> list:
    return [
        (1, 1, True, [("allocate", 1), ("allocate", 1), ("free", 0, False), ("free", 0, False), ("fork", [0])]),
        (4, 1, True, [("allocate", 4), ("allocate", 1), ("free", 1, True), ("free", 2, False), ("free", 3, True),
                      ("free", 0, False), ("incref", 1), ("incref", 1), ("fork", [1]), ("free", 1, False),
                      ("free", 1, False), ("free", 1, False), ("fork", [2]), ("free_default", 2), ("allocate", 4)]),
        (3, 2, False, [("allocate", 2), ("free", 0, True), ("free", 1, False), ("allocate", 3), ("allocate", 0)]),
        (2, 1, True, [("allocate", 2), ("free", 1, True), ("free", 0, True), ("incref", 0), ("allocate", 1),
                      ("free", 0, True), ("allocate", 2)]),
    ]


# ---------------------------------------------------------------------------------------------------
# Exercise 2: the slot mapping
# ---------------------------------------------------------------------------------------------------

@st.composite
def _slot_input(draw: Any) -> tuple:
    table = draw(st.lists(st.integers(0, 1000), max_size=5))
    block_size = draw(st.one_of(st.integers(1, 64), st.integers(1, 2 ** 70)))
    capacity = len(table) * block_size
    position = draw(st.one_of(st.integers(-3, capacity + 3), st.integers(max(capacity - 3, 0), capacity + 3),
                              st.integers(-2 ** 70, 2 ** 70)))
    return table, position, block_size


def _slot_corners(ns: dict) -> list:
    corners = []
    for table, bs in (([7, 2, 5], 4), ([3], 1), ([0, 9, 1, 4], 16), ([6, 0], 3), ([], 4)):
        for p in (-1, 0, bs - 1, bs, len(table) * bs - 1, len(table) * bs):
            corners.append((table, p, bs))
    big = 2 ** 60
    corners += [([0], big - 1, big), ([5, 2], 2 * big - 1, big), ([1], big, big), ([0], 2 ** 53, 2 ** 53 + 1)]
    return corners


# ---------------------------------------------------------------------------------------------------
# Exercise 3: the chained block hash
# ---------------------------------------------------------------------------------------------------

@st.composite
def _hash_input(draw: Any) -> tuple:
    block_size = draw(st.integers(1, 4))
    prompts = draw(st.lists(st.lists(st.integers(0, 2), max_size=3 * block_size), min_size=1, max_size=5))
    loose = draw(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 2 ** 64 - 1), st.integers(0, 3)),
                                    st.lists(st.integers(0, 100_000), max_size=6)), max_size=5))
    return block_size, prompts, loose


def _run_hash(hash_block: Any, value: tuple) -> tuple:
    """(kinds, within 64 bits, deterministic, which inputs share a hash) of every hash computed."""
    block_size, prompts, loose = value
    hashes: list = []
    for prompt in prompts:
        parent = None
        for i in range(len(prompt) // block_size):
            parent = _attempt(hash_block, parent, prompt[i * block_size:(i + 1) * block_size])
            hashes.append(parent)
    for parent, tokens in loose:
        hashes.append(_attempt(hash_block, parent, list(tokens)))
        hashes.append(_attempt(hash_block, parent, list(tokens)))          # again: deterministic
    kinds = [type(h).__name__ if not isinstance(h, (Raised, tuple)) else h for h in hashes]
    in_64_bits = [isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2 ** 64 for h in hashes]
    first: dict = {}
    labels = [first.setdefault(repr(h), len(first)) for h in hashes]   # which computed hashes are equal
    return kinds, in_64_bits, labels


def _hash_corners(ns: dict) -> list:
    return [(4, [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 4, 3], [9, 9, 9, 9, 5, 6, 7, 8], [5, 6, 7, 8]], []),
            (1, [[0, 0, 0], [1, 0]], [(None, []), (None, [12, 3]), (None, [1, 23]), (0, [1]), (None, [0, 1])]),
            (2, [[10, 1, 0, 11]], [(2 ** 64 - 1, [1, 2]), (12, [3]), (1, [23])])]


# ---------------------------------------------------------------------------------------------------
# Exercise 4: the block manager
# ---------------------------------------------------------------------------------------------------

@st.composite
def _manager_program(draw: Any) -> tuple:
    num_blocks = draw(st.integers(1, 10))
    block_size = draw(st.integers(1, 4))
    prefix = draw(st.booleans())
    seq = st.integers(0, 4)
    tokens = st.lists(st.integers(0, 2), max_size=3 * block_size + 1)
    op = st.one_of(
        st.tuples(st.just("add"), seq, st.lists(st.integers(0, 2), min_size=1, max_size=4 * block_size + 1)),
        st.tuples(st.just("append"), seq, tokens),
        st.tuples(st.just("fork"), seq, seq),
        st.tuples(st.just("free"), seq),
    )
    return num_blocks, block_size, prefix, draw(st.lists(op, max_size=25))


def _table_view(t: Any) -> tuple:
    return (t.block_size, list(t.blocks), list(t.token_ids), _attempt(lambda: t.capacity),
            _attempt(lambda: [t.slot(p) for p in range(len(t.token_ids))]))


def _manager_state(m: Any) -> tuple:
    return (list(m.pool.ref_counts), list(m.pool.free_blocks()), m.pool.num_free,
            {s: _table_view(t) for s, t in m.tables.items()}, {s: list(h) for s, h in m.hashes.items()},
            None if m.prefix_cache is None else dict(m.prefix_cache.block_of))


def _reservation(r: Any) -> Any:
    if isinstance(r, (Raised, tuple)) or r is None:
        return r
    return (list(r.slots), [tuple(c) for c in r.copies], r.num_cached)


def _run_manager(manager_cls: Any, program: tuple) -> list:
    num_blocks, block_size, prefix, ops = program
    m = _attempt(manager_cls, num_blocks, block_size, enable_prefix_caching=prefix)
    if not hasattr(m, "add_sequence"):
        return [m]
    trace: list = [_manager_state(m)]
    for op in ops:
        if op[0] == "add":
            got = _reservation(_attempt(m.add_sequence, op[1], list(op[2])))
        elif op[0] == "append":
            got = _reservation(_attempt(m.append_tokens, op[1], list(op[2])))
        elif op[0] == "fork":
            got = _attempt(m.fork, op[1], op[2])
        else:
            got = _attempt(m.free, op[1])
        trace.append((op, got, _manager_state(m)))
    return trace


def _manager_corners(ns: dict) -> list:
    return [
        # copy-on-write after a fork, both siblings writing, then frees (prefix caching on and off)
        (16, 4, True, [("add", 0, list(range(10))), ("fork", 0, 1), ("append", 1, [42]), ("append", 0, [7, 7, 7]),
                       ("free", 0), ("free", 1), ("add", 2, list(range(10)) + [1])]),
        (16, 4, False, [("add", 0, list(range(10))), ("fork", 0, 1), ("append", 1, [42]), ("append", 0, [7]),
                        ("fork", 1, 0), ("free", 0), ("free", 1)]),
        # a pool of one block: fits exactly, then out of blocks; copy-on-write with no block to copy into
        (1, 2, True, [("add", 0, [1, 2]), ("add", 1, [1]), ("append", 0, [3]), ("free", 0), ("add", 1, [1, 2, 3])]),
        (2, 2, False, [("add", 0, [1]), ("fork", 0, 1), ("append", 1, [2]), ("append", 0, [3]), ("append", 1, [4])]),
        (1, 2, False, [("add", 0, [1]), ("fork", 0, 1), ("append", 1, [2])]),
        # the prefix-cache scenarios of the check: LRU eviction, the last prompt token computed, near a full pool
        (5, 2, True, [("add", "a", [1, 2, 3, 4, 9]), ("free", "a"), ("add", "f", [20, 21, 22, 23]),
                      ("add", "b", [1, 2, 3, 4, 7]), ("free", "b"), ("add", "c", [1, 2, 3, 4, 7, 8, 6])]),
        (4, 2, True, [("add", "a", [1, 2, 3, 4, 5, 6]), ("free", "a"), ("add", "f", [20, 21, 22, 23]),
                      ("free", "f"), ("add", "a2", [1, 2, 3, 4, 9]), ("add", "a3", [1, 2, 3, 4])]),
        (3, 2, True, [("add", 0, [1, 2, 3, 4]), ("fork", 0, 1), ("free", 0), ("append", 1, [5]), ("free", 1),
                      ("add", 2, [1, 2, 3, 4, 5]), ("append", 2, []), ("free", 9), ("append", 9, [1])]),
    ]


# ---------------------------------------------------------------------------------------------------
# Exercises 5 and 6: paged attention
# ---------------------------------------------------------------------------------------------------

_FLOATS = ("float32", "float64", "bfloat16", "float16")


@st.composite
def _attention_input(draw: Any, prefill: bool) -> dict:
    B = draw(st.integers(1, 3))
    Hkv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    D = draw(st.sampled_from([1, 2, 4, 8]))
    bs = draw(st.integers(1, 5))
    M = draw(st.integers(1, 4))
    num_blocks = draw(st.integers(1, B * M + 2))
    seq_lens = [draw(st.integers(1, M * bs)) for _ in range(B)]
    tables = [[draw(st.integers(0, num_blocks - 1)) for _ in range(M)] for _ in range(B)]
    spec = dict(B=B, Hq=Hkv * group, Hkv=Hkv, D=D, bs=bs, num_blocks=num_blocks, seq_lens=seq_lens, tables=tables,
                dtype=draw(st.sampled_from(_FLOATS)), index_dtype=draw(st.sampled_from(["int32", "int64"])),
                seed=draw(st.integers(0, 2 ** 16)), scale=draw(st.sampled_from([1.0, 3.0, 100.0])),
                far=draw(st.booleans()))
    if prefill:
        q_lens = [draw(st.integers(1, n)) for n in seq_lens]
        spec.update(q_lens=q_lens, Tq=max(q_lens) + draw(st.integers(0, 2)))
    return spec


def _attention_args(spec: dict) -> tuple:
    import torch

    g = torch.Generator().manual_seed(spec["seed"])
    dtype, index = getattr(torch, spec["dtype"]), getattr(torch, spec["index_dtype"])
    shape_q = (spec["B"], spec["Hq"], spec["Tq"], spec["D"]) if "q_lens" in spec else (spec["B"], spec["Hq"], spec["D"])
    q = torch.randn(shape_q, generator=g) * spec["scale"]
    k = torch.randn(spec["num_blocks"], spec["bs"], spec["Hkv"], spec["D"], generator=g)
    v = torch.randn(spec["num_blocks"], spec["bs"], spec["Hkv"], spec["D"], generator=g)
    if spec["far"]:              # every score far below -1e4 (the check's case against a -1e4 mask)
        k, q = k.abs() + 0.5, -(q.abs() + 0.5) * 2e4
    args = [q.to(dtype), k.to(dtype), v.to(dtype), torch.tensor(spec["tables"], dtype=index),
            torch.tensor(spec["seq_lens"], dtype=index)]
    if "q_lens" in spec:
        args.append(torch.tensor(spec["q_lens"], dtype=index))
    return tuple(args)


def _run_decode(fn: Any, spec: dict) -> Any:
    return _attempt(fn, *_attention_args(spec))


def _run_prefill(fn: Any, spec: dict) -> Any:
    """The real query rows exactly; the padding rows (i >= q_lens[b]) only whether they are finite (the contract:
    "give them any finite output, they are ignored")."""
    import torch

    out = _attempt(fn, *_attention_args(spec))
    if not isinstance(out, torch.Tensor) or out.dim() != 4 or out.shape[0] != spec["B"] or out.shape[2] != spec["Tq"]:
        return out
    real = torch.zeros(out.shape[0], out.shape[2], dtype=torch.bool)
    for b, n in enumerate(spec["q_lens"]):
        real[b, :n] = True
    mask = real[:, None, :, None].expand(out.shape)
    padding_finite = bool(torch.isfinite(out[~mask]).all())
    return out.masked_fill(~mask, 0), padding_finite


def _decode_corners(ns: dict) -> list:
    base = dict(Hkv=1, D=1, index_dtype="int32", seed=0, scale=1.0, far=False, dtype="float32")
    return [dict(base, B=1, Hq=1, bs=1, num_blocks=1, seq_lens=[1], tables=[[0]]),           # the smallest
            dict(base, B=2, Hq=4, Hkv=2, D=8, bs=4, num_blocks=3, seq_lens=[8, 1], tables=[[2, 0], [1, 1]]),
            dict(base, B=3, Hq=6, Hkv=1, D=4, bs=5, num_blocks=4, seq_lens=[20, 5, 11], tables=[[3, 1, 0, 2]] * 3,
                 far=True)]


def _prefill_corners(ns: dict) -> list:
    corners = []
    for spec in _decode_corners(ns):
        corners.append(dict(spec, q_lens=list(spec["seq_lens"]), Tq=max(spec["seq_lens"])))     # prefills
        corners.append(dict(spec, q_lens=[1] * spec["B"], Tq=1))                                # decodes
        corners.append(dict(spec, q_lens=[1] * spec["B"], Tq=3))                                # padded decodes
    corners.append(dict(_decode_corners(ns)[1], q_lens=[3, 1], Tq=4))
    return corners


CONTRACTS = {
    "ex1_code": Contract("BlockPool", lambda ns: _pool_program(), run=_run_pool, corners=_pool_corners,
                         examples=300),
    "ex2_code": Contract("slot_of", lambda ns: _slot_input(), corners=_slot_corners, examples=300),
    "ex3_code": Contract("hash_block", lambda ns: _hash_input(), run=_run_hash, corners=_hash_corners),
    "ex4_code": Contract("BlockManager", lambda ns: _manager_program(), run=_run_manager,
                         corners=_manager_corners, examples=300),
    "ex5_code": Contract("paged_decode_attention", lambda ns: _attention_input(False), run=_run_decode,
                         corners=_decode_corners),
    "ex6_code": Contract("paged_attention", lambda ns: _attention_input(True), run=_run_prefill,
                         corners=_prefill_corners),
}
