"""What every Triton kernel of the course needs around it: is Triton interpreting (a CPU), dot precision options
per dtype, and a clear error for tensors on the wrong device."""

from __future__ import annotations

import torch
import triton
from torch import Tensor


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 at import time)."""
    return bool(triton.knobs.runtime.interpret)


def dot_options(dtype: torch.dtype) -> dict[str, object]:
    """Kernel constexprs for the dots: exact fp32 dots for fp32 inputs (no TF32 rounding), and under the
    interpreter bf16 tiles upcast to fp32 right after loading (Triton 3.9's interpreter miscomputes bf16
    arithmetic; on a GPU bf16 goes to the tensor cores as is)."""
    upcast = interpreting() and dtype == torch.bfloat16
    return {"PRECISION": "ieee" if dtype == torch.float32 or upcast else "tf32", "UPCAST": upcast}


def check_triton_device(*tensors: Tensor) -> None:
    """Triton needs CUDA tensors, or CPU tensors under the interpreter; say so clearly otherwise."""
    on_cuda = [t.is_cuda for t in tensors]
    if all(on_cuda):
        return
    if any(on_cuda):
        raise ValueError("all tensors must be on the same device (some are on CUDA, some are not)")
    if not interpreting():
        raise RuntimeError("Triton kernels need CUDA tensors; on a CPU set the environment variable "
                           "TRITON_INTERPRET=1 before importing triton (and minigpt.kernels) to use the interpreter")
