"""The interview questions: continuous over static tokens/s with a step cost that grows with the batch, the
compute-bound batch, its KV memory, and the knob that bounds inter-token latency."""

from __future__ import annotations

import math
from typing import Any

from autograder.harness import check_answer
from minigpt.teaching.calculators import PRESETS, critical_batch_size, kv_cache_bytes
from minigpt.teaching.hardware import ACCELERATORS


Q1_STEP_COST = (2.0, 0.5)        # a decode step of B sequences costs a + b*B milliseconds (a CPU-like step)


def _q1_ratio(a: float, b: float, lengths: list[int]) -> float:
    """Continuous over static tokens/s when a decode step of B sequences costs a + b*B (an endless queue, batches of
    len(lengths)): static runs B = (answers not yet ended) for max(lengths) steps; continuous keeps every slot full."""
    n = len(lengths)
    static_ms = sum(a + b * sum(length > step for length in lengths) for step in range(max(lengths)))
    continuous_tokens_per_ms = n / (a + b * n)
    return continuous_tokens_per_ms / (sum(lengths) / static_ms)


def check_q1_continuous_vs_static(answer: Any) -> None:
    """Batches of 8; in every group of 8, 7 answers of 16 tokens and 1 of 256; an endless queue; a decode step of B
    sequences costs a + b*B ms (a = 2, b = 0.5). Output tokens/s of continuous over static batching (decode only)?"""
    lengths = [16] * 7 + [256]
    a, b = Q1_STEP_COST
    n = len(lengths)
    flat = n / (sum(lengths) / max(lengths))
    check_answer(answer, _q1_ratio(a, b, lengths), "Q1 (continuous / static tokens per second, step cost a + b*B)",
                 {flat: "that is the answer for a step whose cost does not depend on B (section 1's): here a full step "
                  "of 8 costs a + 8b, much more than the a + b of the 240 static steps that carry the long answer alone.",
                  (n / (a + b)) / (sum(lengths) / (max(lengths) * (a + b * n))):
                      "you charged the continuous steps the batch-1 price and the static steps the batch-8 price: "
                      "it is the other way round (continuous steps are full, most static steps carry one sequence).",
                  (n / (a + b * n)) / (sum(lengths) / (max(lengths) * (a + b))):
                      "every static step was charged as a 1-sequence step: the first 16 carry all 8 sequences.",
                  max(lengths) / min(lengths): "that is longest / shortest answer, not a ratio of tokens per time."},
                 unit="ratio", rel=0.01,
                 hint="Static: 16 steps with 8 sequences, then 240 with 1; tokens per batch = 7*16 + 256. Continuous: "
                      "8 tokens per step of 8. Compare tokens per millisecond.")


Q4_OPTIONS = {1: "raise max_num_seqs from 64 to 256", 2: "lower max_num_batched_tokens from 8192 to 512",
              3: "turn chunked prefill off", 4: "raise gpu_memory_utilization so that the KV pool grows",
              5: "switch to static batching"}


def check_q4_itl_knob(answer: Any) -> None:
    """A chat service (max_num_seqs 64, max_num_batched_tokens 8192, chunked prefill on) meets its throughput and TTFT
    targets, the KV pool stays under 40% with no preemption, but the p99 inter-token latency of running chats jumps
    tenfold whenever an 8,000-token document is pasted. Which one change (Q4_OPTIONS) fixes it?"""
    check_answer(answer, 2, "Q4 (which knob fixes the inter-token latency spikes)",
                 {1: "more sequences per step does not shorten the step that carries the pasted document: with a budget "
                  "of 8,192 tokens its whole 8,000-token prefill still goes in one step, and every running chat waits "
                  "for that step.",
                  3: "without chunked prefill the whole prompt must go in one step: that is the spike itself, now for "
                  "every long prompt (and a prompt above the budget could never run).",
                  4: "the pool is under 40% full and nothing is preempted: memory is not what the chats wait for, the "
                  "length of one step is.",
                  5: "static batching does not shorten a step either; it makes newcomers wait for the whole batch and "
                  "leaves finished slots empty, so throughput and TTFT get worse."},
                 unit="option number (1 to 5)",
                 hint="An inter-token latency is the length of the steps between two tokens. What sets the length of the "
                      "step that carries the pasted document, and which knob caps it?")


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
