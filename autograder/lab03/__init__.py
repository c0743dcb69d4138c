"""Checks for Lab 03, continuous batching (a package: one file per exercise group, each check re-exported here).

Each check takes the learner's object, runs it on small seeded workloads and raises AssertionError
saying what is wrong (which step, which request, expected vs got, likely cause).

CPU tier (correctness):
    check_pack_chunks(pack_fn)                    packed (varlen) layout: positions continue across chunks
    check_scheduler(scheduler_cls)                seeded random workloads: budget, max_num_seqs, each chunk's
                                                  position, tokens and slots (in blocks of its own, freed when it
                                                  finishes or is preempted), preempted resume with their tokens,
                                                  finished when done, bounded finish; no starvation; first come first
                                                  served; no chunking when chunked prefill is disabled; bad input
    check_greedy_outputs(scheduler_cls, pack_fn)  every request's greedy output == generating it alone
    check_static_batching(static_fn)              static batching output == alone (padding never attended), run
                                                  in groups of batch_size (model calls counted)
    check_metrics(request_metrics_fn, goodput_fn) TTFT, TPOT, ITL, E2E, goodput on hand-made timelines
Speed (deterministic proxy): check_continuous_speedup(scheduler_cls): model steps of static batching over the
learner's continuous scheduler on a skewed workload, relative to the reference's, same run.
Files: common.py (shared helpers, the refusal of the reference scheduler), packing.py (Exercise 1), stepping.py (the
scheduler driven by the judge and its own record of the run), scheduler.py (Exercise 2: drive, the policy's
invariants, scheduler_invariants for the package's own tests), outputs.py (Exercises 2 and 3 on a model), metrics.py
(Exercise 4), speed.py, questions.py.
Judged (autograder/judging/judge.py), the learner's scheduler stays in the kernel with its own BlockManager
(manager_beside, never read); the judge calls add_request(), schedule() and update() one request each, reads every
step from what schedule() returned and holds it against its own record (stepping.JudgedRun: tokens, positions, the
queue, the blocks it assigns from the slots), and for the outputs runs each step on its own model and samples there.
No lab 03 function runs in the kernel for the scheduler's checks. Static batching runs on a copy of the model in the
kernel (model_beside: lab 02's generation swaps the model's attention), whose rows the kernel reports (count_rows).
Every check refuses the package's reference handed in as the answer (reference_guard: the object itself, a subclass
inheriting `schedule`, a thin wrapper calling into it).
Interview questions: check_q1_continuous_vs_static (a step cost that grows with the batch), check_q2_chunk_budget (the
largest prefill chunk a decode step carries within 1.25x), check_q3_attention_crossover (the context where attention
outlasts the weight matmuls), both priced on lab 00's rule kernel by kernel, check_q4_itl_knob (a knob chosen for a
stated workload, each wrong option diagnosed).
GPU tier (speed): check_continuous_speedup_gpu(scheduler_cls, pack_fn): wall time of static batching over the learner's
continuous batching on a GPU, relative to the reference, behind autograder.harness.require_gpu.
"""

from autograder.checking.models import NEAR_TIE, SMALL_CONFIG
from autograder.lab03.common import (GPU_SPEED_CHECK, SCHEDULER, SPEED_MIN_FRACTION, Pool, _fake_token, _rand_tokens,
                                     _request, construct, learner_scheduling, own_scheduler)
from autograder.lab03.metrics import check_metrics, metrics_cases
from autograder.lab03.outputs import check_greedy_outputs, check_static_batching
from autograder.lab03.packing import check_pack_chunks
from autograder.lab03.questions import (Q1_STEP_COST, Q2_STEP, Q3_BATCH, Q4_OPTIONS, check_q1_continuous_vs_static,
                                        check_q2_chunk_budget, check_q3_attention_crossover, check_q4_itl_knob)
from autograder.lab03.scheduler import check_scheduler, drive, scheduler_invariants
from autograder.lab03.speed import check_continuous_speedup, check_continuous_speedup_gpu

__all__ = ["check_pack_chunks", "check_scheduler", "check_greedy_outputs", "check_static_batching", "check_metrics",
           "check_continuous_speedup", "check_q1_continuous_vs_static", "check_q2_chunk_budget",
           "check_q3_attention_crossover", "check_q4_itl_knob", "Q1_STEP_COST", "Q2_STEP", "Q3_BATCH", "Q4_OPTIONS", "check_continuous_speedup_gpu", "GPU_SPEED_CHECK", "SMALL_CONFIG", "NEAR_TIE",
           "SPEED_MIN_FRACTION", "drive", "scheduler_invariants", "metrics_cases", "own_scheduler",
           "learner_scheduling", "construct", "SCHEDULER", "Pool"]
