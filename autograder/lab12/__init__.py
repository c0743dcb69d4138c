"""Checks for Lab 12, the engine's hidden costs: one module per exercise group, every check re-exported here.

Every check first refuses the package's reference handed in as the answer (the object itself, a thin wrapper that
calls it: autograder.checking.reference_guard).

CPU tier (correctness):
    timeline.check_step_timeline(fn)            Exercise 1: (start, end) of each model step, serial and overlapped
                                                with a hand-off, on hand-made and drawn timelines; each mistake named
    overlap_loop.check_overlapped_loop(fn)      Exercise 2: the overlapped engine loop on the judge's engine through
                                                its OverlapDriver: the serial engine's tokens on drawn workloads,
                                                nothing left running, every landed step beside the scheduling of the
                                                next (the driver records the order itself)
    static.check_pad_decode_batch(fn)           Exercise 3: a decode step padded to its bucket: every tensor exactly
                                                the reference's (shapes set by the bucket alone, padding rows on the
                                                null block), on hand-made and drawn steps
    invariance.check_invariant_matmul(fn)       Exercise 4: near x @ w; a row's bits the same alone and anywhere in
                                                batches of 2..300 rows for tiles 1, 4, 8; not a rounded float64 product
    invariance.check_invariant_attention(fn)    Exercise 5: near causal attention (GQA, MHA, MQA); a query's bits the
                                                same alone, among other rows, with its keys padded by masked blocks
                                                and across the chunks of a prefill
Bits are compared only between calls of the learner's own function (autograder/lab12/invariance.py says why).
Interview questions (questions.py): check_q1_overlap_on_h100 (serial over overlapped time between tokens for
Llama-3.2-1B on an H100), check_q2_bucket_padding (padding share of computed rows, buckets 1..32),
check_q3_padded_intensity (FLOP per weight byte of a tile-8 padded decode matmul); each mistake diagnosed.
"""

from autograder.lab12.invariance import check_invariant_attention, check_invariant_matmul
from autograder.lab12.overlap_loop import check_overlapped_loop
from autograder.lab12.questions import check_q1_overlap_on_h100, check_q2_bucket_padding, check_q3_padded_intensity
from autograder.lab12.static import check_pad_decode_batch
from autograder.lab12.timeline import check_step_timeline

__all__ = ["check_step_timeline", "check_pad_decode_batch", "check_invariant_matmul", "check_invariant_attention",
           "check_overlapped_loop",
           "check_q1_overlap_on_h100", "check_q2_bucket_padding", "check_q3_padded_intensity"]
