"""Lab 11's contracts (disaggregation, MoE): the differential tests that show a mutant equivalent.

ex3_code  receive_kv(channel, request_id, n_layers, n_tokens, store) -> block table. Driven through a scripted
          transfer: a decode-side store (1 to 3 layers, MHA/GQA/MQA, blocks of 1 to 4, some blocks already held by
          other requests, fewer free blocks than needed too), a prompt of 1 to 9 tokens, and a channel whose script
          delivers the request's layers in any order, with each message in flight up to 2 s (a slow link), or breaks
          (TransferError), times out (TransferTimeout), brings a message that does not belong (another request's, a
          layer twice, a layer past the model), or loses a message: then a `recv` with a timeout raises
          TransferTimeout once that timeout has passed, and a `recv` without one never returns (reported as
          `Raised("ReceiveHung")`, where a real channel would hang). The exercise fixes no timeout value, so any
          timeout of at least the longest flight time is the contract's. Compared: the return value or exception
          type, the recv calls made, and the store afterwards (blocks held, every block's K/V).
ex4_code  moe_forward(x, probabilities, experts, top_k) -> (N, d_model): x of 0 to 9 tokens (float32, float64,
          bfloat16; the meta device), 1 to 6 experts, top_k 1 to E. Compared: the output and the rows each expert was
          called with (the check counts them).
ex5_code  ep_dispatch / ep_combine: EP size 1 to 4, any placement (ranks that own no expert), 0 to 8 tokens, top-k
          distinct experts per token, capacity None or 0 up to every assignment; the judge's all-to-all played here
          (each row's expert output), then the cell's own ep_combine. Compared: rows and expert ids per rank, and the
          combined output.
ex6_code  eplb_placement(load, n_ranks, slots_per_rank): token counts (int64 or float64 tensors, zeros allowed), 1 to
          10 experts, 1 to 4 ranks, at least as many slots as experts. Compared: the placement.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised, call_with

# -- ex3: receive_kv ------------------------------------------------------------------------------------------------

MAX_FLIGHT_S = 2.0          # the longest a message of the contract is in flight


class ReceiveHung(Exception):
    """A recv with no timeout on a stream whose next message was lost: a real channel never returns."""


class _Channel:
    """The decode side's end of a scripted transfer, on a simulated clock. Script items: ("msg", request_id, layer,
    flight_s), ("break",), ("timeout",), ("lost",); after the script, every message is lost."""

    def __init__(self, script, messages) -> None:
        self.script, self.messages, self.calls = list(script), messages, []

    def recv(self, timeout_s: float | None = 10.0):
        from minigpt.disagg.channel import TransferError, TransferTimeout

        if timeout_s is not None and type(timeout_s) not in (int, float):
            raise TypeError(f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}")
        item = self.script.pop(0) if self.script else ("lost",)
        if item[0] == "msg" and (timeout_s is None or item[3] <= timeout_s):
            self.calls.append("delivered")
            return self.messages[(item[1], item[2])]
        if item[0] == "break":
            self.calls.append("broke")
            raise TransferError("the prefill worker's connection was lost")
        if timeout_s is None:
            self.calls.append("hung")
            raise ReceiveHung("recv without a timeout on a lost message")
        if item[0] == "msg":        # still in flight when the timeout passed: it arrives for the next recv
            self.script.insert(0, ("msg", item[1], item[2], 0.0))
        self.calls.append("timed out")
        raise TransferTimeout(f"no KV message within {timeout_s} s")


def _receive_inputs(ns: dict):
    def build(draw):
        n_layers = draw(st.integers(1, 3))
        n_kv_heads, head_dim = draw(st.sampled_from([(1, 2), (2, 2), (2, 4)]))
        block_size = draw(st.integers(1, 4))
        n_tokens = draw(st.integers(1, 9))
        others = draw(st.integers(0, 3))
        need = math.ceil(n_tokens / block_size)
        num_blocks = others + need + draw(st.sampled_from([-1, 0, 0, 0, 0, 1, 3]))
        num_blocks = max(num_blocks, others, 1)
        order = draw(st.permutations(range(n_layers)))
        script = [("msg", "req", layer, draw(st.sampled_from([0.0, 0.01, 1.0, MAX_FLIGHT_S]))) for layer in order]
        fault = draw(st.sampled_from(["none", "none", "break", "timeout", "lost", "other request", "twice",
                                      "past the model", "negative layer"]))
        at = draw(st.integers(0, len(script)))
        bad = {"break": ("break",), "timeout": ("timeout",), "lost": ("lost",),
               "other request": ("msg", "old", 0, 0.0), "twice": ("msg", "req", order[0], 0.0),
               "past the model": ("msg", "req", n_layers, 0.0), "negative layer": ("msg", "req", -1, 0.0)}
        if fault != "none":
            script.insert(at, bad[fault])
        return (n_layers, n_kv_heads, head_dim, block_size, num_blocks, others, n_tokens, script,
                draw(st.integers(0, 2**16)))
    return st.composite(lambda draw: build(draw))()


def _receive_corners(ns: dict) -> list:
    return [
        (1, 1, 2, 1, 2, 0, 2, [("msg", "req", 0, 0.0)], 0),                          # 1 layer, 2 tokens
        (3, 2, 2, 4, 12, 4, 9, [("msg", "req", 2, 1.0), ("msg", "req", 0, 0.0), ("msg", "req", 1, 2.0)], 1),
        (2, 2, 2, 4, 12, 4, 9, [("msg", "req", 0, 0.0), ("lost",)], 2),               # a lost message
        (2, 2, 2, 4, 12, 4, 9, [("msg", "req", 0, 0.0)], 3),                          # the stream ends early
        (2, 2, 2, 4, 12, 4, 9, [("msg", "req", 0, 0.0), ("break",), ("msg", "req", 1, 0.0)], 4),
        (2, 2, 2, 4, 12, 4, 9, [("msg", "old", 0, 0.0), ("msg", "req", 0, 0.0), ("msg", "req", 1, 0.0)], 5),
        (2, 1, 2, 2, 5, 4, 3, [("msg", "req", 0, 0.0), ("msg", "req", 1, 0.0)], 6),   # too few free blocks
    ]


def _receive_run(fn, value):
    from minigpt.cache.paged import PagedKVCache
    from minigpt.config import ModelConfig
    from minigpt.disagg.channel import KVMessage
    from minigpt.disagg.receiver import DecodeKVStore

    n_layers, n_kv_heads, head_dim, block_size, num_blocks, others, n_tokens, script, seed = value
    cfg = ModelConfig(vocab_size=16, max_seq_len=64, d_model=n_kv_heads * head_dim * 2, n_layers=n_layers,
                      n_heads=n_kv_heads * 2, n_kv_heads=n_kv_heads, d_ff=8)
    store = DecodeKVStore(PagedKVCache.for_model(cfg, num_blocks, block_size))
    g = torch.Generator().manual_seed(seed)
    held = store.allocate(others)
    for layer in range(n_layers):
        shape = (len(held) * block_size, n_kv_heads, head_dim)
        store.write(layer, held, torch.randn(shape, generator=g), torch.randn(shape, generator=g))
    messages = {}
    for rid in ("req", "old"):
        for layer in range(-1, n_layers + 1):
            shape = (n_tokens, n_kv_heads, head_dim)
            messages[(rid, layer)] = KVMessage(rid, layer, torch.randn(shape, generator=g),
                                               torch.randn(shape, generator=g), [0, 1, 2])
    channel = _Channel(script, messages)
    got = call_with(fn, (channel, "req", n_layers, n_tokens, store))
    every = list(range(num_blocks))
    contents = [store.read(layer, every, num_blocks * block_size) for layer in range(n_layers)]
    return got, channel.calls, [b for b in every if not store.pool.is_free(b)], store.num_free, contents


# -- ex4: moe_forward -----------------------------------------------------------------------------------------------

_DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def _moe_inputs(ns: dict):
    return st.integers(1, 6).flatmap(lambda e: st.tuples(
        st.integers(0, 9), st.integers(1, 6), st.just(e), st.integers(1, e), st.sampled_from(_DTYPES),
        st.integers(0, 2**16), st.just("cpu")))


def _moe_corners(ns: dict) -> list:
    return [(0, 4, 3, 2, torch.float32, 0, "cpu"), (1, 1, 1, 1, torch.float32, 1, "cpu"),
            (5, 4, 4, 4, torch.float64, 2, "cpu"), (6, 3, 5, 2, torch.bfloat16, 3, "cpu"),
            (4, 4, 3, 2, torch.float32, 4, "meta")]


def _moe_run(fn, value):
    n, d, n_experts, top_k, dtype, seed, device = value
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g).to(dtype)
    gate = torch.randn(d, n_experts, generator=g).to(dtype)
    weights = [(torch.randn(d, d, generator=g).to(dtype), torch.randn(d, generator=g).to(dtype))
               for _ in range(n_experts)]
    if device == "meta":
        x, gate = x.to("meta"), gate.to("meta")
        weights = [(w.to("meta"), b.to("meta")) for w, b in weights]
    calls = [[] for _ in range(n_experts)]

    def probabilities(rows):
        return torch.softmax(rows @ gate, dim=-1)

    def expert(e):
        def run(rows):
            calls[e].append(rows.detach().clone())
            return torch.tanh(rows @ weights[e][0] + weights[e][1])
        return run

    got = call_with(fn, (x, probabilities, [expert(e) for e in range(n_experts)], top_k))
    return got, calls


# -- ex5: ep_dispatch, ep_combine -----------------------------------------------------------------------------------

def _ep_inputs(ns: dict):
    def build(draw):
        n_ranks = draw(st.integers(1, 4))
        n_experts = draw(st.integers(1, 6))
        top_k = draw(st.integers(1, n_experts))
        n_tokens = draw(st.integers(0, 8))
        placement = draw(st.lists(st.integers(0, n_ranks - 1), min_size=n_experts, max_size=n_experts))
        ids = [draw(st.permutations(range(n_experts)))[:top_k] for _ in range(n_tokens)]
        capacity = draw(st.one_of(st.none(), st.integers(0, max(1, n_tokens * top_k))))
        return (n_tokens, draw(st.integers(1, 5)), ids, placement, n_ranks, capacity,
                draw(st.sampled_from([torch.float32, torch.float64])), draw(st.integers(0, 2**16)))
    return st.composite(lambda draw: build(draw))()


def _ep_corners(ns: dict) -> list:
    return [(0, 4, [], [0, 1], 2, None, torch.float32, 0),                          # no token
            (3, 4, [[0], [0], [0]], [0], 1, None, torch.float32, 1),                 # EP size 1
            (3, 4, [[0, 1], [1, 0], [0, 1]], [0, 0], 3, None, torch.float32, 2),     # ranks with no expert
            (4, 4, [[0, 1], [1, 0], [0, 1], [1, 0]], [0, 1], 2, 1, torch.float64, 3),
            (4, 4, [[0, 1], [1, 0], [0, 1], [1, 0]], [1, 0], 2, 0, torch.float32, 4)]  # capacity 0: all dropped


def _ep_run(fn, value):
    n_tokens, d, ids, placement, n_ranks, capacity, dtype, seed = value
    g = torch.Generator().manual_seed(seed)
    top_k = len(ids[0]) if ids else 1
    x = torch.randn(n_tokens, d, generator=g).to(dtype)
    expert_ids = torch.tensor(ids, dtype=torch.long).reshape(n_tokens, top_k)
    w = torch.rand(n_tokens, top_k, generator=g).to(dtype) + 0.1
    w = w / w.sum(-1, keepdim=True)
    scale = torch.randn(len(placement), d, generator=g).to(dtype)
    sent = call_with(fn, (x, expert_ids, placement, n_ranks, capacity))
    if isinstance(sent, Raised):
        return sent
    rows, experts, plan = sent
    returned = [torch.tanh(chunk * scale[ex]) if len(ex) else chunk.clone() for chunk, ex in zip(rows, experts)]
    combined = call_with(fn.__globals__["ep_combine"], (returned, plan, w, n_tokens))
    return rows, experts, combined


# -- ex6: eplb_placement --------------------------------------------------------------------------------------------

def _eplb_inputs(ns: dict):
    def build(draw):
        n_experts = draw(st.integers(1, 10))
        n_ranks = draw(st.integers(1, 4))
        slots = draw(st.integers(max(1, math.ceil(n_experts / n_ranks)), math.ceil(n_experts / n_ranks) + 3))
        load = draw(st.lists(st.one_of(st.integers(0, 12), st.integers(0, 2000)), min_size=n_experts,
                             max_size=n_experts))
        return load, draw(st.sampled_from([torch.int64, torch.float64])), n_ranks, slots
    return st.composite(lambda draw: build(draw))()


def _eplb_corners(ns: dict) -> list:
    return [([5], torch.int64, 1, 1), ([0, 0, 0], torch.int64, 2, 2), ([100] * 8, torch.float64, 4, 2),
            ([600, 40, 35, 30, 25, 20], torch.float64, 2, 4), ([90, 10, 50, 40, 70, 30], torch.float64, 3, 2),
            ([3, 3, 1, 1, 1], torch.int64, 2, 4), ([7, 1, 1, 1, 1, 1, 1], torch.int64, 3, 4),
            # replicas' shares in thirds: ranks whose loads tie in exact arithmetic, compared after rounding
            ([6, 7, 3, 11, 3, 0, 2, 3, 7, 28], torch.int64, 3, 7), ([4, 18, 40, 3, 0, 15, 50, 6, 12, 3], torch.float64, 3, 5)]


def _eplb_run(fn, value):
    load, dtype, n_ranks, slots = value
    return call_with(fn, (torch.tensor(load, dtype=dtype), n_ranks, slots))


CONTRACTS = {
    "ex3_code": Contract("receive_kv", _receive_inputs, run=_receive_run, corners=_receive_corners, examples=150),
    "ex4_code": Contract("moe_forward", _moe_inputs, run=_moe_run, corners=_moe_corners, examples=80),
    "ex5_code": Contract("ep_dispatch", _ep_inputs, run=_ep_run, corners=_ep_corners, examples=200),
    "ex6_code": Contract("eplb_placement", _eplb_inputs, run=_eplb_run, corners=_eplb_corners, examples=300),
}
