"""Lab 02 interview questions: block waste, paged capacity, prefix-cache compute and TTFT, a fork gone wrong."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer

__all__ = ["check_q1_block_waste", "check_q2_paged_capacity", "check_q3_prefix_compute_saved",
           "check_q4_ttft_with_cache", "check_q5_fork_trace"]


# ---------------------------------------------------------------------------------------------------
# Interview questions
# ---------------------------------------------------------------------------------------------------

def check_q1_block_waste(answer: Any) -> None:
    """A request of 1,234 tokens in blocks of 16: token slots allocated but never used."""
    check_answer(answer, -(-1234 // 16) * 16 - 1234, "Q1 (wasted slots)",
                 {1234 % 16: "that is the fill of the last block, not its empty part.",
                  4096 - 1234: "that is the waste of max-length preallocation (4096), not of paging."},
                 unit="token slots", hint="Blocks = ceil(1234 / 16); waste = blocks * 16 - 1234.")


def check_q2_paged_capacity(answer: Any) -> None:
    """32 layers, 8 KV heads of 128, bf16; 40 GiB of cache; requests of 700 tokens; blocks of 16: how many fit?"""
    per_token = 2 * 32 * 8 * 128 * 2
    budget = 40 * 2**30
    check_answer(answer, budget // (-(-700 // 16) * 16 * per_token), "Q2 (requests that fit, paged)",
                 {budget // (700 * per_token): "a request holds whole blocks: round 700 up to a multiple of 16.",
                  (40 * 10**9) // (-(-700 // 16) * 16 * per_token): "40 GiB is 40 * 2**30 bytes, not 40e9.",
                  budget // (4096 * per_token): "that is max-length preallocation (4096 tokens per request)."},
                 unit="requests", hint="Bytes per request = ceil(700/16) * 16 tokens * bytes per token; divide the budget.")


def check_q3_prefix_compute_saved(answer: Any) -> None:
    """1,000 chat requests: the same 1,500-token system prompt + a distinct 100-token message, blocks of 16,
    the cache empty before the first: prompt tokens computed in all with prefix caching."""
    per_later = 1600 - (1500 // 16) * 16
    check_answer(answer, 1600 + 999 * per_later, "Q3 (prompt tokens computed)",
                 {1600 + 999 * 100: "only FULL blocks are cached: the system prompt's last partial block is computed again.",
                  1000 * per_later: "the first request finds an empty cache and computes all 1,600 tokens.",
                  1000 * 1600: "that is without prefix caching."},
                 unit="tokens", hint="The first request computes 1,600; each later one reuses the 1500 // 16 full blocks.")


def check_q4_ttft_with_cache(answer: Any) -> None:
    """Q3's workload, prefill time proportional to the tokens computed: TTFT speedup of a later request."""
    check_answer(answer, 1600 / (1600 - (1500 // 16) * 16), "Q4 (time-to-first-token speedup)",
                 {1600 / 100: "the cached part is whole blocks: 1500 // 16 * 16 tokens, not 1500.",
                  1500 / 100: "the speedup compares all 1,600 prompt tokens to those still computed."},
                 unit="x (a ratio)", rel=1e-3, hint="speedup = tokens computed without cache / tokens computed with it.")


def check_q5_fork_trace(answer: Any) -> None:
    """A teammate's manager (blocks of 4, prefix caching off) prints: s0 added with 10 tokens in blocks [3, 7, 1];
    fork to s1 (every ref count 2); append s1 [42] -> slots [6], copies [], s1 still [3, 7, 1]; append s0 [17] ->
    slots [6], copies [], s0 still [3, 7, 1]; the two samples then garble. Which explanation (1-5) is right?"""
    check_answer(answer, 3, "Q5 (what went wrong in the fork trace)",
                 {1: "nothing ran out: no OutOfBlocks was raised, and a copy would have needed one free block only.",
                  2: "copying every block at the fork would waste the sharing: full blocks 3 and 7 never change. Only the "
                  "partly filled last block must be copied, at the first write into it.",
                  4: "the slot is right: position 10 is in logical block 10 // 4 = 2, which is physical block 1, offset 2, "
                  "so slot 1 * 4 + 2 = 6. The trouble is whose block that slot is in.",
                  5: "prefix caching is off in this trace, and only full blocks are hashed: block 1 holds 2 tokens."},
                 unit="option number (1 to 5)",
                 hint="Look at the reference counts when s1 writes: who else holds the block that its slot is in, and is "
                      "that block full?")
