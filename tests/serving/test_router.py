"""The routing policies (hash ring, round-robin) and the router app in front of fake replicas."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from typing import Iterator

import httpx
import openai
import pytest
from hypothesis import given, settings, strategies as st

from minigpt.serving.load_generator import benchmark, shared_prefix_prompts
from minigpt.serving.router import create_router_app
from minigpt.serving.routing import HashRing, RoundRobin, prefix_key, route
from fakes import fake_replicas, serve_in_thread

REPLICAS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003", "http://127.0.0.1:9004"]
tokens = st.lists(st.integers(0, 4095), min_size=0, max_size=120)


# ------------------------------------------------------------------ the routing function

@settings(max_examples=60, deadline=None)
@given(prefix=st.lists(st.integers(0, 4095), min_size=64, max_size=64), tail_a=tokens, tail_b=tokens)
def test_shared_first_blocks_go_to_one_replica(prefix, tail_a, tail_b) -> None:
    assert route(prefix + tail_a, REPLICAS) == route(prefix + tail_b, REPLICAS)


@settings(max_examples=60, deadline=None)
@given(prompt=tokens, removed=st.integers(0, 3))
def test_removing_a_replica_moves_only_its_keys(prompt, removed) -> None:
    before = route(prompt, REPLICAS)
    rest = [r for i, r in enumerate(REPLICAS) if i != removed]
    after = route(prompt, rest)
    assert after == before or before == REPLICAS[removed]
    assert route(prompt, REPLICAS[::-1]) == before, "the ring must not depend on the order of the replica list"


def test_short_prompts_hash_their_full_blocks() -> None:
    a, b = list(range(20)), list(range(16)) + [99, 98]           # one full block each, equal; tails differ
    assert prefix_key(a) == prefix_key(b)
    assert prefix_key([1, 2, 3]) != prefix_key([1, 2, 4])        # shorter than a block: its tokens
    assert prefix_key(list(range(64)) + [5]) != prefix_key(list(range(63)) + [7, 5])


def test_the_ring_spreads_distinct_prefixes() -> None:
    load = Counter(route([i, i * 7 % 4096] * 40, REPLICAS) for i in range(800))
    assert set(load) == set(REPLICAS)
    assert min(load.values()) > 0.6 * 800 / 4, load


def test_ring_rejects_bad_replica_lists() -> None:
    with pytest.raises(ValueError):
        HashRing([])
    with pytest.raises(ValueError):
        HashRing(["a", "a"])
    with pytest.raises(ValueError):
        prefix_key([1, 2], block_size=0)


def test_round_robin_cycles() -> None:
    rr = RoundRobin()
    assert [rr([1], REPLICAS[:3]) for _ in range(6)] == REPLICAS[:3] * 2


# ------------------------------------------------------------------ the router app

@contextlib.contextmanager
def routed(policy: str, n: int = 2, **fake_kwargs: float) -> Iterator[tuple[str, list[str]]]:
    with fake_replicas(*[f"r{i}" for i in range(n)], **fake_kwargs) as urls:
        with serve_in_thread(create_router_app(urls, policy=policy)) as router:
            yield router, urls


@pytest.fixture(scope="module")
def prefix_router() -> Iterator[tuple[str, list[str]]]:
    with routed("prefix") as pair:
        yield pair


def test_openai_client_through_the_router(prefix_router) -> None:
    router, _ = prefix_router
    client = openai.OpenAI(base_url=router + "/v1", api_key="none", http_client=httpx.Client(trust_env=False))
    full = client.completions.create(model="m", prompt="def f(x):", max_tokens=4)
    assert full.choices[0].text == " t0 t1 t2 t3" and full.usage.completion_tokens == 4
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="m", prompt="def f(x):",
                                                                           max_tokens=4, stream=True) if c.choices)
    assert streamed == full.choices[0].text
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.choices[0].message.content == " t0 t1 t2"
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True) if c.choices]
    assert "".join(pieces) == " t0 t1 t2"
    client.close()


def test_raw_stream_passes_through_and_ends_with_done(prefix_router) -> None:
    router, urls = prefix_router
    with httpx.Client(trust_env=False) as http:
        with http.stream("POST", router + "/v1/completions",
                         json={"model": "m", "prompt": "x", "max_tokens": 3, "stream": True}) as r:
            assert r.headers["x-routed-to"] in urls
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]" and len(events) == 4
        bad = http.post(router + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and "error" in bad.json()
        for body in ({"model": "m", "messages": [{"role": "user", "content": ["parts"]}]},
                     {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, {"model": "m", "messages": "hi"}):
            bad = http.post(router + "/v1/chat/completions", json=body)
            assert bad.status_code == 400 and "could not route" in bad.json()["error"]["message"], bad.text
        assert http.post(router + "/v1/completions", json=[1, 2]).status_code == 400
        stats = http.get(router + "/stats").json()
        metrics = http.get(router + "/metrics").text
    assert stats["policy"] == "prefix" and set(stats["replicas"]) == set(urls)
    assert "router_requests_total" in metrics


def test_prefix_affinity_versus_round_robin() -> None:
    work = shared_prefix_prompts(4, 6, prefix_tokens=80, question_tokens=12, seed=0)
    results = {}
    for policy in ("prefix", "round_robin"):
        with routed(policy) as (router, urls):
            records = benchmark(router, work, max_tokens=2, rate=float("inf"), max_concurrency=4)
            with httpx.Client(trust_env=False) as http:
                served = {u: http.get(u + "/stats").json() for u in urls}
                counts = http.get(router + "/stats").json()["replicas"]
        assert all(r.ok for r in records)
        assert sum(c["requests"] for c in counts.values()) == len(work.prompts)
        hits = sum(s["prefix_hit_tokens"] for s in served.values())
        results[policy] = hits / sum(s["prompt_tokens"] for s in served.values())
        if policy == "round_robin":
            assert sorted(c["requests"] for c in counts.values()) == [12, 12]
    # affinity: each system prompt is prefilled once (first of its 6), round-robin once per replica it lands on
    assert results["prefix"] > results["round_robin"], results


def test_requests_of_one_prefix_are_served_by_one_replica(prefix_router) -> None:
    router, urls = prefix_router
    work = shared_prefix_prompts(3, 4, seed=2)
    by_prefix: dict[int, set[str]] = {}
    with httpx.Client(trust_env=False) as http:
        for pid, prompt in zip(work.prefix_ids, work.prompts):
            body = http.post(router + "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 1}).json()
            by_prefix.setdefault(pid, set()).add(body["system_fingerprint"])
    assert all(len(s) == 1 for s in by_prefix.values()), by_prefix


def test_disconnect_closes_the_upstream_stream() -> None:
    with routed("prefix", n=1, token_delay=0.05) as (router, (replica,)):
        with httpx.Client(trust_env=False) as http:
            with http.stream("POST", router + "/v1/completions",
                             json={"model": "m", "prompt": "x", "max_tokens": 400, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        json.loads(line[5:])
                        break                      # client goes away after the first event
            for _ in range(200):
                if http.get(replica + "/stats").json()["running"] == 0:
                    break
                time.sleep(0.05)
            assert http.get(replica + "/stats").json()["running"] == 0, "the replica still streams to nobody"


def test_a_dead_replica_gives_502() -> None:
    with serve_in_thread(create_router_app(["http://127.0.0.1:9"])) as router:
        with httpx.Client(trust_env=False) as http:
            r = http.post(router + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
            assert r.status_code == 502 and "did not answer" in r.json()["error"]["message"]
            assert http.get(router + "/stats").json()["replicas"]["http://127.0.0.1:9"]["errors"] == 1


def test_router_refuses_remote_replicas_and_bad_policies() -> None:
    with pytest.raises(ValueError, match="loopback"):
        create_router_app(["http://example.com:8000"])
    with pytest.raises(ValueError, match="policy"):
        create_router_app(["http://127.0.0.1:1"], policy="random")


def test_a_failing_policy_answers_500_and_the_router_lives_on() -> None:
    def broken(prompt_token_ids, replicas, **kwargs):
        raise NotImplementedError()

    with fake_replicas("r0") as urls, serve_in_thread(create_router_app(urls, policy=broken)) as router:
        with httpx.Client(trust_env=False) as http:
            r = http.post(router + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
            assert r.status_code == 500 and "NotImplementedError" in r.json()["error"]["message"]
            assert http.get(router + "/health").status_code == 200


def test_router_command_line_serves_and_stops() -> None:
    """`python -m minigpt.serving.router` as a child process in front of a fake replica; stopped afterwards."""
    from minigpt.serving.launch import serve_subprocess

    with fake_replicas("r0") as (replica,):
        with serve_subprocess(["--replica", replica, "--policy", "round_robin"], module="minigpt.serving.router",
                              timeout=60) as router:
            r = httpx.post(router + "/v1/completions", trust_env=False,
                           json={"model": "m", "prompt": "x", "max_tokens": 2})
            assert r.json()["system_fingerprint"] == "r0" and r.headers["x-routed-to"] == replica
    assert router.process.poll() is not None


def test_routing_real_engines_raises_the_prefix_cache_hit_rate() -> None:
    """Two engine replicas (draft checkpoint, in this process) behind the router: affinity finds more prefixes."""
    from minigpt.serving.experiments import compare_routing

    rr, prefix = compare_routing(("round_robin", "prefix"), checkpoint="draft", num_prefixes=3, questions_per_prefix=4,
                                 prefix_tokens=64, question_tokens=8, max_tokens=2, rate=float("inf"), processes=False)
    assert rr.summary.num_ok == prefix.summary.num_ok == 12
    assert sorted(rr.requests_per_replica) == [6, 6]
    # prefix: each system prompt is prefilled once (3 misses); round-robin: on both replicas (about 6)
    assert prefix.prefix_hit_rate > rr.prefix_hit_rate > 0, (rr.row(), prefix.row())
