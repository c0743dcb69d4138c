"""Where a request's time to first token goes when prefill and decode run in two processes, measured.

    rows = ttft_breakdown("target", prompt_lengths=[64, 256, 448], modes=["colocated", "layerwise", "whole"])
    rows = ttft_breakdown(model, [64, 64, 64], arrivals_s=[0.0, 0.01, 0.02])     # open loop: given arrival times
    rows = ttft_breakdown(model, [256], link_bandwidth=100e6)                    # an EMULATED 100 MB/s link

Two real processes (`minigpt.parallel.launch.run_ranks`, gloo over loopback, one torch thread each):

    rank 0, prefill worker                       rank 1, decode worker
    ---------------------------------------      -----------------------------------------------------------
    colocated: prefill, K/V written into its     (idle)
      own paged pool, then the decode steps
    layerwise: prefill_and_send  --KV by layer-> receive_kv (GlooChannel) -> decode_from_blocks
    whole:     prefill_then_send --KV, at end--> receive_kv (GlooChannel) -> decode_from_blocks
               first token       --------------> (it starts the decode)

Requests are served one after another. Without `arrivals_s` each request arrives when the previous one has
finished (a closed loop: no queueing); with it, request i arrives at arrivals_s[i] and waits if the prefill
worker is busy. Each process reads time.perf_counter (CLOCK_MONOTONIC: one clock for all processes of a Linux
host) relative to rank 0's reading just after a barrier, broadcast to rank 1.

One row per (mode, request), seconds from the request's arrival unless said otherwise:
    queueing_s             prefill start - arrival
    prefill_s              the prefill's compute, embed to first token (layer-wise: the sends it starts included)
    transfer_s             from the end of the prefill until the LAST layer has arrived on the decode worker,
                           never below 0: for layer-wise the part of the transfer the compute did not hide
                           (colocated: 0, the K/V never leaves)
    decode_wait_s          from that arrival until the decode worker starts decoding (it was busy, or waited
                           for the first token's message)
    first_decode_step_s    the decode step that makes token 2
    ttft_s                 the CLIENT's time to first token, lab 11's one TTFT (goodput_sim and measured_goodput
                           count it the same way): arrival -> the first token leaves the worker the client streams
                           from. Colocated: the end of the prefill. Split: the client streams from the decode
                           worker (as behind vLLM's and SGLang's P/D proxies), which has the token (made by the
                           prefill, sent as a message of its own) once the last layer has arrived and it starts
                           the request: queueing + prefill + transfer (exposed) + decode_wait, the four parts
    time_to_second_token_s arrival -> token 2: ttft_s + first_decode_step_s. It is also a vLLM client's FIRST
                           token: vLLM's decode worker recomputes the last prompt position in a decode step of
                           its own (the proxy asks the prefill worker for max_tokens=1, unstreamed, and streams
                           the reply from the decode worker), so its client waits one decode step more
    e2e_s                  arrival -> last token
    kv_bytes               k and v bytes the channel sent (0 colocated); kv_bytes_formula the cache's size,
                           transfer_cost.kv_bytes_per_request at the model's element size (4 for fp32)
    tokens                 the greedy output, first token included (identical across modes)

On loopback the link is fast (GB/s) and the course model's cache small (2 * 6 * 2 * 64 * 4 = 6 KiB a token), so the
transfer is a small share of the prefill; `link_bandwidth` emulates a slower link (see GlooChannel) to show the
layer-wise overlap. Timings are of this machine at the moment: noisy, and never asserted by the tests.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist

from minigpt.cache.block_table import blocks_needed
from minigpt.checkpoint import load_model
from minigpt.disagg.channel import GlooChannel, KVMessage
from minigpt.disagg.clock import RunClock, shared_clock
from minigpt.disagg.layerwise import LayerRunner, prefill_and_send, prefill_then_send
from minigpt.disagg.receiver import DecodeKVStore, WriteIntoStore, decode_from_blocks, receive_kv
from minigpt.disagg.transfer_cost import kv_bytes_per_request
from minigpt.model import GPT
from minigpt.parallel.comm import CountingComm
from minigpt.parallel.launch import run_ranks
from minigpt.costmodel.calculators import ModelShape

__all__ = ["MODES", "ttft_breakdown", "random_prompts"]

MODES = ("colocated", "layerwise", "whole")
_PRODUCERS = {"layerwise": prefill_and_send, "whole": prefill_then_send}
_FIRST_TAG, _DONE_TAG = 21, 22            # the first token (rank 0 -> 1), a request finished (rank 1 -> 0)


def random_prompts(lengths: Sequence[int], vocab_size: int, seed: int = 0) -> list[list[int]]:
    """One prompt of random token ids per length, from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]


