"""One timing harness for every lab and the autograder: warm-up, interleaved runs, medians, ratios.

    results = compare({"naive": lambda: gen_naive(...), "cached": lambda: gen_cached(...)}, repeats=7)
    results["naive"].median / results["cached"].median         # speedup, measured in one process

On CPU each call is timed with a monotonic clock (time.perf_counter) under a fixed thread count; on
CUDA with events around the call (the device is synchronized before reading them). Candidates are run
in turn, round after round, with the order rotated each round, so that drifts in clock speed or load
hit all of them alike. `do_bench_median` wraps triton.testing.do_bench for single GPU kernels, and
`bench_interleaved` runs several of them in interleaved rounds.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

CPU_THREADS = 2     # the course's reference machine (and CI) has 2 cores


@dataclass
class Timing:
    """Seconds per call for one candidate."""

    name: str
    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the measurement was."""
        return (max(self.samples) - min(self.samples)) / self.median

    def __repr__(self) -> str:
        return (f"Timing({self.name!r}, median={self.median * 1e3:.3f} ms over {len(self.samples)} runs, "
                f"slowest - fastest = {self.spread:.0%} of the median)")


@contextmanager
def fixed_threads(n: int = CPU_THREADS) -> Iterator[None]:
    """Run torch's CPU ops on exactly n threads inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_call(fn: Callable[[], Any], device: torch.device | str = "cpu") -> float:
    """Seconds for one call of fn (device work included)."""
    if torch.device(device).type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare(candidates: dict[str, Callable[[], Any]], *, warmup: int = 1, repeats: int = 5,
            device: torch.device | str = "cpu", threads: int = CPU_THREADS,
            measure: dict[str, Callable[[Callable[[], Any]], float]] | None = None) -> dict[str, Timing]:
    """Time each candidate `repeats` times, interleaved and warmed up; returns {name: Timing}. `measure[name](fn)`,
    where given, times one call of that candidate instead of `time_call` (a grader that holds other processes
    while it times)."""
    if not candidates:
        raise ValueError("compare() needs at least one candidate")
    names = list(candidates)
    samples: dict[str, list[float]] = {n: [] for n in names}
    with fixed_threads(threads):
        for _ in range(warmup):
            for n in names:
                candidates[n]()
        for r in range(repeats):
            order = names[r % len(names):] + names[: r % len(names)]
            for n in order:
                timer = (measure or {}).get(n)
                samples[n].append(timer(candidates[n]) if timer else time_call(candidates[n], device))
    return {n: Timing(n, samples[n]) for n in names}


def speedup(results: dict[str, Timing], baseline: str, candidate: str) -> float:
    """median(baseline) / median(candidate): above 1 means the candidate is faster."""
    return results[baseline].median / results[candidate].median


def do_bench_median(fn: Callable[[], Any], warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median seconds of a GPU callable via triton.testing.do_bench (CUDA events, cache flushed)."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") / 1e3


def bench_interleaved(fns: dict[str, Callable[[], Any]], *, rounds: int = 5,
                      device: torch.device | str = "cuda") -> dict[str, float]:
    """Median seconds per call of each callable over `rounds` interleaved rounds (order rotated each round).

    CUDA: each round's figure is do_bench's median (CUDA events, L2 flushed). CPU: one perf_counter call per round
    after one warm-up call (the device-generic path, for running GPU-tier checks on small shapes without a GPU).
    """
    names = list(fns)
    cuda = torch.device(device).type == "cuda"
    if not cuda:
        for n in names:
            fns[n]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            samples[n].append(do_bench_median(fns[n]) if cuda else time_call(fns[n], device))
    return {n: statistics.median(ts) for n, ts in samples.items()}


def device_class(device: torch.device | str | None = None) -> str:
    """Threshold bucket for speed checks: "cpu", or "cuda-sm90" style (compute capability) on a GPU."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"cuda-sm{major}{minor}"
