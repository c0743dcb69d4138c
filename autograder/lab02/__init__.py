"""Checks for Lab 02, the paged KV cache: one module per exercise group, every check re-exported here.

Every check first refuses the package's reference handed in as the answer (the object itself, a subclass that
inherits the asked-for methods, a thin wrapper that calls it: autograder.checking.reference_guard).

CPU tier (correctness):
    pool.check_block_pool(BlockPool)               allocate / free / incref / fork, ref counts, OutOfBlocks unchanged
    pool.check_slot_mapping(slot_of)               slot(p) = table[p // bs] * bs + p % bs, errors past the table
    pool.check_block_hash(hash_block)              deterministic, depends on the tokens AND the parent hash
    state_machine.check_block_manager(make_manager, hash_fn)
                                                   the hypothesis state machine (seeded, a fixed example source:
                                                   the same verdict in any process), copy-on-write forks included;
                                                   an invariant that fails is reported, not the teardown's leak check
    prefix_cache.check_prefix_cache(make_manager)  longest cached run, last prompt token computed, LRU, stale hashes,
                                                   admission counting cached blocks still in the free queue (near-full
                                                   pool), eviction within one sequence (tail block first)
    attention.check_paged_decode_attention(fn)     (B, Hq, D) decode over block tables, GQA, different lengths
    attention.check_paged_attention(fn)            prefill / chunk / mixed batches, bottom-right mask
    attention.check_paged_generation(fn)           the model on a paged cache == lab 01's contiguous cache
Interview questions (questions.py): check_q1_block_waste ... check_q4_ttft_with_cache, check_q5_blocks_in_use (blocks
held after prefix hits, the last-token rule and forks, on a case the notebook does not run; each mistake diagnosed).

Exercise 4 is graded alone: handed the notebook's BlockManager class, its checks set its `pool_class` and `hash_fn`
(the learner's exercises 1 and 3) to the package's BlockPool and hash_block for their run and put the learner's back
(state_machine.exercise_4_alone); a factory is used as it is.
A manager (the learner's or `minigpt.cache.block_manager.BlockManager`) is built as
make_manager(num_blocks, block_size, enable_prefix_caching) and must offer: add_sequence(seq, prompt)
and append_tokens(seq, tokens) returning an object with .slots, .copies and .num_cached; fork(parent,
child); free(seq); .tables {seq: object with .blocks, .token_ids}; .pool with .num_blocks, .ref_counts,
free_blocks(); .prefix_cache with .block_of {hash: block} (or None). Out of blocks it raises
minigpt.cache.block_pool.OutOfBlocks and changes nothing.
"""

from autograder.lab02.attention import (GEN_CONFIG, check_paged_attention, check_paged_decode_attention,
                                        check_paged_generation)
from autograder.lab02.pool import check_block_hash, check_block_pool, check_slot_mapping
from autograder.lab02.prefix_cache import check_prefix_cache
from autograder.lab02.questions import (check_q1_block_waste, check_q2_paged_capacity, check_q3_prefix_compute_saved,
                                        check_q4_ttft_with_cache, check_q5_blocks_in_use)
from autograder.lab02.state_machine import (GRADED_EXAMPLES, STEPS_PER_EXAMPLE, check_block_manager,
                                            make_state_machine, run_state_machine)

__all__ = ["check_block_pool", "check_slot_mapping", "check_block_hash", "check_block_manager",
           "check_prefix_cache", "check_paged_decode_attention", "check_paged_attention", "check_paged_generation",
           "make_state_machine", "run_state_machine", "GRADED_EXAMPLES", "STEPS_PER_EXAMPLE", "GEN_CONFIG", "check_q1_block_waste",
           "check_q2_paged_capacity", "check_q3_prefix_compute_saved", "check_q4_ttft_with_cache",
           "check_q5_blocks_in_use"]
