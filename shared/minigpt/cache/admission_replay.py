"""An engine's admission, step by step, on a trace (lab 13): what first come, first served and longest prefix first
give in hit rate, time to first token and throughput. No model runs.

    result = replay_admission(conversation_trace(4, sessions=20), "lpm", pool_blocks=128, max_wait=32)
    result.hit_rate, result.mean_ttft_ms, result.p90_ttft_ms, result.tokens_per_s, result.max_wait

Requests are trace records (`minigpt.serving.trace.TraceRecord`): their prompt blocks are their hash ids, each of
`block_size` tokens (the last one cut to input_length). Each step, in order:

1. requests whose timestamp has come join the waiting queue (if nothing waits or runs, the clock jumps to the next);
2. the policy orders the queue: "fcfs" (`fcfs_order`) or "lpm" (`admission_order`: longest cached prefix first, and
   a request that has waited `max_wait` steps ahead of all others); requests are admitted in that order until one
   does not fit, which stops the step's admissions (as SGLang does);
3. a request fits when its prefill fits what is left of the step's `token_budget` and the pool can give it every
   block it will hold, evicting unreferenced blocks from the tree (`RadixCache.evict`) when the pool runs short. It
   holds its prompt's blocks (the cached prefix from the `RadixCache`, the rest new) and the blocks of its output
   (`output_length` tokens, never cached: the trace names no ids for them), all reserved at admission, so nothing is
   ever preempted. Its prompt's blocks enter the tree as it is admitted (vLLM caches blocks as it schedules them),
   so a request admitted after it, in the same step too, finds them;
4. the step runs: each admitted request computes its uncached prompt tokens (at least one: the last prompt token's
   logits give the first output token) and its first token; each request admitted earlier decodes one token;
5. requests that have all their output tokens free their blocks; the tree keeps its own reference on the prompt's,
   which stay cached until evicted.

The cost rule, a step's duration:

    step_ms = fixed_ms + prefill_ms_per_token * (prompt tokens computed in the step)

Decode tokens add nothing (a decode step is bound by reading the weights, whatever the batch). The defaults, 20 ms a
step and 1.5 ms a prefill token with a budget of 512 prefill tokens a step, stand for a small model on a slow device:
parameters, not measurements, chosen so that `conversation_trace` loads the engine enough (queues form) for the order
of admission to matter.

Reported: the block hit rate (prompt blocks found cached at admission / prompt blocks), TTFT (arrival to the end of
the step that computed the first token: mean and p90), throughput (output tokens / simulated seconds from the first
arrival to the last step's end), and the longest wait in steps (a request's wait: the steps that started after its
arrival before the one that admitted it; lpm's bound puts a request that has waited `max_wait` ahead of the others,
so it waits longer only behind older such requests or for room).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from minigpt.cache.block_pool import BlockPool
from minigpt.cache.cache_aware import admission_order, fcfs_order
from minigpt.cache.radix_cache import RadixCache
from minigpt.engine.metrics import percentile
from minigpt.serving.trace import TraceRecord

__all__ = ["POLICIES", "AdmissionResult", "replay_admission"]

POLICIES = ("fcfs", "lpm")


@dataclass(frozen=True)
class AdmissionResult:
    """What one policy gave on one trace; per-request tuples are in trace order."""

    policy: str
    blocks: int                       # prompt blocks over the trace
    hit_blocks: int                   # of them found cached at admission
    ttft_ms: tuple[float, ...]        # arrival to the end of the step that computed the first token
    waits: tuple[int, ...]            # steps waited before admission
    output_tokens: int
    duration_ms: float                # first arrival to the last step's end
    steps: int

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    @property
    def mean_ttft_ms(self) -> float:
        return sum(self.ttft_ms) / len(self.ttft_ms)

    @property
    def p90_ttft_ms(self) -> float:
        return percentile(self.ttft_ms, 90)

    @property
    def tokens_per_s(self) -> float:
        return 1000 * self.output_tokens / self.duration_ms

    @property
    def max_wait(self) -> int:
        return max(self.waits)


@dataclass(eq=False)
class _Request:
    index: int
    record: TraceRecord
    arrival_step: int
    left: int = 0                     # output tokens still to decode
    held: list[int] = field(default_factory=list)


def _check(records: Sequence[TraceRecord], policy: str, pool_blocks: int, block_size: int, token_budget: int,
           max_wait: int, fixed_ms: float, prefill_ms_per_token: float) -> None:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    for name, value in (("pool_blocks", pool_blocks), ("block_size", block_size), ("token_budget", token_budget)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(max_wait, bool) or not isinstance(max_wait, int) or max_wait < 0:
        raise ValueError(f"max_wait must be an int >= 0 (steps), got {max_wait!r}")
    if not (fixed_ms > 0 and prefill_ms_per_token >= 0):
        raise ValueError(f"the cost rule needs fixed_ms > 0 and prefill_ms_per_token >= 0, got {fixed_ms!r} and "
                         f"{prefill_ms_per_token!r}")
    if not records:
        raise ValueError("no records to replay")
    if any(b.timestamp < a.timestamp for a, b in zip(records, records[1:])):
        raise ValueError("trace timestamps must not decrease (requests in arrival order)")
    for i, r in enumerate(records):
        if len(r.hash_ids) != -(-r.input_length // block_size):
            raise ValueError(f"record {i}: {r.input_length} input tokens in blocks of {block_size} need "
                             f"{-(-r.input_length // block_size)} hash ids, it has {len(r.hash_ids)} "
                             "(wrong block_size?)")
        if r.input_length > token_budget:
            raise ValueError(f"record {i}: a {r.input_length}-token prompt never fits a token_budget of {token_budget}")
        if _blocks_held(r, block_size) > pool_blocks:
            raise ValueError(f"record {i} holds {_blocks_held(r, block_size)} blocks, more than the pool's "
                             f"{pool_blocks}")


def _blocks_held(r: TraceRecord, block_size: int) -> int:
    return len(r.hash_ids) + -(-max(1, r.output_length) // block_size)


def replay_admission(records: Sequence[TraceRecord], policy: str, pool_blocks: int, *, block_size: int = 16,
                     token_budget: int = 512, max_wait: int = 32, fixed_ms: float = 20.0,
                     prefill_ms_per_token: float = 1.5) -> AdmissionResult:
    """Run `records` through the admission of the module docstring under `policy` ("fcfs" or "lpm"), with a pool of
    `pool_blocks` blocks of `block_size` tokens; ValueError, before anything runs, for arguments that cannot work
    (a prompt over the budget, a request over the pool, hash ids that do not match the block size)."""
    _check(records, policy, pool_blocks, block_size, token_budget, max_wait, fixed_ms, prefill_ms_per_token)
    pool = BlockPool(pool_blocks, 1)                         # one pool block per hash id: the ids are the 'tokens'
    tree = RadixCache(pool)
    ttft, waits = [0.0] * len(records), [0] * len(records)
    waiting: deque[_Request] = deque()
    running: list[_Request] = []
    now, step, arrived = float(records[0].timestamp), 0, 0
    hits = blocks = output = 0

    def admit(req: _Request, budget_left: int) -> int | None:
        """Admit `req` if it fits: the prompt tokens it computes, or None (nothing changed)."""
        nonlocal hits, blocks
        r = req.record
        hit = tree.match(r.hash_ids)
        compute = max(1, r.input_length - len(hit) * block_size)
        if compute > budget_left:
            return None
        for b in hit:
            pool.incref(b)                                   # before evicting: a request's own prefix stays
        need = _blocks_held(r, block_size) - len(hit)
        if need > pool.num_free:
            tree.evict(need - pool.num_free)
        if need > pool.num_free:
            for b in hit:
                pool.free(b)
            return None
        new = pool.allocate(need)                            # the uncached prompt blocks, then the output's
        tree.insert(r.hash_ids, hit + new[:len(r.hash_ids) - len(hit)])
        req.held, req.left = hit + new, max(1, r.output_length)
        hits, blocks = hits + len(hit), blocks + len(r.hash_ids)
        return compute

    while arrived < len(records) or waiting or running:
        if not waiting and not running:
            now = max(now, float(records[arrived].timestamp))
        while arrived < len(records) and records[arrived].timestamp <= now:
            waiting.append(_Request(arrived, records[arrived], step))
            arrived += 1
        if policy == "fcfs":
            order = fcfs_order(waiting)
        else:
            order = admission_order(waiting, cached=lambda q: len(tree.match(q.record.hash_ids)),
                                    waited=lambda q: step - q.arrival_step, max_wait=max_wait)
        admitted, computed = [], 0
        for req in order:
            tokens = admit(req, token_budget - computed)
            if tokens is None:
                break
            computed += tokens
            admitted.append(req)
            waiting.remove(req)
        if not admitted and not running:
            raise RuntimeError("nothing running and nothing admitted: a request that fits alone was refused")
        now += fixed_ms + prefill_ms_per_token * computed
        for req in running:
            req.left -= 1                                    # one decode token each
        for req in admitted:
            req.left -= 1                                    # the first token, from the prefill
            ttft[req.index], waits[req.index] = now - req.record.timestamp, step - req.arrival_step
        output += len(running) + len(admitted)
        running += admitted
        for req in [q for q in running if q.left == 0]:
            running.remove(req)
            for b in req.held:
                pool.free(b)
        step += 1
    return AdmissionResult(policy, blocks, hits, tuple(ttft), tuple(waits), output, now - records[0].timestamp, step)
