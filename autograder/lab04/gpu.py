"""GPU tier of lab 04: speed and memory (call behind require_gpu)."""

from __future__ import annotations

import math
from typing import Callable

import torch

import minigpt.kernels  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before any kernel is built)
from autograder.gpu_bench import fits, free_bytes, fwd_bwd, naive_attention_bytes, sdpa_fwd_bwd
from autograder.harness import at_least, call_learner, quiet, within
from autograder.lab04.common import BACKWARD_SPEED_CHECK, DECODE_SPEED_CHECK, FLASH_SPEED_CHECK, MEMORY_CHECK
from autograder.checking.thresholds import threshold
from autograder.checking.wire import run_where
from minigpt.attention import naive_attention
from minigpt.kernels.flash_attention import flash_attention_forward
from minigpt.kernels.paged_decode import gather_then_sdpa, paged_decode, random_paged_inputs

# ---------------------------------------------------------------------------------------------------
# GPU tier: speed and memory (call behind require_gpu). `device="cpu"` and small shapes run the same code with
# the kernels in Triton's interpreter (tests); grading uses the GPU and the default shapes.
# ---------------------------------------------------------------------------------------------------

def _speed_verdict(times: dict[str, float], baseline: str, fraction: float, shortfall: str) -> dict:
    """The learner's speedup over `baseline` against the reference's, both from the same interleaved medians: at
    least `fraction` of the reference's, else AssertionError(shortfall.format(learner=, ref=, need=))."""
    learner, ref = times[baseline] / times["learner"], times[baseline] / times["reference"]
    need = fraction * ref
    if not at_least(learner, need):
        raise AssertionError(shortfall.format(learner=learner, ref=ref, need=need))
    return {"speedup": learner, "reference_speedup": ref, "threshold": need,
            "times_ms": {n: t * 1e3 for n, t in times.items()}}


def check_flash_speed(fn: Callable, *, kwargs: dict | None = None, seq_len: int = 4096, head_dim: int = 64,
                      batch: int = 4, heads: int = 32, device: str = "cuda", rounds: int = 5) -> dict:
    """Learner's fn(q, k, v, causal, **kwargs) speedup over naive attention >= the calibrated fraction
    (FLASH_SPEED_CHECK) of the reference kernel's, fp16, causal, timed in interleaved rounds. On a GPU whose free memory
    cannot hold naive attention's temporaries (3 fp32 copies of B x H x T x T scores: 26 GB at the default shape) the
    batch is halved until they fit; the result says which batch was timed. The timing runs where fn lives (the
    learner's kernel when judged: a call across processes would time the copies), the verdict here."""
    from minigpt.timing import device_class

    fraction = threshold(FLASH_SPEED_CHECK, device_class(device))
    m = run_where(fn, measure_flash_speed, fn, kwargs or {}, seq_len, head_dim, batch, heads, device, rounds)
    if not m["close"]:
        raise AssertionError("the kernel's output differs from the reference at the benchmark shape")
    verdict = _speed_verdict(m["times"], "naive", fraction,
                             "forward kernel speedup over naive attention {learner:.2f}x; the reference reaches "
                             "{ref:.2f}x here and {need:.2f}x is needed. Skip fully masked tiles, keep the tiles in "
                             "fp16 for tl.dot, and do not re-read Q inside the loop.")
    return {**verdict, "batch": m["batch"]}


def measure_flash_speed(fn: Callable, kwargs: dict, seq_len: int, head_dim: int, batch: int, heads: int,
                        device: str, rounds: int) -> dict:
    """Run where fn lives: {"close": fn's output matches the reference kernel's, "times": median seconds of naive
    attention, fn and the reference kernel (interleaved), "batch": the batch timed}."""
    from minigpt.timing import bench_interleaved

    if torch.device(device).type == "cuda":
        while batch > 1 and not fits(naive_attention_bytes(batch, heads, seq_len, seq_len), free_bytes(device)):
            batch //= 2
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=device, generator=g).half() for _ in range(3))
    with quiet():
        out = call_learner("your forward kernel at the benchmark shape", fn, q, k, v, True, **kwargs)[0]
        want = flash_attention_forward(q, k, v, causal=True)[0]
    close = isinstance(out, torch.Tensor) and out.shape == want.shape and torch.allclose(
        out.float(), want.float(), atol=1e-2, rtol=1e-2)
    if not close:
        return {"close": False, "times": {}, "batch": batch}
    with quiet():
        times = bench_interleaved({"naive": lambda: naive_attention(q, k, v),
                                   "learner": lambda: fn(q, k, v, True, **kwargs),
                                   "reference": lambda: flash_attention_forward(q, k, v, causal=True)},
                                  rounds=rounds, device=device)
    return {"close": True, "times": times, "batch": batch}


