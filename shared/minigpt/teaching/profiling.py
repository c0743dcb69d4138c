"""Reading a torch.profiler profile of a forward pass: operators grouped into three categories (lab 01).

    with quiet_profile() as prof:                 # a torch.profiler.profile (CPU; CUDA too where a GPU is present)
        model(tokens, positions=..., kv_caches=cache)
    top_operators(prof, 5)                        # [("aten::mm", 0.0045, 43), ...]: (name, self seconds, calls)
    self_seconds_by_category(prof)                # {"matmul": 0.0045, "attention": 0.0005, "other": 0.0028}
    count_operations(lambda: model(...))          # Counter({"aten::mm": 43, "aten::mul": 81, ...}), no profiler

*Self* time is the time inside an operator itself, its children excluded: `aten::linear`'s *total* time contains
the `aten::mm` it calls, so totals double count and a ranking uses self time. The categories:

* ``matmul``: the weight and attention matrix multiplies (`aten::mm`, `addmm`, `bmm`, and the `linear`/`matmul`
  wrappers around them),
* ``attention``: fused attention and softmax (`aten::*scaled_dot_product*`, `aten::*softmax*`),
* ``other``: everything else: element-wise operators, norms, RoPE, copies, views, indexing, and on a GPU the
  CUDA runtime calls (`cudaLaunchKernel`) that launch each kernel.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from typing import Any, Callable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

CATEGORIES = ("matmul", "attention", "other")
MATMUL_OPERATORS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"})


def category(name: str) -> str:
    """The category ("matmul", "attention" or "other") of one profiler event name."""
    if name in MATMUL_OPERATORS:
        return "matmul"
    if name.startswith("aten::") and ("scaled_dot_product" in name or "softmax" in name):
        return "attention"
    return "other"


def default_activities() -> list[ProfilerActivity]:
    """CPU operators always; CUDA kernels too where torch sees a GPU."""
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """File descriptor 2 (C-level stderr) sent to /dev/null inside the block: the profiler's C++ library prints a
    line there at every start and stop in some torch builds, and native torch/Triton warnings go there too; a
    notebook shows such lines as errors (and nbgrader scores a test cell with stderr 0)."""
    try:
        sys.stderr.flush()
    except Exception:
        pass
    try:
        saved = os.dup(2)
    except OSError:          # no fd 2 at all: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def quiet_profile(activities: list[ProfilerActivity] | None = None) -> Iterator[profile]:
    """torch.profiler.profile(activities) around the block, with only its start and stop kept off stderr."""
    prof = profile(activities=activities if activities is not None else default_activities())
    with stderr_silenced():
        prof.__enter__()
    try:
        yield prof
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        with stderr_silenced():
            prof.__exit__(None, None, None)


def top_operators(prof: profile, n: int = 5) -> list[tuple[str, float, int]]:
    """The n operators with the most self CPU time: (name, self seconds, calls), largest first."""
    rows = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()]
    return sorted(rows, key=lambda row: row[1], reverse=True)[:n]


def self_seconds_by_category(prof: profile) -> dict[str, float]:
    """Self CPU seconds summed per category (their sum is the table's "Self CPU time total")."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for event in prof.key_averages():
        out[category(event.key)] += event.self_cpu_time_total / 1e6
    return out


def calls_by_category(prof: profile) -> dict[str, int]:
    """Operator calls per category."""
    out = dict.fromkeys(CATEGORIES, 0)
    for event in prof.key_averages():
        out[category(event.key)] += event.count
    return out


def self_seconds_total(prof: profile) -> float:
    """The profile's "Self CPU time total", in seconds."""
    return sum(self_seconds_by_category(prof).values())


class _CountOperations(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if not func.is_view:
            self.counts[func._schema.name] += 1
        return func(*args, **(kwargs or {}))


def count_operations(fn: Callable[[], Any]) -> Counter[str]:
    """The ATen operations `fn()` runs, by name ("aten::mm"), views excluded: each is a dispatch on the CPU and, on a
    GPU, about one kernel launch. Counted at the dispatcher, so the same run always gives the same counts."""
    with torch.inference_mode(), _CountOperations() as counter:
        fn()
    return counter.counts

