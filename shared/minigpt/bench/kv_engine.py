"""The KV cache hierarchy in the serving engine (lab 13): lab 02's hash cache against lab 13's radix tree, alone and
with a host tier behind it, serving the first requests of the conversation trace on the course's target model at one
thread.

    requests   the first 30 of `conversation_trace(0)`, each prompt's hash ids turned into validation-corpus tokens
               (`trace_prompts`, 16-token blocks), each asking for its trace output length, greedy; a request joins at
               the first engine step whose simulated time (ms_per_step a step) has reached its timestamp, so the
               schedule is the same on any machine
    caches     EngineConfig(prefix_cache="hash"), ("radix") and ("radix", host_tier_blocks=256: every block the tree
               evicts kept in host memory and loaded back for a later prompt), on pools of 64 and 128 blocks (the
               trace's prompts hold about 250 blocks: every cache evicts)
    exact      prompt tokens found in the prefix cache on admission (with the host tier: found in the tree or loaded
               back from host memory), looked up, restored, preemptions, evictions, steps: the same in every run, and
               asserted so; the greedy tokens of every cache are asserted equal
    timed      output tokens / seconds spent in engine steps (simulated waits for arrivals excluded), medians over
               interleaved runs (`minigpt.timing.compare`), measured on this machine
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from minigpt.bench.ledger import figure
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.trace import TraceRecord, conversation_trace, trace_prompts
from minigpt.timing import compare

__all__ = ["CACHES", "settings", "replay", "measure_kv_engine", "figures", "notes"]

CACHES: dict[str, dict[str, Any]] = {          # name -> EngineConfig's cache settings
    "hash cache (lab 02)": {"prefix_cache": "hash"},
    "radix cache": {"prefix_cache": "radix"},
    "radix cache + host tier": {"prefix_cache": "radix", "host_tier_blocks": 256},
}
EXACT = ("hit_tokens", "lookup_tokens", "restored_tokens", "preemptions", "evicted", "steps", "output_tokens")


def settings(quick: bool = False, threads: int = 1) -> dict[str, Any]:
    """3 interleaved runs of each cache at each pool (quick: 1)."""
    return {"model": "target", "threads": threads, "trace": {"seed": 0, "requests": 30}, "block_size": 16,
            "pools": [64, 128], "max_num_seqs": 16, "max_num_batched_tokens": 256, "ms_per_step": 20,
            "repeats": 1 if quick else 3}


def replay(model: GPT, records: list[TraceRecord], prompts: list[list[int]], cache: dict[str, Any], pool: int,
           s: dict[str, Any]) -> tuple[dict[str, Any], list[list[int]], float]:
    """Serve the requests on a fresh engine with `cache` (one of CACHES' settings): (the exact counts, each
    request's tokens, seconds in engine steps)."""
    engine = LLMEngine(model, EngineConfig(num_blocks=pool, block_size=s["block_size"], max_num_seqs=s["max_num_seqs"],
                                           max_num_batched_tokens=s["max_num_batched_tokens"], **cache))
    tokens: dict[int, list[int]] = {i: [] for i in range(len(records))}
    queue, step, busy = list(range(len(records))), 0, 0.0
    while queue or engine.has_unfinished():
        while queue and records[queue[0]].timestamp <= step * s["ms_per_step"]:
            i = queue.pop(0)
            engine.add_request(i, prompts[i], max_tokens=records[i].output_length, sampling=SamplingParams())
        if engine.has_unfinished():
            start = time.perf_counter()
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
            busy += time.perf_counter() - start
        step += 1
    st = engine.stats()
    counts = {"hit_tokens": st.prefix_cache_hit_tokens, "lookup_tokens": st.prefix_cache_queried_tokens,
              "restored_tokens": getattr(engine.cache.manager, "restored_tokens", None),
              "preemptions": st.num_preemptions, "evicted": getattr(engine.cache.manager.pool, "evicted", None),
              "steps": st.num_steps, "output_tokens": st.num_generated_tokens}
    engine.close()
    return counts, [tokens[i] for i in range(len(records))], busy


def measure_kv_engine(model: GPT, *, quick: bool, threads: int = 1,
                      overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Serve the trace's first requests with each cache at each pool, timed and interleaved; the ledger section
    (`overrides` replace settings: a test's tiny configuration)."""
    from minigpt.training.data import load_tokens

    s = {**settings(quick, threads), **(overrides or {})}
    records = conversation_trace(s["trace"]["seed"])[:s["trace"]["requests"]]
    prompts = trace_prompts(records, s["block_size"], load_tokens("val").tolist())
    pools: dict[str, dict[str, Any]] = {}
    for pool in s["pools"]:
        found: dict[str, list[tuple[dict[str, Any], list[list[int]]]]] = {name: [] for name in CACHES}

        def busy_seconds(name: str):
            def run(fn: Any) -> float:
                counts, tokens, busy = fn()
                found[name].append((counts, tokens))
                return busy
            return run

        runs = {name: partial(replay, model, records, prompts, cache, pool, s) for name, cache in CACHES.items()}
        timed = compare(runs, warmup=0, repeats=s["repeats"], threads=threads,
                        measure={name: busy_seconds(name) for name in CACHES})
        every = [run for name in CACHES for run in found[name]]
        if any(tokens != every[0][1] for _, tokens in every):
            raise RuntimeError(f"{pool}-block pool: the caches' greedy tokens differ (or differ between runs)")
        pools[str(pool)] = {}
        for name in CACHES:
            counts = found[name][0][0]
            if any(c != counts for c, _ in found[name]):
                raise RuntimeError(f"{pool}-block pool, {name}: the exact counts differ between runs: "
                                   f"{[c for c, _ in found[name]]}")
            pools[str(pool)][name] = {**counts, "tokens_per_s": counts["output_tokens"] / timed[name].median,
                                      "samples_s": timed[name].samples}
    blocks = sum(-(-len(p) // s["block_size"]) for p in prompts)
    trace = {"records": len(records), "prompt_tokens": sum(map(len, prompts)), "prompt_blocks": blocks,
             "output_tokens": sum(r.output_length for r in records), "span_ms": records[-1].timestamp}
    return {"settings": s, "trace": trace, "pools": pools}


def exact(section: dict[str, Any]) -> dict[str, Any]:
    """The section without its timed figures: what any run must reproduce."""
    return {"settings": section["settings"], "trace": section["trace"],
            "pools": {pool: {name: {k: found[k] for k in EXACT} for name, found in caches.items()}
                      for pool, caches in section["pools"].items()}}


def figures(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows: at each pool, for the radix cache and then the radix cache with its host tier, the prompt tokens found
    cached against the hash cache's (exact), then throughput against the hash cache's (measured)."""
    rows = []
    hashed, *others = CACHES
    for pool, caches in section["pools"].items():
        h = caches[hashed]
        for name in others:
            r = caches[name]
            rows.append(figure(f"KV engine, {pool}-block pool: prompt tokens found cached, {name}", r["hit_tokens"],
                               "tokens", against=hashed, baseline=h["hit_tokens"]))
            rows.append(figure(f"KV engine, {pool}-block pool: throughput (measured here), {name}", r["tokens_per_s"],
                               "tok/s", against=hashed, baseline=h["tokens_per_s"]))
    return rows


def notes(section: dict[str, Any]) -> list[str]:
    s, t = section["settings"], section["trace"]
    per_pool = "; ".join(
        f"{pool} blocks: " + ", ".join(
            f"{name} {c['hit_tokens']:,} of {c['lookup_tokens']:,} looked-up tokens found"
            + (f" ({c['restored_tokens']:,} loaded back from host memory)" if c.get("restored_tokens") is not None and CACHES.get(name, {}).get("host_tier_blocks") else "")
            + f", {c['preemptions']} preemptions" + (f", {c['evicted']} blocks evicted" if c["evicted"] is not None else "")
            for name, c in caches.items()) for pool, caches in section["pools"].items())
    return [f"kv_engine (lab 13): the engine on the {s['model']} model at {s['threads']} thread(s) serving the first "
            f"{t['records']} requests of `conversation_trace({s['trace']['seed']})` ({t['prompt_tokens']:,} prompt "
            f"tokens in {t['prompt_blocks']} blocks of {s['block_size']}, {t['output_tokens']:,} output tokens, "
            f"greedy; arrivals honoured at {s['ms_per_step']} ms a step), max {s['max_num_seqs']} sequences and "
            f"{s['max_num_batched_tokens']} tokens a step. Hits are exact (the same in every run; both caches' "
            f"tokens equal); throughput is output tokens over the seconds in engine steps, the median of "
            f"{s['repeats']} interleaved runs on this machine. " + per_pool + ". Where the pool is short the caches "
            "keep different blocks: the hash cache reuses the least recently freed block, the radix tree evicts the "
            "least recently matched or inserted leaf nobody holds."]
