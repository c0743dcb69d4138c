"""Measure what the lab-05 CPU speed threshold is chosen from; writes lab05_int4_cpu_linear.<device>.json here.

    python autograder/calibration/measure_lab05_cpu.py

Records, over several runs on this machine, in the check's own setting (4096 x 4096, batch 1, group 128, timed
against fp32 F.linear with minigpt.timing.compare): the reference CPU INT4 kernel's speedup, and the speedup of a
plausible slow candidate (the same INT4 values, dequantized to float32 in PyTorch on every call). Also the full
GEMV table of the notebook (fp32, bf16, oneDNN INT8 W8A8, INT4 W4A16, INT8 W8A16) at 4096 and 8192.
"""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import torch
import torch.nn.functional as F

from autograder.lab05 import INT4_CPU_MIN_FRACTION
from minigpt.quant.cpu_kernels import Int4WeightOnlyLinear, Int8DynamicLinear, Int8WeightOnlyLinear
from minigpt.timing import compare, device_class


def slow_int4(w: torch.Tensor, group_size: int = 128):
    wg = w.reshape(w.shape[0], -1, group_size)
    lo = wg.amin(-1, keepdim=True)
    scale = (wg.amax(-1, keepdim=True) - lo) / 15
    q = torch.round((wg - lo) / scale).clamp(0, 15).to(torch.uint8)
    return lambda x: F.linear(x, (q.float() * scale + lo).reshape(w.shape))


def main(runs: int = 3, n: int = 4096) -> None:
    g = torch.Generator().manual_seed(0)
    W, x = torch.randn(n, n, generator=g) * 0.02, torch.randn(1, n, generator=g)
    ref, slow = Int4WeightOnlyLinear(W, 128), slow_int4(W)
    check = []
    for _ in range(runs):
        r = compare({"fp32": lambda: F.linear(x, W), "ref": lambda: ref(x), "slow": lambda: slow(x)}, repeats=5)
        check.append({k: round(r["fp32"].median / r[k].median, 2) for k in ("ref", "slow")})
    table = {}
    for size in (4096, 8192, 1024):
        k = 384 if size == 1024 else size
        Wt, xt = torch.randn(size, k, generator=g) * 0.02, torch.randn(1, k, generator=g)
        f8, f4, f8w = Int8DynamicLinear(Wt), Int4WeightOnlyLinear(Wt, 128), Int8WeightOnlyLinear(Wt)
        Wb, xb = Wt.to(torch.bfloat16), xt.to(torch.bfloat16)
        r = compare({"fp32": lambda: F.linear(xt, Wt), "bf16": lambda: F.linear(xb, Wb), "int8_w8a8_onednn": lambda: f8(xt),
                     "int4_w4a16": lambda: f4(xt), "int8_w8a16_int8pack": lambda: f8w(xt)}, repeats=7 if size > 1024 else 30)
        table[f"{size}x{k}"] = {name: {"ms": round(t.median * 1e3, 4), "speedup_vs_fp32": round(r["fp32"].median / t.median, 2)}
                                for name, t in r.items()}
    cls = device_class()
    out = {
        "check": "autograder.lab05.check_int4_cpu_linear",
        "device_class": cls,
        "device_name": platform.processor() or platform.machine(),
        "threads": 2,
        "torch": torch.__version__,
        "measured": {"reference_speedup": [c["ref"] for c in check],
                     "plausible_slow_speedup": [c["slow"] for c in check], "gemv_table": table},
        "chosen_min_fraction": INT4_CPU_MIN_FRACTION.get(cls),
        "notes": "shared 2-core machine under heavy load from other jobs: absolute times are noisy",
        "date": datetime.date.today().isoformat(),
    }
    path = Path(__file__).with_name(f"lab05_int4_cpu_linear.{cls}.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
