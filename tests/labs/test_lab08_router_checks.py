"""Lab 08 (load testing, routing) checks: a learner's own code passes; the stub, the package's reference handed in
(itself, a thin wrapper) and each plausible wrong implementation fail."""

from __future__ import annotations

import bisect
import functools
import hashlib

import pytest

from autograder import lab08
from autograder.checking.reference_guard import ReferenceHandedIn
from minigpt.cache.prefix_cache import block_hashes, hash_block
from minigpt.serving.client_metrics import request_goodput
from minigpt.serving.routing import HashRing, prefix_key, ring_hash, route


def _stub(*args, **kwargs):
    raise NotImplementedError()


def own_goodput(records, ttft_limit, tpot_limit):
    if not records:
        return 0.0
    span = max(r.end_time for r in records) - min(r.send_time for r in records)
    good = sum(r.ok and r.ttft <= ttft_limit and r.tpot <= tpot_limit for r in records)
    return good / span if span > 0 else 0.0


def own_key(tokens, block_size=16, prefix_blocks=4):
    """The notebook's key: the chained hash of the first prefix_blocks full blocks (the tokens if none)."""
    hashes = block_hashes(list(tokens[:block_size * prefix_blocks]), block_size)
    return hashes[-1] if hashes else hash_block(None, tokens)


def own_route(prompt_token_ids, replicas, *, block_size=16, prefix_blocks=4):
    """The notebook's solution."""
    key = own_key(prompt_token_ids, block_size, prefix_blocks)
    points = sorted((ring_hash(f"{r}#{v}"), r) for r in replicas for v in range(64))
    i = bisect.bisect_left([p for p, _ in points], key) % len(points)
    return points[i][1]


# --- wrong goodput -----------------------------------------------------------------------------------

def _span(records):
    return max(r.end_time for r in records) - min(r.send_time for r in records)


def _counting(good, duration=_span):
    def goodput(records, ttft_limit, tpot_limit):
        if not records:
            return 0.0
        return sum(bool(good(r, ttft_limit, tpot_limit)) for r in records) / duration(records)
    return goodput


ttft_only = _counting(lambda r, a, b: r.ok and r.ttft <= a)
tpot_only = _counting(lambda r, a, b: r.ok and r.tpot <= b)
either = _counting(lambda r, a, b: r.ok and (r.ttft <= a or r.tpot <= b))
counts_failed = _counting(lambda r, a, b: r.chunk_times and r.ttft <= a and r.tpot <= b)
strict = _counting(lambda r, a, b: r.ok and r.ttft < a and r.tpot < b)
duration_of_ok = _counting(lambda r, a, b: r.ok and r.ttft <= a and r.tpot <= b,
                           lambda rs: _span([r for r in rs if r.ok]))
duration_sum = _counting(lambda r, a, b: r.ok and r.ttft <= a and r.tpot <= b, lambda rs: sum(r.e2e for r in rs))
duration_first_last = _counting(lambda r, a, b: r.ok and r.ttft <= a and r.tpot <= b,
                                lambda rs: rs[-1].end_time - rs[0].send_time)     # assumes sorted records


def share(records, ttft_limit, tpot_limit):
    """Lab 03's SLO attainment, not a rate."""
    return sum(r.ok and r.ttft <= ttft_limit and r.tpot <= tpot_limit for r in records) / len(records) if records else 0.0


def crashes_on_empty(records, ttft_limit, tpot_limit):
    return own_goodput(records, ttft_limit, tpot_limit) if records else 1 / len(records)


def test_goodput_reference_passes() -> None:
    lab08.check_goodput(own_goodput)


@pytest.mark.parametrize("wrong", [_stub, ttft_only, tpot_only, either, counts_failed, strict, duration_of_ok,
                                   duration_sum, duration_first_last, share, crashes_on_empty])
def test_goodput_rejects(wrong) -> None:
    with pytest.raises(AssertionError):
        lab08.check_goodput(wrong)


