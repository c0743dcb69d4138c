"""The GPU tier's device-generic code paths, run on the CPU on small shapes (Triton kernels in the interpreter), with a
threshold pinned (`thresholds.fixed`): the CPU does not grade them, these tests check the code, not the speed. The
CUDA-graph check is the exception (capture needs a GPU). About 10 s on a quiet 2-core machine."""

from __future__ import annotations

import pytest
import torch

import minigpt.kernels  # noqa: F401  (TRITON_INTERPRET=1 on a CPU before any kernel is built)
from autograder import lab04, lab05
from autograder.gpu_tier import slow_implementations
from autograder.checking.thresholds import Uncalibrated, fixed
from minigpt.kernels.dequant_gemv import dequant_gemv
from minigpt.kernels.flash_attention import flash_attention_forward
from minigpt.kernels.paged_decode import paged_decode

FLASH_SMALL = dict(seq_len=32, head_dim=16, batch=1, heads=2, rounds=1, device="cpu")
DECODE_SMALL = dict(batch=2, context=20, heads=4, kv_heads=2, head_dim=16, rounds=1, device="cpu")


def _flash(q, k, v, causal):
    return flash_attention_forward(q, k, v, causal=causal)


def test_flash_speed_check_code_path():
    with fixed(0.0):
        r = lab04.check_flash_speed(_flash, **FLASH_SMALL)
        lab04.check_flash_speed(slow_implementations.flash_small_tiles, **FLASH_SMALL)
        lab04.check_flash_speed(slow_implementations.naive_as_flash, **FLASH_SMALL)
    assert r["reference_speedup"] > 0 and r["threshold"] == 0.0 and r["batch"] == 1
    with fixed(0.0), pytest.raises(AssertionError, match="differs from the reference"):
        lab04.check_flash_speed(lambda q, k, v, c: (torch.zeros_like(q), None), **FLASH_SMALL)


BACKWARD_SMALL = dict(seq_len=20, head_dim=16, batch=1, heads=2, rounds=1, device="cpu")


def test_flash_backward_speed_check_code_path():
    from minigpt.kernels.flash_attention import FlashAttentionFunction
    with fixed(0.0):
        r = lab04.check_flash_backward_speed(FlashAttentionFunction, **BACKWARD_SMALL)
        lab04.check_flash_backward_speed(slow_implementations.FlashBackwardSmallTiles, **BACKWARD_SMALL)
        lab04.check_flash_backward_speed(slow_implementations.NaiveAttentionFunction, **BACKWARD_SMALL)
    assert r["reference_speedup"] > 0 and set(r["times_ms"]) == {"sdpa_flash", "learner", "reference"}

    class Wrong:                                     # right forward, gradients twice too large
        @staticmethod
        def apply(q, k, v, is_causal):
            return 2 * FlashAttentionFunction.apply(q, k, v, is_causal)
    with fixed(0.0), pytest.raises(AssertionError, match="gradients differ from the reference"):
        lab04.check_flash_backward_speed(Wrong, **BACKWARD_SMALL)


def test_causal_fast_path_and_backward_sweep_code_paths():
    from autograder.gpu_bench import flash_backward_sweep
    r = lab04.causal_fast_path_speedup(seq_len=40, head_dim=16, batch=1, heads=2, device="cpu", rounds=1,
                                       block_m=16, block_n=16)
    assert r["speedup"] > 0 and set(r["times_ms"]) == {"fast_path", "single_loop"}
    rows = flash_backward_sweep([16], head_dims=(16,), dtypes=(torch.float32,), batch=1, heads=2, device="cpu")
    assert len(rows) == 1 and rows[0]["reference_vs_sdpa"] > 0 and rows[0]["batch"] == 1


