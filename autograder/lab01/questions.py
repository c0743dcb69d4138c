"""Lab 01 interview questions (numeric answers)."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer

def check_q1_kv_bytes_per_token(answer: Any) -> None:
    """32 layers, 8 KV heads, head_dim 128, bf16: KV-cache bytes per token."""
    per_token = 2 * 32 * 8 * 128 * 2
    check_answer(answer, per_token, "Q1 (KV bytes per token)",
                 {per_token // 2: "forgot the factor 2 for K and V.",
                  per_token * 4: "used the 32 query heads instead of the 8 KV heads."},
                 unit="bytes", hint="Bytes per token = 2 (K and V) * layers * kv_heads * head_dim * bytes_per_element.")


def check_q2_max_batch(answer: Any) -> None:
    """40 GiB for the cache of the Q1 model, sequences of 4096 tokens: how many fit at once?"""
    per_seq = 2 * 32 * 8 * 128 * 2 * 4096
    check_answer(answer, (40 * 2**30) // per_seq, "Q2 (sequences that fit)",
                 {(40 * 10**9) // per_seq: "40 GiB is 40 * 2**30 bytes, not 40e9."}, unit="sequences",
                 hint="Divide the memory (1 GiB = 2**30 bytes) by the bytes of one full sequence "
                      "(Q1's bytes per token * 4096), and round down.")


def check_q3_naive_tokens(answer: Any) -> None:
    """Prompt of 100 tokens, 50 new tokens: token positions the naive loop pushes through the model."""
    check_answer(answer, sum(100 + i for i in range(50)), "Q3 (positions processed by the naive loop)",
                 {100 * 50: "the loop re-runs the tokens generated so far too, not only the prompt.",
                  sum(100 + i for i in range(1, 51)): "off by one: the first step runs the prompt alone."},
                 unit="token positions",
                 hint="Step i (i = 0..49) re-runs the prompt plus the i tokens generated so far: sum over i of (100 + i).")


def check_q4_compute_bound_batch(answer: Any) -> None:
    """989 TFLOP/s, 3.35 TB/s, bf16 weights: the batch size at which a decode step's weight matmuls become
    compute-bound (2 FLOPs per weight per sequence, 2 bytes per weight read once per step)."""
    check_answer(answer, 989e12 / 3.35e12, "Q4 (batch size at the ridge point)", unit="sequences", rel=0.005,
                 hint="Arithmetic intensity of the weight matmuls = 2*B FLOPs / 2 bytes per weight = B FLOP/byte; "
                      "it reaches the machine balance (peak FLOP/s / bandwidth) at B = balance.")
