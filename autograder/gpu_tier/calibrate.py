"""`make calibrate` (`python -m autograder calibrate`): measure every speed check on this machine and set its threshold.

For each speed check graded on this device class (the CPU tier on a CPU, the GPU tier on a GPU) it runs the check
itself, with its threshold switched off (`thresholds.fixed`), on the reference and on each plausible slow
implementation (autograder/gpu_tier/slow_implementations.py), `runs` times, interleaved (reference, slow 1, slow 2, reference,
... with the order rotated each run). Each call yields the check's figure:

    speed checks   fraction = speedup(candidate) / speedup(reference), both timed inside the same call
                   (the reference handed in as the candidate gives about 1; a slow implementation well below 1)
    memory check   growth of the peak extra memory per doubling of T (about 2 for O(T), 4 for O(T^2))

The threshold goes between the worst reference run and the best slow run, at their geometric mean, so that both
sides keep the same relative margin:

    at_least:  threshold = sqrt(min(reference) * max(slow)),   margin = min(reference) / threshold - 1
    at_most:   threshold = sqrt(max(reference) * min(slow)),   margin = min(slow) / threshold - 1

when the two are at least MIN_SEPARATION apart (so each margin is at least sqrt(1.5) - 1 = 22%). Closer than that,
the check cannot tell them apart on this device: the file says `"graded": false` and the check is ungraded here.
Each result goes to autograder/calibration/<check>.<device class>.json with the device, versions, raw runs and date.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from autograder.checking import thresholds

__all__ = ["SpeedCheck", "REGISTRY", "MIN_SEPARATION", "choose_threshold", "calibrate_check", "versions", "main",
           "estimate_seconds"]

MIN_SEPARATION = 1.5
DEFAULT_RUNS = 5


@dataclass(frozen=True)
class SpeedCheck:
    """One graded speed (or memory) check, as calibration sees it.

    measure(implementation, small, device) -> the check's figure for that implementation (threshold switched off).
    reference / slow: zero-argument loaders of the implementations (imports happen only when measured).
    """

    name: str
    lab: str
    tier: str                                   # "cpu" or "gpu": which device class grades it
    what: str
    measure: Callable[[Any, bool, str], float]
    reference: Callable[[], Any]
    slow: dict[str, Callable[[], Any]] = field(default_factory=dict)
    direction: str = "at_least"                 # at_least: fraction of the reference; at_most: memory growth
    seconds_per_run: dict[str, float] = field(default_factory=dict)   # estimate per device tier, for the README


# ---------------------------------------------------------------------------------------------------------------
# The checks. Each measure() calls the graded check function unchanged, so calibration times what grading times.
# ---------------------------------------------------------------------------------------------------------------

def _fraction(result: dict[str, float]) -> float:
    return result["speedup"] / result["reference_speedup"]


def _lab01_cached(impl: Any, small: bool, device: str) -> float:
    from autograder.lab01 import time_cached_speedup      # the graded check refuses the reference and generate_naive
    return _fraction(time_cached_speedup(impl, **(dict(prompt_len=16, new_tokens=4, repeats=1) if small else {})))


def _lab05_int4_cpu(impl: Any, small: bool, device: str) -> float:
    from autograder.lab05 import check_int4_cpu_linear
    return _fraction(check_int4_cpu_linear(impl, allow_reference=True, **(dict(K=512, N=512, repeats=1) if small else {})))


def _lab06_speculative(impl: Any, small: bool, device: str) -> float:
    from autograder.lab06 import check_speculative_speedup
    # the check's other bar (a speedup above 1) is the learner's, not calibration's: a slow run must be measured
    return _fraction(check_speculative_speedup(impl, require_real_speedup=False, allow_reference=True,
                                               **(dict(new_tokens=4, repeats=1) if small else {})))


def _lab01_graph(impl: Any, small: bool, device: str) -> float:
    from autograder.lab01 import check_graphed_decode
    return _fraction(check_graphed_decode(impl, **(dict(steps=8) if small else {})))


def _lab03_gpu(impl: Any, small: bool, device: str) -> float:
    from autograder.lab03 import SMALL_CONFIG, check_continuous_speedup_gpu
    from minigpt.engine.packed_batch import pack_chunks
    kw = dict(repeats=1, config=SMALL_CONFIG) if small else {}
    return _fraction(check_continuous_speedup_gpu(impl, pack_chunks, device=device, allow_reference=True, **kw))


def _lab04_flash(impl: Any, small: bool, device: str) -> float:
    from autograder.lab04 import check_flash_speed
    kw = dict(seq_len=32, head_dim=16, batch=1, heads=2, rounds=1) if small else {}
    return _fraction(check_flash_speed(impl, device=device, **kw))


def _lab04_backward(impl: Any, small: bool, device: str) -> float:
    from autograder.lab04 import check_flash_backward_speed
    kw = dict(seq_len=32, head_dim=16, batch=1, heads=2, rounds=1) if small else {}
    return _fraction(check_flash_backward_speed(impl, device=device, **kw))


def _lab04_decode(impl: Any, small: bool, device: str) -> float:
    from autograder.lab04 import check_paged_decode_speed
    kw = dict(batch=2, context=64, heads=4, kv_heads=2, head_dim=16, rounds=1) if small else {}
    return _fraction(check_paged_decode_speed(impl, device=device, **kw))


def _lab04_memory(impl: Any, small: bool, device: str) -> float:
    from autograder.lab04 import check_flash_memory
    return check_flash_memory(impl, **(dict(seq_lens=(256, 512), heads=2) if small else {}))["max_growth"]


def _lab05_gemv(bits: int) -> Callable[[Any, bool, str], float]:
    def measure(impl: Any, small: bool, device: str) -> float:
        from autograder.lab05 import check_gemv_speed
        kw = dict(N=64, K=256, rounds=1) if small else {}
        return _fraction(check_gemv_speed(impl, bits=(bits,), device=device, **kw)[f"int{bits}"])
    return measure


def _slow(name: str) -> Callable[[], Any]:
    def load() -> Any:
        from autograder.gpu_tier import slow_implementations
        return getattr(slow_implementations, name)
    return load


def _ref(module: str, name: str) -> Callable[[], Any]:
    def load() -> Any:
        import importlib
        return getattr(importlib.import_module(module), name)
    return load


def _flash_reference() -> Any:
    from minigpt.kernels.flash_attention import flash_attention_forward
    return lambda q, k, v, causal: flash_attention_forward(q, k, v, causal=causal)


# seconds_per_run: one run of one implementation, measured (CPU: the shared 2-core machine; GPU: an NVIDIA H200,
# 2026-11-26, calibration seconds / (runs x implementations), rounded up).
REGISTRY: list[SpeedCheck] = [
    SpeedCheck("lab01_cached_speedup", "01", "cpu", "cached generation vs generate_naive (target shape, 128 + 32 tokens)",
               _lab01_cached, _ref("minigpt.engine.cached_generation", "generate_kv_cache"),
               {"generate_naive": _slow("generate_naive")}, seconds_per_run={"cpu": 40}),
    SpeedCheck("lab05_int4_cpu_linear", "05", "cpu", "INT4 CPU linear vs fp32 at 4096 x 4096, batch 1",
               _lab05_int4_cpu, _ref("minigpt.quant.cpu_kernels", "Int4WeightOnlyLinear"),
               {"dequantize_every_call": _slow("dequantize_every_call")}, seconds_per_run={"cpu": 8}),
    SpeedCheck("lab06_speculative_speedup", "06", "cpu", "speculative decoding (prompt lookup, k=4) vs cached decoding",
               _lab06_speculative, _ref("minigpt.engine.speculative", "generate_speculative"),
               {"recompute_everything": _slow("recompute_everything")}, seconds_per_run={"cpu": 50}),
    SpeedCheck("lab01_cuda_graph_decode", "01", "gpu", "64 decode steps replayed from a CUDA graph vs eager",
               _lab01_graph, _ref("minigpt.engine.cuda_graph", "GraphedDecodeStep"),
               {"eager_decode_step": _slow("eager_decode_step")}, seconds_per_run={"gpu": 3}),
    SpeedCheck("lab03_continuous_speedup_gpu", "03", "gpu", "continuous vs static batching, skewed workload, wall time",
               _lab03_gpu, _ref("minigpt.engine.scheduler", "Scheduler"),
               {"RefillOnlyWhenEmpty": _slow("RefillOnlyWhenEmpty")}, seconds_per_run={"gpu": 8}),
    SpeedCheck("lab04_flash_speed", "04", "gpu", "flash forward vs naive attention, T=4096, d=64, causal, fp16",
               _lab04_flash, _flash_reference,
               {"flash_small_tiles": _slow("flash_small_tiles"), "naive_as_flash": _slow("naive_as_flash")},
               seconds_per_run={"gpu": 4}),
    SpeedCheck("lab04_flash_backward_speed", "04", "gpu",
               "flash fwd+bwd (autograd Function) vs SDPA-flash fwd+bwd, T=4096, d=64, causal, fp16",
               _lab04_backward, _ref("minigpt.kernels.flash_attention", "FlashAttentionFunction"),
               {"FlashBackwardSmallTiles": _slow("FlashBackwardSmallTiles"),
                "NaiveAttentionFunction": _slow("NaiveAttentionFunction")}, seconds_per_run={"gpu": 4}),
    SpeedCheck("lab04_paged_decode_speed", "04", "gpu", "paged decode vs gather-then-SDPA, batch 32, context 8k",
               _lab04_decode, _ref("minigpt.kernels.paged_decode", "paged_decode"),
               {"paged_decode_one_split": _slow("paged_decode_one_split"),
                "paged_decode_pytorch": _slow("paged_decode_pytorch")}, seconds_per_run={"gpu": 2}),
    SpeedCheck("lab04_flash_memory", "04", "gpu", "peak extra memory growth per doubling of T (2k, 4k, 8k)",
               _lab04_memory, _flash_reference, {"naive_as_flash": _slow("naive_as_flash")},
               direction="at_most", seconds_per_run={"gpu": 2}),
    SpeedCheck("lab05_dequant_gemv_int8", "05", "gpu", "INT8 dequantizing GEMV vs bf16 matmul, 8192 x 8192, batch 1",
               _lab05_gemv(8), _ref("minigpt.kernels.dequant_gemv", "dequant_gemv"),
               {"dequantize_then_matmul": _slow("dequantize_then_matmul")}, seconds_per_run={"gpu": 3}),
    SpeedCheck("lab05_dequant_gemv_int4", "05", "gpu", "INT4 dequantizing GEMV vs bf16 matmul, 8192 x 8192, batch 1",
               _lab05_gemv(4), _ref("minigpt.kernels.dequant_gemv", "dequant_gemv"),
               {"dequantize_then_matmul": _slow("dequantize_then_matmul")}, seconds_per_run={"gpu": 3}),
]


# ---------------------------------------------------------------------------------------------------------------
# Choosing the threshold
# ---------------------------------------------------------------------------------------------------------------

def _two_digits(x: float) -> float:
    """x rounded to two significant digits (0.4123 -> 0.41, 2.828 -> 2.8)."""
    return float(f"{x:.2g}")


def summary(values: list[float]) -> dict[str, float]:
    med = statistics.median(values)
    return {"median": round(med, 4), "min": round(min(values), 4), "max": round(max(values), 4),
            "spread": round((max(values) - min(values)) / med, 4) if med else math.inf}


def choose_threshold(reference: list[float], slow: dict[str, list[float]], direction: str = "at_least") -> dict:
    """The threshold between the reference's runs and the slow implementations' runs (module docstring), or why not."""
    slow_runs = [v for runs in slow.values() for v in runs]
    if not reference or not slow_runs:
        return {"graded": False, "threshold": None, "decision": "nothing to separate: a side has no successful run"}
    if direction == "at_least":
        good, bad = min(reference), max(slow_runs)
        separation = good / bad if bad > 0 else math.inf
    elif direction == "at_most":
        good, bad = max(reference), min(slow_runs)
        separation = bad / good if good > 0 else math.inf
    else:
        raise ValueError(f"direction must be at_least or at_most, got {direction!r}")
    side = {"worst_reference_run": round(good, 4), "best_slow_run": round(bad, 4), "separation": round(separation, 4)}
    if not separation >= MIN_SEPARATION:
        return {"graded": False, "threshold": None, **side,
                "decision": (f"overlap: the worst reference run ({good:.3g}) and the best slow run ({bad:.3g}) are "
                             f"{separation:.2f}x apart, less than the {MIN_SEPARATION}x needed to grade")}
    threshold = _two_digits(math.sqrt(good * bad)) if math.isfinite(separation) else _two_digits(good / 2)
    if direction == "at_least":
        margins = {"margin_reference": good / threshold - 1, "margin_slow": threshold / bad - 1 if bad > 0 else math.inf}
    else:
        margins = {"margin_reference": threshold / good - 1, "margin_slow": bad / threshold - 1}
    rel = "at least" if direction == "at_least" else "at most"
    return {"graded": True, "threshold": threshold, **side, **{k: round(v, 4) for k, v in margins.items()},
            "decision": (f"{rel} {threshold:g}: geometric mean of the worst reference run ({good:.3g}) and the best "
                         f"slow run ({bad:.3g}); margins {margins['margin_reference']:.0%} to the reference and "
                         f"{margins['margin_slow']:.0%} to the slow side")}


# ---------------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------------

def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def versions(device: str) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "cpu_count": os.cpu_count()}
    try:        # the installed version, without importing triton (an import before minigpt.kernels decides
        out["triton"] = importlib.metadata.version("triton")      # TRITON_INTERPRET would fix it to "compile")
    except importlib.metadata.PackageNotFoundError:
        out["triton"] = None
    if device == "cuda":
        out["driver"] = _driver_version()
        major, minor = torch.cuda.get_device_capability()
        out["compute_capability"] = f"{major}.{minor}"
        out["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return out


def calibrate_check(spec: SpeedCheck, *, runs: int = DEFAULT_RUNS, small: bool = False, device: str = "cpu",
                    note: str = "", log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure one check `runs` times on the reference and each slow implementation, interleaved; choose its threshold."""
    from autograder.harness import quiet
    from minigpt.timing import device_class

    impls = {"reference": spec.reference(), **{name: load() for name, load in spec.slow.items()}}
    names = list(impls)
    measured: dict[str, list[float]] = {n: [] for n in names}
    errors: dict[str, str] = {}
    off = 0.0 if spec.direction == "at_least" else math.inf
    started = time.perf_counter()
    for r in range(runs):
        for name in names[r % len(names):] + names[: r % len(names)]:
            if name in errors:
                continue
            try:
                with thresholds.fixed(off), quiet():
                    value = spec.measure(impls[name], small, device)
            except AssertionError as err:       # a slow implementation the check rejects outright
                if name == "reference":
                    raise
                errors[name] = str(err)[:300]
                continue
            measured[name].append(round(float(value), 5))
        log(f"  {spec.name} run {r + 1}/{runs}: " + ", ".join(f"{n} {v[-1]:.3g}" for n, v in measured.items() if v))
    slow = {n: v for n, v in measured.items() if n != "reference" and v}
    choice = choose_threshold(measured["reference"], slow, spec.direction)
    dev_class = device_class(device)
    return {
        "check": spec.name,
        "lab": spec.lab,
        "what": spec.what,
        "device_class": dev_class,
        "device_name": thresholds.device_name(dev_class),
        "versions": versions(device),
        "date": datetime.date.today().isoformat(),
        "runs": runs,
        "shapes": "small (a test of the machinery, not a calibration)" if small else "the check's own",
        "direction": spec.direction,
        "figure": ("growth of peak extra memory per doubling of T" if spec.direction == "at_most" else
                   "speedup(candidate over baseline) / speedup(reference over baseline), same call"),
        "measured": measured,
        "summary": {n: summary(v) for n, v in measured.items() if v},
        "rejected_outright": errors,
        **choice,
        "rule": f"geometric mean between the worst reference run and the best slow run; graded only when they are at "
                f"least {MIN_SEPARATION}x apart",
        "seconds": round(time.perf_counter() - started, 1),
        "note": note,
    }


