"""Checks for Lab 08's load-testing and routing exercises (merged into autograder/lab08.py by the lead).

Each check takes the learner's function, runs it on small hand-made inputs and raises AssertionError
saying what is wrong (which case, expected vs got, the likely mistake).

CPU tier (correctness; no model):
    check_goodput(goodput_fn)        goodput_fn(records, ttft_limit, tpot_limit) -> requests/s meeting BOTH limits
                                     over the benchmark's duration (max end - min send, all records); failed never count
    check_route(route_fn)            route_fn(prompt_token_ids, replicas, *, block_size, prefix_blocks) -> replica:
                                     prefix affinity, every token of the first blocks matters, short prompts,
                                     spread, consistent hashing (removing / adding a replica moves only its keys),
                                     independent of the replica list's order
    check_router(route_fn)           the learner's function inside the router (minigpt.serving.router) in front of
                                     two fake replicas on loopback: who served each request of a shared-prefix mix
Interview questions (the gateway):
    check_q_gateway_replicas(answer, request_rate=..., per_replica_goodput=..., per_replica_throughput=...,
                             utilization=0.8)     replicas = ceil(rate / (goodput per replica * utilization))
    check_q_affinity_pays(answer)    which workloads (letters of AFFINITY_SCENARIOS) prefix-aware routing helps
"""

from __future__ import annotations

import contextlib
import math
import random
from collections import Counter
from typing import Any, Callable, Iterator, Sequence

from autograder.harness import call_learner, check_answer, quiet
from minigpt.serving.client_metrics import RequestRecord, request_goodput

__all__ = ["check_goodput", "check_route", "check_router", "goodput_cases", "check_q_gateway_replicas",
           "check_q_affinity_pays", "AFFINITY_SCENARIOS"]

REPLICAS4 = ["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003", "http://127.0.0.1:8004"]


# ---------------------------------------------------------------------------------------------------
# Goodput
# ---------------------------------------------------------------------------------------------------

def _record(i: int, send: float, first: float, tpot: float, n: int, end: float, *, status: int = 200,
            error: str | None = None) -> RequestRecord:
    return RequestRecord(i, send, end, [first + k * tpot for k in range(n)], n, 8, status=status, error=error)


def goodput_cases() -> dict[str, tuple[list[RequestRecord], float, float]]:
    """Named (records, ttft_limit, tpot_limit) cases. Limits 0.5 s TTFT and 0.25 s/token TPOT; times are exact
    binary fractions, so a request exactly AT a limit meets it."""
    mixed = [
        _record(0, 1.0, 1.25, 0.125, 5, 1.875),          # good
        _record(1, 0.5, 1.75, 0.125, 5, 2.5),            # TTFT 1.25: misses TTFT only
        _record(2, 2.0, 2.25, 0.75, 4, 4.5),             # TPOT 0.75: misses TPOT only
        _record(3, 0.0, 0.5, 0.25, 3, 1.0),              # exactly at both limits: good
        _record(4, 3.0, 3.125, 0.0, 1, 3.25),            # one token (TPOT 0): good
        _record(5, 3.5, 3.5, 0.0, 0, 3.5, status=429, error="HTTP 429: queue full"),     # rejected, no chunks
        _record(6, 4.0, 4.125, 0.125, 4, 8.0, error="the stream ended without data: [DONE]"),  # broken stream
        _record(7, 2.5, 3.5, 0.5, 3, 5.0),               # misses both
        _record(8, 1.5, 1.75, 0.5, 3, 3.0),              # TPOT 0.5: misses TPOT only
        _record(9, 4.5, 4.625, 1.0, 3, 6.75),            # TPOT 1.0: misses TPOT only
        _record(10, 5.0, 5.25, 0.125, 6, 7.0, error="cancelled: the benchmark's max_duration ran out"),
    ]
    all_good = [_record(i, 0.25 * i, 0.25 * i + 0.25, 0.125, 3, 0.25 * i + 0.75) for i in range(4)]
    return {"a mixed benchmark (11 requests: some slow to start, some slow per token, a 429, a broken and a "
            "cancelled stream)":
            (mixed, 0.5, 0.25),
            "four fast requests": (all_good, 0.5, 0.25),
            "no requests at all": ([], 0.5, 0.25)}