def test_goodput_names_the_mistake() -> None:
    with pytest.raises(AssertionError, match="BOTH"):
        lab08.check_goodput(ttft_only)
    with pytest.raises(AssertionError, match="failed requests"):
        lab08.check_goodput(counts_failed)
    with pytest.raises(AssertionError, match="not implemented"):
        lab08.check_goodput(_stub)


# --- wrong routing -----------------------------------------------------------------------------------

def _ring_route(key_fn, vnodes=64, point=lambda replica, v, i: f"{replica}#{v}"):
    @functools.lru_cache(maxsize=None)
    def ring_of(replicas):
        ring = sorted((ring_hash(point(r, v, i)), r) for i, r in enumerate(replicas) for v in range(vnodes))
        return [p for p, _ in ring], [r for _, r in ring]

    def route_fn(prompt_token_ids, replicas, *, block_size=16, prefix_blocks=4):
        positions, owners = ring_of(tuple(replicas))         # (cached: as a learner's lru_cache would)
        key = key_fn(prompt_token_ids, block_size, prefix_blocks)
        return owners[bisect.bisect_left(positions, key) % len(positions)]
    return route_fn


def _whole_prompt(tokens, bs, pb):
    return hash_block(None, tokens)


def _flat_window(tokens, bs, pb):
    """The first prefix_blocks * block_size tokens as one string, partial blocks included."""
    return hash_block(None, tokens[:bs * pb])


def _first_tokens(tokens, bs, pb):
    """prefix_blocks TOKENS instead of blocks."""
    return hash_block(None, tokens[:pb])


def _all_full_blocks(tokens, bs, pb):
    """The chained hash of every full block: the whole prompt again, block by block."""
    hashes = block_hashes(tokens, bs)
    return hashes[-1] if hashes else hash_block(None, tokens)


def _one_block_short(tokens, bs, pb):
    hashes = block_hashes(tokens[:bs * (pb - 1)], bs)
    return hashes[-1] if hashes else hash_block(None, tokens)


def _one_token_past(tokens, bs, pb):
    """The window one token too long: the same key while blocks are longer than a token (the extra token is a
    partial block, which gets no hash), another one with blocks of one token."""
    hashes = block_hashes(tokens[:bs * pb + 1], bs)
    return hashes[-1] if hashes else hash_block(None, tokens)


def _default_params(tokens, bs, pb):
    """Ignores the block_size / prefix_blocks arguments."""
    return own_key(tokens)


def modulo(prompt_token_ids, replicas, *, block_size=16, prefix_blocks=4):
    return replicas[own_key(prompt_token_ids, block_size, prefix_blocks) % len(replicas)]


def first_replica(prompt_token_ids, replicas, **kwargs):
    return replicas[0]


def no_wraparound(prompt_token_ids, replicas, *, block_size=16, prefix_blocks=4):
    points = sorted((ring_hash(f"{r}#{v}"), r) for r in replicas for v in range(64))
    key = own_key(prompt_token_ids, block_size, prefix_blocks)
    return points[bisect.bisect_left([p for p, _ in points], key)][1]     # IndexError past the last point


def python_hash_of_tuple(prompt_token_ids, replicas, *, block_size=16, prefix_blocks=4):
    """Built-in hash of the window, modulo: affinity yes, consistency no."""
    return replicas[hash(tuple(prompt_token_ids[:block_size * prefix_blocks])) % len(replicas)]


def sorted_modulo(prompt_token_ids, replicas, *, block_size=16, prefix_blocks=4):
    """Order-independent, still modulo."""
    replicas = sorted(replicas)
    return replicas[own_key(prompt_token_ids, block_size, prefix_blocks) % len(replicas)]


@functools.lru_cache(maxsize=None)
def _md5_ring(replicas):
    return sorted((int(hashlib.md5(f"{i}-{v}".encode()).hexdigest()[:16], 16), r)
                  for i, r in enumerate(replicas) for v in range(64))


