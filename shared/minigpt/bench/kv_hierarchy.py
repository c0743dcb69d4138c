"""The KV cache hierarchy (lab 13) on a seeded trace: no model runs and nothing is timed, so every figure is exact
and repeats on any machine (a few seconds).

    replay     `minigpt.cache.trace_replay`, on pools of 64, 128 and 256 blocks:
                 hash cache      lab 02's chained block hashes, freed blocks reused oldest first
                 radix cache     `RadixCache`, LRU eviction of unreferenced leaves
                 radix + host    the radix cache with a host tier of 256 blocks taking what it evicts
               block hit rate = prompt blocks found cached (GPU or host) / prompt blocks; the ideal is an unbounded
               cache that never evicts (`shared_prefix_blocks`)
    admission  `minigpt.cache.admission_replay` on the 128-block pool: first come, first served against longest
               prefix first (with its starvation bound), in hit rate, TTFT (mean, p90), throughput and the longest
               wait, under the module's stated cost rule

The trace is `conversation_trace(4, sessions=20)`: the one lab 13's trace-replay tests use.
"""

from __future__ import annotations

from typing import Any

from minigpt.bench.ledger import figure
from minigpt.cache.admission_replay import replay_admission
from minigpt.cache.trace_replay import replay_trace
from minigpt.serving.trace import conversation_trace, shared_prefix_blocks

__all__ = ["CACHES", "settings", "measure_kv_hierarchy", "figures", "notes"]

CACHES = {"hash cache (lab 02)": {"cache": "hash"}, "radix cache": {"cache": "radix"},
          "radix cache + host tier": {"cache": "radix", "host": True}}


def settings(quick: bool = False) -> dict[str, Any]:
    """The same with --quick: the part is exact and takes seconds."""
    return {"trace": {"seed": 4, "sessions": 20}, "pools": [64, 128, 256], "host_blocks": 256, "ms_per_token": 20.0,
            "admission": {"pool_blocks": 128, "block_size": 16, "token_budget": 512, "max_wait": 32,
                          "fixed_ms": 20.0, "prefill_ms_per_token": 1.5}}


def measure_kv_hierarchy(*, quick: bool = False) -> dict[str, Any]:
    """Replay the trace through each cache at each pool size, and through each admission policy; the ledger section."""
    s = settings(quick)
    records = conversation_trace(s["trace"]["seed"], sessions=s["trace"]["sessions"])
    replay: dict[str, dict[str, Any]] = {}
    for pool in s["pools"]:
        replay[str(pool)] = {}
        for name, how in CACHES.items():
            r = replay_trace(records, how["cache"], pool, ms_per_token=s["ms_per_token"],
                             host_blocks=s["host_blocks"] if how.get("host") else 0)
            replay[str(pool)][name] = {"gpu_hits": r.gpu_hits, "host_hits": r.host_hits, "computed": r.computed,
                                       "refused": r.refused, "hit_rate": r.hit_rate}
    a = s["admission"]
    admission = {}
    for policy in ("fcfs", "lpm"):
        r = replay_admission(records, policy, a["pool_blocks"], block_size=a["block_size"],
                             token_budget=a["token_budget"], max_wait=a["max_wait"], fixed_ms=a["fixed_ms"],
                             prefill_ms_per_token=a["prefill_ms_per_token"])
        admission[policy] = {"hit_rate": r.hit_rate, "mean_ttft_ms": r.mean_ttft_ms, "p90_ttft_ms": r.p90_ttft_ms,
                             "tokens_per_s": r.tokens_per_s, "max_wait_steps": r.max_wait, "steps": r.steps,
                             "duration_ms": r.duration_ms, "output_tokens": r.output_tokens}
    blocks = sum(len(r.hash_ids) for r in records)
    trace = {"records": len(records), "blocks": blocks, "ideal_hits": shared_prefix_blocks(records),
             "span_ms": records[-1].timestamp}
    return {"settings": s, "trace": trace, "replay": replay, "admission": admission}