def _goodput_mistakes(records: list[RequestRecord], ttft: float, tpot: float) -> list[tuple[float, str]]:
    """Answers the usual mistakes give on these records, with their diagnosis."""
    if not records:
        return []
    ok = [r for r in records if r.ok]
    span = max(r.end_time for r in records) - min(r.send_time for r in records)
    good = [r for r in ok if r.ttft <= ttft and r.tpot <= tpot]
    strict = [r for r in ok if r.ttft < ttft and r.tpot < tpot]
    counted_failed = [r for r in records if r.chunk_times and r.ttft <= ttft and r.tpot <= tpot]
    spans = {"the span of the ok requests only": max(r.end_time for r in ok) - min(r.send_time for r in ok),
             "the span of the good requests only": max(r.end_time for r in good) - min(r.send_time for r in good)
             if good else span,
             "the sum of the requests' latencies (they overlap in time)": sum(r.e2e for r in records),
             "the time to the last FIRST token": max(r.chunk_times[0] for r in ok) - min(r.send_time for r in records)}
    out = [(sum(r.ttft <= ttft for r in ok) / span, "a request that met only the TTFT limit counted; it must "
            "meet BOTH limits (TTFT <= ttft_limit AND TPOT <= tpot_limit)"),
           (sum(r.tpot <= tpot for r in ok) / span, "a request that met only the TPOT limit counted; it must "
            "meet BOTH limits"),
           (sum(r.ttft <= ttft or r.tpot <= tpot for r in ok) / span, "`or` instead of `and`: both limits must "
            "hold"),
           (len(counted_failed) / span, "failed requests (a 429, a broken stream) counted; only ok ones can be good"),
           (len(strict) / span, "a request exactly AT a limit must count (<=, not <)"),
           (len(good) / len(records), "that is the SHARE of good requests (lab 03); goodput here is a rate: "
            "good requests per second of benchmark"),
           (len(good), "that is a count; divide by the benchmark's duration in seconds")]
    out += [(len(good) / d, f"divided by {what}; the duration is max(end_time) - min(send_time) over ALL records")
            for what, d in spans.items() if d > 0]
    return [(v, m) for v, m in out if abs(v - len(good) / span) > 1e-9]


def check_goodput(goodput_fn: Callable[[Sequence[RequestRecord], float, float], float]) -> None:
    """goodput_fn(records, ttft_limit, tpot_limit) equals the reference (requests/s) on hand-made benchmarks."""
    for what, (records, ttft, tpot) in goodput_cases().items():
        expected = request_goodput(records, ttft, tpot)
        shuffled = list(records)
        random.Random(0).shuffle(shuffled)
        got = call_learner(f"goodput ({what})", goodput_fn, shuffled, ttft, tpot,
                           context="a failed request (record.ok is False: a 429, a broken or cancelled stream) may "
                                   "have no chunk_times, so no TTFT: skip failed records before looking at latencies; no "
                                   "records at all give 0.0")
        check_answer(got, expected, f"goodput of {what}, ttft_limit={ttft} s, tpot_limit={tpot} s",
                     _goodput_mistakes(records, ttft, tpot), unit="requests/s", rel=1e-6, reveal=True,
                     hint="Count the ok requests with TTFT <= ttft_limit AND TPOT <= tpot_limit, and divide by "
                          "max(end_time) - min(send_time) over all records (0.0 when there are none).")


# ---------------------------------------------------------------------------------------------------
# The routing function
# ---------------------------------------------------------------------------------------------------

def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(4096) for _ in range(n)]


def _call_route(route_fn: Callable, prompt: list[int], replicas: list[str], block_size: int = 16,
                prefix_blocks: int = 4, what: str = "") -> str:
    got = call_learner(f"route{what}", route_fn, list(prompt), list(replicas), block_size=block_size,
                       prefix_blocks=prefix_blocks, context=f"a {len(prompt)}-token prompt, {len(replicas)} replicas")
    if got not in replicas:
        raise AssertionError(f"route must return one of the replicas it was given ({replicas}), got {got!r}")
    return got


