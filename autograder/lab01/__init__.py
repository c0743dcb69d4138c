"""Checks for Lab 01, the KV cache: one module per exercise group, every check re-exported here.

Each check takes the learner's object (a class or a function), runs it on small seeded models and
raises AssertionError saying what is wrong (which input, which step, expected vs got, likely cause).

CPU tier (correctness):
    check_causal_attention(attention_fn)         bottom-right causal mask, GQA                 (attention.py)
    check_layer_cache(LayerKVCache)               shapes, writes, length, GQA heads, reset      (cache.py)
    check_cache_overflow(LayerKVCache)            clear error, state untouched, exact fill allowed
    check_generate_kv_cache(generate_fn, ...)     identical to the naive generator, one token per decode step
                                                                                                  (generation.py)
    check_cached_speedup(generate_fn)             speedup vs the naive loop, relative to the reference (speed.py)
Profiling questions, graded against the learner's own profiles (profiling.py):
    check_q5_dominant_category(answer, profiles)  the category with the most self time in each pass (or a near tie)
    check_q6_decode_position_cost(answer, profiles, prompt_len)  decode self time / prefill self time per position
Interview questions: check_q1_kv_bytes_per_token, check_q2_max_batch, check_q3_attention_pairs,
check_q4_kv_crossover_context (questions.py).
The decode step without its overhead (fast_step.py):
    check_fuse_weights(fuse_weights)             fused K-major matrices, norms, embedding, RoPE table, by value
    check_decode_step(decode_step)                logits equal to the model's, K/V written at the position only
GPU tier (speed): check_graphed_decode(make_step) behind autograder.harness.require_gpu (gpu.py).
Every check refuses the package's reference handed in (reference_guard), shared pieces live in common.py.
"""

from autograder.lab01.attention import check_causal_attention
from autograder.lab01.cache import check_cache_overflow, check_layer_cache
from autograder.lab01.common import CACHED_SPEED_CHECK, GRAPH_SPEED_CHECK, SMALL_CONFIGS
from autograder.lab01.fast_step import check_decode_step, check_fuse_weights
from autograder.lab01.generation import check_generate_kv_cache
from autograder.lab01.gpu import check_graphed_decode
from autograder.lab01.profiling import check_q5_dominant_category, check_q6_decode_position_cost
from autograder.lab01.questions import (check_q1_kv_bytes_per_token, check_q2_max_batch, check_q3_attention_pairs,
                                        check_q4_kv_crossover_context)
from autograder.lab01.speed import check_cached_speedup, time_cached_speedup

__all__ = ["check_causal_attention", "check_layer_cache", "check_cache_overflow", "check_generate_kv_cache",
           "check_cached_speedup", "time_cached_speedup", "check_fuse_weights", "check_decode_step", "check_graphed_decode", "check_q1_kv_bytes_per_token",
           "check_q2_max_batch", "check_q3_attention_pairs", "check_q4_kv_crossover_context",
           "check_q5_dominant_category", "check_q6_decode_position_cost", "SMALL_CONFIGS",
           "CACHED_SPEED_CHECK", "GRAPH_SPEED_CHECK"]