def figures(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows: the ideal hit rate; at each pool, the hash cache against the ideal, the radix cache against the hash
    cache, the host tier against the radix cache alone; then longest prefix first against first come, first served."""
    t = section["trace"]
    ideal = 100 * t["ideal_hits"] / t["blocks"]
    rows = [figure("KV hierarchy: block hit rate of an ideal cache (unbounded, never evicting)", ideal, "%")]
    against = {"hash cache (lab 02)": "ideal cache", "radix cache": "hash cache (lab 02)",
               "radix cache + host tier": "radix cache"}
    for pool, caches in section["replay"].items():
        rates = {name: 100 * found["hit_rate"] for name, found in caches.items()}
        rates["ideal cache"] = ideal
        for name in CACHES:
            rows.append(figure(f"KV hierarchy, {pool}-block pool: block hit rate, {name}", rates[name], "%",
                               against=against[name], baseline=rates[against[name]]))
    a, pool = section["admission"], section["settings"]["admission"]["pool_blocks"]
    fcfs, lpm = a["fcfs"], a["lpm"]
    base = "first come, first served"
    for what, key, unit, scale, higher in (("block hit rate", "hit_rate", "%", 100, True),
                                           ("mean TTFT", "mean_ttft_ms", "ms", 1, False),
                                           ("p90 TTFT", "p90_ttft_ms", "ms", 1, False),
                                           ("throughput", "tokens_per_s", "tok/s", 1, True),
                                           ("longest wait", "max_wait_steps", "steps", 1, False)):
        rows.append(figure(f"KV hierarchy, admission on the {pool}-block pool: {what}, longest prefix first",
                           scale * lpm[key], unit, against=base, baseline=scale * fcfs[key], higher_is_better=higher))
    return rows


def notes(section: dict[str, Any]) -> list[str]:
    s, t = section["settings"], section["trace"]
    a, found = s["admission"], section["admission"]
    refused = "; ".join(f"{pool} blocks: " + ", ".join(f"{name} {c['refused']}" for name, c in caches.items())
                        for pool, caches in section["replay"].items() if any(c["refused"] for c in caches.values()))
    return [f"kv_hierarchy (lab 13): no model, nothing timed (exact, the same on any machine): "
            f"`conversation_trace({s['trace']['seed']}, sessions={s['trace']['sessions']})`, {t['records']} requests "
            f"over {t['span_ms'] / 1000:.1f} s, {t['blocks']} prompt blocks of {a['block_size']} tokens, "
            f"{t['ideal_hits']} of them a prefix an earlier request computed (the ideal). Replayed block by block "
            f"(`minigpt.cache.trace_replay`: a request holds its blocks until it has decoded its output at "
            f"{s['ms_per_token']:g} ms a token); the host tier holds {s['host_blocks']} blocks. Requests refused for "
            "want of blocks (their blocks count as missed): " + (refused or "none") + ".",
            f"admission (`minigpt.cache.admission_replay`) on the {a['pool_blocks']}-block pool: a step costs "
            f"{a['fixed_ms']:g} ms + {a['prefill_ms_per_token']:g} ms per prompt token computed (decode tokens free), "
            f"at most {a['token_budget']} prompt tokens a step, a cached prefix costs nothing, blocks reserved at "
            f"admission; longest prefix first with max_wait {a['max_wait']} steps. Longest waits (fcfs "
            f"{found['fcfs']['max_wait_steps']}, lpm {found['lpm']['max_wait_steps']} steps) past max_wait are "
            "waits behind older starving requests or for room (budget, pool blocks); throughput is output tokens over "
            f"the simulated span (fcfs {found['fcfs']['duration_ms'] / 1000:.1f} s, lpm "
            f"{found['lpm']['duration_ms'] / 1000:.1f} s)."]
