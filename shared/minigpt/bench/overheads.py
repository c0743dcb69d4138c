"""The engine's hidden costs (lab 12), in-process on the course's target at one thread: what each of the engine's
modes buys or costs against its default step, on the same requests.

    mode                      EngineConfig                     measured against the default engine
    overlap scheduling        async_scheduling=True            decode time per token at batch 1; tokens/s at 8
    static, compiled step     static_decode="compiled"         batch-1 time per token and MBU (inductor, one graph
                                                               a bucket, compiled in the warm-up and timed apart)
    batch-invariant           batch_invariant=True             tokens/s at batch 1 and at 8 (what determinism costs)

Each candidate generates `tokens` greedy tokens after a `prompt`-token corpus prompt for `batch` requests at once;
time per token = seconds / (tokens * batch), medians over interleaved repeats (`minigpt.timing.compare`). MBU =
bytes per token by lab 00's rule / time per token / the bandwidth the decode part measured (or this part, alone).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from minigpt.bench.decode import step_cost
from minigpt.bench.ledger import figure
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.timing import compare, fixed_threads

__all__ = ["MODES", "settings", "measure_overheads", "figures", "notes"]

MODES = {"default": {}, "overlapped": {"async_scheduling": True}, "static compiled": {"static_decode": "compiled"},
         "batch-invariant": {"batch_invariant": True}}


def settings(quick: bool, threads: int = 1) -> dict[str, Any]:
    """64 tokens after a 32-token prompt, 5 repeats (quick: 32 tokens, 3 repeats); batches of 1 and 8."""
    return {"model": "target", "prompt_tokens": 32, "tokens": 32 if quick else 64, "repeats": 3 if quick else 5,
            "batches": [1, 8], "threads": threads, "max_num_seqs": 8, "max_num_batched_tokens": 256}


def _generation(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> Callable[[], None]:
    def run() -> None:
        for p in prompts:
            engine.add_request(f"r{time.perf_counter_ns()}-{len(engine._tracked)}", p, max_tokens=tokens,
                               sampling=SamplingParams())
        while engine.has_unfinished():
            engine.step()
    return run


def measure_overheads(model: GPT, *, quick: bool, threads: int = 1, bandwidth: float | None = None) -> dict[str, Any]:
    """Time each mode at each batch (interleaved with the default); the ledger section."""
    from minigpt.bench.bandwidth import memory_bandwidth
    from minigpt.training.data import load_tokens

    s = settings(quick, threads)
    corpus = load_tokens("val")
    prompts = [corpus[i * 97:i * 97 + s["prompt_tokens"]].tolist() for i in range(max(s["batches"]))]
    results: dict[str, dict[str, Any]] = {}
    compile_s = None
    with fixed_threads(threads):
        engines = {}
        for name, mode in MODES.items():
            engines[name] = LLMEngine(model, EngineConfig(max_num_seqs=s["max_num_seqs"],
                                                          max_num_batched_tokens=s["max_num_batched_tokens"], **mode))
        start = time.perf_counter()
        for batch in s["batches"]:                                  # every bucket a run needs, compiled now
            _generation(engines["static compiled"], prompts[:batch], 4)()
        compile_s = time.perf_counter() - start
    for batch in s["batches"]:
        runs = {name: _generation(engine, prompts[:batch], s["tokens"]) for name, engine in engines.items()
                if batch == 1 or name != "static compiled"}
        timed = compare(runs, warmup=1, repeats=s["repeats"], threads=threads)
        results[str(batch)] = {name: {"seconds_per_token": t.median / (s["tokens"] * batch),
                                      "samples_s": t.samples} for name, t in timed.items()}
    for engine in engines.values():
        engine.close()
    if bandwidth is None:
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        bandwidth = max(k["bytes_per_s"] for k in memory_bandwidth(weights, threads=threads).values())
    _, nbytes = step_cost(model, s["prompt_tokens"] + s["tokens"] / 2)
    for name, row in results["1"].items():
        row["mbu_percent"] = 100 * nbytes / row["seconds_per_token"] / bandwidth
    return {"settings": s, "results": results, "bytes_per_token": nbytes, "bandwidth_bytes_per_s": bandwidth,
            "compile_s": compile_s, "compilations": engines["static compiled"].runner.static.compilations}


def figures(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows: overlap at batch 1 (time per token) and 8 (tokens/s); the compiled step's batch-1 MBU; the
    batch-invariant mode's tokens/s at 1 and 8, each against the default engine."""
    r1, r8 = section["results"]["1"], section["results"]["8"]
    base = "engine, default step"
    rows = [figure("overlap scheduling, batch 1: time per token, overlapped engine",
                   1e3 * r1["overlapped"]["seconds_per_token"], "ms", against=base,
                   baseline=1e3 * r1["default"]["seconds_per_token"], higher_is_better=False),
            figure("overlap scheduling, 8 requests at once: tokens/s, overlapped engine",
                   1 / r8["overlapped"]["seconds_per_token"], "tok/s", against=base,
                   baseline=1 / r8["default"]["seconds_per_token"]),
            figure("static shapes, batch 1: MBU, compiled decode step (inductor)", r1["static compiled"]["mbu_percent"],
                   "%", against=base, baseline=r1["default"]["mbu_percent"])]
    for batch, r in (("1", r1), ("8", r8)):
        rows.append(figure(f"batch-invariant mode, {batch} request{'s' if batch != '1' else ''}: tokens/s",
                           1 / r["batch-invariant"]["seconds_per_token"], "tok/s", against=base,
                           baseline=1 / r["default"]["seconds_per_token"]))
    return rows


def notes(section: dict[str, Any]) -> list[str]:
    s = section["settings"]
    return [f"overheads (lab 12): `{s['model']}` in-process on {s['threads']} thread(s), greedy, {s['tokens']} tokens "
            f"after {s['prompt_tokens']}-token corpus prompts, batches of 1 and 8 (max_num_seqs {s['max_num_seqs']}), "
            f"{s['repeats']} interleaved repeats; the compiled step's {section['compilations']} graph(s) compiled in the "
            f"warm-up ({section['compile_s']:.0f} s), not timed. Ratios above 1x: the mode is faster than the default "
            "engine; below: what it costs."]
