"""Lab 05: wrong versions of the notebook's own solution cells, one edit each, that mutation testing
(`make mutation LAB=05`) found passing; each check below now rejects its edit, with a message that says why."""

from __future__ import annotations

import pytest

from autograder import lab05
from tests.labs.notebook_solutions import solution_cells

PREAMBLE = """
import copy
import torch
from minigpt.quant.awq import AWQ_GROUPS
"""

CHECKS = {"ex1_code": ("quantize_symmetric", lab05.check_quantize_symmetric),
          "ex3_code": ("quantize_fp8", lab05.check_quantize_fp8),
          "ex4_code": ("gptq", lab05.check_gptq),
          "ex6_code": ("smoothing_factors", lab05.check_smoothing_factors),
          "ex7_code": ("Int8LayerKVCache", lab05.check_quantized_kv_cache),
          "ex9_code": ("triton_dequant_gemv", lab05.check_dequant_gemv)}

# (cell, the edit, what the check's message says)
EDITS = [
    ("ex1_code", {"if bits not in (2, 3, 4, 8):": "if bits not in (3, 3, 4, 8):"}, "bits=2"),
    ("ex1_code", {"if bits not in (2, 3, 4, 8):": "if bits not in (2, 4, 4, 8):"}, "bits=3"),
    ("ex1_code", {'raise ValueError(f"unsupported bits={bits}; use 2, 3, 4 or 8")': "raise ValueError(None)"},
     "should name 5"),
    ("ex1_code", {"group_size <= 0 or": "group_size < 0 or"}, "group_size=0"),
    ("ex1_code", {"group_size <= 0 or": "group_size <= 1 or"}, "group_size=1"),
    ("ex1_code", {'raise ValueError("the weight holds NaN or infinite values")': "raise ValueError(None)"},
     "should name nan"),
    ("ex3_code", {"scale = (x.float().abs().max()": "scale = (x.abs().max()"}, "one-element float32"),
    ("ex3_code", {"return (x.float() / scale)": "return (x / scale)"}, "codes differ"),
    ("ex4_code", {"H += 0.01 * torch.diag(H).mean()": "H += 0.01 / torch.diag(H).mean()"}, "Damp with"),
    ("ex4_code", {"return Q.to(torch.int8), scale.float()": "return Q, scale.float()"}, "hold integers"),
    ("ex4_code", {"return Q.to(torch.int8), scale.float()": "return Q.to(torch.int8), scale"}, "float32"),
    ("ex4_code", {"W = w.double().clone()": "W = w.double()"}, "modified the w or H"),
    ("ex4_code", {"H = H.double().clone()": "H = H.double()"}, "modified the w or H"),
    ("ex6_code", {"w_absmax.clamp(min=1e-5)": "w_absmax.clamp(min=1.00001)"}, "factors differ"),
    ("ex6_code", {"torch.cat([w.float().abs()": "torch.cat([w.abs()"}, "computed in float32"),
    ("ex6_code", {"(act_absmax.float().clamp": "(act_absmax.clamp"}, "computed in float32"),
    ("ex7_code", {"s = (x.float().abs().amax(-1) / 127)": "s = (x.abs().amax(-1) / 127)"}, "computed in float32"),
    ("ex9_code", {"acc += tl.sum(w * s * x[None, :], axis=1)": "acc = tl.sum(w * s * x[None, :], axis=1)"},
     "drawn case"),
    ("ex9_code", {"j = k0 // 2 + tl.arange(0, HALF)": "j = k0 // 3 + tl.arange(0, HALF)"}, "drawn case"),
    ("ex9_code", {"ok = row_ok[:, None] & (cols < K)[None, :]": "ok = row_ok[:, None] | (cols < K)[None, :]"},
     "drawn case"),
    ("ex9_code", {"x = tl.load(x_ptr + cols, mask=cols < K, other=0.0)":
                  "x = tl.load(x_ptr + cols, mask=cols <= K, other=0.0)"}, "drawn case"),
    ("ex9_code", {"y = torch.empty(N, dtype=x.dtype, device=x.device)": "y = torch.empty(N, device=x.device)"},
     "in x's dtype"),
    ("ex9_code", {"](x.contiguous(), qweight": "](x, qweight"}, "drawn case"),
    ("ex9_code", {"qweight.contiguous(), scale": "qweight, scale"}, "drawn case"),
    ("ex9_code", {"BLOCK_N=block_n, BLOCK_K=block_k)": "BLOCK_N=block_k, BLOCK_K=block_k)"}, "drawn case"),
]


def _edited(cell: str, edit: dict[str, str]):
    name, _ = CHECKS[cell]
    return solution_cells("05_quantization", cell, preamble=PREAMBLE, replace=edit)[name]


@pytest.mark.parametrize("cell", sorted(CHECKS))
def test_the_unedited_cell_passes(cell):
    CHECKS[cell][1](_edited(cell, {}))


@pytest.mark.parametrize("cell, edit, match", EDITS, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(EDITS)])
def test_each_edit_is_rejected(cell, edit, match):
    with pytest.raises(AssertionError, match=match):
        CHECKS[cell][1](_edited(cell, edit))
