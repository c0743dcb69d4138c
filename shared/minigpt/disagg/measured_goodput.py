"""When does disaggregation pay, MEASURED: one Poisson stream served colocated and split, on the same two cores.

    rows = measure([4.0, 12.0, 16.0])         # the notebook's call: 3 rates x 2 modes x 20 requests, about 25 s
    rows = measure([12.0], n_requests=24, prompt_tokens=(200, 400), output_tokens=(16, 32),
                   ttft_limit=0.3, tpot_limit=0.015, seed=0, check_greedy=True)
    work = make_workload(20, 12.0, prompt_tokens=(200, 400), output_tokens=(16, 32), seed=0)   # what is served

`goodput_sim` answers the question on a model of H100s; this module answers it on this machine, with the course's
target model on CPU, where prefill interference is real: a 300-token prompt takes 60-90 ms to prefill on one
thread, a decode step 7-11 ms at batch 1 or 2 (13-16 ms at batch 4 or 5). Two processes
(`minigpt.parallel.launch.run_ranks`, gloo over loopback, one torch thread each; the clock, the channel and the
colocated prefill are lab 11's `ttft`):

    colocated                                         disaggregated
    rank 0: requests 0, 2, 4, ...                     rank 0, prefill worker: every request, FIFO, as it arrives:
    rank 1: requests 1, 3, 5, ...                       prefill_and_send -> GlooChannel, layer by layer,
      each a small engine over its own paged pool:      then the first token (a message of its own)
      a step that finds arrived prompts prefills      rank 1, decode worker: receive_kv into its DecodeKVStore;
      them (every running decode waits); otherwise      a request whose last layer has arrived joins the batch at
      one batched decode step of all running ones       the next step boundary; batched decode steps only

Both modes run the SAME code for a prefill (`LayerRunner`, the K/V written into a paged pool, locally or through
the channel) and for a decode step (`_decode_step`: one packed step of lab 03's layout on lab 02's pools, greedy),
so only the placement differs. No batching cap: the pools hold every request at once. Every run of a call (each
rate, each mode) serves the same requests; only the arrival times change with the rate.

Per request (seconds from the run's shared start, the first request arriving at 0):
    first token   when the client gets it (lab 11's one TTFT, as in `ttft` and `goodput_sim`): colocated, the end
                  of its prefill; split, when the decode worker takes the request into its batch (its last layer
                  and the first token, made by the prefill, have arrived): the client streams from the decode
                  worker, so the transfer and the wait to join a batch count in TTFT
    later tokens  the end of the decode step that made each
    TTFT, TPOT    lab 08's `request_metrics`: first token - arrival; (last - first) / (n - 1)
One row per (rate, mode):
    goodput_rps          offered rate x attainment (goodput_sim's definition); goodput_per_worker the same / 2
    attainment           share of requests with TTFT <= ttft_limit AND TPOT <= tpot_limit (`engine.metrics.goodput`);
                         ttft_ok, tpot_ok the share meeting each alone
    ttft_p50_s ...       p50 / p90 of TTFT and TPOT (`engine.metrics.percentile`)
    throughput_tok_s     output tokens / wall_s; wall_s: first arrival to last token
    decode_step_p50_s    the median decode step, decode_batch_mean its mean batch (both workers together);
    decode_stalled_s     the time running decodes waited for a prefill (0 when split, by construction)
    tokens_agree         every request's tokens equal the reference: greedy decoding alone (lab 01's
                         generate_kv_cache) with check_greedy=True, else the tokens the first run gave it;
                         mismatched lists the requests that differ (batched float sums could flip a near tie)
    others_cpu_share     the share of the machine's CPU time during the run that was NOT these two processes
                         (other programs, the hypervisor's steal; /proc/stat): above about 0.05 the run shared
                         its cores and its timings say little; load_1min is os.getloadavg()[0] at its end
    requests             one dict per request: arrival_s, worker, prompt_tokens, ttft_s, tpot_s, ok, tokens

The SLOs (defaults). TPOT <= 15 ms sits above a decode step at the batch sizes seen here (7-13 ms) and below what
a request pays when a prefill or two land in its lifetime (60-90 ms each over its 15-31 gaps: +2 to +12 ms):
tight, like goodput_sim's 20 ms for an 8B model on an H100. TTFT <= 0.3 s is a prefill plus a few of queueing.
Colocated, every prefill stalls its worker's decodes (TPOT fails first); split, the decode worker is never
stalled, but it holds every request's batch and one prefill worker takes all the prompts, so its queue (TTFT)
fails first as the rate rises.

What it measured (2 vCPUs of a shared VM, 20 requests, prompts 200-400, outputs 16-32, seed 0, the default SLOs;
goodput_rps colocated / split, one pair per call, only calls with others_cpu_share <= 0.02 in both modes; measured
before 2026-11-29, when the split's first token was read at the end of its prefill and the transfer and the wait
to join a batch fell in its first gap, hence in TPOT, instead of TTFT):
     4 req/s   4.0/4.0  3.4/3.8  3.8/4.0  3.8/3.8  4.0/3.0  3.8/4.0  3.8/3.8  4.0/4.0    a tie
     7 req/s   4.9/7.0  4.2/4.9  6.3/6.3                                                the split ahead or a tie
    12 req/s   7.8/11.4  4.2/9.6  8.4/7.8  7.2/10.8  4.2/6.6  4.2/1.2                  the split ahead in 4 of 6
    16 req/s   4.8/0.0  6.4/4.0  4.8/5.6  8.0/6.4  2.4/6.4                              either; far below the rate
At 12 req/s colocated TPOT p90 is 21-24 ms (decodes stalled by one or two 60-90 ms prefills; decode_stalled_s
0.7-1.2 s a run), the split's mostly 12-17 ms: its decode worker never waits for a prefill, but runs every request
at once, so its steps are 1-4 ms slower (in the run it lost, 15 ms at batch 2.8: TPOT p90 21 ms). The split's TTFT
p50 of 0.15-0.23 s still fits: its one prefill worker is busy about 90% of the time. At 16 req/s that worker is
overloaded (TTFT p50 0.22-0.30 s, up to half the requests past 0.3 s), while colocated, two workers prefilling,
keeps TTFT near 0.1 s and fails TPOT instead. The margins are of the size of the spread between two runs of the
same call: the decode step itself moves between 7 and 11 ms from run to run on this VM. A run that shares its
cores with other programs (others_cpu_share 0.3-0.5) slows its decode steps about twofold in both modes and says
nothing about the placement.

Timings are this machine's at that moment and are never asserted by the tests; no delay is emulated.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from minigpt.cache.block_table import block_tables_tensor, blocks_needed, slot_mapping
from minigpt.checkpoint import load_model
from minigpt.disagg.channel import GlooChannel
from minigpt.disagg.layerwise import LayerRunner, prefill_and_send
from minigpt.disagg.receiver import DecodeKVStore, WriteIntoStore, receive_kv
# lab 11's two-process setup, reused as it is: the shared clock and the colocated "channel" into a local pool
from minigpt.disagg.clock import RunClock, shared_clock
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.cuda_graph import using_attention
from minigpt.engine.metrics import goodput, percentile, request_metrics
from minigpt.engine.packed_batch import PackedBatch, packed_attention, packed_layers
from minigpt.model import GPT
from minigpt.parallel.comm import CountingComm
from minigpt.parallel.launch import run_ranks
from minigpt.tokenizer import load_tokenizer

__all__ = ["MODES", "WorkItem", "make_workload", "measure"]

MODES = ("colocated", "disaggregated")
N_WORKERS = 2                                # both modes: two processes, one torch thread each
_FIRST_TAG = 31                              # the first token, prefill worker -> decode worker


@dataclass(frozen=True)
class WorkItem:
    """One request of the stream: it arrives at `arrival_s` and wants `output_tokens` tokens (first included)."""

    index: int
    arrival_s: float
    prompt: tuple[int, ...]
    output_tokens: int


def _span(name: str, value: int | Sequence[int]) -> tuple[int, int]:
    """An int n as (n, n), a pair (lo, hi) as it is; ValueError unless 1 <= lo <= hi."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair) \
            or not 1 <= pair[0] <= pair[1]:
        raise ValueError(f"{name} must be an int >= 1 or a range (lo, hi) with 1 <= lo <= hi, got {value!r}")
    return int(pair[0]), int(pair[1])


