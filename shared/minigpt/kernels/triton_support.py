"""What every Triton kernel of the course needs around it: is Triton interpreting (a CPU), dot precision options
per dtype, a clear error for tensors on the wrong device, and an interpreter that does not hide undefined lanes."""

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


def undefined_lanes_as_nan() -> None:
    """Under the interpreter, a masked `tl.load` without `other=` gets NaN in its masked lanes (the dtype's largest
    value for integers) instead of the interpreter's zeros. Triton leaves those lanes undefined: on a GPU they hold
    whatever the registers held, so a kernel whose result depends on them (an undefined lane times a zero is not
    zero, a row max over them is not the row's) is wrong there even where zeros hide it here. Idempotent; does
    nothing unless Triton is interpreting."""
    if not interpreting():
        return
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_undefined_lanes_as_nan", False):
        return
    load = builder.create_masked_load

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        if other is None:
            dtype_tt = ptrs.get_element_ty()
            dtype_np = interpreter._get_np_dtype(dtype_tt)
            fill = np.nan if np.issubdtype(dtype_np, np.floating) else (
                True if dtype_np == np.bool_ else np.iinfo(dtype_np).max)
            other = interpreter.TensorHandle(np.full_like(ptrs.data, fill, dtype=dtype_np), dtype_tt)
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    builder.create_masked_load = create_masked_load
    builder._undefined_lanes_as_nan = True