def check_paged_decode_speed(fn: Callable, *, kwargs: dict | None = None, batch: int = 32, context: int = 8192,
                             heads: int = 32, kv_heads: int = 8, head_dim: int = 128, block_size: int = 16,
                             device: str = "cuda", rounds: int = 5) -> dict:
    """Learner's paged decode fn(*inputs, **kwargs) speedup over gather-then-SDPA >= the calibrated fraction
    (DECODE_SPEED_CHECK) of the reference kernel's, fp16, timed in interleaved rounds where fn lives."""
    from minigpt.timing import device_class

    fraction = threshold(DECODE_SPEED_CHECK, device_class(device))
    m = run_where(fn, measure_paged_decode_speed, fn, kwargs or {}, batch, context, heads, kv_heads, head_dim,
                  block_size, device, rounds)
    if not m["close"]:
        raise AssertionError("the decode kernel's output differs from the reference at the benchmark shape")
    return _speed_verdict(m["times"], "gather_sdpa", fraction,
                          "decode speedup over gather-then-SDPA {learner:.2f}x; the reference reaches {ref:.2f}x "
                          "and {need:.2f}x is needed. Split the context over enough programs to fill the GPU.")


def measure_paged_decode_speed(fn: Callable, kwargs: dict, batch: int, context: int, heads: int, kv_heads: int,
                               head_dim: int, block_size: int, device: str, rounds: int) -> dict:
    """Run where fn lives: {"close": fn matches the reference kernel, "times": median seconds of gather-then-SDPA,
    fn and the reference kernel (interleaved)}."""
    from minigpt.timing import bench_interleaved

    args = random_paged_inputs([context] * batch, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
                               block_size=block_size, dtype=torch.float16, device=device)
    with quiet():
        got = call_learner("your decode kernel at the benchmark shape", fn, *args, **kwargs)
        want = paged_decode(*args)
        if not (isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(
                got.float(), want.float(), atol=1e-2, rtol=1e-2)):
            return {"close": False, "times": {}}
        times = bench_interleaved({"gather_sdpa": lambda: gather_then_sdpa(*args), "learner": lambda: fn(*args, **kwargs),
                                   "reference": lambda: paged_decode(*args)}, rounds=rounds, device=device)
    return {"close": True, "times": times}


def growth_per_doubling(peaks: list[int]) -> list[float]:
    """Ratios of successive peak byte counts (T doubling each step): about 2 for O(T) memory, 4 for O(T^2)."""
    return [b / max(a, 1) for a, b in zip(peaks, peaks[1:])]


def check_flash_memory(fn: Callable, *, kwargs: dict | None = None, seq_lens: tuple[int, ...] = (2048, 4096, 8192),
                       heads: int = 8, head_dim: int = 64) -> dict:
    """Peak extra memory of fn(q, k, v, causal, **kwargs) grows O(T) per doubling of T (about 2x), not O(T^2) (4x): at
    most the calibrated growth (MEMORY_CHECK) per doubling. Measured in the process where fn runs (its allocations
    happen there), judged here."""
    from minigpt.timing import device_class

    most = threshold(MEMORY_CHECK, device_class("cuda"))
    peaks = run_where(fn, measure_flash_memory, fn, kwargs or {}, tuple(seq_lens), heads, head_dim)
    growth = growth_per_doubling(peaks)
    if not within(growth, most):
        raise AssertionError(f"peak extra memory grows {', '.join(f'{g:.1f}x' for g in growth)} per doubling of T "
                             f"({peaks} bytes; at most {most:.2f}x allowed): something of size T x T is being "
                             "materialised")
    return {"seq_lens": list(seq_lens), "peak_bytes": peaks, "growth": growth, "max_growth": max(growth),
            "threshold": most}


def measure_flash_memory(fn: Callable, kwargs: dict, seq_lens: tuple[int, ...], heads: int, head_dim: int) -> list[int]:
    """Run where fn lives: the peak CUDA bytes fn(q, k, v, True, **kwargs) allocates beyond its inputs, per T.

    Each T is called once before it is measured: the first call at a new T may compile or autotune (Triton's
    autotuner benchmarks with a 256 MB cache-flush buffer), which is not the kernel's memory. On an H200 the
    unwarmed figures were [270598144, 4325376, 277086208] bytes at T = 2k, 4k, 8k for the reference."""
    peaks = []
    for T in seq_lens:
        q, k, v = (torch.randn(1, heads, T, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
        with quiet():
            call_learner(f"your forward kernel at T={T} (warm-up)", fn, q, k, v, True, **kwargs)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with quiet():
            call_learner(f"your forward kernel at T={T}", fn, q, k, v, True, **kwargs)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        del q, k, v
    return peaks


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12))


