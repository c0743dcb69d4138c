"""Continuous against static batching on the course's target, one thread, at equal KV memory (lab 03's engine).

Workloads (`serving_simulator.corpus_workload`): real prompts of 8-32 tokens, all arrived at once (2000 req/s),
greedy, stop tokens off, outputs either long-tailed (lognormal, mean 32, sigma 1.5, clipped to 256) or uniform
(sigma 0: every answer 32 tokens), the contrast.

Memory (lab 03's `static_pool`): static batching never preempts, so it reserves every sequence's prompt plus its
whole output up front, and the pool it needs is what its largest batch of B reserves:

    pool = sum of the B largest ceil((prompt + max_new_tokens) / block size)     (99 blocks for the long tail, 8 x 4
                                                                                  for the uniform one)

Paging hands a sequence a block only when a token needs one, so in that same pool continuous batching holds as many
sequences as their blocks so far allow (preempting, and later recomputing, one that no longer fits). Three policies
on that pool, each step on the fused weights (`ModelRunner(fused=True)`, as the serving engine runs):

    static B                 StaticBatchScheduler(B), padded layout: a batch runs until its longest answer ends
    continuous, same batch   Scheduler(max_num_seqs=B), packed layout
    continuous, equal memory Scheduler(max_num_seqs=4B): as many as the pool holds, blocks following tokens

tokens/s = output tokens / (first arrival to last finish), `ServeResult.tokens_per_second`, median over repeats of
runs interleaved by `minigpt.timing.compare`; steps = model calls; rows per step = sequences in a step, averaged.
Every policy must produce the same tokens for every request (greedy): `compare_batching` raises if not.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from minigpt.bench.ledger import figure
from minigpt.cache.block_table import blocks_needed
from minigpt.cache.paged import PagedKVCache
from minigpt.engine.baselines import StaticBatchScheduler
from minigpt.engine.request import Request
from minigpt.engine.runner import ModelRunner
from minigpt.engine.scheduler import Scheduler, SchedulerConfig
from minigpt.engine.serving_loop import ServeResult, serve
from minigpt.model import GPT
from minigpt.timing import compare, fixed_threads

__all__ = ["WORKLOADS", "POLICIES", "settings", "workload", "static_pool", "serve_policy", "compare_batching",
           "measure_batching", "figures", "notes"]

WORKLOADS = {"long-tailed": 1.5, "uniform": 0.0}             # lognormal sigma of the output lengths
POLICIES = ("static", "continuous, same batch", "continuous, equal memory")
GOAL = 3.0                                                    # continuous at equal memory, long-tailed outputs


def settings(quick: bool, threads: int = 1) -> dict[str, Any]:
    """128 requests, outputs up to 256 tokens, 3 repeats (quick: 24 requests, up to 128 tokens, 2 repeats)."""
    return {"model": "target", "requests": 24 if quick else 128, "mean_output": 32, "max_output": 128 if quick else 256,
            "prompt_lens": [8, 32], "batch": 8, "equal_memory_seqs": 32, "block_size": 16,
            "repeats": 2 if quick else 3, "threads": threads, "seed": 0, "step": "fused"}


def workload(kind: str, n: int, *, mean_output: int = 32, max_output: int = 256, prompt_lens: tuple[int, int] = (8, 32),
             seed: int = 0) -> list[Request]:
    """n corpus requests, all arrived at once, outputs long-tailed or uniform (see the module docstring)."""
    from minigpt.costmodel.serving_simulator import corpus_workload

    if kind not in WORKLOADS:
        raise ValueError(f"workload must be one of {sorted(WORKLOADS)}, got {kind!r}")
    return corpus_workload(n, rate=2000.0, mean_output=mean_output, spread=WORKLOADS[kind], max_output=max_output,
                           seed=seed, prompt_lens=prompt_lens)


def static_pool(requests: Sequence[Request], batch: int, block_size: int = 16) -> int:
    """Blocks static batching needs: its `batch` largest reservations (prompt + max_new_tokens each), made up front."""
    reserved = sorted((blocks_needed(len(r.prompt) + r.max_new_tokens, block_size) for r in requests), reverse=True)
    return sum(reserved[:batch])


def serve_policy(model: GPT, requests: Sequence[Request], policy: str, *, batch: int, seqs: int, blocks: int,
                 block_size: int = 16, max_num_batched_tokens: int = 512) -> ServeResult:
    """Serve `requests` on a fresh pool of `blocks` with one of `POLICIES` (wall clock, fused step)."""
    cache = PagedKVCache.for_model(model, blocks, block_size)
    max_len = model.config.max_seq_len
    if policy == "static":
        scheduler: object = StaticBatchScheduler(cache.manager, batch, max_model_len=max_len)
        runner = ModelRunner(model, cache, "padded", fused=True)
    elif policy in POLICIES:
        n = batch if policy == "continuous, same batch" else seqs
        scheduler = Scheduler(cache.manager, SchedulerConfig(n, max(n, max_num_batched_tokens)), max_model_len=max_len)
        runner = ModelRunner(model, cache, "packed", fused=True)
    else:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    result = serve(requests, scheduler, runner.execute)
    if result.rejected:
        raise RuntimeError(f"{policy}: {len(result.rejected)} requests rejected, e.g. {result.rejected[0][1]}")
    return result


def _mismatches(outputs: dict[Hashable, list[int]], reference: dict[Hashable, list[int]]) -> list[Hashable]:
    return sorted((i for i in reference if outputs.get(i) != reference[i]), key=str)


def compare_batching(model: GPT, requests: Sequence[Request], *, batch: int = 8, seqs: int = 32, repeats: int = 3,
                     threads: int = 1, block_size: int = 16) -> dict[str, Any]:
    """Time the three policies on `requests`, interleaved (one warm-up run each on the first requests); tokens/s,
    steps, rows per step and preemptions per policy, and the output lengths. Raises if any policy's tokens differ."""
    blocks = static_pool(requests, batch, block_size)
    kw = dict(batch=batch, seqs=seqs, blocks=blocks, block_size=block_size)
    with fixed_threads(threads):
        for policy in POLICIES:                                   # first calls: allocations, fused copies
            serve_policy(model, requests[:2 * batch], policy, **kw)
    results: dict[str, list[ServeResult]] = {p: [] for p in POLICIES}
    runs = {p: (lambda p=p: results[p].append(serve_policy(model, requests, p, **kw))) for p in POLICIES}
    timings = compare(runs, warmup=0, repeats=repeats, threads=threads)
    reference = results["static"][0].outputs()
    for policy, served in results.items():
        for result in served:
            if bad := _mismatches(result.outputs(), reference):
                raise RuntimeError(f"{policy} produced other tokens than static batching for {len(bad)} of "
                                   f"{len(reference)} requests (first: {bad[0]!r}); greedy outputs must not depend "
                                   "on the batching")
    lengths = np.array([r.max_new_tokens for r in requests])
    policies = {}
    for policy, served in results.items():
        tps = [r.tokens_per_second for r in served]
        steps = [len(r.steps) for r in served]
        policies[policy] = {
            "max_num_seqs": batch if policy != "continuous, equal memory" else seqs,
            "layout": "padded" if policy == "static" else "packed",
            "tokens_per_s": statistics.median(tps), "steps": int(statistics.median(steps)),
            "rows_per_step": statistics.median(sum(len(s.seq_ids) for s in r.steps) / len(r.steps) for r in served),
            "max_rows": max(len(s.seq_ids) for r in served for s in r.steps),
            "preemptions": max(sum(s.num_preemptions for s in r.sequences) for r in served),
            "output_tokens": served[0].output_tokens, "samples_tokens_per_s": tps, "samples_steps": steps,
            "samples_s": timings[policy].samples}
    return {"requests": len(requests), "pool_blocks": blocks, "block_size": block_size, "batch": batch,
            "equal_memory_seqs": seqs,
            "output_lengths": {"p50": float(np.percentile(lengths, 50)), "p90": float(np.percentile(lengths, 90)),
                               "max": int(lengths.max()), "total": int(lengths.sum())},
            "tokens_identical": True, "policies": policies}


