"""What the lab 05 checks share: the reference code refused per exercise, seeded tensors, the expected-ValueError
helper, the speed-check names."""

from __future__ import annotations

from typing import Any, Callable

import torch

from autograder.harness import call_learner
from autograder.checking.reference_guard import no_calls_into
from minigpt.config import ModelConfig
from minigpt.quant import formats, fp4
from minigpt.quant.awq import apply_awq_scales, awq_model
from minigpt.quant.gptq import gptq_model, gptq_quantize
from minigpt.quant.kv_cache import QuantizedLayerKVCache, dequantize_kv, quantize_kv
from minigpt.quant.linear import WeightOnlyLinear
from minigpt.quant.smoothquant import smooth_model, smoothing_factors

# Speed thresholds, calibrated per device class by `make calibrate` (autograder/gpu_tier/calibrate.py): a fraction of the
# reference's speedup in the same run, chosen between the reference's ratio and a slow implementation's.
# CPU: INT4 kernel vs fp32 at 4096 x 4096, batch 1 (slow: dequantize to float on every call).
INT4_CPU_SPEED_CHECK = "lab05_int4_cpu_linear"
# GPU: the learner's Triton GEMV against a bf16 matmul at 8192 x 8192, batch 1, one check per width
# (slow: dequantize to a bf16 matrix, then matmul).
GEMV_SPEED_CHECKS = {8: "lab05_dequant_gemv_int8", 4: "lab05_dequant_gemv_int4"}

TINY_CONFIG = ModelConfig(vocab_size=128, max_seq_len=32, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)


# The package's code a learner's answer must not be (nor call), per exercise.
_INT_QUANT = (formats.quantize, formats.fake_quantize, formats.QuantizedTensor, WeightOnlyLinear.from_weight,
              gptq_quantize, quantize_kv)
_PACKING = (formats.pack_int4, formats.unpack_int4)
_FP8 = (formats.quantize_fp8, quantize_kv)
_GPTQ = (gptq_quantize, gptq_model)
_AWQ = (apply_awq_scales, awq_model)
_SMOOTH = (smoothing_factors, smooth_model)
_KV = (QuantizedLayerKVCache.update, quantize_kv, dequantize_kv)
_FP4 = (fp4.round_to_e2m1, fp4.quantize_mxfp4, fp4.quantize_nvfp4, fp4.fake_quantize_mxfp4, fp4.fake_quantize_nvfp4)


EX1 = "Exercise 1 (quantize_symmetric)"


def _call(references: tuple, exercise: str, what: str, fn: Callable, *args: Any) -> Any:
    """call_learner, refusing a call into the exercise's reference code while the learner's code runs."""
    with no_calls_into(*references, what=exercise):
        return call_learner(what, fn, *args)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


