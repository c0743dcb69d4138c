"""Lab 12's contracts (the engine's hidden costs): the differential tests that show a mutant equivalent.

ex1_code  step_timeline(model_s, cpu_s, *, overlapped, handoff_s): 0 to 8 steps of times 0 to 10 (integers and
          fractions), now and then lists of unequal length or a negative time (both refused), either mode, a hand-off
          of 0 to 2 (or negative). Compared: the (start, end) pairs exactly, or the exception's type.
ex2_code  run_overlapped(driver): none (a loop over the judge's driver); its mutants are graded by the check alone.
ex3_code  pad_decode_batch(rows, bucket, max_blocks, null_block, block_size): 0 to bucket + 1 rows (too many are
          refused), buckets 1 to 8, tables 1 to 5 wide, a null block 0 to 9, blocks of 1 to 16 slots; each row's
          blocks 1 to max_blocks long. Compared: every tensor of the dict, dtype and shape included.
ex4_code  invariant_matmul(x, w, tile): x of 1 to 20 rows (2-D, or 3-D with 1 to 3 leading rows), K and N 1 to 12,
          float32, tiles 1 to 9 and refused ones (0, -1, True, 2.0). Compared: the result bit for bit, or the
          exception's type.
ex5_code  invariant_attention(q, positions, keys, values, block_size): 1 to 4 rows, 1 to 20 keys, 1 or 2 KV heads and
          1 or 2 query heads per KV head, head dimension 1 to 8, each position below the key count, blocks of 1 to 8.
          Compared: the result bit for bit.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, call_with

# -- ex1: step_timeline ---------------------------------------------------------------------------------------------

_TIMES = st.one_of(st.integers(0, 10).map(float), st.floats(0, 10, allow_nan=False), st.just(0.5))


def _timeline_inputs(ns: dict):
    def build(draw):
        n = draw(st.integers(0, 8))
        model = draw(st.lists(_TIMES, min_size=n, max_size=n))
        cpu = draw(st.lists(_TIMES, min_size=n, max_size=n))
        broken = draw(st.sampled_from(["no", "no", "no", "length", "negative model", "negative cpu"]))
        if broken == "length":
            cpu = cpu + [1.0]
        elif broken == "negative model" and model:
            model[draw(st.integers(0, n - 1))] = -1.0
        elif broken == "negative cpu" and cpu:
            cpu[draw(st.integers(0, n - 1))] = -0.5
        handoff = draw(st.one_of(_TIMES.map(lambda t: t / 5), st.just(-0.1), st.just(0.0)))
        return (model, cpu), {"overlapped": draw(st.booleans()), "handoff_s": handoff}
    return st.composite(lambda draw: build(draw))()


def _timeline_corners(ns: dict) -> list:
    return [(([4.0, 4.0, 4.0], [1.0, 1.0, 6.0]), {"overlapped": o, "handoff_s": 0.5}) for o in (False, True)] + \
        [(([], []), {"overlapped": True, "handoff_s": 0.0}), (([1.0], [0.0]), {"overlapped": True, "handoff_s": 0.0}),
         (([2.0, 2.0], [3.0, 3.0]), {"overlapped": True, "handoff_s": 0.0}),
         (([1.0, 2.0], [1.0]), {"overlapped": False, "handoff_s": 0.0}),
         (([1.0, 2.0], [1.0, 1.0]), {"overlapped": False, "handoff_s": -1.0})]


# -- ex2: pad_decode_batch ------------------------------------------------------------------------------------------

def _padding_inputs(ns: dict):
    def build(draw):
        bucket, width = draw(st.integers(1, 8)), draw(st.integers(1, 5))
        null, block_size = draw(st.integers(0, 9)), draw(st.integers(1, 16))
        n = draw(st.integers(0, bucket + 1))
        rows = []
        for _ in range(n):
            blocks = draw(st.lists(st.integers(0, 30), min_size=1, max_size=width))
            position = draw(st.integers(0, len(blocks) * block_size - 1))
            rows.append((draw(st.integers(0, 4095)), position, draw(st.integers(0, 500)), blocks))
        return rows, bucket, width, null, block_size
    return st.composite(lambda draw: build(draw))()


def _padding_corners(ns: dict) -> list:
    return [([(11, 16, 64, [3, 4, 5])], 1, 4, 0, 16), ([(7, 0, 32, [2]), (9, 31, 63, [6, 3])], 8, 4, 1, 16),
            ([], 2, 3, 5, 8), ([(1, 0, 0, [1])] * 3, 2, 2, 0, 8), ([(5, 63, 95, [2, 3, 4, 5])], 4, 4, 7, 16)]


# -- ex3: invariant_matmul ------------------------------------------------------------------------------------------

def _matmul_inputs(ns: dict):
    def build(draw):
        lead = draw(st.sampled_from([(), (), (1,), (2,), (3,)]))
        return lead, draw(st.integers(1, 20)), draw(st.integers(1, 12)), draw(st.integers(1, 12)), \
            draw(st.one_of(st.integers(1, 9), st.sampled_from([0, -1, True, 2.0]))), draw(st.integers(0, 2**16))
    return st.composite(lambda draw: build(draw))()


def _matmul_corners(ns: dict) -> list:
    return [((), 1, 4, 3, 8, 0), ((), 8, 4, 3, 8, 1), ((), 9, 5, 2, 8, 2), ((2,), 5, 16, 8, 4, 3), ((), 3, 2, 2, 1, 4),
            ((), 3, 2, 2, 0, 5), ((), 3, 2, 2, True, 6)]


def _matmul_run(fn, value):
    lead, rows, K, N, tile, seed = value
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, rows, K, generator=g)
    return call_with(fn, (x, torch.randn(K, N, generator=g), tile))


# -- ex4: invariant_attention ---------------------------------------------------------------------------------------

def _attention_inputs(ns: dict):
    def build(draw):
        N, L = draw(st.integers(1, 4)), draw(st.integers(1, 20))
        positions = draw(st.lists(st.integers(0, L - 1), min_size=N, max_size=N))
        return N, L, positions, draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 8)), \
            draw(st.integers(1, 8)), draw(st.integers(0, 2**16))
    return st.composite(lambda draw: build(draw))()


def _attention_corners(ns: dict) -> list:
    return [(1, 1, [0], 1, 1, 4, 4, 0), (3, 13, [12, 0, 6], 2, 2, 8, 4, 1), (2, 16, [15, 7], 1, 2, 4, 8, 2),
            (4, 9, [8, 8, 0, 3], 2, 1, 2, 1, 3)]


def _attention_run(fn, value):
    N, L, positions, hkv, group, D, block_size, seed = value
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(N, hkv * group, D, generator=g)
    keys, values = torch.randn(N, L, hkv, D, generator=g), torch.randn(N, L, hkv, D, generator=g)
    return call_with(fn, (q, torch.tensor(positions), keys, values, block_size))


CONTRACTS = {
    "ex1_code": Contract("step_timeline", _timeline_inputs, corners=_timeline_corners, examples=300),
    "ex3_code": Contract("pad_decode_batch", _padding_inputs, corners=_padding_corners, examples=200),
    "ex4_code": Contract("invariant_matmul", _matmul_inputs, run=_matmul_run, corners=_matmul_corners, examples=200),
    "ex5_code": Contract("invariant_attention", _attention_inputs, run=_attention_run, corners=_attention_corners,
                         examples=150),
}