def select(*, tier: str, lab: str | None = None, check: str | None = None) -> list[SpeedCheck]:
    chosen = [s for s in REGISTRY if s.tier == tier and (lab is None or s.lab == lab.zfill(2))
              and (check is None or s.name == check)]
    if check is not None and not chosen:
        known = ", ".join(s.name for s in REGISTRY)
        raise SystemExit(f"no {tier}-tier speed check named {check!r} (known: {known})")
    return chosen


def estimate_seconds(tier: str, runs: int = DEFAULT_RUNS) -> float:
    """Rough wall time of a full calibration of one tier: runs x implementations x seconds per run (an estimate)."""
    return sum(runs * (1 + len(s.slow)) * s.seconds_per_run.get(tier, 0) for s in REGISTRY if s.tier == tier)


def main(*, lab: str | None = None, runs: int = DEFAULT_RUNS, check: str | None = None, small: bool = False,
         out_dir: Path | None = None, device: str | None = None, note: str = "") -> int:
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("calibrate --device cuda needs a CUDA GPU; this machine has none. Nothing was measured.")
        return 2
    tier = "gpu" if device == "cuda" else "cpu"
    specs = select(tier=tier, lab=lab, check=check)
    out_dir = out_dir or thresholds.calibration_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"calibrating {len(specs)} {tier}-tier check(s) on {thresholds.device_name('cpu' if tier == 'cpu' else 'cuda')}, "
          f"{runs} run(s) each (estimate for the full tier: {estimate_seconds(tier, runs) / 60:.0f} min)", flush=True)
    rows = []
    for spec in specs:
        result = calibrate_check(spec, runs=runs, small=small, device=device, note=note)
        path = thresholds.calibration_path(spec.name, result["device_class"], out_dir)
        path.write_text(json.dumps(result, indent=1) + "\n")
        rows.append(result)
        print(f"{spec.name}: {result['decision']} -> {path}", flush=True)
    print("\n| check | reference (median, min-max) | slowest-to-beat (median, min-max) | threshold | margins |")
    print("|---|---|---|---|---|")
    for r in rows:
        ref = r["summary"]["reference"]
        slow = "; ".join(f"{n} {s['median']:.3g} ({s['min']:.3g}-{s['max']:.3g})" for n, s in r["summary"].items()
                         if n != "reference")
        thr = f"{r['threshold']:g}" if r["graded"] else "ungraded (overlap)"
        margins = (f"{r['margin_reference']:.0%} / {r['margin_slow']:.0%}" if r["graded"] else "-")
        print(f"| {r['check']} | {ref['median']:.3g} ({ref['min']:.3g}-{ref['max']:.3g}) | {slow} | {thr} | {margins} |")
    return 0
