"""Lab 02 interview questions: block waste, paged capacity, prefix-cache compute and TTFT, blocks in use after
prefix hits and forks."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer

__all__ = ["check_q1_block_waste", "check_q2_paged_capacity", "check_q3_prefix_compute_saved",
           "check_q4_ttft_with_cache", "check_q5_blocks_in_use"]


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


# Q5: prefix hits, the last-token rule and forks on a case the notebook does not run (the course's manager, exercise 4).
Q5 = dict(block_size=16, prompt=48, a_generated=5, samples=4, new_tokens=20)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def q5_blocks_in_use(*, last_token_rule: bool = True, prefix_hits: bool = True, copy_full_shared: bool = False,
                     fork_shares: bool = True) -> int:
    """Blocks with a reference count >= 1 at the end of Q5, from the manager's rules; the keywords switch one rule off
    (the mistakes). A holds ceil((P + g) / bs) blocks; B finds A's full prompt blocks by hash but reuses at most
    (P - 1) // bs of them (its last prompt token is computed); the forks share all of B's blocks; a sample's first
    append copies the last block only if it is partly filled and shared, otherwise it opens a new block."""
    bs, P, g, n, m = (Q5[k] for k in ("block_size", "prompt", "a_generated", "samples", "new_tokens"))
    a_blocks = _ceil(P + g, bs)
    if not fork_shares:                                   # every sample holds all of its blocks privately
        return a_blocks + n * _ceil(P + m, bs)
    hits = (P // bs if not last_token_rule else min(P // bs, (P - 1) // bs)) if prefix_hits else 0
    b_own = _ceil(P, bs) - hits                           # B's prompt blocks not found in A's
    fill = P % bs                                         # tokens in B's last prompt block when it is partial
    if fill:
        per_sample = _ceil(fill + m, bs) - 1              # the last block is finished (after a copy) then new ones
        copies = n - 1                                    # the last holder writes in place
    else:
        per_sample = _ceil(m, bs)
        copies = n - 1 if copy_full_shared else 0
    return a_blocks + b_own + n * per_sample + copies


def check_q5_blocks_in_use(answer: Any) -> None:
    """Exercise 4's manager, blocks of 16, prefix caching on, no eviction. A (48-token prompt) has generated 5 tokens
    and is still running; B arrives with the same 48 tokens, is prefilled, then forked three times (n = 4 samples,
    B among them); each sample appends 20 tokens, one per step. Physical blocks in use at the end. The key follows
    the manager's rules (q5_blocks_in_use); tests/labs/test_lab02_checks.py replays the scenario on the package's
    BlockManager and gets the same count."""
    key = q5_blocks_in_use()
    candidates = [
        (q5_blocks_in_use(last_token_rule=False),
         "B cannot reuse all 3 of A's full prompt blocks: its last prompt token must be computed (its logits give the "
         "first sampled token), so at most (48 - 1) // 16 = 2 are reused and the third block is recomputed into a new one."),
        (q5_blocks_in_use(prefix_hits=False),
         "prefix caching is on and A's full prompt blocks are hashed: B finds them and shares them (reference count 2)."),
        (q5_blocks_in_use(copy_full_shared=True),
         "copy-on-write copies the last block only when it is partly filled: B's last prompt block is full (48 = 3 x 16), "
         "so each sample's first new token opens a new block and the shared blocks stay shared."),
        (q5_blocks_in_use(fork_shares=False),
         "a fork shares every block of the parent (reference counts go up); nothing is copied at the fork."),
    ]
    mistakes: dict[int, str] = {}
    for wrong, why in candidates:
        if wrong != key:
            mistakes[wrong] = f"{mistakes[wrong]} Or: {why}" if wrong in mistakes else why
    check_answer(answer, key, "Q5 (blocks in use after prefix hits and forks)", mistakes, unit="blocks",
                 hint="Count A's blocks (53 tokens), then B's prompt blocks that are not reused (the last prompt token "
                      "is always computed), then each sample's blocks for its 20 new tokens: is B's last block full "
                      "when the samples start writing?")