def measure_batching(model: GPT, *, quick: bool, threads: int = 1, progress: Callable[[], Any] = lambda: None
                     ) -> dict[str, Any]:
    """Both workloads through `compare_batching`; the ledger section (`progress` is called after each)."""
    s = settings(quick, threads)
    found = {}
    for kind in WORKLOADS:
        requests = workload(kind, s["requests"], mean_output=s["mean_output"], max_output=s["max_output"],
                            prompt_lens=tuple(s["prompt_lens"]), seed=s["seed"])
        found[kind] = compare_batching(model, requests, batch=s["batch"], seqs=s["equal_memory_seqs"],
                                       repeats=s["repeats"], threads=threads, block_size=s["block_size"])
        progress()
    return {"settings": s, "workloads": found}


def figures(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows: each continuous policy against static batching, per workload, steps in the labels."""
    rows = []
    for kind, found in section["workloads"].items():
        p = found["policies"]
        static = p["static"]
        against = f"static batching of {found['batch']} ({static['steps']} steps)"
        for policy, what, goal in (("continuous, same batch", f"max {found['batch']} sequences", None),
                                   ("continuous, equal memory", f"max {found['equal_memory_seqs']} sequences in the "
                                    f"same {found['pool_blocks']} blocks", GOAL if kind == "long-tailed" else None)):
            rows.append(figure(f"continuous batching, {what}, {kind} outputs ({p[policy]['steps']} steps)",
                               p[policy]["tokens_per_s"], "tok/s", against=against, baseline=static["tokens_per_s"],
                               goal=goal))
    return rows


def notes(section: dict[str, Any]) -> list[str]:
    """One line per finding, each with its measured cause."""
    lines = []
    for kind, found in section["workloads"].items():
        p = found["policies"]
        static, same, equal = (p[name] for name in POLICIES)
        lens = found["output_lengths"]
        head = (f"{kind} outputs (p50 {lens['p50']:.0f}, p90 {lens['p90']:.0f}, max {lens['max']} tokens), "
                f"{found['requests']} requests, {found['pool_blocks']}-block pool")
        if kind == "long-tailed":
            lines.append(f"{head}: a static batch runs until its longest answer ends, so its late steps carry one "
                         f"row: {static['rows_per_step']:.1f} rows per step over {static['steps']} steps, against "
                         f"{same['rows_per_step']:.1f} over {same['steps']} for continuous batching at the same "
                         f"batch ({same['tokens_per_s'] / static['tokens_per_s']:.2f}x).")
            lines.append(f"{kind}, equal memory: the pool static batching of {found['batch']} fills with reservations "
                         f"for whole answers holds up to {equal['max_rows']} sequences at once when blocks follow "
                         f"tokens ({equal['rows_per_step']:.1f} a step on average, {equal['preemptions']} "
                         f"preemptions); the CPU's step cost grows with rows and the longest answer alone takes "
                         f"{lens['max']} of the {equal['steps']} steps, so that gives "
                         f"{equal['tokens_per_s'] / same['tokens_per_s']:.2f}x over the same batch "
                         f"({equal['tokens_per_s'] / static['tokens_per_s']:.2f}x over static).")
        else:
            lines.append(f"{head}: a batch's answers end together and static batching reserves only what it uses "
                         f"({static['rows_per_step']:.1f} rows per step over {static['steps']} steps), so continuous "
                         f"batching at the same batch gains {same['tokens_per_s'] / static['tokens_per_s']:.2f}x, "
                         f"and in the same pool, holding up to {equal['max_rows']} sequences "
                         f"({equal['preemptions']} preemptions), {equal['tokens_per_s'] / static['tokens_per_s']:.2f}x.")
    return lines
