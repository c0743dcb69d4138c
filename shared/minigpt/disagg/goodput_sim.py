"""DistServe's question on lab 00's roofline: run prefill and decode on every GPU, or split the GPUs between them?

    wl = make_workload(500, rate=40.0, prompt_len=4096, output_len=128, seed=0)     # 40 req/s for 4 GPUs
    co = simulate_colocated(wl, n_gpus=4)
    dis = simulate_disaggregated(wl, prefill_gpus=3, decode_gpus=1)
    goodput(co, ttft_limit=1.0, itl_limit=0.02, per_gpu=True)       # 6.38 req/s per GPU meet both SLOs
    goodput(dis, ttft_limit=1.0, itl_limit=0.02, per_gpu=True)      # 10.0: all of the offered 10 per GPU
    best_placement(40.0, 4, prompt_len=4096)                        # Placement(prefill_gpus=3, decode_gpus=1, ...)
    rows = sweep([16, 24, 32, 40], [1024, 2048, 4096], n_gpus=4)    # a table: one row per (prompt, rate)
    rows = sweep([40, 48], [4096], n_gpus=4, chunks=(8192, 512))     # ... and colocated with chunked prefill too
    bursty = make_workload(500, 40.0, prompt_len=4096, burstiness=3.0)   # gaps with 3x a Poisson stream's spread

What is modelled. Every worker is one GPU (`SimConfig.gpu`, an H100 SXM by default) holding the whole model
(Llama-3-8B by default, bf16 weights and KV cache). Steps are priced by lab 00's rule, `calculators.forward_kernels`
and `kernels_time`, so no model runs:
* a prefill step of whole prompts L_i: rows sum L_i, sum L_i(L_i+1)/2 causal (query, key) pairs, sum L_i K/V written
  (15.8 ms for 1024 tokens of Llama-3-8B on an H100, 32 ms for 2048, 67 ms for 4096: compute-bound);
* a decode step of B requests with contexts summing to S: forward_kernels(B, S, S) = a[B] + b * S, the weights read
  once (4.5 ms at B = 1) plus 0.039 us per cached token (0.16 ms per 4K-token request): memory-bound;
* a chunked-prefill step (only when `SimConfig.chunked_prefill` is set): the decodes and the prompt chunks in one pass.
Requests arrive as a Poisson process (`make_workload`, seeded numpy generator), or in bursts (`burstiness` > 1: gamma
gaps whose coefficient of variation is `burstiness`, the same mean); each has a prompt and an output length, fixed
or uniform in a range. Request i goes to worker i % n (round robin; no load-aware router).

Colocated: n identical workers, each one vLLM engine with continuous batching and V0's default policy without chunked
prefill: whenever waiting prompts can be admitted, the next step prefills them (first come first served, up to
`token_budget` tokens) and every running decode waits for that step; otherwise a decode step. That wait is the
prefill interference this lab is about: a 4096-token prompt stalls every running request for 67 ms, fifteen decode
steps' worth, so the mean gap between tokens (TPOT) becomes about decode step / (1 - f), f the share of time the GPU
spends prefilling, and the worst gap is a whole prefill.

Disaggregated: P prefill workers (a queue each, prompts batched up to `token_budget`, or one at a time) and D decode
workers (continuous batching of decodes only). A request's KV cache moves over `SimConfig.link` (one InfiniBand NDR
port by default) as `transfer_cost` prices it: layer by layer while the prefill computes, so only the exposed tail
delays it (0.34 ms for 4096 tokens; the whole 512 MiB after the prefill would take 10.7 ms). The first token, made by
the prefill, travels with the cache; the decode worker streams it when it takes the request into its batch, at its
next step boundary once the cache has arrived (or later, when it waits for room).

TTFT is the client's, in both modes: arrival to the first token the client receives. Colocated: queue + prefill (the
worker that prefilled streams it). Disaggregated: queue + prefill + exposed transfer + the wait for the decode
worker's step boundary (the client streams from the decode worker, as behind vLLM's and SGLang's P/D proxies).
SGLang's decode worker, like this simulator's, streams the token the prefill made; vLLM's recomputes the last prompt
position in its first decode step, so a vLLM client waits one decode step more (lab 11's `ttft` module measures
that path as `time_to_second_token_s`).

Per request: TTFT (above), TPOT = (t_n - t_1) / (n - 1) (the mean inter-token latency, DistServe's decode SLO and
`engine.metrics.goodput`'s), the largest gap, and every gap (`SimResult.itls`). Goodput = offered rate x the share
of requests with TTFT <= ttft_limit AND TPOT <= itl_limit, per GPU when divided by the GPUs it took.

The SLOs the lab starts from, and why: TTFT <= 1 s (a chat reply that starts within a second) and TPOT <= 20 ms (50
tokens/s, faster than anyone reads, so the stream never stutters). 20 ms is a TIGHT decode SLO here, about 4x the 4.5
ms floor of one decode step of an 8B model on an H100; 50 ms, a common figure for larger models, is loose for this
one: both modes meet it until the GPUs saturate, so it only shows where the raw throughput ends.

Where disaggregation wins and where it loses (defaults, 4 GPUs, 128 output tokens, 500 requests, seed 0):
* long prompts, tight ITL, AGAINST COLOCATION WITHOUT CHUNKED PREFILL (vLLM's V0 default): 4096-token prompts at 10
  req/s per GPU, colocated serves 6.4 req/s per GPU within both SLOs (its prefills push TPOT past 20 ms), the best
  split (3 prefill + 1 decode) all 10;
* the same against colocation WITH chunked prefill at a small budget (`SimConfig(chunked_prefill=512)`; vLLM's V1
  always chunks, its budget is `--max-num-batched-tokens`): a tie at 10 req/s per GPU, and colocation serves all 12
  at 12 req/s per GPU where the best split serves 3.4. On this roofline a decode step is memory-bound and leaves
  most of the GPU's FLOPs idle; a prompt chunk of a few hundred tokens rides in it almost free, which no split of
  identical one-GPU workers can match. Bursty arrivals, tighter targets and longer prompts do not change that here
  (lab 11, section 4); where splits do pay is outside this model (see Not modelled);
* short prompts or light load: both meet every SLO, a tie; disaggregation only adds a transfer and a queue;
* loose ITL and too few GPUs to split: 2048-token prompts on 2 GPUs at 20 req/s per GPU with TPOT <= 50 ms,
  colocated serves all 20, one prefill + one decode GPU only 8: a single prefill GPU saturates at 31 prompts/s while
  the decode GPU idles, and colocated workers share both kinds of work.
Disaggregation does not raise raw throughput (vLLM's docs on disaggregated prefilling say so in a note: "Disaggregated
prefill DOES NOT improve throughput", docs.vllm.ai v0.8.0 to latest, features/disagg_prefill). Every request needs the
same prefill FLOPs and the same decode steps wherever they run; splitting only rearranges them, and a fixed integer
split matches the work's ratio only by luck, so one pool saturates while the other idles. What it buys is latency
control: decode steps are never stalled by a prefill (TPOT and tail ITL set by the decode pool alone), and TTFT and
ITL can be tuned separately (how many GPUs, or which parallelism, each phase gets): the two reasons vLLM's page gives.

Not modelled: chunked prefill unless asked (`SimConfig.chunked_prefill`); what makes production splits pay against
chunked colocation: a different parallelism per phase (DistServe sizes TP and PP per phase; DeepSeek serves prefill
and decode at different expert-parallel widths), different hardware per phase (Splitwise), a cluster-wide KV cache
pool (Mooncake), and the cost of mixed batches in real kernels; preemption (a request reserves KV for its
prompt and whole output when admitted, vLLM allocates as it goes and preempts when out), prefix caching, tensor or
pipeline parallelism (every worker is one GPU), a load-aware router, contention on the links (each prefill-decode
pair has its own; one 4096-token cache keeps an NDR port busy 11 ms per 67 ms prefill), the prefill side's memory,
the CPU's scheduling time and any kernel launch overhead. The clock is each worker's own, step by step; decode steps
between two events (an arrival, a request joining or finishing) are computed together, since only the contexts
change. A run must last several request lifetimes (n_requests / rate well above the time one request takes), or an
overloaded system has no time to show it.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, NamedTuple, Sequence, Union

import numpy as np

from minigpt.disagg.transfer_cost import LINKS, exposed_after_compute, kv_bytes_per_request, transfer_time
from minigpt.costmodel.calculators import PRESETS, forward_kernels, kernels_time, kv_bytes_per_token, weight_bytes
from minigpt.costmodel.hardware import ACCELERATORS

__all__ = ["SimConfig", "Workload", "make_workload", "RooflineCosts", "costs_for", "SimResult", "simulate_colocated",
           "simulate_disaggregated", "goodput", "Placement", "best_placement", "sweep", "DEFAULT_TTFT_S",
           "DEFAULT_ITL_S"]

# The SLOs the lab starts from (see the module docstring for why these two numbers).
DEFAULT_TTFT_S = 1.0
DEFAULT_ITL_S = 0.020

Lengths = Union[int, tuple[int, int]]


# ---------------------------------------------------------------- what is simulated

@dataclass(frozen=True)
class SimConfig:
    """The hardware and the scheduler's knobs, shared by both modes (every GPU is one `gpu` holding the whole model).

    token_budget: tokens one prefill step may batch (vLLM's max_num_batched_tokens; without chunked prefill vLLM
        needs it >= max_model_len, so 8192 for an 8K model). A step takes waiting prompts first come first served
        while they fit, and always at least one.
    chunked_prefill: None (off, as vLLM's V0 engine ran by default) or a step's token budget with chunked prefill: each
        running decode takes one token of it, then waiting prompts are cut into chunks that fill the rest.
    max_batch: requests a worker holds at once (vLLM's max_num_seqs); the KV pool is the other limit.
    batch_prefills: a disaggregated prefill worker batches waiting prompts up to token_budget (True) or runs them
        one at a time (False).
    layerwise: the KV cache leaves layer by layer as the prefill computes it (only the exposed tail delays the
        request: transfer_cost.exposed_after_compute) or whole after the prefill.
    """

    model: str = "Llama-3-8B"
    gpu: str = "H100-SXM"
    link: str = "InfiniBand NDR (1 port)"
    token_budget: int = 8192
    chunked_prefill: int | None = None
    max_batch: int = 256
    batch_prefills: bool = True
    layerwise: bool = True
    memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        for name in ("token_budget", "max_batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"SimConfig.{name} must be a positive int, got {v!r}")
        if self.chunked_prefill is not None and (not isinstance(self.chunked_prefill, int)
                                                 or self.chunked_prefill <= self.max_batch):
            raise ValueError(f"SimConfig.chunked_prefill must be None or an int budget above max_batch="
                             f"{self.max_batch} (decodes take one token each), got {self.chunked_prefill!r}")
        for key, table in (("model", PRESETS), ("gpu", ACCELERATORS), ("link", LINKS)):
            if getattr(self, key) not in table:
                raise KeyError(f"unknown {key} {getattr(self, key)!r}; known: {list(table)}")


@dataclass(frozen=True)
class Workload:
    """n requests: arrival times in seconds (increasing), prompt and output lengths in tokens, the offered rate."""

    rate: float
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival)


def _lengths(spec: Lengths, n: int, rng: np.random.Generator, name: str) -> np.ndarray:
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"{name} must be at least 1 token, got {spec}")
        return np.full(n, int(spec), dtype=np.int64)
    lo, hi = spec
    if not 1 <= lo <= hi:
        raise ValueError(f"{name} range must be 1 <= lo <= hi, got {spec!r}")
    return rng.integers(lo, hi + 1, n)


def make_workload(n: int, rate: float, *, prompt_len: Lengths = 2048, output_len: Lengths = 128,
                  seed: int = 0, burstiness: float = 1.0) -> Workload:
    """n requests arriving at `rate` req/s on average; each length fixed (an int) or uniform in (lo, hi) inclusive.

    The gaps are unit-mean draws divided by `rate`, so one seed gives the same pattern at every rate, only
    compressed in time: a sweep over rates compares like with like. burstiness 1: exponential gaps (Poisson
    arrivals); b > 1: gamma gaps of shape 1 / b^2, whose standard deviation is b times their mean (requests come in
    clumps separated by long quiet stretches)."""
    if not isinstance(n, int) or n < 1 or not rate > 0:
        raise ValueError(f"need n >= 1 requests and rate > 0, got n={n!r}, rate={rate!r}")
    if not burstiness >= 1.0:
        raise ValueError(f"burstiness must be >= 1 (1 is a Poisson stream), got {burstiness!r}")
    rng = np.random.default_rng(seed)
    shape = 1.0 / burstiness ** 2
    gaps = rng.exponential(1.0, n) if burstiness == 1.0 else rng.gamma(shape, 1.0 / shape, n)
    arrival = np.cumsum(gaps) / rate
    return Workload(float(rate), arrival, _lengths(prompt_len, n, rng, "prompt_len"),
                    _lengths(output_len, n, rng, "output_len"))


# ---------------------------------------------------------------- step times on lab 00's roofline

class RooflineCosts:
    """Seconds of each kind of step on one GPU, priced by `calculators.forward_kernels` and `kernels_time`.

    A decode step of B requests whose contexts sum to S: forward_kernels(B, S, S), which is
        a[B] + b * S,   a[B] = time of the weight matmuls over B rows,  b = attention's time per cached token
    (attention's FLOPs and bytes both grow with S, so its roofline time is linear in S): precomputed once.
    """

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.shape, self.gpu, self.link = PRESETS[config.model], ACCELERATORS[config.gpu], LINKS[config.link]
        self.peak, self.bandwidth = self.gpu.peak("bf16"), self.gpu.memory_bandwidth
        self.a = [kernels_time({"weights": forward_kernels(self.shape, b, 0, 0)["weights"]}, self.peak, self.bandwidth)
                  for b in range(config.max_batch + 1)]
        flops, n_bytes = forward_kernels(self.shape, 1, 1, 1)["attention"]
        self.b = max(flops / self.peak, n_bytes / self.bandwidth)
        free = int(self.gpu.memory_bytes * config.memory_utilization) - weight_bytes(self.shape, 2)
        self.kv_capacity = max(0, free // kv_bytes_per_token(self.shape, 2))     # tokens of KV one worker holds

    def prefill_s(self, prompts: Sequence[int]) -> float:
        """One step prefilling whole prompts: rows = their tokens, L(L+1)/2 causal pairs each, their K/V written."""
        return self._prefill(tuple(sorted(int(n) for n in prompts)))

    def decode_step_s(self, batch: int, context_sum: int) -> float:
        """One decode step: `batch` new tokens attending over `context_sum` cached tokens in all."""
        return self.a[batch] + self.b * context_sum

    def mixed_step_s(self, batch: int, context_sum: int, chunks: Sequence[tuple[int, int]]) -> float:
        """A chunked-prefill step: `batch` decodes plus prompt chunks (start, n): n tokens after `start` cached."""
        rows = batch + sum(n for _, n in chunks)
        pairs = context_sum + sum(n * s + n * (n + 1) // 2 for s, n in chunks)
        kv_tokens = context_sum + sum(s + n for s, n in chunks)
        return kernels_time(forward_kernels(self.shape, rows, pairs, kv_tokens), self.peak, self.bandwidth)

    def transfer_s(self, prompts: Sequence[int], prefill_s: float) -> float:
        """What moving these prompts' KV cache to a decode worker adds after their prefill step (of `prefill_s`): the
        exposed tail of one message per layer sent as the layers compute (layerwise), or the whole cache as one
        message after it."""
        return self._transfer(tuple(sorted(int(n) for n in prompts)), prefill_s)

    # The same few batches of prompts come back thousands of times in a sweep: both are remembered.
    @lru_cache(maxsize=4096)
    def _prefill(self, prompts: tuple[int, ...]) -> float:
        rows = sum(prompts)
        pairs = sum(n * (n + 1) // 2 for n in prompts)
        return kernels_time(forward_kernels(self.shape, rows, pairs, rows), self.peak, self.bandwidth)

    @lru_cache(maxsize=4096)
    def _transfer(self, prompts: tuple[int, ...], prefill_s: float) -> float:
        kv = sum(kv_bytes_per_request(self.shape, n) for n in prompts)
        if not self.config.layerwise:
            return transfer_time(kv, self.link)
        layers = self.shape.n_layers
        return exposed_after_compute([prefill_s / layers] * layers, [transfer_time(kv // layers, self.link)] * layers)


@lru_cache(maxsize=16)
def costs_for(config: SimConfig) -> RooflineCosts:
    """One RooflineCosts per configuration (building the table of a[B] is the only slow part)."""
    return RooflineCosts(config)


# ---------------------------------------------------------------- one worker: a clock and its running decodes

class _Log:
    """Per-request results, filled in by the workers."""

    def __init__(self, wl: Workload) -> None:
        n = len(wl)
        self.wl = wl
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.tpot = np.zeros(n)
        self.max_itl = np.zeros(n)
        self.itls: list[np.ndarray] = []


class _Worker:
    """One GPU's clock and the requests decoding on it.

    Decode steps run back to back; every one emits one token per running request. Between two events (a request
    joins, a request finishes, a waiting request arrives) nothing changes but the contexts, which all grow by one
    token a step, so `decode_until` runs that stretch in one go: step j costs a[B] + b * (S + B * j).
    Invariant: `finishing` holds each decoding request once, keyed by the step count after which it is done.
    """

    def __init__(self, costs: RooflineCosts, log: _Log) -> None:
        self.costs, self.log = costs, log
        self.t = 0.0
        self.steps = 0                  # decode steps done
        self.context_sum = 0            # tokens the next decode step attends over, all running requests
        self.finishing: list[tuple[int, int]] = []
        self.held = 0                   # requests admitted (KV reserved) and not finished
        self.reserved = 0               # KV tokens reserved: prompt + output of each held request
        self.step_ends: list[np.ndarray] = []
        self.joined: list[tuple[int, int]] = []     # (request, steps when it joined the decodes)

    # queries
    def fits(self, requests: int, tokens: int) -> bool:
        """Could `requests` more requests holding `tokens` more KV tokens be admitted now?"""
        return (self.held + requests <= self.costs.config.max_batch
                and self.reserved + tokens <= self.costs.kv_capacity)

    @property
    def decoding(self) -> int:
        return len(self.finishing)

    # changes
    def admit(self, rid: int) -> None:
        self.held += 1
        self.reserved += int(self.log.wl.prompt[rid] + self.log.wl.output[rid])

    def start_decoding(self, rid: int) -> None:
        """`rid` has its first token (log.first_token set) and joins the decodes at the next step."""
        n = int(self.log.wl.output[rid])
        if n == 1:
            self._release(rid)
            return
        heapq.heappush(self.finishing, (self.steps + n - 1, rid))
        self.context_sum += int(self.log.wl.prompt[rid]) + 1
        self.joined.append((rid, self.steps))

    def stall(self, seconds: float) -> None:
        """A step without decodes (a whole-prompt prefill): every running request waits it out."""
        self.t += seconds

    def mixed_step(self, seconds: float) -> None:
        """A step that also decodes one token for every running request (chunked prefill)."""
        if self.decoding:
            self._emitted(np.array([self.t + seconds]))
        else:
            self.t += seconds

    def decode_until(self, t_event: float) -> None:
        """Decode steps until the first one that ends at or after `t_event`, or until a request finishes."""
        batch = self.decoding
        k_max = self.finishing[0][0] - self.steps
        dts = self.costs.a[batch] + self.costs.b * (self.context_sum + batch * np.arange(k_max, dtype=float))
        ends = self.t + np.cumsum(dts)
        k = min(k_max, int(np.searchsorted(ends, t_event)) + 1)
        self._emitted(ends[:k])

    def _emitted(self, ends: np.ndarray) -> None:
        k, batch = len(ends), self.decoding
        self.step_ends.append(ends)
        self.t = float(ends[-1])
        self.steps += k
        self.context_sum += batch * k
        while self.finishing and self.finishing[0][0] == self.steps:
            _, rid = heapq.heappop(self.finishing)
            self.context_sum -= int(self.log.wl.prompt[rid] + self.log.wl.output[rid])
            self._release(rid)

    def _release(self, rid: int) -> None:
        self.held -= 1
        self.reserved -= int(self.log.wl.prompt[rid] + self.log.wl.output[rid])
        self.log.finish[rid] = self.t

    def record_latencies(self) -> None:
        """Each decoded request's gaps between tokens, read off the decode steps' end times."""
        if not self.joined:
            return
        ends = np.concatenate(self.step_ends)
        between = np.diff(ends)             # between[j] = ends[j + 1] - ends[j]
        for rid, j0 in self.joined:
            n, t1 = int(self.log.wl.output[rid]), self.log.first_token[rid]
            first, rest = ends[j0] - t1, between[j0:j0 + n - 2]    # the gap to its second token, then the others
            self.log.tpot[rid] = (ends[j0 + n - 2] - t1) / (n - 1)
            self.log.max_itl[rid] = max(first, rest.max()) if n > 2 else first
            self.log.itls += [np.array([first]), rest]


def _take_waiting(ids: np.ndarray, nxt: int, ready: np.ndarray, t: float, prompts: np.ndarray, budget: int,
                  fits: Any, kv_need: np.ndarray) -> list[int]:
    """Waiting requests (first come first served from ids[nxt]) for one prefill step: ready by `t`, their prompts
    within `budget` tokens (the first one always), and `fits(count, kv_tokens)` for all of them together."""
    chosen: list[int] = []
    tokens = kv = 0
    while nxt + len(chosen) < len(ids):
        rid = int(ids[nxt + len(chosen)])
        too_many = chosen and tokens + prompts[rid] > budget
        if ready[rid] > t or too_many or not fits(len(chosen) + 1, kv + kv_need[rid]):
            break
        chosen.append(rid)
        tokens += int(prompts[rid])
        kv += int(kv_need[rid])
    return chosen


def _check_fits(wl: Workload, costs: RooflineCosts) -> None:
    need = int((wl.prompt + wl.output).max())
    if need > costs.kv_capacity:
        raise ValueError(f"a request of {need} tokens needs more KV cache than one {costs.config.gpu} holds next to "
                         f"{costs.config.model}'s weights ({costs.kv_capacity} tokens)")


def _next_event(ids: np.ndarray, nxt: int, ready: np.ndarray, t: float) -> float:
    """When the decodes must stop for a waiting request: its arrival, or never if the queue is empty or the head of
    it is already here (it waits for room, which only a finish makes)."""
    if nxt == len(ids) or ready[ids[nxt]] <= t:
        return math.inf
    return float(ready[ids[nxt]])


# ---------------------------------------------------------------- the two ways to serve

def _colocated_worker(worker: _Worker, ids: np.ndarray) -> None:
    """vLLM's default without chunked prefill: a step prefills waiting prompts if any can be admitted (prefill
    first), and the running decodes wait for it; otherwise a decode step."""
    wl, costs = worker.log.wl, worker.costs
    need = wl.prompt + wl.output
    nxt = 0
    while nxt < len(ids) or worker.held:
        if not worker.held:
            worker.t = max(worker.t, float(wl.arrival[ids[nxt]]))
        batch = _take_waiting(ids, nxt, wl.arrival, worker.t, wl.prompt, costs.config.token_budget, worker.fits, need)
        if batch:
            for rid in batch:
                worker.admit(rid)
            worker.stall(costs.prefill_s(wl.prompt[batch]))
            for rid in batch:
                worker.log.first_token[rid] = worker.t
                worker.start_decoding(rid)
            nxt += len(batch)
        else:
            worker.decode_until(_next_event(ids, nxt, wl.arrival, worker.t))


def _chunked_worker(worker: _Worker, ids: np.ndarray) -> None:
    """Chunked prefill (vLLM's chunked-prefill policy): each step decodes every running request, then fills what is
    left of the token budget with prompt chunks, first the prompts already started, then new ones."""
    wl, costs = worker.log.wl, worker.costs
    budget = costs.config.chunked_prefill
    prefilling: list[list[int]] = []          # [request, prompt tokens done]
    nxt = 0
    while nxt < len(ids) or worker.held:
        if not worker.held:
            worker.t = max(worker.t, float(wl.arrival[ids[nxt]]))
        room = budget - worker.decoding
        chunks: list[tuple[list[int], int]] = []
        for p in prefilling:
            n = min(int(wl.prompt[p[0]]) - p[1], room)
            if n > 0:
                chunks.append((p, n))
                room -= n
        while (room > 0 and nxt < len(ids) and wl.arrival[ids[nxt]] <= worker.t
               and worker.fits(1, int(wl.prompt[ids[nxt]] + wl.output[ids[nxt]]))):
            rid = int(ids[nxt])
            worker.admit(rid)
            prefilling.append([rid, 0])
            n = min(int(wl.prompt[rid]), room)
            chunks.append((prefilling[-1], n))
            room -= n
            nxt += 1
        if not chunks:
            worker.decode_until(_next_event(ids, nxt, wl.arrival, worker.t))
            continue
        worker.mixed_step(costs.mixed_step_s(worker.decoding, worker.context_sum, [(p[1], n) for p, n in chunks]))
        for p, n in chunks:
            p[1] += n
        for p in [p for p in prefilling if p[1] == wl.prompt[p[0]]]:
            prefilling.remove(p)
            worker.log.first_token[p[0]] = worker.t
            worker.start_decoding(p[0])


def simulate_colocated(workload: Workload, n_gpus: int, config: SimConfig = SimConfig()) -> SimResult:
    """Serve `workload` on `n_gpus` identical workers, each prefilling and decoding; request i goes to worker i % n."""
    _check_count("n_gpus", n_gpus)
    costs = costs_for(config)
    _check_fits(workload, costs)
    log = _Log(workload)
    run = _colocated_worker if config.chunked_prefill is None else _chunked_worker
    for w in range(n_gpus):
        worker = _Worker(costs, log)
        run(worker, np.arange(w, len(workload), n_gpus))
        worker.record_latencies()
    return SimResult.from_log("colocated", n_gpus, None, log)


def _prefill_worker(costs: RooflineCosts, wl: Workload, ids: np.ndarray, ready: np.ndarray) -> None:
    """Prefill waiting prompts (batched up to the token budget, or one at a time); ready[i] = when request i's KV
    cache and first token have reached its decode worker. Its memory is not a limit: each cache leaves at once."""
    budget = costs.config.token_budget if costs.config.batch_prefills else 0
    t, nxt = 0.0, 0
    while nxt < len(ids):
        t = max(t, float(wl.arrival[ids[nxt]]))
        batch = _take_waiting(ids, nxt, wl.arrival, t, wl.prompt, budget, lambda _n, _kv: True, wl.prompt)
        prompts = wl.prompt[batch]
        dt = costs.prefill_s(prompts)
        t += dt
        ready[batch] = t + costs.transfer_s(prompts, dt)
        nxt += len(batch)


def _decode_worker(worker: _Worker, ids: np.ndarray, ready: np.ndarray) -> None:
    """Continuous batching of decodes only: a request whose cache has arrived joins at the next step if it fits,
    and its first token (made by the prefill, carried with the cache) goes to the client then."""
    wl = worker.log.wl
    nxt = 0
    while nxt < len(ids) or worker.held:
        if not worker.held:
            worker.t = max(worker.t, float(ready[ids[nxt]]))
        while nxt < len(ids) and ready[ids[nxt]] <= worker.t and worker.fits(1, int(wl.prompt[ids[nxt]]
                                                                                    + wl.output[ids[nxt]])):
            worker.admit(int(ids[nxt]))
            worker.log.first_token[ids[nxt]] = worker.t
            worker.start_decoding(int(ids[nxt]))
            nxt += 1
        if worker.decoding:
            worker.decode_until(_next_event(ids, nxt, ready, worker.t))


def simulate_disaggregated(workload: Workload, prefill_gpus: int, decode_gpus: int,
                           config: SimConfig = SimConfig()) -> SimResult:
    """Serve `workload` on `prefill_gpus` prefill workers and `decode_gpus` decode workers; request i is prefilled on
    worker i % P and decoded on worker i % D, its first token streamed from there when the decode worker takes it in
    (its KV cache arrived, at a step boundary, with room)."""
    _check_count("prefill_gpus", prefill_gpus)
    _check_count("decode_gpus", decode_gpus)
    costs = costs_for(config)
    _check_fits(workload, costs)
    log = _Log(workload)
    ready = np.full(len(workload), np.nan)
    for w in range(prefill_gpus):
        _prefill_worker(costs, workload, np.arange(w, len(workload), prefill_gpus), ready)
    for w in range(decode_gpus):
        ids = np.arange(w, len(workload), decode_gpus)
        ids = ids[np.argsort(ready[ids], kind="stable")]
        worker = _Worker(costs, log)
        _decode_worker(worker, ids, ready)
        worker.record_latencies()
    return SimResult.from_log("disaggregated", prefill_gpus + decode_gpus, (prefill_gpus, decode_gpus), log)


def _check_count(name: str, value: Any) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


# ---------------------------------------------------------------- results and goodput

@dataclass(frozen=True)
class SimResult:
    """One run: per request (in workload order) when its first token reached the client, when it finished, its mean
    and largest gap between tokens; `itls` every gap of every request."""

    mode: str                           # "colocated" or "disaggregated"
    n_gpus: int
    placement: tuple[int, int] | None   # (prefill GPUs, decode GPUs) when disaggregated
    workload: Workload
    first_token: np.ndarray
    finish: np.ndarray
    tpot: np.ndarray                    # mean inter-token latency (t_n - t_1) / (n - 1); 0 for one token
    max_itl: np.ndarray
    itls: np.ndarray = field(repr=False)

    @classmethod
    def from_log(cls, mode: str, n_gpus: int, placement: tuple[int, int] | None, log: _Log) -> "SimResult":
        itls = np.concatenate(log.itls) if log.itls else np.zeros(0)
        return cls(mode, n_gpus, placement, log.wl, log.first_token, log.finish, log.tpot, log.max_itl, itls)

    @property
    def ttft(self) -> np.ndarray:
        """The client's time to first token, per request (module docstring)."""
        return self.first_token - self.workload.arrival

    def meets(self, ttft_limit: float = DEFAULT_TTFT_S, itl_limit: float = DEFAULT_ITL_S) -> np.ndarray:
        """Per request: TTFT <= ttft_limit AND mean ITL (TPOT) <= itl_limit."""
        return (self.ttft <= ttft_limit) & (self.tpot <= itl_limit)

    def attainment(self, ttft_limit: float = DEFAULT_TTFT_S, itl_limit: float = DEFAULT_ITL_S) -> float:
        """Share of requests meeting both SLOs (DistServe's SLO attainment)."""
        return float(self.meets(ttft_limit, itl_limit).mean())

    @property
    def throughput(self) -> float:
        """Requests finished per second, first arrival to last finish (what the GPUs sustained, SLOs or not)."""
        return len(self.workload) / float(self.finish.max() - self.workload.arrival[0])

    def percentiles(self, ps: Sequence[float] = (50, 90, 99)) -> dict[str, dict[float, float]]:
        """{"ttft": {p: s}, "tpot": {...}, "itl": {...}}: TTFT and TPOT over requests, ITL over every gap."""
        itls = self.itls if len(self.itls) else np.zeros(1)
        return {name: {p: float(np.percentile(values, p)) for p in ps}
                for name, values in (("ttft", self.ttft), ("tpot", self.tpot), ("itl", itls))}


def goodput(result: SimResult, ttft_limit: float = DEFAULT_TTFT_S, itl_limit: float = DEFAULT_ITL_S, *,
            per_gpu: bool = False) -> float:
    """Requests per second that meet both SLOs: offered rate x SLO attainment (divided by the GPUs when per_gpu)."""
    g = result.workload.rate * result.attainment(ttft_limit, itl_limit)
    return g / result.n_gpus if per_gpu else g


class Placement(NamedTuple):
    prefill_gpus: int
    decode_gpus: int
    goodput_per_gpu: float


def best_placement(rate: float, n_gpus: int, *, prompt_len: Lengths = 2048, output_len: Lengths = 128,
                   n_requests: int = 500, seed: int = 0, ttft_limit: float = DEFAULT_TTFT_S,
                   itl_limit: float = DEFAULT_ITL_S, config: SimConfig = SimConfig()) -> Placement:
    """DistServe's placement question for one offered `rate` (req/s): the split P + D = n_gpus with the highest
    goodput per GPU (the fewest prefill GPUs among ties), tried exhaustively."""
    wl = make_workload(n_requests, rate, prompt_len=prompt_len, output_len=output_len, seed=seed)
    return _best_split(wl, n_gpus, ttft_limit, itl_limit, config)[0]


def _best_split(wl: Workload, n_gpus: int, ttft_limit: float, itl_limit: float,
                config: SimConfig) -> tuple[Placement, SimResult]:
    if not isinstance(n_gpus, int) or n_gpus < 2:
        raise ValueError(f"disaggregation needs at least 2 GPUs (one prefill, one decode), got {n_gpus!r}")
    best: tuple[Placement, SimResult] | None = None
    for p in range(1, n_gpus):
        result = simulate_disaggregated(wl, p, n_gpus - p, config)
        g = goodput(result, ttft_limit, itl_limit, per_gpu=True)
        if best is None or g > best[0].goodput_per_gpu:
            best = Placement(p, n_gpus - p, g), result
    return best


def sweep(rates: Sequence[float], prompt_lens: Sequence[Lengths], *, n_gpus: int = 4, output_len: Lengths = 128,
          placement: tuple[int, int] | None = None, n_requests: int = 500, seed: int = 0,
          ttft_limit: float = DEFAULT_TTFT_S, itl_limit: float = DEFAULT_ITL_S, config: SimConfig = SimConfig(),
          chunks: Sequence[int] = (), burstiness: float = 1.0) -> list[dict[str, Any]]:
    """One row per (prompt length, offered rate in req/s for all n_gpus): goodput per GPU colocated and
    disaggregated (at `placement`, or the best split when None), who wins, and the p90 latencies of both.

    `config` is the colocated baseline's (and the split's). With `chunks`, each row also has "chunked": {budget:
    colocated goodput per GPU with `chunked_prefill=budget`}, "best_colocated" (the best of the baseline and those)
    and "winner_vs_best": the split against the best colocated configuration."""
    if placement is not None and sum(placement) != n_gpus:
        raise ValueError(f"placement {placement} does not add up to n_gpus={n_gpus}")
    rows = []
    for prompt_len in prompt_lens:
        for rate in rates:
            wl = make_workload(n_requests, rate, prompt_len=prompt_len, output_len=output_len, seed=seed,
                               burstiness=burstiness)
            co = simulate_colocated(wl, n_gpus, config)
            if placement is None:
                dis = _best_split(wl, n_gpus, ttft_limit, itl_limit, config)[1]
            else:
                dis = simulate_disaggregated(wl, *placement, config)
            p = dis.placement[0]
            g_co, g_dis = (goodput(r, ttft_limit, itl_limit, per_gpu=True) for r in (co, dis))
            pc, pd = co.percentiles((90,)), dis.percentiles((90,))
            rows.append({
                "prompt_len": prompt_len, "rate": rate, "rate_per_gpu": rate / n_gpus,
                "colocated": g_co, "disaggregated": g_dis, "P": p, "D": n_gpus - p,
                "winner": _winner(g_dis, g_co),
                "colocated_p90_ttft": pc["ttft"][90], "colocated_p90_tpot": pc["tpot"][90],
                "disaggregated_p90_ttft": pd["ttft"][90], "disaggregated_p90_tpot": pd["tpot"][90]})
            if chunks:
                chunked = {c: goodput(simulate_colocated(wl, n_gpus, replace(config, chunked_prefill=c)), ttft_limit,
                                      itl_limit, per_gpu=True) for c in chunks}
                best = max(g_co, *chunked.values())
                rows[-1].update(chunked=chunked, best_colocated=best, winner_vs_best=_winner(g_dis, best))
    return rows


def _winner(split: float, colocated: float) -> str:
    return "disaggregated" if split > colocated else "colocated" if colocated > split else "tie"