def check_route(route_fn: Callable[..., Any]) -> None:
    """Prefix-aware consistent-hashing routing on token lists (no server)."""
    rng = random.Random(0)
    two = REPLICAS4[:2]
    # 1. affinity: equal first prefix_blocks blocks -> one replica, whatever follows (longer, shorter, partial blocks)
    for block_size, prefix_blocks in ((16, 4), (8, 2)):
        window = block_size * prefix_blocks
        for _ in range(12):
            head = _prompt(rng, window)
            tails = [_prompt(rng, n) for n in (0, 1, block_size - 1, block_size, 3 * block_size + 5)]
            served = {_call_route(route_fn, head + t, REPLICAS4, block_size, prefix_blocks) for t in tails}
            if len(served) > 1:
                raise AssertionError(
                    f"prompts sharing their first {prefix_blocks} blocks of {block_size} tokens went to "
                    f"{len(served)} different replicas: the routing key must depend only on those first "
                    f"{window} tokens (not the whole prompt), so their KV blocks are reused on one replica")
    # 2. spread: distinct prefixes cover the replicas about evenly
    for replicas in (two, REPLICAS4):
        load = Counter(_call_route(route_fn, _prompt(rng, 70), replicas) for _ in range(400))
        fair = 400 / len(replicas)
        if min(load.get(r, 0) for r in replicas) < 0.5 * fair:
            raise AssertionError(
                f"400 different prefixes over {len(replicas)} replicas gave loads {[load.get(r, 0) for r in replicas]}"
                f" (fair share {fair:.0f}): some replica gets less than half its share. Use many virtual nodes per "
                "replica on the ring (e.g. 64), hashed from the replica's NAME")
    # 3. every token of the routing window matters: prompts differing only in the window's first or last token
    for pos, name in ((0, "first"), (63, "last")):
        served = Counter()
        for t in range(200):
            p = [7] * 64 + [1] * 10
            p[pos] = t
            served[_call_route(route_fn, p, REPLICAS4)] += 1
        if len(served) < 4:
            raise AssertionError(
                f"200 prompts that differ only in the {name} token of the first 4 blocks all went to "
                f"{len(served)} replica(s): the key must hash all prefix_blocks * block_size tokens (the chained "
                "block hashes, block_hashes(tokens[:prefix_blocks * block_size], block_size))")
    # 4. short prompts: the full blocks they have; prompts shorter than a block still get a replica, always the same
    for n_full in (1, 2, 3):
        head = _prompt(rng, 16 * n_full)
        served = {_call_route(route_fn, head + _prompt(rng, k), REPLICAS4) for k in (0, 3, 9, 15)}
        if len(served) > 1:
            raise AssertionError(
                f"prompts with the same {n_full} full block(s) and different partial last blocks went to "
                f"{len(served)} replicas: a short prompt is keyed by the full blocks it has (a partial block is "
                "never in the prefix cache, so it must not decide the replica)")
    tiny = [5, 6, 7]
    if _call_route(route_fn, tiny, REPLICAS4) != _call_route(route_fn, tiny, REPLICAS4):
        raise AssertionError("the same 3-token prompt went to two replicas: routing must be deterministic")
    # 5. consistent hashing: removing / adding a replica moves only the keys of that replica
    prompts = [_prompt(rng, 70) for _ in range(300)]
    before = [_call_route(route_fn, p, REPLICAS4) for p in prompts]
    removed = REPLICAS4[1]
    rest = [r for r in REPLICAS4 if r != removed]
    after = [_call_route(route_fn, p, rest) for p in prompts]
    moved = sum(b != a and b != removed for b, a in zip(before, after))
    if moved:
        raise AssertionError(
            f"removing one of 4 replicas moved {moved} of {sum(b != removed for b in before)} prompts that were on "
            "the OTHER replicas: with consistent hashing only the removed replica's keys move (hash % len(replicas) "
            "remaps about 3/4 of all keys when the count changes). Use a hash ring: sorted points, the first at or "
            "after the key, wrapping around")
    added = REPLICAS4 + ["http://127.0.0.1:8005"]
    grown = [_call_route(route_fn, p, added) for p in prompts]
    moved = sum(g != b and g != added[-1] for b, g in zip(before, grown))
    if moved:
        raise AssertionError(f"adding a fifth replica moved {moved} prompts between the OLD replicas; only keys "
                             "taken by the new replica may move")
    shuffled = [REPLICAS4[i] for i in (2, 0, 3, 1)]
    if [_call_route(route_fn, p, shuffled) for p in prompts] != before:
        raise AssertionError("the same prompts went elsewhere when the replica list was given in another order: "
                             "place replicas on the ring by their name (ring_hash(f'{replica}#{v}')), not by index")


# ---------------------------------------------------------------------------------------------------
# The routing function inside the router
# ---------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _fake_cluster(route_fn: Callable, n: int = 2) -> Iterator[tuple[str, list[str]]]:
    from minigpt.serving.fake_replica import create_fake_app
    from minigpt.serving.launch import serve_in_thread
    from minigpt.serving.router import create_router_app

    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(serve_in_thread(create_fake_app(f"replica-{i}"))) for i in range(n)]
        router = stack.enter_context(serve_in_thread(create_router_app(urls, policy=route_fn)))
        yield router, urls


def check_router(route_fn: Callable[..., Any], *, num_prefixes: int = 12, questions: int = 2) -> None:
    """The learner's route_fn inside the router, two fake replicas: each system prompt's requests are served by one
    replica, and both replicas serve some."""
    import httpx

    from minigpt.serving.load_generator import shared_prefix_prompts

    work = shared_prefix_prompts(num_prefixes, questions, seed=0)
    _call_route(route_fn, list(range(70)), REPLICAS4[:2])          # a clear message if it is not implemented yet
    served: dict[int, set[str]] = {}
    with quiet(), _fake_cluster(route_fn) as (router, _), httpx.Client(trust_env=False, timeout=30) as http:
        for pid, prompt in zip(work.prefix_ids, work.prompts):
            r = http.post(router + "/v1/completions", json={"model": "minigpt", "prompt": prompt, "max_tokens": 1})
            if r.status_code != 200:
                raise AssertionError(f"the router answered {r.status_code} with your route function: {r.text[:300]}")
            served.setdefault(pid, set()).add(r.json()["system_fingerprint"])
    split = [pid for pid, s in served.items() if len(s) > 1]
    if split:
        raise AssertionError(f"behind the router, the requests of {len(split)} of {num_prefixes} system prompts were "
                             "served by both replicas: no prefix affinity")
    used = set().union(*served.values())
    if len(used) < 2:
        raise AssertionError(f"all {num_prefixes} system prompts went to {used.pop()}: the other replica idles")