def make_workload(n_requests: int, rate: float, *, prompt_tokens: int | Sequence[int] = (200, 400),
                  output_tokens: int | Sequence[int] = (16, 32), seed: int = 0) -> list[WorkItem]:
    """Lab 08's stream: `poisson_arrivals(n, rate, seed)`, prompts from `corpus_prompts` (token ids, each cut to a
    length uniform in `prompt_tokens`), output lengths uniform in `output_tokens`. The prompts and lengths depend
    on the seed only, so every rate serves the same requests."""
    from minigpt.serving.load_generator import corpus_prompts, poisson_arrivals   # lab 08 (pulls in httpx)
    if isinstance(n_requests, bool) or not isinstance(n_requests, int) or n_requests < 1:
        raise ValueError(f"n_requests must be a positive int, got {n_requests!r}")
    (p_lo, p_hi), (o_lo, o_hi) = _span("prompt_tokens", prompt_tokens), _span("output_tokens", output_tokens)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(p_lo, p_hi + 1, size=n_requests).tolist()
    outputs = rng.integers(o_lo, o_hi + 1, size=n_requests).tolist()
    enc = load_tokenizer()
    texts = corpus_prompts(n_requests, prompt_tokens=p_hi, seed=seed).prompts
    arrivals = poisson_arrivals(n_requests, rate, seed)
    return [WorkItem(i, float(a), tuple(enc.encode(text)[:n]), int(o))
            for i, (a, text, n, o) in enumerate(zip(arrivals, texts, lengths, outputs))]


