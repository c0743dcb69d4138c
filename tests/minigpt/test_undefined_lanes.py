"""Under Triton's interpreter the course fills a masked load's lanes that have no `other=` with NaN (Triton leaves
them undefined; its interpreter would write zeros and hide a kernel that depends on them)."""

from __future__ import annotations

import math

import pytest
import torch

import minigpt.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 on a machine without a GPU, and the NaN lanes)
import triton
import triton.language as tl
from minigpt.kernels.triton_support import interpreting


@triton.jit
def _masked_copy(X, OUT, n, WITH_OTHER: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if WITH_OTHER:
        x = tl.load(X + offs, mask=offs < n, other=-1.0)
    else:
        x = tl.load(X + offs, mask=offs < n)
    tl.store(OUT + offs, x)


@pytest.mark.skipif(not interpreting(), reason="a GPU leaves the lanes undefined; only the interpreter is patched")
def test_masked_lanes_without_other_are_nan_and_other_is_kept():
    x = torch.arange(16, dtype=torch.float32)
    for with_other, fill in ((False, math.nan), (True, -1.0)):
        out = torch.zeros(16)
        _masked_copy[(1,)](x, out, 5, WITH_OTHER=with_other, BLOCK=16)
        assert torch.equal(out[:5], x[:5])
        tail = out[5:]
        assert (tail.isnan().all() if math.isnan(fill) else (tail == fill).all()), (with_other, out)