# ---------------------------------------------------------------------------------------------------
# Interview questions: the gateway
# ---------------------------------------------------------------------------------------------------

def check_q_gateway_replicas(answer: Any, *, request_rate: float, per_replica_goodput: float,
                             per_replica_throughput: float, utilization: float = 0.8) -> None:
    """Replicas a gateway needs for `request_rate` req/s when one replica delivers `per_replica_goodput` req/s within
    the latency objectives and is run at most at `utilization` of it: ceil(rate / (goodput * utilization))."""
    if not (request_rate > 0 and per_replica_goodput > 0 and per_replica_throughput > 0 and 0 < utilization <= 1):
        raise ValueError("request_rate, per-replica goodput and throughput must be > 0 and utilization in (0, 1]")
    expected = math.ceil(request_rate / (per_replica_goodput * utilization))
    mistakes = [(math.floor(request_rate / (per_replica_goodput * utilization)),
                 "rounded down: a fractional replica means one more replica, round UP"),
                (math.ceil(request_rate / per_replica_goodput), "no headroom: run each replica at most at "
                 f"{utilization:.0%} of its goodput, so queues stay short when traffic bursts"),
                (math.ceil(request_rate / (per_replica_throughput * utilization)), "sized on raw request throughput: "
                 "past its goodput a replica still answers, but late; size on goodput (requests meeting the SLO)"),
                (math.ceil(request_rate * utilization / per_replica_goodput), "multiplied by the utilization instead "
                 "of dividing: each replica may carry only utilization x its goodput")]
    check_answer(answer, expected, f"replicas for {request_rate:g} req/s at {per_replica_goodput:g} req/s goodput per "
                 f"replica, run at {utilization:.0%}", [(v, m) for v, m in mistakes if v != expected], unit="replicas")


AFFINITY_SCENARIOS = {
    "A": "an agent framework: every request starts with the same 2,000-token tool description and a few-shot preamble",
    "B": "a batch job summarising a million unrelated documents, each prompt different from the first token",
    "C": "multi-turn chat: each turn resends the whole conversation so far (the history is the previous turn's prompt)",
    "D": "a single popular system prompt carries 90% of the traffic and one replica cannot serve that much alone",
    "E": "short prompts (under one KV block) with long answers",
}


def check_q_affinity_pays(answer: Any) -> None:
    """The set of AFFINITY_SCENARIOS letters where prefix-aware routing (pure consistent hashing) clearly pays."""
    if isinstance(answer, str):
        answer = set(answer.replace(",", " ").split())
    if not isinstance(answer, (set, frozenset, list, tuple)) or not all(isinstance(x, str) for x in answer):
        raise AssertionError(f"answer with a set of letters from {sorted(AFFINITY_SCENARIOS)}, e.g. {{'A'}}; got {answer!r}")
    got = {x.strip().upper() for x in answer}
    unknown = got - set(AFFINITY_SCENARIOS)
    if unknown:
        raise AssertionError(f"unknown scenario(s) {sorted(unknown)}; choose from {sorted(AFFINITY_SCENARIOS)}")
    why = {"A": "A shares a long prefix across requests: affinity prefills it once per replica it lives on, "
                "round-robin once on every replica (and again after each eviction)",
           "B": "B has no shared prefix: nothing to reuse, so affinity only costs balance",
           "C": "C is the classic case: a conversation's next turn extends its last prompt, so the same replica "
                "still holds its KV blocks (route on the first blocks: the whole conversation stays together)",
           "D": "D: pure consistent hashing pins the hot prefix to ONE replica, which overloads; production routers "
                "(SGLang's cache-aware router, vLLM's production stack) fall back to the least-loaded replica past a "
                "load imbalance threshold",
           "E": "E: a prompt shorter than one block has no full block to cache; there is nothing to route on"}
    wrong = sorted(got ^ {"A", "C"})
    if wrong:
        raise AssertionError("not quite: " + " ".join(why[x] for x in wrong) if len(wrong) <= 1 else
                             f"{len(wrong)} scenarios are misjudged; think about which ones repeat a long prefix AND "
                             "keep the load spread")
