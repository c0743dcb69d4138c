"""Lab 08 multi-LoRA measurements outside the notebook: several runs of `lora_serving_figures` on the target
checkpoint (one mixed batch of four adapters vs four one-adapter batches; batched-LoRA step cost vs the base
model), plus the memory of 100 adapters. Writes autograder/calibration/lab08.cpu.json with the machine named.

    .venv/bin/python scripts/measure_lab08_lora.py [--runs 3] [--repeats 3] [--threads 1] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from minigpt.checkpoint import load_model
from minigpt.serving.lora_bench import hundred_adapters, lora_serving_figures
from minigpt.costmodel.calculators import PRESETS

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "autograder" / "calibration" / "lab08.cpu.json")
    args = ap.parse_args()
    model = load_model("target")
    runs = []
    for i in range(args.runs):
        f = lora_serving_figures(model, repeats=args.repeats, threads=args.threads, seed=i, grouped_batch=True)
        runs.append(f)
        print(f"run {i}: mixed {f['mixed_tokens_per_s']:.1f} tok/s (grouped {f['mixed_grouped_tokens_per_s']:.1f}), four batches {f['separate_tokens_per_s']:.1f} tok/s "
              f"({f['mixed_over_separate']:.2f}x); step base {f['base_step_s'] * 1e3:.1f} ms, LoRA gathered "
              f"{f['lora_step_s'] * 1e3:.1f} ms (+{100 * f['lora_step_overhead']:.0f}%), grouped "
              f"{f['grouped_step_s'] * 1e3:.1f} ms (+{100 * f['grouped_step_overhead']:.0f}%); {f['seconds']:.1f} s")
    keys = ["mixed_tokens_per_s", "separate_tokens_per_s", "mixed_over_separate", "mixed_grouped_tokens_per_s",
            "mixed_grouped_over_separate", "single_lora_tokens_per_s", "single_merged_tokens_per_s",
            "mixed_over_single_lora", "mixed_over_single_merged", "base_step_s", "lora_step_s",
            "lora_step_overhead", "grouped_step_s", "grouped_step_overhead", "seconds"]
    memory = {name: hundred_adapters(PRESETS[name], r) for name, r in (("minigpt-target", 8), ("Llama-3-8B", 16))}
    for m in memory.values():
        print(f"{m['model']}: rank {m['rank']}: {m['mib_per_adapter']:.3f} MiB per adapter (bf16), 100 adapters "
              f"{m['total_gib']:.3f} GiB = {m['percent_of_base']:.1f}% of the base weights")
    record = {
        "what": "minigpt.serving.lora_bench.lora_serving_figures (no graded speed threshold: "
                "the notebook prints the learner's own measurement)",
        "device_class": "cpu",
        "device_name": f"{platform.machine()}, {os.cpu_count()} cores shared with other sessions "
                       f"(load average {os.getloadavg()[0]:.1f} at the end): noisy",
        "threads": args.threads, "torch": torch.__version__,
        "workload": {k: runs[0][k] for k in ("n_adapters", "rank", "requests", "prompt_len", "new_tokens")},
        "measured": {k: [round(r[k], 5) for r in runs] for k in keys},
        "median": {k: round(statistics.median(r[k] for r in runs), 5) for k in keys},
        "adapter_bytes": {"fp32": runs[0]["adapter_bytes_fp32"], "bf16": runs[0]["adapter_bytes_bf16"]},
        "hundred_adapters": memory,
        "date": datetime.date.today().isoformat(),
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
