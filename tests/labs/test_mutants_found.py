"""Wrong versions of the solution notebooks' own cells, one edit each, that mutation testing (`make mutation LAB=NN`)
found passing before the checks named here were written: each check now rejects its edit, with a message that says
why. (Lab 03's are in test_lab03_checks.py, beside the wrong schedulers written by hand.)"""

from __future__ import annotations

from typing import Callable

import pytest

from autograder import lab05, lab06, lab07, lab08, lab09
from autograder.lab06.generator import _check_generate
from autograder.lab08.streaming import _check_sse_unit
from tests.labs.notebook_solutions import solution_cells


class Lab:
    """A solution notebook, the imports its cells need, and per cell: the names the check takes and the check."""

    def __init__(self, assignment: str, preamble: str, checks: dict[str, tuple[tuple[str, ...], Callable]]) -> None:
        self.assignment, self.preamble, self.checks = assignment, preamble, checks

    def check(self, cell: str, edit: dict[str, str]) -> None:
        names, check = self.checks[cell]
        ns = solution_cells(self.assignment, cell, preamble=self.preamble, replace=edit)
        check(*(ns[name] for name in names))


LABS = {
    "05": Lab("05_quantization", """
import copy
import torch
from minigpt.quant.awq import AWQ_GROUPS
""", {"ex1_code": (("quantize_symmetric",), lab05.check_quantize_symmetric),
          "ex3_code": (("quantize_fp8",), lab05.check_quantize_fp8),
          "ex4_code": (("gptq",), lab05.check_gptq),
          "ex6_code": (("smoothing_factors",), lab05.check_smoothing_factors),
          "ex7_code": (("Int8LayerKVCache",), lab05.check_quantized_kv_cache),
          "ex9_code": (("triton_dequant_gemv",), lab05.check_dequant_gemv),
          "ex10_code": (("quantize_mxfp4", "quantize_nvfp4"), lab05.check_fp4_quantize)}),
    "06": Lab("06_speculative_decoding", """
import torch
from minigpt.cache.contiguous import KVCache
from minigpt.cache.rollback import truncate_cache
from minigpt.engine.speculative import sampling_probs, verify_draft
from minigpt.generate import Generation, StopRule, check_request
from minigpt.sampling import SamplingParams, filter_logits, make_generator
from minigpt.tokenizer import EOT_ID
""", {"ex1_code": (("truncate_cache",), lab06.check_truncate_cache),
          "ex2_code": (("sampling_probs",), lab06.check_sampling_probs),
          "ex3_code": (("verify_draft",), lab06.check_verify_draft),
          "ex4_code": (("generate_speculative",), lambda fn: _check_generate(fn, seed=0)),   # the loop, tiny pair
          "ex5_code": (("ngram_propose",), lab06.check_ngram_propose),
          "ex6_code": (("acceptance_rate", "expected_tokens_per_round"), lab06.check_acceptance_stats)}),
    "07": Lab("07_tensor_parallel", """
import torch
from minigpt.config import ModelConfig
""", {"ex1_code": (("shard_weight",), lab07.check_shard_weight)}),
    "08": Lab("08_serving", """
import torch
""", {"ex1_code": (("sse_stream",), _check_sse_unit),      # the scripted streams, without a server
          "ex3_code": (("request_goodput",), lab08.check_goodput)}),
    "09": Lab("09_long_context", """
import math
import torch
from minigpt.longctx import sliding_window as sw
""", {"ex1_code": (("scaled_inv_freq",), lab09.check_scaled_inv_freq),
          "ex2_code": (("RingKVCache",), lambda cls: (lab09.check_ring_cache(cls), lab09.check_sink_cache(cls))),
          "ex4_code": (("kv_bytes_per_token",), lab09.check_kv_bytes)}),
}