def md5_ring_by_index(prompt_token_ids, replicas, *, block_size=16, prefix_blocks=4):
    """Points named by the replica's INDEX: removing one renames the others' points."""
    key = own_key(prompt_token_ids, block_size, prefix_blocks)
    ring = _md5_ring(tuple(replicas))
    k = bisect.bisect_left([p for p, _ in ring], key) % len(ring)
    return ring[k][1]


def salted_ring(prompt_token_ids, replicas, *, block_size=16, prefix_blocks=4):
    """Points from the built-in hash() of the replica's name: stable in this process, different after a restart
    (PYTHONHASHSEED). Passes every other property."""
    key = own_key(prompt_token_ids, block_size, prefix_blocks)
    points = sorted((hash(f"{r}#{v}") % 2**64, r) for r in replicas for v in range(64))
    return points[bisect.bisect_left([p for p, _ in points], key) % len(points)][1]


WRONG_ROUTES = {
    "stub": _stub,
    "whole prompt": _ring_route(_whole_prompt),
    "all full blocks": _ring_route(_all_full_blocks),
    "flat window with partial blocks": _ring_route(_flat_window),
    "first tokens, not blocks": _ring_route(_first_tokens),
    "one block short": _ring_route(_one_block_short),
    "one token past the window": _ring_route(_one_token_past),
    "ignores block_size/prefix_blocks": _ring_route(_default_params),
    "modulo": modulo,
    "sorted modulo": sorted_modulo,
    "python hash modulo": python_hash_of_tuple,
    "always the first replica": first_replica,
    "one point per replica": _ring_route(own_key, vnodes=1),
    "ring points by index": _ring_route(own_key, point=lambda r, v, i: f"{i}#{v}"),
    "ring points from Python's salted hash()": salted_ring,
    "md5 ring by index": md5_ring_by_index,
    "no wraparound": no_wraparound,
}


def test_route_reference_passes() -> None:
    lab08.check_route(own_route)


def test_a_different_correct_ring_passes() -> None:
    """Another vnode count and point naming, same idea: accepted (the check tests properties, not our hash)."""
    lab08.check_route(_ring_route(own_key, vnodes=100, point=lambda r, v, i: f"{v}@{r}"))


def _wrapper(reference):
    def wrapper(*args, **kwargs):
        return reference(*args, **kwargs)
    return wrapper


def ring_class_route(prompt_token_ids, replicas, *, block_size=16, prefix_blocks=4):
    return HashRing(replicas).lookup(own_key(prompt_token_ids, block_size, prefix_blocks))


def package_key_route(prompt_token_ids, replicas, *, block_size=16, prefix_blocks=4):
    key = prefix_key(prompt_token_ids, block_size=block_size, prefix_blocks=prefix_blocks)
    points = sorted((ring_hash(f"{r}#{v}"), r) for r in replicas for v in range(64))
    return points[bisect.bisect_left([p for p, _ in points], key) % len(points)][1]


@pytest.mark.parametrize("run, message", [
    (lambda: lab08.check_goodput(request_goodput), "this is the course's reference"),
    (lambda: lab08.check_goodput(_wrapper(request_goodput)), r"reference \(request_goodput\)"),
    (lambda: lab08.check_route(route), "this is the course's reference"),
    (lambda: lab08.check_route(_wrapper(route)), r"reference \(route\)"),
    (lambda: lab08.check_route(ring_class_route), r"reference \(HashRing"),
    (lambda: lab08.check_route(package_key_route), r"reference \(prefix_key\)"),
    (lambda: lab08.check_router(route), "this is the course's reference"),
    (lambda: lab08.check_router(_wrapper(route)), r"reference \(route\)"),
], ids=["goodput", "goodput wrapper", "route", "route wrapper", "HashRing", "prefix_key", "router", "router wrapper"])
def test_the_reference_handed_in_is_refused(run, message) -> None:
    with pytest.raises(ReferenceHandedIn, match=message):
        run()


def test_salted_hash_ring_is_named() -> None:
    with pytest.raises(AssertionError, match="salted per process"):
        lab08.check_route(salted_ring)


