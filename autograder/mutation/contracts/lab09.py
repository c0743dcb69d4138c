"""Lab 09's contracts (long context): the differential tests that show a mutant equivalent.

ex2_code  RingKVCache(batch, n_kv_heads, head_dim, window, n_sinks, inv_freq): driven through a drawn stream, a
          prefill of 0 to capacity + 2 tokens (refused with ValueError when it would evict), then single tokens and
          now and then a chunk of 2 or 3 (refused once the ring is full), past several wrap-arounds. Windows of 1 to
          6, 0 to 3 sinks (the RoPE frequencies given wherever there are sinks, as the exercise's callers do; given
          or None without), batch 1 or 2, keys and values of any float dtype. After each call the trace holds what
          every public method and attribute shows: update's return (or the exception's type), read(), length,
          capacity, nbytes, next_positions(n) for n = 0..2, and slot(p) for every position seen so far and two
          more (the markdown fixes the slot of token p: p below the sinks, else n_s + (p - n_s) mod W).
ex5_code  absorbed_decode(q_nope (B, H, d_n), q_rope (B, H, d_R), c_kv (B, T, r), k_rope (B, T, d_R), w_uk (H, r, d_n),
          w_uv (H, r, d_v), w_o (H d_v, d_model)): batch 1 to 3, 1 to 4 heads, every width 1 to 8 (d_n = r included:
          W_UK folded without its transpose still runs), 1 to 9 cached tokens, float32 or float64 inputs drawn from
          a seed. Compared: the output, dtype and shape included.
ex6_code  snapkv_keep(obs_scores (Hkv, w, N), budget, obs_window): 1 to 3 KV heads, an observation window of 0 to 4
          queries, N from w up, any budget from w to N, probabilities in float32, float64, float16, bfloat16 (ties
          included: uniform votes), the meta device. Compared: the kept positions, dtype and shape included.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised

_FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


# -- ex2: RingKVCache -----------------------------------------------------------------------------------------------

def _ring_inputs(ns: dict):
    def build(draw):
        window = draw(st.integers(1, 6))
        n_sinks = draw(st.integers(0, 3))
        head_dim = draw(st.sampled_from([2, 4]))
        with_freq = True if n_sinks else draw(st.booleans())
        capacity = window + n_sinks
        prefill = draw(st.integers(0, capacity + 2))
        steps = draw(st.lists(st.sampled_from([1, 1, 1, 1, 2, 3, 0]), min_size=1, max_size=3 * capacity + 6))
        return (draw(st.integers(1, 2)), draw(st.integers(1, 2)), head_dim, window, n_sinks, with_freq,
                draw(st.sampled_from([10000.0, 10.0])), [prefill] + steps, draw(st.sampled_from(_FLOATS)),
                draw(st.integers(0, 2**16)))
    return st.composite(lambda draw: build(draw))()


def _ring_corners(ns: dict) -> list:
    ones = [1] * 14
    return [(1, 1, 2, 1, 0, False, 10000.0, [1] + ones, torch.float32, 0),          # a window of 1
            (1, 2, 4, 4, 1, True, 10000.0, [2] + ones, torch.float32, 1),           # 2-token prefill, 1 sink
            (1, 1, 2, 3, 2, True, 10.0, [5] + ones, torch.float32, 2),              # the ring full at once
            (2, 1, 4, 2, 3, True, 10000.0, [6, 2] + ones, torch.float64, 3),        # a refused prefill, then 2
            (1, 1, 2, 5, 4, True, 10.0, [3, 2, 2, 3] + ones, torch.float32, 4),     # chunks of 2 until full
            (1, 2, 2, 4, 2, True, 10.0, [1] + ones, torch.float32, 5)]             # 2 * n_sinks == window


def _ring_run(cls, value):
    from minigpt.longctx.rope_scaling import base_inv_freq

    batch, n_kv_heads, head_dim, window, n_sinks, with_freq, theta, steps, dtype, seed = value
    inv_freq = base_inv_freq(head_dim, theta) if with_freq else None
    g = torch.Generator().manual_seed(seed)
    trace = []

    def observe(cache):
        seen = getattr(cache, "length", 0) if isinstance(getattr(cache, "length", 0), int) else 0
        for name, get in (("read", lambda: cache.read()), ("length", lambda: cache.length),
                          ("capacity", lambda: cache.capacity), ("nbytes", lambda: cache.nbytes),
                          ("next", lambda: [cache.next_positions(n) for n in range(3)]),
                          ("slots", lambda: [cache.slot(p) for p in range(seen + 2)])):
            try:
                trace.append((name, get()))
            except Exception as err:                          # noqa: BLE001
                trace.append((name, Raised(type(err).__name__)))

    try:
        cache = cls(batch, n_kv_heads, head_dim, window, n_sinks, inv_freq)
    except Exception as err:                                  # noqa: BLE001
        return [Raised(type(err).__name__)]
    observe(cache)
    for t in steps:
        k = torch.randn(batch, t, n_kv_heads, head_dim, generator=g).to(dtype)
        v = torch.randn(batch, t, n_kv_heads, head_dim, generator=g).to(dtype)
        try:
            trace.append(("update", cache.update(k, v)))
        except Exception as err:                              # noqa: BLE001
            trace.append(("update", Raised(type(err).__name__)))
        observe(cache)
    return trace


# -- ex5: absorbed_decode ------------------------------------------------------------------------------------------

def _mla_inputs(ns: dict):
    def build(draw):
        sizes = [draw(st.integers(1, hi)) for hi in (3, 4, 8, 8, 8, 8, 9, 8)]     # B, H, r, d_R, d_n, d_v, T, d_model
        return (*sizes, draw(st.sampled_from([torch.float32, torch.float64])), draw(st.integers(0, 2**16)))
    return st.composite(lambda draw: build(draw))()


def _mla_corners(ns: dict) -> list:
    return [(1, 1, 1, 1, 1, 1, 1, 1, torch.float32, 0),             # every width 1, one cached token
            (2, 4, 16, 8, 16, 12, 37, 24, torch.float32, 1),        # the check's first shape (d_n = r)
            (3, 2, 8, 6, 12, 10, 9, 20, torch.float64, 2),
            (1, 3, 5, 2, 5, 7, 9, 4, torch.float32, 3)]


def _mla_run(fn, value):
    from autograder.mutation.equivalence import call_with

    B, H, r, e, n, v, T, d, dtype, seed = value
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    return call_with(fn, (draw(B, H, n), draw(B, H, e), draw(B, T, r), draw(B, T, e), draw(H, r, n), draw(H, r, v),
                          draw(H * v, d)))


# -- ex6: snapkv_keep -----------------------------------------------------------------------------------------------

def _snapkv_inputs(ns: dict):
    def build(draw):
        H, w = draw(st.integers(1, 3)), draw(st.integers(0, 4))
        N = draw(st.integers(max(w, 1), w + 12))
        budget = draw(st.integers(w, N))
        return H, w, N, budget, draw(st.sampled_from(_FLOATS)), draw(st.sampled_from(["random", "uniform", "few"])), \
            draw(st.integers(0, 2**16)), "cpu"
    return st.composite(lambda draw: build(draw))()


def _snapkv_corners(ns: dict) -> list:
    return [(1, 2, 2, 2, torch.float32, "random", 0, "cpu"),        # a 2-token context, all of it the window
            (2, 4, 40, 12, torch.float32, "random", 1, "cpu"), (3, 8, 100, 8, torch.float32, "random", 2, "cpu"),
            (1, 2, 10, 10, torch.float32, "random", 3, "cpu"), (2, 0, 5, 3, torch.float64, "uniform", 4, "cpu"),
            (2, 3, 9, 3, torch.bfloat16, "few", 5, "cpu"), (2, 2, 8, 5, torch.float32, "random", 6, "meta")]


def _snapkv_run(fn, value):
    from autograder.mutation.equivalence import call_with

    H, w, N, budget, dtype, kind, seed, device = value
    g = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        scores = torch.full((H, w, N), 1.0 / N)
    elif kind == "few":                                     # few distinct values: ties among the votes
        scores = torch.randint(0, 3, (H, w, N), generator=g).float().softmax(-1)
    else:
        scores = torch.rand(H, w, N, generator=g).softmax(-1)
    return call_with(fn, (scores.to(dtype).to(device), budget, w))


CONTRACTS = {
    "ex2_code": Contract("RingKVCache", _ring_inputs, run=_ring_run, corners=_ring_corners, examples=150),
    "ex5_code": Contract("absorbed_decode", _mla_inputs, run=_mla_run, corners=_mla_corners, examples=150),
    "ex6_code": Contract("snapkv_keep", _snapkv_inputs, run=_snapkv_run, corners=_snapkv_corners, examples=200),
}
