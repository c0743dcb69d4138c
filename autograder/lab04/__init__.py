"""Checks for Lab 04, FlashAttention in Triton: one module per exercise group, every check re-exported here.

Each check takes the learner's function, runs it on small seeded inputs (Triton kernels in the interpreter
on a CPU) and raises AssertionError saying what is wrong (which shape, how far off, the likely cause).

CPU tier (correctness, and the method where the exercise teaches one):
    check_vector_add(fn)              fn(x, y, out) writes x + y through a Triton kernel; lengths not a multiple of
                                      the block, nothing written past the end of out (warm-up 1)
    check_row_softmax(fn)             fn(x, out) writes softmax(x, -1) row by row; rows shorter than the block,
                                      scores near +1000 and -10000 (warm-up 2)
    check_tiled_matmul(fn)            fn(a, b, out) writes a @ b tile by tile; M, N, K tails, strided b (warm-up 3)
    check_online_softmax(fn)          fn(x (..., N), block_size) -> softmax(x); every reduction (max, sum, softmax)
                                      sees at most block_size columns; fp16 input, very negative rows
    check_tiled_attention(fn)         fn(q, k, v, causal, block_k) -> (out, lse), PyTorch, tiled over keys: no
                                      (Tq x Tk) tensor ever held, no fused attention call
    check_tiled_backward(fn)          fn(q, k, v, out, lse, d_out, causal) -> (dq, dk, dv) from the saved LSE: no
                                      (Tq x Tk) tensor held (key tiles of at most 16), no autograd
    check_flash_forward(fn)           fn(q, k, v, causal) -> (out, lse), must launch a Triton kernel
    check_merge_partials(fn)          fn(o_part (..., S, D), lse_part (..., S)) -> (..., D)
    check_paged_decode(fn)            fn(q, k_pool, v_pool, block_tables, seq_lens, merge=) -> (B, Hq, D), Triton;
                                      merge= the package's merge_partials (only the split kernel is graded)
Part two (backward.py):
    check_flash_backward(fn)          fn(q, k, v, out, lse, d_out, causal) -> (dq, dk, dv) through the notebook's
                                      Triton kernels, against autograd of naive attention (fp32, fp16; T = 1, tails,
                                      GQA groups 1, 2, 8, causal and not); the known mistakes named
    check_attention_function(cls, triton)   apply(q, k, v, is_causal=False) on (B, T, D) and (B, H, T, D), one saved
                                      LSE, gradients, ValueError for is_causal with Tq != Tk
Interview questions: check_q1_online_state, check_q2_naive_hbm_bytes, check_q3_peak_ratio (a prediction the check
measures: naive / tiled peak bytes at T = 16384, counted on the meta device).
Every check refuses the package's reference handed in (reference_guard: minigpt.kernels.* itself, a thin wrapper
calling it, or, for the Triton checks, a launch of one of the package's kernels).
GPU tier (speed, memory; behind autograder.harness.require_gpu):
    check_flash_speed(fn), check_paged_decode_speed(fn), check_flash_memory(fn),
    check_flash_backward_speed(cls)   fwd+bwd of an autograd Function against SDPA-flash's fwd+bwd
Not graded, reported by `make gpu-check`: causal_fast_path_speedup (fast path over the single loop).

Judged (autograder/judging/judge.py: the learner's objects are Remotes here), three things happen where the learner's code
lives, through run_where, and come back as data for the verdict made here: a Triton launcher's call with its launches
counted (call_launcher; a warm-up's padded buffer travels whole with the view the launcher gets), one forward and
backward of an autograd Function (FunctionRun: autograd cannot cross processes), and the GPU tier's timings and peak
memory (measure_*: a call across processes would time the copies and allocate elsewhere).
"""

from autograder.checking.models import Launches, count_triton_launches
from autograder.lab04.common import (ATTENTION_CASES, BACKWARD_SPEED_CHECK, DECODE_SPEED_CHECK, FLASH_SPEED_CHECK,
                                     MEMORY_CHECK, PAGED_CASES, TOL, reference_lse)
from autograder.lab04.backward import (BACKWARD_CASES, FLASH_BACKWARD, FUNCTIONS, FunctionRun, backward64,
                                       check_attention_function, check_flash_backward)
from autograder.lab04.gpu import (causal_fast_path_speedup, check_flash_backward_speed, check_flash_memory,
                                  check_flash_speed, check_paged_decode_speed, growth_per_doubling)
from autograder.lab04.questions import (Q1_BLOCKS, Q2_SHAPE, Q3_MEMORY, check_q1_online_state,
                                        check_q2_naive_hbm_bytes, check_q3_peak_ratio, peak_bytes_naive_and_tiled)
from autograder.lab04.softmax import ONLINE_SOFTMAX, check_online_softmax
from autograder.lab04.tiled import (BACKWARD_TILE, TILED_BACKWARD, TILED_FORWARD, check_tiled_attention,
                                    check_tiled_backward)
from autograder.lab04.triton_kernels import (FLASH_FORWARD, MERGE, PAGED_DECODE, call_counting_launches, call_launcher,
                                             check_flash_forward, check_merge_partials, check_paged_decode, own_kernels)
from autograder.lab04.warmup import check_row_softmax, check_tiled_matmul, check_vector_add

__all__ = ["check_vector_add", "check_row_softmax", "check_tiled_matmul", "check_online_softmax",
           "check_tiled_attention", "check_tiled_backward", "check_flash_forward",
           "check_merge_partials", "check_paged_decode", "check_q1_online_state", "check_q2_naive_hbm_bytes",
           "check_q3_peak_ratio", "check_flash_speed", "check_paged_decode_speed", "check_flash_memory",
           "ATTENTION_CASES", "PAGED_CASES", "FLASH_SPEED_CHECK", "DECODE_SPEED_CHECK", "MEMORY_CHECK",
           "growth_per_doubling", "Q1_BLOCKS", "Q2_SHAPE", "Q3_MEMORY", "peak_bytes_naive_and_tiled",
           "count_triton_launches", "check_flash_backward", "check_attention_function", "BACKWARD_CASES",
           "check_flash_backward_speed", "causal_fast_path_speedup", "BACKWARD_SPEED_CHECK", "call_launcher",
           "call_counting_launches"]