def test_paged_decode_speed_check_code_path():
    with fixed(0.0):
        r = lab04.check_paged_decode_speed(paged_decode, **DECODE_SMALL)
        lab04.check_paged_decode_speed(slow_implementations.paged_decode_one_split, **DECODE_SMALL)
        lab04.check_paged_decode_speed(slow_implementations.paged_decode_pytorch, **DECODE_SMALL)
    assert r["reference_speedup"] > 0
    with fixed(0.0), pytest.raises(AssertionError, match="differs from the reference"):
        lab04.check_paged_decode_speed(lambda q, *a: torch.zeros_like(q), **DECODE_SMALL)


def test_gemv_speed_check_code_path():
    with fixed(0.0):
        r = lab05.check_gemv_speed(dequant_gemv, N=32, K=256, rounds=1, device="cpu")
        lab05.check_gemv_speed(slow_implementations.dequantize_then_matmul, N=32, K=256, rounds=1, device="cpu")
    assert set(r) == {"int8", "int4"} and all(v["reference_speedup"] > 0 for v in r.values())
    with fixed(0.0), pytest.raises(AssertionError, match="differs from the reference kernel"):
        lab05.check_gemv_speed(lambda x, qw, s, b, g: torch.zeros(qw.shape[0]), N=32, K=256, rounds=1, device="cpu")


def test_gemv_speed_check_accepts_bf16_rounding_and_refuses_a_wrong_group():
    """On the GPU the check runs in bf16: a kernel that dequantizes W to bf16 first is correct to about 3e-3 in norm
    but misses elementwise tolerances where y is near 0 (an H200 rejected the slow implementation so, 2026-11-26);
    the norm test accepts it and still refuses a kernel that applies the first group's scale everywhere."""
    def bf16_weights(x, qw, s, b, g):
        return slow_implementations.dequantize_then_matmul(x.bfloat16(), qw, s, b, g).float()

    def first_group(x, qw, s, b, g):
        return dequant_gemv(x, qw, s[:, :1].expand_as(s).contiguous(), b, g)

    with fixed(0.0):
        lab05.check_gemv_speed(bf16_weights, N=64, K=2048, rounds=1, bits=(8,), device="cpu")
        with pytest.raises(AssertionError, match="differs from the reference kernel"):
            lab05.check_gemv_speed(first_group, N=64, K=2048, rounds=1, bits=(8,), device="cpu")


def test_memory_growth_of_linear_and_quadratic_peaks():
    assert lab04.growth_per_doubling([1000, 2000, 4000]) == [2.0, 2.0]
    assert lab04.growth_per_doubling([1000, 4000, 16000]) == [4.0, 4.0]


def test_gpu_checks_without_a_calibration_say_so_before_measuring(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CALIBRATION_DIR", str(tmp_path))
    with pytest.raises(Uncalibrated, match="lab04_flash_speed is uncalibrated on .*make calibrate"):
        lab04.check_flash_speed(_flash, **FLASH_SMALL)
    with pytest.raises(Uncalibrated, match="lab04_flash_backward_speed is uncalibrated"):
        from minigpt.kernels.flash_attention import FlashAttentionFunction
        lab04.check_flash_backward_speed(FlashAttentionFunction, **BACKWARD_SMALL)
    with pytest.raises(Uncalibrated, match="lab05_dequant_gemv_int8 is uncalibrated"):
        lab05.check_gemv_speed(dequant_gemv, N=32, K=256, rounds=1, device="cpu")


def test_speed_checks_below_their_threshold_say_what_was_needed():
    """A threshold no implementation reaches: each lab 04 speed check refuses with the speedups it measured."""
    from minigpt.kernels.flash_attention import FlashAttentionFunction

    with fixed(1e6):
        with pytest.raises(AssertionError, match=r"over naive attention .*x is needed"):
            lab04.check_flash_speed(_flash, **FLASH_SMALL)
        with pytest.raises(AssertionError, match=r"over gather-then-SDPA .*x is needed"):
            lab04.check_paged_decode_speed(paged_decode, **DECODE_SMALL)
        with pytest.raises(AssertionError, match=r"SDPA-flash's speed; .*x is needed"):
            lab04.check_flash_backward_speed(FlashAttentionFunction, **BACKWARD_SMALL)
