"""Serving: the engine against the naive server (lab 08), over HTTP, each a child process on `threads` threads.

`minigpt.serving.experiments.compare_engines` drives both servers with the same seeded corpus prompts, rate by rate
(naive, then engine): a low Poisson rate (1 req/s, where one request at a time is no handicap) and all requests at
once (saturation). The engine runs `--max-num-seqs 32 --max-num-batched-tokens 512`; the naive server lab 01's cached
generation, one request at a time. Figures (the client's clock, `client_metrics.summarize_records`):

    saturation   engine output tokens/s / naive output tokens/s                         goal >= 5x
    low load     inter-token latency p50, naive / engine (ratio >= 1: the engine no slower) goal >= 1x
                 p99 ITL and p99 TTFT beside it, naive / engine, for information

A rate counts only if every request was served (`served` says how many were); ITL = gaps between streamed chunks.
"""

from __future__ import annotations

import math
from typing import Any

from minigpt.bench.ledger import figure

__all__ = ["ENGINE_ARGS", "settings", "measure_serving", "summarize", "figures", "notes"]

ENGINE_ARGS = "--max-num-seqs 32 --max-num-batched-tokens 512"
SATURATION_GOAL, ITL_GOAL = 5.0, 1.0
ENGINES = {"naive": "naive server", "continuous": "engine"}


def settings(quick: bool, threads: int = 1) -> dict[str, Any]:
    """The run's shape: 32 requests of 64 prompt and 64 output tokens at 1 req/s and all at once (quick: 8 of 32
    tokens at 2 req/s)."""
    return {"checkpoint": "target", "num_requests": 8 if quick else 32, "prompt_tokens": 64,
            "max_tokens": 32 if quick else 64, "low_rate": 2.0 if quick else 1.0, "threads": threads,
            "max_duration": 90.0, "engine_args": ENGINE_ARGS}


def _point(p: Any) -> dict[str, Any]:
    s = p.summary
    return {"output_tokens_per_s": s.output_throughput, "served": s.num_ok, "requests": s.num_requests,
            "duration_s": s.duration, **{f"{name}_s": {str(q): v for q, v in getattr(s, name).items()}
                                         for name in ("ttft", "tpot", "itl")}}


def summarize(cmp: Any, low_rate: float) -> dict[str, dict[str, dict[str, Any]]]:
    """{"low load" | "saturation": {"naive" | "continuous": point}} from an `EngineComparison` at (low_rate, inf)."""
    return {load: {engine: _point(cmp.at(engine, rate)) for engine in ENGINES}
            for load, rate in (("low load", low_rate), ("saturation", math.inf))}


def measure_serving(*, quick: bool, threads: int = 1) -> dict[str, Any]:
    """Start both servers, run the two rates; the ledger section (settings and one point per engine and load)."""
    from minigpt.serving.experiments import compare_engines

    s = settings(quick, threads)
    cmp = compare_engines((s["low_rate"], math.inf), checkpoint=s["checkpoint"], num_requests=s["num_requests"],
                          prompt_tokens=s["prompt_tokens"], max_tokens=s["max_tokens"], threads=threads,
                          max_duration=s["max_duration"], engine_args=s["engine_args"].split(), processes=True)
    return {"settings": s, "points": summarize(cmp, s["low_rate"]), "table": cmp.table()}


def figures(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows: saturation throughput, and at low load the ITL p50 (goal), p99 ITL and p99 TTFT."""
    s, points = section["settings"], section["points"]
    sat, low = points["saturation"], points["low load"]
    naive = ENGINES["naive"]
    rows = [figure(f"serving, {s['num_requests']} requests at once ({s['max_tokens']} tokens each): engine output "
                   f"tokens/s", sat["continuous"]["output_tokens_per_s"], "tok/s", against=naive,
                   baseline=sat["naive"]["output_tokens_per_s"], goal=SATURATION_GOAL)]
    for name, key, q, goal in (("inter-token latency p50", "itl_s", "50", ITL_GOAL),
                               ("inter-token latency p99", "itl_s", "99", None),
                               ("time to first token p99", "ttft_s", "99", None)):
        rows.append(figure(f"serving at {s['low_rate']:g} req/s: {name}, engine",
                           1e3 * low["continuous"][key][q], "ms", against=naive, baseline=1e3 * low["naive"][key][q],
                           higher_is_better=False, goal=goal))
    return rows


def notes(section: dict[str, Any]) -> list[str]:
    """How the rows were measured, and how many requests each server served."""
    s, points = section["settings"], section["points"]
    served = "; ".join(f"{load}: engine {p['continuous']['served']}/{p['continuous']['requests']}, naive "
                       f"{p['naive']['served']}/{p['naive']['requests']} served" for load, p in points.items())
    return [f"serving: `{s['checkpoint']}` over HTTP, each server a child process on {s['threads']} thread(s), engine "
            f"`{s['engine_args']}`; {s['num_requests']} corpus prompts of {s['prompt_tokens']} tokens, "
            f"{s['max_tokens']} output tokens each, at {s['low_rate']:g} req/s (Poisson) and all at once; {served}. "
            "Latency ratios are naive / engine: 1x or more means the engine is no slower."]
