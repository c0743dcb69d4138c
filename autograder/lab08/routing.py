"""Lab 08, exercise 5: prefix-aware consistent-hash routing (route), alone and inside the router."""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import httpx

from autograder.harness import call_learner, quiet
from autograder.lab08.common import _watched, one_call_at_a_time
from autograder.checking.reference_guard import own_work
from autograder.checking.wire import run_where
from minigpt.serving.launch import serve_in_thread
from minigpt.serving.routing import HashRing, prefix_key
from minigpt.serving.routing import route as reference_route


REPLICAS4 = ["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003", "http://127.0.0.1:8004"]


# ---------------------------------------------------------------------------------------------------
# The routing function
# ---------------------------------------------------------------------------------------------------



ROUTE_REFERENCES = (reference_route, prefix_key, HashRing)


@contextmanager
def _another_hash_seed() -> Iterator[None]:
    """builtins.hash salted differently, as in a process started with another PYTHONHASHSEED (str and bytes hashes
    change between processes; a router restarted with a different salt would send every prefix elsewhere)."""
    import builtins
    original = builtins.hash
    builtins.hash = lambda obj: original(("another process", obj))
    try:
        yield
    finally:
        builtins.hash = original


def _by_position_diagnosis(route_fn: Callable, prompts: list[list[int]], before: list[str]) -> str:
    """Why keys moved: replicas placed by their position in the list (a ring of f'{i}#{v}' points) or a modulo."""
    renamed = [f"http://10.9.9.{i}:7000" for i in range(1, 5)]
    by_index = [REPLICAS4.index(b) for b in before] == [renamed.index(_call_route(route_fn, p, renamed))
                                                         for p in prompts]
    if by_index:
        grown = renamed + ["http://10.9.9.5:7000"]
        moved = [_call_route(route_fn, p, grown) for p in prompts]
        if all(m in (renamed[REPLICAS4.index(b)], grown[-1]) for m, b in zip(moved, before)):
            return ("The replicas' names do not matter to your routing, only their positions in the list: the ring's "
                    "points are named by the replica's INDEX (f'{i}#{v}'), so removing one renames the points of every "
                    "replica after it. Name the points by the replica itself: ring_hash(f'{replica}#{v}').")
    return ("hash % len(replicas) remaps about 3/4 of all keys when the count changes. Use a hash ring: sorted "
            "points named by each replica (ring_hash(f'{replica}#{v}')), the first point at or after the key, "
            "wrapping around.")


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
    what = "Exercise 5 (route)"
    own_work(route_fn, ROUTE_REFERENCES, what=what)
    _check_route(_watched_first(route_fn, ROUTE_REFERENCES, what), learner_fn=route_fn)


def _watched_first(fn: Callable, references: tuple, what: str, calls: int = 50) -> Callable:
    """fn, its first `calls` calls watched for entering the reference (a wrapper enters it on every call; watching
    all ~2,800 calls of check_route under a profile function tripled its time)."""
    watched = _watched(fn, references, what)
    count = [0]

    def call(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return (watched if count[0] <= calls else fn)(*args, **kwargs)
    return call


def _routes_with_another_hash_seed(route_fn: Callable, prompts: list[list[int]], replicas: list[str]) -> list[str]:
    """route_fn's replica for each prompt with Python's hash() salted differently, run where route_fn lives (the
    learner's kernel, when judged: a salt changed here would not reach the hash() it calls there)."""
    with _another_hash_seed():
        return [_call_route(route_fn, p, replicas) for p in prompts]


def _check_route(route_fn: Callable[..., Any], learner_fn: Callable[..., Any] | None = None) -> None:
    rng = random.Random(0)
    two = REPLICAS4[:2]
    # 1. affinity: equal first prefix_blocks blocks -> one replica, whatever follows (longer, shorter, partial blocks;
    # blocks of one token too, where one token past the window is a block of its own)
    for block_size, prefix_blocks in ((16, 4), (8, 2), (1, 3)):
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
            "the OTHER replicas: with consistent hashing only the removed replica's keys move. "
            + _by_position_diagnosis(route_fn, prompts, before))
    added = REPLICAS4 + ["http://127.0.0.1:8005"]
    grown = [_call_route(route_fn, p, added) for p in prompts]
    moved = sum(g != b and g != added[-1] for b, g in zip(before, grown))
    if moved:
        raise AssertionError(f"adding a fifth replica moved {moved} prompts between the OLD replicas; only keys "
                             "taken by the new replica may move")
    # 6. the same in every process: nothing may depend on Python's salted hash() of strings
    learner_fn = route_fn if learner_fn is None else learner_fn
    elsewhere = run_where(learner_fn, _routes_with_another_hash_seed, learner_fn, prompts[:100], REPLICAS4)
    if elsewhere != before[:100]:
        changed = sum(a != b for a, b in zip(elsewhere, before))
        raise AssertionError(
            f"with Python's hash() salted as in another process (PYTHONHASHSEED), {changed} of 100 prompts went to "
            "another replica: your ring points or key use the built-in hash(), which is salted per process for "
            "strings, so a restarted router would send every prefix elsewhere (and two routers would disagree). Use a "
            "stable hash: ring_hash (SHA-256) for the points, the chained block hashes for the key")
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


def check_router(route_fn: Callable[..., Any], *, num_prefixes: int = 32, questions: int = 2) -> None:
    """The learner's route_fn inside the router, two fake replicas: each system prompt's requests are served by one
    replica, and both replicas serve some. (The replicas are named by their URLs, whose ports change from run to run,
    so the ring changes too: with 12 system prompts an uneven ring once sent all of them to one replica.)"""
    import httpx

    from minigpt.serving.load_generator import shared_prefix_prompts

    what = "Exercise 5 (route, inside the router)"
    own_work(route_fn, ROUTE_REFERENCES, what=what)
    route_fn = one_call_at_a_time(_watched(route_fn, ROUTE_REFERENCES, what))
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
