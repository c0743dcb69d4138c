"""Measure what the lab-01 CPU speed threshold is chosen from; writes lab01_cached_speedup.<device>.json here.

    python autograder/calibration/measure_lab01_cpu.py

Records, over several runs on this machine: the reference cached generator's speedup over generate_naive in
the check's own setting (random target-shaped model, 128-token prompt, 32 new tokens), the speedup of a
plausible slow candidate (the naive loop itself), and the trained target's speedup at 256 new tokens.
"""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import torch

from autograder.lab01 import SPEED_MIN_FRACTION
from minigpt.checkpoint import load_model
from minigpt.config import TARGET_CONFIG
from minigpt.generate import generate_naive
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.model import GPT
from minigpt.timing import compare, device_class, speedup


def speedups(model: GPT, prompt: list[int], new_tokens: int, repeats: int) -> dict[str, float]:
    kw = {"stop_token_ids": ()}
    results = compare({"naive": lambda: generate_naive(model, prompt, new_tokens, **kw),
                       "naive_again": lambda: generate_naive(model, prompt, new_tokens, **kw),
                       "cached": lambda: generate_kv_cache(model, prompt, new_tokens, **kw)},
                      warmup=1, repeats=repeats)
    return {"reference": speedup(results, "naive", "cached"), "slow": speedup(results, "naive", "naive_again"),
            "naive_s": results["naive"].median, "cached_s": results["cached"].median}


def main(runs: int = 3) -> None:
    torch.manual_seed(0)
    check_model = GPT(TARGET_CONFIG).eval()
    prompt = torch.randint(0, TARGET_CONFIG.vocab_size, (128,), generator=torch.Generator().manual_seed(3)).tolist()
    check = [speedups(check_model, prompt, 32, repeats=3) for _ in range(runs)]
    trained = speedups(load_model("target"), list(range(1, 17)), 256, repeats=1)
    cls = device_class()
    out = {
        "check": "autograder.lab01.check_cached_speedup",
        "device_class": cls,
        "device_name": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "measured": {"reference_speedup": [round(c["reference"], 2) for c in check],
                     "plausible_slow_speedup": [round(c["slow"], 2) for c in check],
                     "trained_target_256_new_tokens": {"naive_s": round(trained["naive_s"], 3),
                                                       "cached_s": round(trained["cached_s"], 3),
                                                       "speedup": round(trained["reference"], 2)}},
        "chosen_min_fraction": SPEED_MIN_FRACTION[cls] if cls in SPEED_MIN_FRACTION else SPEED_MIN_FRACTION.get("cuda"),
        "date": datetime.date.today().isoformat(),
    }
    path = Path(__file__).with_name(f"lab01_cached_speedup.{cls}.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
