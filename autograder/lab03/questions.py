"""The interview questions: continuous over static tokens per second, the compute-bound batch, its KV memory."""

from __future__ import annotations

import math
from typing import Any

from autograder.harness import check_answer
from minigpt.teaching.calculators import PRESETS, critical_batch_size, kv_cache_bytes
from minigpt.teaching.hardware import ACCELERATORS


def check_q1_continuous_vs_static(answer: Any) -> None:
    """Batches of 8; 7 answers of 16 tokens and 1 of 256 in every group of 8; a decode step costs the same for 1..8
    sequences; an endless queue. Output tokens/s of continuous over static batching (decode only)?"""
    lengths = [16] * 7 + [256]
    static_per_step = sum(lengths) / max(lengths)          # all 8 slots held until the longest ends
    continuous_per_step = 8                                  # every slot refilled at once
    check_answer(answer, continuous_per_step / static_per_step, "Q1 (continuous / static tokens per second)",
                 {max(lengths) / min(lengths): "that is longest / shortest; static batching still produces the short "
                  "answers, it only leaves their slots empty afterwards.",
                  8.0: "static batching is not 1 token per step: all 8 sequences decode together until they end.",
                  sum(lengths) / 8 / 16: "compare steps per batch, not the mean length over the shortest."},
                 unit="ratio", rel=0.01,
                 hint="Static: one batch takes max(length) steps and yields sum(length) tokens. Continuous: 8 tokens "
                      "every step. The ratio is max / mean of the lengths.")


def _q2_numbers() -> tuple[int, float]:
    shape, gpu = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"]
    batch = critical_batch_size(shape, 256, gpu.peak("bf16"), gpu.memory_bandwidth)
    return batch, kv_cache_bytes(shape, 256, batch, 2) / 2**30


def check_q2_compute_bound_batch(answer: Any) -> None:
    """Llama-3-8B, bf16, H100 SXM, every sequence at context 256: smallest batch at which a decode step is
    compute-bound (weights read once per step, each sequence's K/V read, attention FLOPs included)."""
    batch, _ = _q2_numbers()
    gpu = ACCELERATORS["H100-SXM"]
    check_answer(answer, batch, "Q2 (batch size where decode turns compute-bound)",
                 {round(gpu.ridge_point("bf16")): "that is the ridge point with the weights alone; each sequence also "
                  "reads its K/V cache, which lowers the intensity, so a larger batch is needed.",
                  math.ceil(gpu.ridge_point("bf16")): "that is the ridge point with the weights alone; add the K/V reads."},
                 unit="sequences",
                 hint="intensity(B) = B*f / (W + B*k) with f = decode FLOPs per sequence, k = its KV bytes, W = weight "
                      "bytes; find the smallest B with intensity >= peak / bandwidth (calculators.critical_batch_size).")


def check_q3_kv_memory(answer: Any) -> None:
    """The KV cache that batch needs at context 256, in GiB (bf16)."""
    _, gib = _q2_numbers()
    check_answer(answer, gib, "Q3 (KV memory of that batch)", {gib * 2**30 / 1e9: "GiB is 2**30 bytes, not 1e9.",
                                                                gib / 2: "K and V: two tensors per layer."},
                 unit="GiB", rel=0.01, hint="kv_cache_bytes(shape, 256, batch) / 2**30.")