def ttft_breakdown(model: GPT | str | Path = "target", prompt_lengths: Sequence[int] = (64, 256, 448),
                   modes: Sequence[str] = MODES, *, prompts: Sequence[Sequence[int]] | None = None,
                   max_new_tokens: int = 8, arrivals_s: Sequence[float] | None = None,
                   link_bandwidth: float | None = None, block_size: int = 16, seed: int = 0,
                   recv_timeout_s: float = 30.0, timeout_s: float = 120.0, warmup: bool = True) -> list[dict[str, Any]]:
    """Serve the prompts in each mode on two processes; one row per (mode, request) (module docstring).

    model: a GPT or a checkpoint name ("target"). prompts: token ids (default: random ones of `prompt_lengths`).
    link_bandwidth: bytes/s of an EMULATED link on top of loopback (None: loopback as it is).
    """
    model = load_model(model) if isinstance(model, (str, Path)) else model
    cfg = model.config
    prompts = [list(map(int, p)) for p in prompts] if prompts is not None else \
        random_prompts(prompt_lengths, cfg.vocab_size, seed)
    modes = tuple(modes)
    if not prompts or any(not p for p in prompts):
        raise ValueError("need at least one prompt, none of them empty")
    if bad := [m for m in modes if m not in MODES]:
        raise ValueError(f"unknown mode(s) {bad}; choose among {list(MODES)}")
    if too_long := [len(p) for p in prompts if len(p) + max_new_tokens > cfg.max_seq_len]:
        raise ValueError(f"prompt length(s) {too_long} + max_new_tokens {max_new_tokens} exceed the model's context "
                         f"of {cfg.max_seq_len} tokens")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if arrivals_s is not None:
        arrivals_s = [float(a) for a in arrivals_s]
        if len(arrivals_s) != len(prompts) or any(b < a for a, b in zip(arrivals_s, arrivals_s[1:])) \
                or arrivals_s[0] < 0:
            raise ValueError(f"arrivals_s must give one non-decreasing time >= 0 per prompt ({len(prompts)}), "
                             f"got {arrivals_s}")
    plan = dict(prompts=prompts, modes=modes, max_new_tokens=max_new_tokens, arrivals_s=arrivals_s,
                link_bandwidth=link_bandwidth, block_size=block_size, recv_timeout_s=recv_timeout_s, warmup=warmup)
    prefill_side, decode_side = run_ranks(_serve, 2, model, plan, backend="gloo", timeout_s=timeout_s,
                                          collective_timeout_s=max(30.0, recv_timeout_s))
    shape = ModelShape.from_config(cfg, "model")
    element = torch.finfo(model.dtype).bits // 8
    rows = []
    for mode in modes:
        for i, prompt in enumerate(prompts):
            p, d = prefill_side[mode][i], (decode_side[mode] or [None] * len(prompts))[i]
            row = {"mode": mode, "request": i, "prompt_tokens": len(prompt), **_timings(p, d),
                   "kv_bytes_formula": kv_bytes_per_request(shape, len(prompt), element),
                   "link": "none (one process)" if mode == "colocated" else _link_name(link_bandwidth),
                   "closed_loop": arrivals_s is None}
            rows.append(row)
    return rows


def _link_name(bandwidth: float | None) -> str:
    if bandwidth is None:
        return "loopback (gloo over TCP, measured)"
    return f"EMULATED {bandwidth / 1e6:g} MB/s (receiver-side delay on top of loopback)"


def _timings(p: dict[str, Any], d: dict[str, Any] | None) -> dict[str, Any]:
    """One request's figures from the two processes' timestamps (seconds since the shared start)."""
    arrival = p["arrival"]
    if d is None:                                        # colocated: all on rank 0
        kv_ready, decode_start, second, done = p["prefill_end"], p["prefill_end"], p["second"], p["done"]
        tokens, kv_received = p["tokens"], 0
    else:
        kv_ready, decode_start, second, done = d["last_arrival"], d["decode_start"], d["second"], d["done"]
        tokens, kv_received = d["tokens"], d["kv_bytes_received"]
    return {
        "arrival_s": arrival,
        "queueing_s": p["prefill_start"] - arrival,
        "prefill_s": p["prefill_end"] - p["prefill_start"],
        "transfer_s": max(0.0, kv_ready - p["prefill_end"]),
        "decode_wait_s": max(0.0, decode_start - max(kv_ready, p["prefill_end"])),
        "first_decode_step_s": None if second is None else second - decode_start,
        "ttft_s": max(decode_start, p["prefill_end"]) - arrival,
        "time_to_second_token_s": None if second is None else second - arrival,
        "e2e_s": done - arrival,
        "kv_bytes": p["kv_bytes"], "kv_bytes_received": kv_received, "header_bytes": p["header_bytes"],
        "first_token": p["first_token"], "tokens": tokens,
    }


# ------------------------------------------------------------------------------------------- inside the ranks