def check_flash_backward_speed(cls, *, seq_len: int = 4096, head_dim: int = 64, batch: int = 4, heads: int = 32,
                               dtype: torch.dtype = torch.float16, causal: bool = True, device: str = "cuda",
                               rounds: int = 5) -> dict:
    """Forward + backward of the learner's autograd Function cls (apply(q, k, v, is_causal) on (B, H, T, D)) against
    SDPA-flash's forward + backward: its speedup over SDPA (t_sdpa / t_cls, usually below 1) must reach the calibrated
    fraction (BACKWARD_SPEED_CHECK) of the reference Function's, all timed in interleaved rounds (medians) where cls
    lives (autograd through the learner's Function cannot cross processes)."""
    from minigpt.timing import device_class

    fraction = threshold(BACKWARD_SPEED_CHECK, device_class(device))
    m = run_where(cls, measure_flash_backward_speed, cls, seq_len, head_dim, batch, heads, dtype, causal, device,
                  rounds)
    errs = m["errors"]
    if not within(errs, 2e-2):
        raise AssertionError(f"the Function's gradients differ from the reference at the benchmark shape (relative "
                             f"errors {', '.join(f'{e:.2g}' for e in errs)})")
    return _speed_verdict(m["times"], "sdpa_flash", fraction,
                          "forward + backward at {learner:.2f}x SDPA-flash's speed; the reference reaches {ref:.2f}x "
                          "here and {need:.2f}x is needed. Keep dK, dV (and dQ) in fp32 registers across the loop, "
                          "skip the tiles the causal mask hides, and use tiles of at least 32.")


def measure_flash_backward_speed(cls, seq_len: int, head_dim: int, batch: int, heads: int, dtype: torch.dtype,
                                 causal: bool, device: str, rounds: int) -> dict:
    """Run where cls lives: {"errors": relative errors of cls's (dq, dk, dv) against the reference Function's,
    "times": median seconds of forward + backward of SDPA-flash, cls and the reference (interleaved)}."""
    from minigpt.kernels.flash_attention import FlashAttentionFunction
    from minigpt.timing import bench_interleaved

    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, d_out = (torch.randn(batch, heads, seq_len, head_dim, device=device, generator=g).to(dtype)
                      for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    fns = {"sdpa_flash": sdpa_fwd_bwd(q, k, v, d_out, causal), "learner": fwd_bwd(cls, q, k, v, d_out, causal),
           "reference": fwd_bwd(FlashAttentionFunction, q, k, v, d_out, causal)}
    with quiet():
        got = call_learner("your Function's forward + backward at the benchmark shape", fns["learner"])
        want = fns["reference"]()
    errs = [_rel_err(a, b) for a, b in zip(got, want)] if isinstance(got, tuple) and len(got) == 3 else [math.inf]
    if not within(errs, 2e-2):
        return {"errors": errs, "times": {}}
    with quiet():
        times = bench_interleaved(fns, rounds=rounds, device=device)
    return {"errors": errs, "times": times}


def causal_fast_path_speedup(*, seq_len: int = 4096, head_dim: int = 64, batch: int = 4, heads: int = 32,
                             dtype: torch.dtype = torch.float16, device: str = "cuda", rounds: int = 5,
                             block_m: int | None = None, block_n: int | None = None) -> dict:
    """Not graded (reported by `make gpu-check`): the reference forward kernel, causal, with the two-stage key loop
    (unmasked tiles, then the diagonal) against the single masked loop, same tiles, interleaved medians."""
    from minigpt.timing import bench_interleaved

    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=device, generator=g).to(dtype) for _ in range(3))
    tiles = dict(block_m=block_m, block_n=block_n)
    if block_m is None and torch.device(device).type == "cuda":
        tiles = dict(block_m=128, block_n=64, num_warps=8, num_stages=3)      # AUTOTUNE_CONFIGS[0], both paths
    fast = lambda: flash_attention_forward(q, k, v, causal=True, **tiles)                          # noqa: E731
    single = lambda: flash_attention_forward(q, k, v, causal=True, causal_split=False, **tiles)    # noqa: E731
    if not torch.equal(fast()[0], single()[0]) and not torch.allclose(fast()[0].float(), single()[0].float(),
                                                                      atol=1e-3, rtol=1e-3):
        raise AssertionError("the causal fast path and the single loop disagree")
    with quiet():
        times = bench_interleaved({"fast_path": fast, "single_loop": single}, rounds=rounds, device=device)
    return {"speedup": times["single_loop"] / times["fast_path"], "seq_len": seq_len, "head_dim": head_dim,
            "times_ms": {n: t * 1e3 for n, t in times.items()}}
