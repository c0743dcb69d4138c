"""Lab 08: the engine's per-token latency (ITL) at low load and its throughput at saturation, against the naive
server, side by side with the lab's load generator (`minigpt.serving.load_generator`).

    .venv/bin/python scripts/measure_lab08_itl.py [--tree before=/tmp/old/shared] [--rounds 3]

Each `--tree NAME=PATH` is a copy of `shared/` (a PYTHONPATH root; default: this checkout's `shared/` as "now");
for every tree a naive and a continuous server run as child processes (loopback, one torch thread each). Round by
round, every server gets the same workloads in turn (interleaved, so slow drifts of a shared machine hit all
alike): `--low-rate` requests/s (Poisson; at 0.5 req/s the requests rarely overlap, so the engine decodes at
batch 1) and all at once (saturation). Prints medians over rounds of the p50 ITL and the output tokens/s.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
from pathlib import Path

from minigpt.serving.client_metrics import summarize_records
from minigpt.serving.launch import serve_subprocess
from minigpt.serving.load_generator import benchmark, corpus_prompts

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH of a shared/ copy (repeatable)")
    ap.add_argument("--checkpoint", default="target")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--low-rate", type=float, default=0.5)
    ap.add_argument("--low-requests", type=int, default=6)
    ap.add_argument("--sat-requests", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--engine-args", default="--max-num-seqs 32 --max-num-batched-tokens 512")
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) or {"now": str(ROOT / "shared")}
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start (shared)")
    results: dict[tuple[str, str, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        urls = {}
        for name, path in trees.items():
            env = {"PYTHONPATH": f"{path}:{ROOT}", "OMP_NUM_THREADS": "1", "MINIGPT_DATA_DIR": str(ROOT / "data")}
            for engine in ("naive", "continuous"):
                extra = args.engine_args.split() if engine == "continuous" else []
                urls[name, engine] = stack.enter_context(serve_subprocess(
                    ["--checkpoint", args.checkpoint, "--engine", engine, "--threads", "1",
                     "--max-queue", str(args.sat_requests + 8), *extra], env=env))
        for url in urls.values():
            benchmark(url, ["warm-up"], max_tokens=2, max_duration=60)
        for r in range(args.rounds):
            low = corpus_prompts(args.low_requests, prompt_tokens=args.prompt_tokens, seed=100 + r)
            sat = corpus_prompts(args.sat_requests, prompt_tokens=args.prompt_tokens, seed=200 + r)
            for key, url in urls.items():
                for label, work, rate in (("low", low, args.low_rate), ("sat", sat, math.inf)):
                    s = summarize_records(benchmark(url, work, rate=rate, max_tokens=args.max_tokens, seed=r,
                                                    max_duration=120))
                    results.setdefault((*key, label + "_itl"), []).append(s.itl[50])
                    results.setdefault((*key, label + "_tps"), []).append(s.output_throughput)
                    print(f"round {r} {key[0]:>8} {key[1]:>10} {label}: {s.row()}", flush=True)
    print(f"\nmedians over {args.rounds} rounds (load average {os.getloadavg()[0]:.1f} at the end):")
    for name in trees:
        n, c = (lambda e, m: statistics.median(results[name, e, m]))("naive", "low_itl"), \
            statistics.median(results[name, "continuous", "low_itl"])
        print(f"{name:>8}: ITL p50 at {args.low_rate:g} req/s naive {1e3 * n:.1f} ms, engine {1e3 * c:.1f} ms "
              f"({c / n:.2f}x); saturation tokens/s naive "
              f"{statistics.median(results[name, 'naive', 'sat_tps']):.0f}, engine "
              f"{statistics.median(results[name, 'continuous', 'sat_tps']):.0f}")


if __name__ == "__main__":
    main()
