"""Triton kernels: FlashAttention forward and backward, split-KV paged decode (lab 04), the dequantizing
GEMV (lab 05). On a machine without a GPU they run in Triton's interpreter (TRITON_INTERPRET=1).

* lab 04: `warmup` (three small kernels to learn Triton on: vector add, fused row softmax, tiled matmul),
  `online_softmax` (the running max / denominator recurrence), `tiled_attention` (FlashAttention's
  forward and LSE-recomputing backward in PyTorch, `TiledAttentionFunction`), `flash_attention` (Triton
  forward kernel with the causal fast path, autotuned on a GPU, the model's attention="triton" once imported,
  `FlashAttentionFunction` for autograd), `flash_backward` (the FlashAttention-2 backward: delta, dK/dV and
  dQ kernels), `paged_decode` (Triton split-KV decode over lab 02's paged cache, merged by LSE).
* lab 05: `dequant_gemv` (fused dequantizing INT8 / INT4 GEMV with group scales).

Importing this package on a machine where torch sees no CUDA device sets TRITON_INTERPRET=1 (unless the
variable is already set), so that the @triton.jit kernels of the modules below are built for the CPU
interpreter; Triton reads the variable when a kernel is decorated, i.e. when its module is imported. Under the
interpreter, a masked load without `other=` then fills its masked lanes with NaN, as undefined as a GPU leaves them
(`triton_support.undefined_lanes_as_nan`).
"""

import os as _os

import torch as _torch

if "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available():
    _os.environ["TRITON_INTERPRET"] = "1"

from minigpt.kernels.triton_support import undefined_lanes_as_nan as _undefined_lanes_as_nan  # noqa: E402

_undefined_lanes_as_nan()