# A mask that lets a load run past its tensor reads whatever memory lies there: the drawn cases catch it, unless a
# fixed case already met a NaN there (seen in CI, 2026-11-26) or other garbage (the case with torch's default device
# moved, CI 2026-11-30). Rejected every time; which comparison says so first is the memory's choice, so the test
# asks only that a comparison with the dequantized product said it.
OUT_OF_BOUNDS = "drawn case|differs from the dequantized product"
# lab -> (cell, the edit, what the check's message says)
EDITS: dict[str, list[tuple[str, dict[str, str], str]]] = {
    "05": [
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
        ("ex4_code", {"for b0 in range(0, n, block_size)": "for b0 in range(0, n - 1, block_size)"},
         r"block_size=9\): output error"),
        ("ex4_code", {"W[:, i:i + group_size].abs()": "W[:, i:(i + group_size) + 1].abs()"}, "first group"),
        ("ex4_code", {"W[:, i:i + group_size].abs()": "W[:, i:(i + group_size) - 1].abs()"}, "first group"),
        ("ex6_code", {"w_absmax.clamp(min=1e-5)": "w_absmax.clamp(min=1.00001)"}, "factors differ"),
        ("ex6_code", {"torch.cat([w.float().abs()": "torch.cat([w.abs()"}, "computed in float32"),
        ("ex6_code", {"(act_absmax.float().clamp": "(act_absmax.clamp"}, "computed in float32"),
        ("ex7_code", {"s = (x.float().abs().amax(-1) / 127)": "s = (x.abs().amax(-1) / 127)"}, "computed in float32"),
        ("ex9_code", {"acc += tl.sum(w * s * x[None, :], axis=1)": "acc = tl.sum(w * s * x[None, :], axis=1)"},
         "drawn case"),
        ("ex9_code", {"j = k0 // 2 + tl.arange(0, HALF)": "j = k0 // 3 + tl.arange(0, HALF)"}, "drawn case"),
        ("ex9_code", {"ok = row_ok[:, None] & (cols < K)[None, :]": "ok = row_ok[:, None] | (cols < K)[None, :]"},
         OUT_OF_BOUNDS),
        ("ex9_code", {"x = tl.load(x_ptr + cols, mask=cols < K, other=0.0)":
                      "x = tl.load(x_ptr + cols, mask=cols <= K, other=0.0)"}, OUT_OF_BOUNDS),
        ("ex9_code", {"y = torch.empty(N, dtype=x.dtype, device=x.device)": "y = torch.empty(N, device=x.device)"},
         "in x's dtype"),
        ("ex9_code", {"](x.contiguous(), qweight": "](x, qweight"}, "drawn case"),
        ("ex9_code", {"qweight.contiguous(), scale": "qweight, scale"}, "drawn case"),
        ("ex9_code", {"BLOCK_N=block_n, BLOCK_K=block_k)": "BLOCK_N=block_k, BLOCK_K=block_k)"}, "drawn case"),
        ("ex10_code", {".clamp(-127, 127)": ".clamp(None, 127)"}, "clamp the exponent"),
        ("ex10_code", {".clamp(-127, 127)": ".clamp(-128, 127)"}, "clamp the exponent"),
        ("ex10_code", {"elements = torch.where(denom > 0,": "elements = torch.where(denom >= 0,"}, "rounds to 0"),
        ("ex10_code", {"blocks = w.float().reshape(w.shape[0], -1, 32)": "blocks = w.reshape(w.shape[0], -1, 32)"},
         "log2 in bfloat16"),
        ("ex9_code", {"row_ok = rows < N": "row_ok = rows <= N"}, "read or wrote past the end of a tensor"),
        ("ex9_code", {"        for k0 in range(0, K, BLOCK_K):\n            cols":
                      "        for k0 in range(0, K - 1, BLOCK_K):\n            cols"}, "edge case"),
        ("ex9_code", {"        for k0 in range(0, K, BLOCK_K):\n            j":
                      "        for k0 in range(0, K + 1, BLOCK_K):\n            j"}, "edge case"),
    ],
    "06": [
        ("ex1_code", {"if isinstance(length, bool) or not": "if isinstance(length, bool) and not"}, "truncate_cache"),
        ("ex2_code", {"one_hot(logits.argmax(-1), logits.shape[-1]).float()":
                      "one_hot(logits.argmax(1), logits.shape[-1]).float()"}, "the last one the vocabulary"),
        ("ex2_code", {"flat = logits.reshape(-1, logits.shape[-1])": "flat = logits.reshape(-1, logits.shape[1])"},
         "bfloat16 logits"),
        ("ex2_code", {"    logits = logits.float()\n": "    logits = logits\n"}, "float32 probabilities"),
        ("ex2_code", {"logits.shape[-1]).float()": "logits.shape[-1])"}, "float32 probabilities"),
        ("ex3_code", {"return [int(torch.multinomial(p[0], 1, generator=generator))], p.new_zeros(0)":
                      "return [int(torch.multinomial(p[0], 1))], p.new_zeros(0)"}, "generator"),
        ("ex3_code", {"generator=generator))], p.new_zeros(0)": "generator=generator))], p.new_zeros(1)"},
         "shape \\(0,\\)"),
        ("ex4_code", {"stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)":
                      "stop = StopRule(max_new_tokens, stop_token_ids, (), tokenizer)"}, "stop_strings"),
        ("ex4_code", {'reason = "length" if max_new_tokens == 0 else None': "reason = None"}, "max_new_tokens=0"),
        ("ex4_code", {"n, L = len(emitted) - 1, len(context)": "n, L = len(emitted) - 2, len(context)"},
         "computed again"),
        ("ex4_code", {"truncate_cache(t_cache, L + n)": "truncate_cache(t_cache, L - n)"}, "computed again"),
        ("ex4_code", {"truncate_cache(d_cache, min(d_cache.length, L + n))":
                      "truncate_cache(d_cache, min(d_cache.length, L - n))"}, "computed again"),
        ("ex4_code", {"prompt_tokens=len(ids))": "prompt_tokens=None)"}, "prompt_tokens"),
        ("ex5_code", {"if k == 0:": "if k == 1:"}, "k=1"),
        ("ex6_code", {"return torch.minimum(p, q).sum(-1)": "return torch.minimum(p, q).sum(1)"}, "LAST axis"),
    ],
    "07": [
        ("ex1_code", {"or (cfg.n_kv_heads % tp and tp % cfg.n_kv_heads) or cfg.d_ff % tp:":
                      "or (cfg.n_kv_heads % tp and tp % cfg.n_kv_heads) and cfg.d_ff % tp:"}, "d_ff=130"),
        ("ex1_code", {'raise ValueError(f"tp={tp} cannot split':
                      'raise ValueError(None)\n        print(f"tp={tp} cannot split'},
         "should name 3"),
        ("ex1_code", {"return piece.contiguous().clone()": "return piece.contiguous()"}, "is a view of the full"),
    ],
    "08": [
        ("ex1_code", {"json.dumps(chunk, separators=(',', ':'))": "json.dumps(chunk)"}, "compact JSON"),
        # the check itself raised JSONDecodeError on these (a broken run, issue 57): now its own verdict
        ("ex1_code", {"json.dumps(chunk, separators=(',', ':'))": "json.dumps(chunk, separators=(':', ','))"},
         "not JSON"),
        ("ex3_code", {"duration = max(r.end_time for r in records) - min(r.send_time for r in records)":
                      "duration = max(r.end_time for r in records) + min(r.send_time for r in records)"}, "100 s"),
        ("ex3_code", {"if duration > 0 else 0.0": "if duration >= 0 else 0.0"}, "0 s"),
        ("ex3_code", {"if duration > 0 else 0.0": "if duration > 1 else 0.0"}, "shorter than a second"),
        ("ex3_code", {"if duration > 0 else 0.0": "if duration > 0 else 1.0"}, "0 s"),
    ],
    "09": [
        ("ex1_code", {"return new_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)":
                      "return new_theta ** (-torch.arange(0, head_dim, 2) / head_dim)"}, "must be float64"),
        ("ex1_code", {'raise ValueError(f"unknown method {method!r}")': "raise ValueError(None)"}, "should name rope2"),
        ("ex2_code", {"if T > 1 and self.length + T > self.capacity:": "if T > 2 and self.length + T > self.capacity:"},
         "2 tokens at once"),
        # the ring turned the other way: the same logits stream, but slot() is not the one the exercise fixes
        # (found by the differential test of issue 57)
        ("ex2_code", {"return self.n_sinks + (position - self.n_sinks) % self.window":
                      "return self.n_sinks + (position + self.n_sinks) % self.window"}, "slot\\(\\d+\\) is"),
        ("ex2_code", {"if T > 1 and self.length + T > self.capacity:":
                      "if T > 1 and self.length + T >= self.capacity:"},
         "16 tokens at once"),          # a prefill that fills the window exactly, refused
        ("ex2_code", {'raise ValueError(f"{T} tokens at once would evict cached ones; feed one at a time")':
                      "raise ValueError(None)"}, "says nothing"),
        ("ex4_code", {'raise ValueError(f"unknown kind {kind!r}")': "raise ValueError(None)"}, "should name XYZ"),
    ],
}
CASES = [(lab, cell, edit, match) for lab, edits in EDITS.items() for cell, edit, match in edits]


@pytest.mark.parametrize("lab, cell", [(lab, cell) for lab, spec in LABS.items() for cell in spec.checks])
def test_the_unedited_cell_passes(lab: str, cell: str) -> None:
    LABS[lab].check(cell, {})


@pytest.mark.parametrize("lab, cell, edit, match", CASES,
                         ids=[f"{lab}-{cell}-{i}" for i, (lab, cell, _, _) in enumerate(CASES)])
def test_each_edit_is_rejected(lab: str, cell: str, edit: dict[str, str], match: str) -> None:
    with pytest.raises(AssertionError, match=match):
        LABS[lab].check(cell, edit)
