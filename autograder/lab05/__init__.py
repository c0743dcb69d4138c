"""Checks for Lab 05, quantization (a package: one file per exercise group, each check re-exported here).

Each check takes the learner's function or class, runs it on small seeded tensors (or a tiny model) and
raises AssertionError saying what is wrong (which input, expected vs got, likely cause).

CPU tier (correctness):
    check_quantize_symmetric(fn)        INT8/INT4 symmetric, per channel and per group; bad input errors
    check_int4_model_perplexity(fn)     the trained target with the learner's INT4 g128 weights: perplexity bound
    check_int4_packing(pack, unpack)    two codes per byte, element 2j in the low nibble
    check_quantize_fp8(fn)              scale so max|x| lands on the format's max, then cast
    check_gptq(fn)                      error propagation through the Cholesky of H^-1, lazy blocks
    check_awq_fold(fn)                  scales folded into the producers: same function in full precision
    check_smoothing_factors(fn)         SmoothQuant's migration factors for several alphas
    check_quantized_kv_cache(cls)       INT8 K/V with one scale per token and KV head
    check_dequant_gemv(fn)              the Triton GEMV (interpreter on CPU) against the dequantized product
    check_int4_cpu_linear(make)         PyTorch's CPU INT4 kernel: right values, speed relative to the reference
    check_fp4_quantize(mx, nv)          MXFP4 (E8M0 power-of-two scale per 32) and NVFP4 (E4M3 scale per 16 and an
                                        FP32 tensor scale): scales and round-half-even E2M1 elements
Interview questions: check_q1_e3m2_max ... check_q6_production_choice (Q1, Q2: FP6 E3M2 from its bit layout; Q4
reads the shipped quality table).
Edge inputs: an all-zero row / group / token / tensor (scale 0 must not give NaN), bf16 / fp16 inputs, a dead
activation channel and a dead input channel of the Hessian. Every check refuses the package's reference handed in
(reference_guard: minigpt.quant.* itself, a subclass inheriting update(), a thin wrapper calling it, the package's
Triton kernel behind the notebook's launcher).
GPU tier (speed): check_gemv_speed(fn) behind autograder.harness.require_gpu.
Files: common.py (the reference code refused per exercise, helpers), integer.py (Exercises 1, 2), fp8.py (3),
gptq.py (4), awq_smooth.py (5, 6), kv_cache.py (7), kernels.py (8, 9 and the speed checks), fp4.py (10),
questions.py.
"""

from autograder.lab05.awq_smooth import check_awq_fold, check_smoothing_factors
from autograder.lab05.common import GEMV_SPEED_CHECKS, INT4_CPU_SPEED_CHECK, TINY_CONFIG
from autograder.lab05.fp4 import check_fp4_quantize
from autograder.lab05.fp8 import check_quantize_fp8
from autograder.lab05.gptq import check_gptq
from autograder.lab05.integer import check_int4_model_perplexity, check_int4_packing, check_quantize_symmetric
from autograder.lab05.kernels import check_dequant_gemv, check_gemv_speed, check_int4_cpu_linear
from autograder.lab05.kv_cache import check_quantized_kv_cache
from autograder.lab05.questions import (check_q1_e3m2_max, check_q2_e3m2_smallest_subnormal, check_q3_range_ratio,
                                        check_q4_low_bit_recovery, check_q5_gptq_hessian_bytes,
                                        check_q6_production_choice)

__all__ = ["check_quantize_symmetric", "check_int4_model_perplexity", "check_int4_packing", "check_quantize_fp8", "check_gptq", "check_awq_fold",
           "check_smoothing_factors", "check_quantized_kv_cache", "check_dequant_gemv", "check_int4_cpu_linear",
           "check_gemv_speed", "check_fp4_quantize", "check_q1_e3m2_max", "check_q2_e3m2_smallest_subnormal",
           "check_q3_range_ratio",
           "check_q4_low_bit_recovery", "check_q5_gptq_hessian_bytes", "check_q6_production_choice", "INT4_CPU_SPEED_CHECK", "GEMV_SPEED_CHECKS",
           "TINY_CONFIG"]