def measure(rates: Sequence[float], *, n_requests: int = 20, prompt_tokens: int | Sequence[int] = (200, 400),
            output_tokens: int | Sequence[int] = (16, 32), ttft_limit: float = 0.3, tpot_limit: float = 0.015,
            seed: int = 0, modes: Sequence[str] = MODES, timeout_s: float = 180.0,
            model: GPT | str | Path = "target", check_greedy: bool = False, block_size: int = 16,
            recv_timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Serve the seeded stream at each rate in each mode on two processes; one row per (rate, mode), in that order
    (module docstring). All runs share one pair of processes, started once; none outlives the call, and a failed
    rank raises RankError with its traceback. `timeout_s` bounds the whole call."""
    rates, modes = [float(r) for r in rates], tuple(modes)
    if not rates or not all(r > 0 and np.isfinite(r) for r in rates):
        raise ValueError(f"rates must be finite request rates > 0 per second, got {rates}")
    if not modes or any(m not in MODES for m in modes):
        raise ValueError(f"modes must be some of {list(MODES)}, got {list(modes)}")
    if not (ttft_limit > 0 and tpot_limit > 0):
        raise ValueError(f"the SLO limits must be positive seconds, got ttft_limit={ttft_limit}, "
                         f"tpot_limit={tpot_limit}")
    model = load_model(model) if isinstance(model, (str, Path)) else model
    works = [make_workload(n_requests, r, prompt_tokens=prompt_tokens, output_tokens=output_tokens, seed=seed)
             for r in rates]
    longest = max(len(w.prompt) + w.output_tokens for w in works[0])
    if longest > model.config.max_seq_len:
        raise ValueError(f"a prompt plus its output reaches {longest} tokens, beyond the model's context of "
                         f"{model.config.max_seq_len}: lower prompt_tokens or output_tokens")
    reference = _greedy_reference(model, works[0]) if check_greedy else None
    runs = [(r, mode, work) for r, work in zip(rates, works) for mode in modes]
    plan = dict(runs=[(mode, work) for _, mode, work in runs], block_size=block_size, recv_timeout_s=recv_timeout_s,
                num_blocks=sum(blocks_needed(len(w.prompt) + w.output_tokens, block_size) for w in works[0]) + 2)
    sides = run_ranks(_serve, N_WORKERS, model, plan, backend="gloo", timeout_s=timeout_s,
                      collective_timeout_s=max(30.0, recv_timeout_s))
    rows = []
    for k, (rate, mode, work) in enumerate(runs):
        timelines = _merge(mode, work, sides[0][k], sides[1][k])
        if reference is None:
            reference = [t.tokens for t in timelines]
        rows.append(_row(rate, mode, work, timelines, reference, ttft_limit, tpot_limit, sides[0][k], sides[1][k]))
    return rows


def _greedy_reference(model: GPT, work: list[WorkItem]) -> list[list[int]]:
    return [generate_kv_cache(model, w.prompt, w.output_tokens, stop_token_ids=()).tokens for w in work]


# ------------------------------------------------------------------------------------------- the rows

@dataclass
class _Timeline:
    """One request as lab 08's `request_metrics` reads it."""

    seq_id: int
    arrival_time: float
    worker: str
    token_times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    @property
    def first_token_time(self) -> float:
        return self.token_times[0]

    @property
    def finish_time(self) -> float:
        return self.token_times[-1]


def _merge(mode: str, work: list[WorkItem], rank0: dict[str, Any], rank1: dict[str, Any]) -> list[_Timeline]:
    """Colocated: each request's record is on the rank that served it. Split: on rank 1, which streams every token,
    the first (made on rank 0) when it takes the request in."""
    out = []
    for w in work:
        if mode == "colocated":
            rec = (rank0 if w.index % N_WORKERS == 0 else rank1)["requests"][w.index]
            out.append(_Timeline(w.index, w.arrival_s, f"rank {w.index % N_WORKERS}", rec["times"], rec["tokens"]))
        else:
            p, d = rank0["requests"][w.index], rank1["requests"][w.index]
            out.append(_Timeline(w.index, w.arrival_s, "prefill 0 -> decode 1", d["times"], d["tokens"]))
    return out


def _row(rate: float, mode: str, work: list[WorkItem], timelines: list[_Timeline], reference: list[list[int]],
         ttft_limit: float, tpot_limit: float, rank0: dict[str, Any], rank1: dict[str, Any]) -> dict[str, Any]:
    metrics = [request_metrics(t) for t in timelines]
    attainment = goodput(metrics, ttft_limit, tpot_limit)
    wall = max(t.finish_time for t in timelines) - min(t.arrival_time for t in timelines)
    mismatched = [t.seq_id for t, want in zip(timelines, reference) if t.tokens != want]
    ttfts, tpots = [m.ttft for m in metrics], [m.tpot for m in metrics]
    steps = rank0["steps"] + rank1["steps"]
    decodes = [(end - start, batch) for kind, start, end, batch in steps if kind == "decode"]
    others = rank0["machine_busy_s"] - rank0["cpu_s"] - rank1["cpu_s"]     # CPU seconds not ours
    return {
        "rate": rate, "mode": mode, "n_requests": len(work),
        "goodput_rps": rate * attainment, "goodput_per_worker": rate * attainment / N_WORKERS,
        "attainment": attainment,
        "ttft_ok": float(np.mean([x <= ttft_limit for x in ttfts])),
        "tpot_ok": float(np.mean([x <= tpot_limit for x in tpots])),
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p90_s": percentile(ttfts, 90),
        "tpot_p50_s": percentile(tpots, 50), "tpot_p90_s": percentile(tpots, 90),
        "throughput_tok_s": sum(len(t.tokens) for t in timelines) / wall if wall > 0 else 0.0,
        "wall_s": wall, "ttft_limit": ttft_limit, "tpot_limit": tpot_limit,
        "decode_step_p50_s": percentile([d for d, _ in decodes], 50) if decodes else 0.0,
        "decode_batch_mean": float(np.mean([b for _, b in decodes])) if decodes else 0.0,
        "decode_stalled_s": sum(end - start for kind, start, end, waiting in steps if kind == "prefill" and waiting),
        "tokens_agree": not mismatched, "mismatched": mismatched,
        "others_cpu_share": max(0.0, others / ((os.cpu_count() or 1) * rank0["elapsed_s"])),
        "load_1min": rank0["load_1min"],
        "requests": [dict(request=t.seq_id, arrival_s=t.arrival_time, worker=t.worker, prompt_tokens=len(w.prompt),
                          ttft_s=m.ttft, tpot_s=m.tpot, ok=m.ttft <= ttft_limit and m.tpot <= tpot_limit,
                          tokens=t.tokens) for t, m, w in zip(timelines, metrics, work)],
    }


# ------------------------------------------------------------------------------------------- inside the ranks

def _serve(comm: CountingComm, model: GPT, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Both ranks: every (mode, workload) run in turn, each from a barrier and a fresh shared clock."""
    rank = comm.rank
    runner = LayerRunner(model)
    store = DecodeKVStore.for_model(model, plan["num_blocks"], plan["block_size"])
    _warm_up(runner, store, plan["runs"][0][1])
    out = []
    for mode, work in plan["runs"]:
        now = shared_clock()
        machine0, cpu0 = _machine_busy_s(), time.process_time()
        if mode == "colocated":
            records = _colocated_worker(runner, store, [w for w in work if w.index % N_WORKERS == rank], now)
        else:
            channel = GlooChannel(1 - rank, block_size=plan["block_size"])
            try:
                records = _prefill_worker(runner, channel, work, now) if rank == 0 else \
                    _decode_worker(model, store, channel, work, now, plan["recv_timeout_s"])
            finally:
                channel.close()
        if store.num_free != store.num_blocks:
            raise RuntimeError(f"rank {rank}, {mode}: {store.num_blocks - store.num_free} KV blocks still held "
                               "after every request finished")
        dist.barrier()                                   # both ranks done: the run's CPU accounting ends here
        out.append({**records, "load_1min": os.getloadavg()[0], "elapsed_s": now(),
                    "cpu_s": time.process_time() - cpu0, "machine_busy_s": _machine_busy_s() - machine0})
    return out


def _machine_busy_s() -> float:
    """CPU seconds every process of this machine has used since boot, all cores together (Linux /proc/stat:
    user, nice, system, irq, softirq, steal); nan elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _warm_up(runner: LayerRunner, store: DecodeKVStore, work: list[WorkItem]) -> None:
    """First calls are slow (allocations, thread pools): one long prefill and a few decode steps, then all freed."""
    clock = RunClock(time.perf_counter())
    longest = max(work, key=lambda w: len(w.prompt))
    running = [_prefill_into(runner, store, WorkItem(-1, 0.0, longest.prompt, 4), clock),
               _prefill_into(runner, store, WorkItem(-2, 0.0, work[0].prompt[:32], 4), clock)]
    while running:
        _decode_step(runner.model, store, running, clock)


@dataclass
class _Running:
    """A request in a decode batch: its block table, the position of its next token, the token to feed."""

    index: int
    table: list[int]
    position: int
    token: int
    left: int                                    # tokens still to make
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


def _prefill_into(runner: LayerRunner, store: DecodeKVStore, w: WorkItem, now: RunClock) -> _Running:
    """Colocated prefill (lab 11's ttft): each layer's K/V straight into this process's pool; the first token."""
    table = store.allocate(blocks_needed(len(w.prompt), store.block_size))
    first = prefill_and_send(runner, w.prompt, WriteIntoStore(store, table), f"r{w.index}")
    return _Running(w.index, table, len(w.prompt), first, w.output_tokens - 1, [first], [now()])


@torch.inference_mode()
def _decode_step(model: GPT, store: DecodeKVStore, running: list[_Running], now: RunClock) -> None:
    """One batched greedy decode step of every running request (lab 03's packed layout, decodes only, on lab 02's
    pools), then `_retire`."""
    live = [r for r in running if r.left > 0]
    bs = store.block_size
    for r in live:
        if r.position == len(r.table) * bs:          # a block boundary: one more block
            r.table += store.allocate(1)
    if live:
        B = len(live)
        batch = PackedBatch([r.index for r in live], torch.tensor([[r.token for r in live]]),
                            torch.tensor([[r.position for r in live]]),
                            torch.tensor([slot_mapping(r.table, r.position, r.position + 1, bs)[0] for r in live]),
                            torch.arange(B + 1), torch.tensor([r.position + 1 for r in live]),
                            block_tables_tensor([r.table for r in live], model.device))
        with using_attention(model, packed_attention(batch)):
            logits = model(batch.tokens, positions=batch.positions, kv_caches=packed_layers(store.cache, batch))
        t = now()
        for r, token in zip(live, logits[0].float().argmax(-1).tolist()):
            r.token, r.position, r.left = token, r.position + 1, r.left - 1
            r.tokens.append(token)
            r.times.append(t)
    _retire(store, running)


def _retire(store: DecodeKVStore, running: list[_Running]) -> None:
    """Finished requests leave `running` and give their blocks back."""
    for r in [r for r in running if r.left == 0]:
        store.free(r.table)
        running.remove(r)


def _records(served: list[_Running]) -> dict[int, dict[str, Any]]:
    return {r.index: {"tokens": r.tokens, "times": r.times} for r in served}


def _timed_decode_step(model: GPT, store: DecodeKVStore, running: list[_Running], now: RunClock,
                       steps: list[tuple[str, float, float, int]]) -> None:
    batch, start = sum(r.left > 0 for r in running), now()
    _decode_step(model, store, running, now)
    steps.append(("decode", start, now(), batch))


def _colocated_worker(runner: LayerRunner, store: DecodeKVStore, mine: list[WorkItem], now: RunClock
                      ) -> dict[str, Any]:
    """A small engine: a step that finds arrived prompts prefills them all, one after another (the running decodes
    wait); otherwise one batched decode step; idle until the next arrival when nothing runs."""
    queue, running, served, steps = deque(mine), [], [], []
    while queue or running:
        if queue and queue[0].arrival_s <= now():
            stalled, start = sum(r.left > 0 for r in running), now()
            while queue and queue[0].arrival_s <= now():
                served.append(_prefill_into(runner, store, queue.popleft(), now))
                running.append(served[-1])
            steps.append(("prefill", start, now(), stalled))
            _retire(store, running)                      # one-token requests are done
        elif running:
            _timed_decode_step(runner.model, store, running, now, steps)
        else:
            time.sleep(max(0.0, queue[0].arrival_s - now()))
    return {"requests": _records(served), "steps": steps}


def _prefill_worker(runner: LayerRunner, channel: GlooChannel, work: list[WorkItem], now: RunClock
                    ) -> dict[str, Any]:
    """FIFO: wait for each arrival, prefill layer by layer through the channel, then send the first token."""
    records, first_sends, steps = {}, [], []
    for w in work:
        time.sleep(max(0.0, w.arrival_s - now()))
        start = now()
        first = prefill_and_send(runner, w.prompt, channel, f"r{w.index}")
        end = now()
        token = torch.tensor([first], dtype=torch.int64)
        first_sends.append((dist.isend(token, 1, tag=_FIRST_TAG), token))
        records[w.index] = {"prefill_start": start, "prefill_end": end, "first_token": first}
        steps.append(("prefill", start, end, 0))            # no decode ever waits for it here
    channel.flush()
    for handle, _ in first_sends:
        handle.wait()
    return {"requests": records, "steps": steps}


def _decode_worker(model: GPT, store: DecodeKVStore, channel: GlooChannel, work: list[WorkItem], now: RunClock,
                   recv_timeout_s: float) -> dict[str, Any]:
    """Requests join in FIFO order at step boundaries once their last layer has arrived (with an empty batch it
    waits for the next one); batched decode steps only."""
    channel.start_receiving()                           # layers flow in while this process decodes
    n_layers = len(model.layers)
    queue, running, served, steps = deque(work), [], [], []
    while queue or running:
        while queue and (not running or (f"r{queue[0].index}", n_layers - 1) in channel.arrived_at):
            w = queue.popleft()
            table = receive_kv(channel, f"r{w.index}", n_layers, len(w.prompt), store, timeout_s=recv_timeout_s)
            first = torch.empty(1, dtype=torch.int64)
            dist.recv(first, 0, tag=_FIRST_TAG)
            served.append(_Running(w.index, table, len(w.prompt), int(first), w.output_tokens - 1, [int(first)],
                                   [now()]))                # the client gets the first token from here, now
            running.append(served[-1])
        _timed_decode_step(model, store, running, now, steps)
    return {"requests": _records(served), "steps": steps}
