"""Lab 01 interview questions (numeric answers). None is printed in lab 00 or above it in lab 01."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer

# Q1: a Qwen2.5-7B-shaped model (28 layers, 28 query heads, 4 KV heads of 128) with an fp8 KV cache.
Q1_SHAPE = dict(layers=28, query_heads=28, kv_heads=4, head_dim=128, bytes_per_element=1)
Q3_PROMPT, Q3_NEW = 100, 50


def check_q1_kv_bytes_per_token(answer: Any) -> None:
    """28 layers, 28 query heads, 4 KV heads, head_dim 128, fp8 (1 byte) KV cache: bytes per token."""
    s = Q1_SHAPE
    per_token = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * s["bytes_per_element"]
    check_answer(answer, per_token, "Q1 (KV bytes per token)",
                 {per_token // 2: "forgot the factor 2 for K and V.",
                  per_token * 2: "fp8 stores 1 byte per element, not 2 (bf16).",
                  per_token * s["query_heads"] // s["kv_heads"]: "used the 28 query heads instead of the 4 KV heads.",
                  per_token * 2 * s["query_heads"] // s["kv_heads"]: "used the query heads and 2 bytes per element."},
                 unit="bytes", hint="Bytes per token = 2 (K and V) * layers * kv_heads * head_dim * bytes_per_element.")


def check_q2_max_batch(answer: Any) -> None:
    """40 GiB for the cache of a 32-layer, 8-KV-head, head_dim-128 bf16 model, sequences of 4096 tokens."""
    per_seq = 2 * 32 * 8 * 128 * 2 * 4096
    check_answer(answer, (40 * 2**30) // per_seq, "Q2 (sequences that fit)",
                 {(40 * 10**9) // per_seq: "40 GiB is 40 * 2**30 bytes, not 40e9."}, unit="sequences",
                 hint="Divide the memory (1 GiB = 2**30 bytes) by the bytes of one full sequence "
                      "(bytes per token * 4096), and round down.")


def _pairs(prompt: int, new: int, *, diagonal: bool = True, decode_steps: int | None = None,
           full_prefill: bool = False) -> int:
    """(query, key) pairs per layer and head scored by cached generation, with the variants learners get wrong."""
    self_pair = 1 if diagonal else 0
    prefill = prompt * prompt if full_prefill else prompt * (prompt - 1) // 2 + self_pair * prompt
    steps = new - 1 if decode_steps is None else decode_steps
    return prefill + sum(prompt + j - 1 + self_pair for j in range(1, steps + 1))


def check_q3_attention_pairs(answer: Any) -> None:
    """Cached generation of 50 tokens after a 100-token prompt: (query, key) pairs one attention head of one layer
    scores in all (the prefill's causal triangle, then one query per decode step over every cached key)."""
    P, N = Q3_PROMPT, Q3_NEW
    naive = sum((P + i) * (P + i + 1) // 2 for i in range(N))
    check_answer(answer, _pairs(P, N), "Q3 (attention pairs of cached generation)",
                 {_pairs(P, N, full_prefill=True): "the prefill's mask is causal: query i sees keys 0..i only, a "
                                                   "triangle, not the full 100 x 100 square.",
                  _pairs(P, N, decode_steps=N): "one decode step too many: the 50th token is sampled but never fed "
                                                "back (the loop stops before running the model on it).",
                  _pairs(P, N, diagonal=False): "a position also attends to itself: query i sees keys 0..i, i + 1 keys.",
                  naive: "that is the naive loop, which re-runs the whole causal triangle at every step; with a cache "
                         "each decode step has one query."},
                 unit="(query, key) pairs",
                 hint="Prefill: query i (0..99) sees i + 1 keys. Then each decode step feeds one token and its single "
                      "query sees every key cached so far, itself included. Count the decode steps carefully.")


def check_q4_compute_bound_batch(answer: Any) -> None:
    """989 TFLOP/s (bf16), 3.35 TB/s, INT8 weight-only quantization (1 byte per weight, bf16 compute): the batch at
    which a decode step's weight matmuls become compute-bound (2 FLOPs per weight per sequence)."""
    balance = 989e12 / 3.35e12
    check_answer(answer, balance / 2, "Q4 (batch size at the ridge point, INT8 weights)", unit="sequences", rel=0.005,
                 mistakes={balance: "that is the bf16 ridge (2 bytes per weight); an INT8 weight is 1 byte, so each "
                                    "byte read carries twice the FLOPs.",
                           balance * 2: "the intensity doubles with 1-byte weights, so the ridge batch halves."},
                 hint="Arithmetic intensity of the weight matmuls = 2*B FLOPs / 1 byte per weight = 2B FLOP/byte; "
                      "it reaches the machine balance (peak FLOP/s / bandwidth) at B = balance / 2.")