def test_ring_by_index_is_not_blamed_on_modulo() -> None:
    for name in ("ring points by index", "md5 ring by index"):
        with pytest.raises(AssertionError, match="INDEX") as err:
            lab08.check_route(WRONG_ROUTES[name])
        assert "hash % len" not in str(err.value)
    with pytest.raises(AssertionError, match="hash % len"):
        lab08.check_route(WRONG_ROUTES["modulo"])


@pytest.mark.parametrize("name", list(WRONG_ROUTES))
def test_route_rejects(name: str) -> None:
    with pytest.raises(AssertionError):
        lab08.check_route(WRONG_ROUTES[name])


def test_route_messages_teach() -> None:
    with pytest.raises(AssertionError, match="not the whole prompt"):
        lab08.check_route(WRONG_ROUTES["whole prompt"])
    with pytest.raises(AssertionError, match="consistent hashing"):
        lab08.check_route(WRONG_ROUTES["sorted modulo"])


# --- the routing function inside the router ----------------------------------------------------------

def test_router_check_passes_with_the_reference() -> None:
    lab08.check_router(own_route)


@pytest.mark.parametrize("wrong", [_stub, WRONG_ROUTES["whole prompt"], first_replica])
def test_router_check_rejects(wrong) -> None:
    with pytest.raises(AssertionError):
        lab08.check_router(wrong)


# --- interview questions -------------------------------------------------------------------------------

def test_gateway_replicas() -> None:
    """answer_q1 is a rule of a replica's figures, asked on (3.2, 4.5) req/s and on figures the check draws."""
    import math

    asked = []

    def right(goodput, throughput):
        asked.append((goodput, throughput))
        return math.ceil(100_000 / (goodput * 0.8))

    lab08.check_q_gateway_replicas(right)
    assert asked[0] == (3.2, 4.5) and len(asked) == 4          # ceil(100000 / 2.56) = 39063 first, then 3 drawn
    wrong = {"round UP": lambda g, t: math.floor(100_000 / (g * 0.8)),
             "headroom": lambda g, t: math.ceil(100_000 / g),
             "goodput": lambda g, t: math.ceil(100_000 / (t * 0.8)),
             "instead": lambda g, t: math.ceil(100_000 * 0.8 / g),
             "int": lambda g, t: float(math.ceil(100_000 / (g * 0.8))),
             "not implemented": lambda g, t: (_ for _ in ()).throw(NotImplementedError())}
    for why, rule in wrong.items():
        with pytest.raises(AssertionError, match=why):
            lab08.check_q_gateway_replicas(rule)
    table = {(3.2, 4.5): 39063}                    # the shown case answered from a table: the drawn ones find it out
    with pytest.raises(AssertionError, match="answer with a finite int"):
        lab08.check_q_gateway_replicas(lambda g, t: table.get((g, t)))
    with pytest.raises(AssertionError, match="is a function"):
        lab08.check_q_gateway_replicas(39063)


def test_affinity_pays() -> None:
    lab08.check_q_affinity_pays({"C", "D"})
    lab08.check_q_affinity_pays("d, c")
    for wrong in ({"C"}, {"A", "C", "D"}, {"B"}, set(), {"C", "D", "E"}):
        with pytest.raises(AssertionError):
            lab08.check_q_affinity_pays(wrong)
    with pytest.raises(AssertionError, match="unknown"):
        lab08.check_q_affinity_pays({"Z"})


def test_one_prefix_shared_by_every_request_is_not_where_affinity_pays() -> None:
    """Scenario A (one 2,000-token prefix on every request): hashing sends everything to one replica and round-robin
    misses once per replica, so affinity does not pay; the answer that says it does is refused with that diagnosis,
    alone or next to the right letters (the answer this question used to accept, {"A", "C"}, included)."""
    for wrong in ({"A", "C", "D"}, {"A", "C"}, {"A"}):
        with pytest.raises(AssertionError, match="one replica.*once per replica"):
            lab08.check_q_affinity_pays(wrong)
