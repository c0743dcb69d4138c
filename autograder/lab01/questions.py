"""Lab 01 interview questions (numeric answers). None is printed in lab 00 or above it in lab 01, and none repeats a
lab 00 question."""

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


# Q4: the context at which a batched decode step reads more KV cache than weights (section 6's decode_cost, applied to
# another model; lab 00 prices whole steps, this asks where the cache takes over).
Q4 = dict(layers=32, query_heads=32, kv_heads=8, head_dim=128, kv_bytes=2, weight_bytes=15.0e9, batch=32)


def _q4_crossover(*, batch: int | None = None, heads: int | None = None, kv_factor: int = 2,
                  kv_bytes: int | None = None) -> int:
    """Smallest context t (tokens per sequence) with batch * t * (KV bytes per token) > the weight bytes; the
    keywords swap in the values that the mistakes use."""
    q = Q4
    per_token = (kv_factor * q["layers"] * (q["kv_heads"] if heads is None else heads) * q["head_dim"]
                 * (q["kv_bytes"] if kv_bytes is None else kv_bytes))
    per_context_token = (q["batch"] if batch is None else batch) * per_token
    return int(q["weight_bytes"] // per_context_token) + 1


def check_q4_kv_crossover_context(answer: Any) -> None:
    """Llama-3-8B-shaped decode step (32 layers, 32 query heads, 8 KV heads of 128, bf16 KV cache) at batch 32, reading
    15.0e9 bytes of weights per step: the smallest context length (tokens per sequence) at which the step reads more
    bytes of KV cache than of weights. Key: floor(15e9 / (32 * 2*32*8*128*2)) + 1, computed here."""
    key = _q4_crossover()
    candidates = [
        (_q4_crossover(batch=1), "the weights are read once per step for the whole batch, but every sequence reads its "
                                 "own cache: multiply the per-sequence KV bytes by the batch of 32."),
        (_q4_crossover(heads=Q4["query_heads"]), "the cache holds the 8 KV heads (GQA), not the 32 query heads."),
        (_q4_crossover(kv_factor=1), "the cache holds K and V: a factor 2 per token."),
        (_q4_crossover(kv_bytes=1), "the cache is bf16: 2 bytes per element."),
        (key - 1, "off by one: at that context the KV bytes are still at most the weight bytes; give the first "
                  "context where they exceed them."),
    ]
    mistakes: dict[int, str] = {}
    for wrong, why in candidates:
        if wrong != key:
            mistakes[wrong] = f"{mistakes[wrong]} Or: {why}" if wrong in mistakes else why
    check_answer(answer, key, "Q4 (context where the KV cache read overtakes the weights)", mistakes,
                 unit="tokens per sequence",
                 hint="KV bytes read per step = batch * context * 2 (K and V) * layers * kv_heads * head_dim * 2 bytes; "
                      "find the smallest integer context at which this exceeds 15.0e9.")
