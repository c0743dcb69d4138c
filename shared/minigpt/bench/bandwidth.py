"""What the machine gives: memory bandwidth on a working set of a given size, and a matmul peak.

Bandwidth, four STREAM-like kernels on float32 buffers of `nbytes` each (one thread unless told otherwise), each
figure the bytes it moves over its median seconds:

    read    src.sum()                  nbytes          (what a decode step does to its weights: read them once)
    copy    dst.copy_(src)             2 * nbytes      (read + write)
    triad   a = b + s * c              3 * nbytes      (two reads, one write)
    gemv    A @ x, A the buffer        nbytes          (a one-row product's read: the BLAS kernel a decode step's
            seen as (n / 1024, 1024)                    matmuls run; it can outrun `read` where the sum's adds, not
                                                        the memory, set the pace, as on CPUs whose cache holds the set)

A decode step's memory-bandwidth utilisation is taken against the highest of the three, so that it is not flattered
by a slow kernel. Measured at the model's size, not an arbitrary one: a 44 MB set may sit partly in a large
last-level cache, and then so do the weights.

Matmul peak: 2 * n^3 / median seconds of an (n, n) @ (n, n) float32 matmul, the most FLOP/s a step's matmuls could
reach on this many threads.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from minigpt.timing import compare

__all__ = ["bandwidth_kernels", "memory_bandwidth", "matmul_peak"]


def bandwidth_kernels(nbytes: int) -> dict[str, tuple[Callable[[], Any], int]]:
    """{kernel: (a call, the bytes it moves)} on float32 buffers of `nbytes` each, to time alone or interleaved with
    the steps they are the bound of (a shared machine's bandwidth moves with its load)."""
    n = max(1, nbytes // 4)
    a, b, c = torch.rand(n), torch.rand(n), torch.empty(n)
    width = min(1024, n)
    matrix, x = a[:n // width * width].view(-1, width), torch.rand(width)
    return {"read": (lambda: a.sum(), n * 4), "copy": (lambda: c.copy_(a), 2 * n * 4),
            "triad": (lambda: torch.add(a, b, alpha=3.0, out=c), 3 * n * 4),
            "gemv": (lambda: torch.mv(matrix, x), matrix.nbytes)}


def memory_bandwidth(nbytes: int, *, threads: int = 1, repeats: int = 21) -> dict[str, dict]:
    """{kernel: {"bytes_per_s", "samples_s"}} for the read, copy, triad and gemv kernels on `nbytes` buffers."""
    kernels = bandwidth_kernels(nbytes)
    timings = compare({k: fn for k, (fn, _) in kernels.items()}, warmup=3, repeats=repeats, threads=threads)
    return {k: {"bytes_per_s": moved / timings[k].median, "samples_s": timings[k].samples}
            for k, (_, moved) in kernels.items()}


def matmul_peak(n: int = 1024, *, threads: int = 1, repeats: int = 9) -> tuple[float, list[float]]:
    """FLOP/s of an (n, n) @ (n, n) float32 matmul, and the raw seconds per matmul."""
    a, b = torch.rand(n, n), torch.rand(n, n)
    out = torch.empty(n, n)
    timing = compare({"matmul": lambda: torch.mm(a, b, out=out)}, warmup=2, repeats=repeats, threads=threads)["matmul"]
    return 2 * n ** 3 / timing.median, timing.samples
