"""Lab 08 measurements: naive serving against the engine (throughput and p99 TTFT against request rate), and
prefix-aware routing against round-robin over two engine replicas. Writes
autograder/calibration/lab08_serving.cpu.json (the lead quotes it in the notebook and the closing note):
"engines_NxT" for N requests of T output tokens per rate, and "routing_PxQ" for P system prompts x Q questions each.

    .venv/bin/python scripts/measure_lab08_serving.py [--checkpoint target] [--requests 24] [--threads 1]

Each server is a child process (`python -m minigpt.serving`, loopback, free port) stopped at the end; every
benchmark is bounded by --max-duration seconds. About 4-6 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from minigpt.serving.experiments import compare_engines, compare_routing

OUT = Path(__file__).resolve().parents[1] / "autograder" / "calibration" / "lab08_serving.cpu.json"


def _rate(r: float) -> float | str:
    return "inf" if math.isinf(r) else r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="target")
    ap.add_argument("--rates", default="1,2,4,8,inf", help="request rates (req/s), inf = all at once")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per server process")
    ap.add_argument("--engine-args", default="--max-num-seqs 32 --max-num-batched-tokens 512",
                    help="extra `python -m minigpt.serving` arguments for the continuous engine")
    ap.add_argument("--max-duration", type=float, default=90.0)
    ap.add_argument("--routing-prefixes", type=int, default=4)
    ap.add_argument("--routing-questions", type=int, default=12)
    ap.add_argument("--routing-prefix-tokens", type=int, default=256)
    ap.add_argument("--routing-rate", type=float, default=4.0)
    ap.add_argument("--skip-engines", action="store_true")
    ap.add_argument("--skip-routing", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    result: dict = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update({
        "script": "scripts/measure_lab08_serving.py",
        "device_class": "cpu",
        "device_name": f"{platform.machine()}, {os.cpu_count()} cores shared with other sessions "
                       f"(load average {os.getloadavg()[0]:.1f} at the start)",
        "torch": torch.__version__, "date": datetime.date.today().isoformat(),
    })

    if not args.skip_engines:
        t0 = time.perf_counter()
        cmp = compare_engines(rates, checkpoint=args.checkpoint, num_requests=args.requests,
                              prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, threads=args.threads,
                              max_duration=args.max_duration, engine_args=args.engine_args.split(), processes=True)
        print(cmp.table())
        common = cmp.highest_common_rate()
        speedup = cmp.speedup() if common is not None else None
        if common is not None:
            n, c = cmp.at("naive", common), cmp.at("continuous", common)
            print(f"highest rate both sustain: {common}; engine/naive output tokens/s = {speedup:.2f}x; "
                  f"p99 TTFT {1e3 * c.p99_ttft:.0f} ms (engine) vs {1e3 * n.p99_ttft:.0f} ms (naive)")
        key = f"engines_{args.requests}x{args.max_tokens}"          # one entry per workload shape
        result[key] = {
            "checkpoint": args.checkpoint, "requests_per_rate": args.requests, "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens, "threads_per_server": args.threads, "engine_args": args.engine_args,
            "curve": [{"engine": p.engine, "rate": _rate(p.rate), "output_tokens_per_s": round(p.output_throughput, 2),
                       "request_throughput": round(p.summary.request_throughput, 3),
                       "p50_ttft_ms": round(1e3 * p.summary.ttft[50], 1), "p99_ttft_ms": round(1e3 * p.p99_ttft, 1),
                       "p50_tpot_ms": round(1e3 * p.summary.tpot[50], 2), "p99_itl_ms": round(1e3 * p.summary.itl[99], 1),
                       "goodput_req_per_s": round(p.summary.goodput, 3), "ok": p.summary.num_ok,
                       "requests": p.summary.num_requests, "duration_s": round(p.summary.duration, 2)}
                      for p in cmp.points],
            "goodput_objective": {"ttft_s": cmp.points[0].summary.ttft_limit, "tpot_s": cmp.points[0].summary.tpot_limit},
            "highest_rate_both_sustain": None if common is None else _rate(common),
            "speedup_at_that_rate": None if speedup is None else round(speedup, 2),
            "target_speedup": 5.0,
            "wall_s": round(time.perf_counter() - t0, 1),
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    if not args.skip_routing:
        t0 = time.perf_counter()
        points = compare_routing(checkpoint=args.checkpoint, num_prefixes=args.routing_prefixes,
                                 questions_per_prefix=args.routing_questions, prefix_tokens=args.routing_prefix_tokens,
                                 rate=args.routing_rate, threads=args.threads, max_duration=args.max_duration,
                                 processes=True, question_tokens=16, max_tokens=4)
        for p in points:
            print(p.row())
        key = f"routing_{args.routing_prefixes}x{args.routing_questions}"     # one entry per workload shape
        result[key] = {
            "checkpoint": args.checkpoint, "replicas": 2, "system_prompts": args.routing_prefixes,
            "questions_per_system_prompt": args.routing_questions, "system_prompt_tokens": args.routing_prefix_tokens,
            "question_tokens": 16, "max_tokens": 4, "block_size": 16, "prefix_blocks": 4,
            "rate": args.routing_rate, "threads_per_replica": args.threads,
            "policies": [{"policy": p.policy, "prefix_cache_hit_rate": round(p.prefix_hit_rate, 4),
                          "mean_ttft_ms": round(1e3 * p.mean_ttft, 1), "p99_ttft_ms": round(1e3 * p.summary.ttft[99], 1),
                          "requests_per_replica": p.requests_per_replica, "ok": p.summary.num_ok,
                          "requests": p.summary.num_requests} for p in points],
            "wall_s": round(time.perf_counter() - t0, 1),
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