def _serve(comm: CountingComm, model: GPT, plan: dict[str, Any]) -> dict[str, list[dict[str, Any]] | None]:
    """Both ranks: every mode in turn, a barrier and a fresh shared clock before each."""
    rank = comm.rank
    runner = LayerRunner(model)
    longest = max(len(p) for p in plan["prompts"]) + plan["max_new_tokens"]
    store = DecodeKVStore.for_model(model, blocks_needed(longest, plan["block_size"]) + 1, plan["block_size"])
    if plan["warmup"]:                                   # first calls are slow (allocations, thread pools)
        _colocated(runner, store, [plan["prompts"][0][:32]], 2, None, RunClock(time.perf_counter()))
    out: dict[str, list[dict[str, Any]] | None] = {}
    for mode in plan["modes"]:
        now = shared_clock()
        if mode == "colocated":
            out[mode] = _colocated(runner, store, plan["prompts"], plan["max_new_tokens"], plan["arrivals_s"], now) \
                if rank == 0 else None
            continue
        channel = GlooChannel(1 - rank, block_size=plan["block_size"], emulated_bandwidth=plan["link_bandwidth"])
        try:
            if rank == 0:
                out[mode] = _prefill_worker(runner, channel, _PRODUCERS[mode], plan, now)
            else:
                out[mode] = _decode_worker(model, store, channel, plan, now)
        finally:
            channel.close()
    return out


def _wait_for_arrival(i: int, arrivals_s: Sequence[float] | None, now: RunClock) -> float:
    """Closed loop: the request arrives now. Open loop: at arrivals_s[i] (sleep until then if early)."""
    if arrivals_s is None:
        return now()
    time.sleep(max(0.0, arrivals_s[i] - now()))
    return arrivals_s[i]


def _colocated(runner: LayerRunner, store: DecodeKVStore, prompts: list[list[int]], max_new_tokens: int,
               arrivals_s: Sequence[float] | None, now: RunClock) -> list[dict[str, Any]]:
    records = []
    for i, prompt in enumerate(prompts):
        arrival = _wait_for_arrival(i, arrivals_s, now)
        blocks = store.allocate(blocks_needed(len(prompt), store.block_size))
        start = now()
        first = prefill_and_send(runner, prompt, WriteIntoStore(store, blocks), f"r{i}")
        end = now()
        stamps: list[float] = []
        tokens = [first] + decode_from_blocks(runner.model, store, blocks, len(prompt), first, max_new_tokens - 1,
                                              on_token=lambda _: stamps.append(now()))
        store.free(blocks)
        records.append(dict(arrival=arrival, prefill_start=start, prefill_end=end, first_token=first,
                            second=stamps[0] if stamps else None, done=now(), tokens=tokens, kv_bytes=0,
                            header_bytes=0))
    return records


def _prefill_worker(runner: LayerRunner, channel: GlooChannel, producer, plan: dict[str, Any], now: RunClock
                    ) -> list[dict[str, Any]]:
    records, first_sends = [], []
    for i, prompt in enumerate(plan["prompts"]):
        arrival = _wait_for_arrival(i, plan["arrivals_s"], now)
        kv0, header0 = channel.kv_bytes_sent, channel.header_bytes_sent
        start = now()
        first = producer(runner, prompt, channel, f"r{i}")
        end = now()
        token = torch.tensor([first], dtype=torch.int64)
        first_sends.append((dist.isend(token, 1, tag=_FIRST_TAG), token))
        records.append(dict(arrival=arrival, prefill_start=start, prefill_end=end, first_token=first,
                            kv_bytes=channel.kv_bytes_sent - kv0, header_bytes=channel.header_bytes_sent - header0))
        if plan["arrivals_s"] is None:                  # closed loop: the next request comes once this one is done
            dist.recv(torch.empty(1, dtype=torch.int64), 1, tag=_DONE_TAG)
    channel.flush()
    for work, _ in first_sends:
        work.wait()
    return records


class _Tally:
    """Counts the k, v bytes of the messages a consumer takes from a channel (per request, exactly)."""

    def __init__(self, channel: GlooChannel) -> None:
        self.channel, self.kv_bytes = channel, 0

    def recv(self, timeout_s: float) -> KVMessage:
        msg = self.channel.recv(timeout_s)
        self.kv_bytes += msg.k.nbytes + msg.v.nbytes
        return msg


def _decode_worker(model: GPT, store: DecodeKVStore, channel: GlooChannel, plan: dict[str, Any], now: RunClock
                   ) -> list[dict[str, Any]]:
    channel.start_receiving()                           # messages flow even while this process decodes
    records = []
    n_layers = len(model.layers)
    for i, prompt in enumerate(plan["prompts"]):
        tally = _Tally(channel)
        blocks = receive_kv(tally, f"r{i}", n_layers, len(prompt), store, timeout_s=plan["recv_timeout_s"])
        first = torch.empty(1, dtype=torch.int64)
        dist.recv(first, 0, tag=_FIRST_TAG)
        decode_start = now()
        stamps: list[float] = []
        tokens = [int(first)] + decode_from_blocks(model, store, blocks, len(prompt), int(first),
                                                   plan["max_new_tokens"] - 1, on_token=lambda _: stamps.append(now()))
        store.free(blocks)
        done = now()
        if plan["arrivals_s"] is None:
            dist.send(torch.ones(1, dtype=torch.int64), 0, tag=_DONE_TAG)
        last = now.at(max(channel.arrived_at[(f"r{i}", layer)] for layer in range(n_layers)))
        records.append(dict(last_arrival=last, decode_start=decode_start, second=stamps[0] if stamps else None,
                            done=done, tokens=tokens, kv_bytes_received=tally.kv_bytes))
    return records
