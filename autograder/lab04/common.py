"""Shared pieces of the lab 04 checks: the graded shapes, the float64 reference, tolerances, GPU check names."""

from __future__ import annotations

import math

import torch

import minigpt.kernels  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before any kernel is built)
from minigpt.kernels.tiled_attention import attention_lse

# GPU thresholds, calibrated per GPU class by `make calibrate` (autograder/gpu_tier/calibrate.py; files
# autograder/calibration/<check>.<device class>.json): the learner's speedup over the baseline must reach a fraction
# of the reference kernel's speedup measured in the same run; the memory check bounds the growth per doubling of T.
FLASH_SPEED_CHECK = "lab04_flash_speed"        # slow: 16 x 16 tiles; naive attention itself
DECODE_SPEED_CHECK = "lab04_paged_decode_speed"  # slow: one program per sequence (no split); PyTorch paged attention
MEMORY_CHECK = "lab04_flash_memory"            # slow: naive attention (O(T^2) scores)
BACKWARD_SPEED_CHECK = "lab04_flash_backward_speed"  # slow: 16 x 16 backward tiles; autograd of naive attention

# (B, Hq, Hkv, Tq, Tk, D, causal, what): awkward shapes, small enough for the interpreter
ATTENTION_CASES = [
    (1, 2, 2, 1, 1, 8, True, "T = 1"),
    (2, 2, 2, 37, 37, 16, True, "causal prefill, T = 37 not a multiple of the tile, MHA (group 1)"),
    (1, 4, 2, 5, 29, 8, True, "Tq = 5 < Tk = 29 (bottom-right causal mask), GQA group 2"),
    (1, 8, 1, 3, 40, 16, True, "Tq = 3 < Tk = 40, GQA group 8 (one KV head)"),
    (1, 4, 2, 20, 33, 24, False, "non-causal, Tq = 20, Tk = 33, head_dim 24, GQA group 2"),
]
# (B, Hq, Hkv, D, block_size, seq_lens, what)
PAGED_CASES = [
    (3, 4, 2, 16, 16, [1, 37, 70], "seq_lens 1, 37, 70 (partial last pages), GQA group 2"),
    (2, 8, 1, 16, 8, [5, 100], "seq_lens 5 and 100, pages of 8, GQA group 8"),
    (2, 2, 2, 8, 16, [16, 33], "seq_lens 16 (one full page) and 33, group 1"),
]
TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _qkv(B: int, Hq: int, Hkv: int, Tq: int, Tk: int, D: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, Tq, D, generator=g).to(dtype), torch.randn(B, Hkv, Tk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Tk, D, generator=g).to(dtype))


def _full_attention(q, k, v, causal: bool):
    """float64 reference (out, lse) with the bottom-right causal mask."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = q.double() @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        Tq, Tk = q.shape[2], k.shape[2]
        s = s.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    return got.shape == want.shape and bool(torch.isfinite(got).all()) and torch.allclose(
        got.double(), want.double(), atol=tol, rtol=tol)


def _err(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} instead of {tuple(want.shape)}"
    if not torch.isfinite(got).all():
        return ("non-finite values (inf / nan; a masked tl.load without other= leaves its masked lanes undefined, NaN "
                "in the course's interpreter as on a GPU: give each masked load the value its lanes must hold)")
    return f"max abs error {(got.double() - want.double()).abs().max().item():.3g}"



def reference_lse(q, k, v, causal: bool = True) -> torch.Tensor:
    """Convenience for the notebook: the exact LSE (B, Hq, Tq)."""
    return attention_lse(q, k, v, causal=causal)
