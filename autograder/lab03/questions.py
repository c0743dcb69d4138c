"""The interview questions: continuous over static tokens/s with a step cost that grows with the batch, the largest
prefill chunk a decode step carries within a latency allowance, the context where attention outlasts the weight
matmuls, and the knob that bounds inter-token latency. Q2 and Q3 price steps on lab 00's rule, kernel by kernel."""

from __future__ import annotations

import math
from typing import Any

from autograder.harness import check_answer
from minigpt.costmodel.calculators import (PRESETS, critical_batch_size, forward_kernels, kernels_time, kv_bytes_per_token,
                                          matmul_parameters, weight_bytes, weight_bytes_read)
from minigpt.costmodel.hardware import ACCELERATORS


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


Q2_STEP = {"decodes": 64, "cached": 256, "slowdown": 1.25}     # the step a prefill chunk joins, and its allowance


def _q2_step_time(chunk: int, *, lumped: bool = False, stored_weights: bool = False) -> float:
    """Seconds of one step on the H100 roofline: Q2_STEP's decodes (each attending to cached + 1 positions) plus a
    fresh prompt's first `chunk` tokens; per kernel as lab 00 prices it (or lumped / charging stored weights: the
    mistakes)."""
    shape, gpu = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"]
    b, c = Q2_STEP["decodes"], Q2_STEP["cached"]
    kernels = forward_kernels(shape, b + chunk, b * (c + 1) + chunk * (chunk + 1) // 2, b * (c + 1) + chunk)
    if stored_weights:
        kernels["weights"] = (kernels["weights"][0], weight_bytes(shape, 2))
    peak, bw = gpu.peak("bf16"), gpu.memory_bandwidth
    if lumped:
        return max(sum(f for f, _ in kernels.values()) / peak, sum(m for _, m in kernels.values()) / bw)
    return kernels_time(kernels, peak, bw)


def _q2_largest_chunk(**mistake: bool) -> int:
    """The largest chunk whose step costs at most Q2_STEP["slowdown"] times the decodes' step alone."""
    allowed = Q2_STEP["slowdown"] * _q2_step_time(0, **mistake)
    chunk = 0
    while _q2_step_time(chunk + 1, **mistake) <= allowed:
        chunk += 1
    return chunk


def check_q2_chunk_budget(answer: Any) -> None:
    """Llama-3-8B, bf16, H100 SXM. A step carries 64 decodes (256 tokens cached each) and the first C tokens of a new
    prompt. Priced kernel by kernel (lab 00), the largest C whose step costs at most 1.25x the 64 decodes alone."""
    shape, gpu = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"]
    free_ride = critical_batch_size(shape, 0, gpu.peak("bf16"), gpu.memory_bandwidth) - Q2_STEP["decodes"]
    check_answer(answer, _q2_largest_chunk(), "Q2 (largest prefill chunk within 1.25x of the decode step)",
                 {_q2_largest_chunk(lumped=True): "that prices the step as ONE roofline point: the decodes' attention "
                  "bytes then hide part of the matmuls' compute time, which the hardware cannot do. Price the weight "
                  "matmuls and attention each on its own roofline and add them (lab 00, section 7).",
                  _q2_largest_chunk(stored_weights=True): "that charges every stored parameter, the whole "
                  "input-embedding table included; a step reads one embedding row per token.",
                  free_ride: "that is where the chunk stops riding for free (the weight matmuls turn compute-bound at "
                  f"{free_ride + Q2_STEP['decodes']} rows); the question allows the step to grow by 25%."},
                 unit="tokens",
                 hint="t(C) = max(2P(64 + C) / peak, W_read / bw) + max(attention FLOPs / peak, K/V bytes / bw); the "
                      "decodes read 257 positions each, the chunk writes C and attends to C(C+1)/2 pairs. Find the "
                      "largest C with t(C) <= 1.25 t(0).")


Q3_BATCH = 512


def _q3_crossover(*, weights_memory_bound: bool = False, kv_factor: float = 1.0, batch: int = Q3_BATCH) -> int:
    """Smallest context c at which `batch` sequences' attention (memory-bound: its K/V bytes over the bandwidth) takes
    at least as long as the weight matmuls, max(2 P B / peak, W_read / bw) (or W_read / bw alone: a mistake)."""
    shape, gpu = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"]
    peak, bw = gpu.peak("bf16"), gpu.memory_bandwidth
    weights_read = weight_bytes_read(shape, batch)
    matmuls = weights_read / bw if weights_memory_bound else max(2 * matmul_parameters(shape) * batch / peak,
                                                                 weights_read / bw)
    return math.ceil(matmuls * bw / (batch * kv_factor * kv_bytes_per_token(shape, 2)))


def check_q3_attention_crossover(answer: Any) -> None:
    """Llama-3-8B, bf16, H100 SXM, a decode step of 512 sequences all at context c: the smallest c at which attention
    takes at least as long as the weight matmuls (each kernel on its own roofline)."""
    check_answer(answer, _q3_crossover(), "Q3 (context where attention outlasts the weight matmuls at batch 512)",
                 {_q3_crossover(weights_memory_bound=True): "that prices the weight matmuls by their bytes; at batch "
                  "512 they are past the ridge (lab 00: compute-bound from 296 rows), so their time is 2 P B / peak.",
                  _q3_crossover(kv_factor=0.5): "K and V: each cached token holds both, in every layer.",
                  _q3_crossover(batch=64): "that is the crossover at batch 64, where the matmuls are still memory-bound; "
                  "at 512 they are compute-bound and take longer."},
                 unit="tokens", rel=0.002,
                 hint="Which kernel is bound by what at batch 512? Attention reads 512 * c * (K/V bytes per token); the "
                      "matmuls do 2 * P * 512 FLOPs. Past the ridge the answer does not depend on the batch.")
