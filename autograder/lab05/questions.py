"""The interview questions: FP8 ranges, GPTQ's recovery, the memory of its Hessians."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer
from minigpt.config import TARGET_CONFIG


def check_q1_e4m3_max(answer: Any) -> None:
    check_answer(answer, 448.0, "Q1: the largest finite FP8 E4M3 (float8_e4m3fn) value", unit="a plain number",
                 mistakes={240.0: "240 is the IEEE-style E4M3 with infinities; e4m3fn ('finite') uses the top exponent "
                                  "for normal values and keeps only one NaN pattern, reaching 1.75 * 2^8.",
                           57344.0: "57344 is the E5M2 maximum.", 480.0: "only S.1111.111 is NaN: the largest mantissa is 110."})


def check_q2_e5m2_smallest_normal(answer: Any) -> None:
    check_answer(answer, 2.0 ** -14, "Q2: the smallest positive normal FP8 E5M2 value", unit="a plain number",
                 mistakes={2.0 ** -6: "2^-6 is E4M3's smallest normal (bias 7); E5M2 has bias 15.",
                           2.0 ** -16: "2^-16 is E5M2's smallest subnormal, not the smallest normal.",
                           2.0 ** -15: "the smallest normal exponent is 1 - bias = -14."})


def check_q3_range_ratio(answer: Any) -> None:
    check_answer(answer, (57344.0 / 2.0 ** -14) / (448.0 / 2.0 ** -6),
                 "Q3: E5M2's dynamic range (max / smallest normal) divided by E4M3's", unit="a ratio",
                 mistakes={57344.0 / 448.0: "that compares only the maxima; the range is max / smallest normal."})


def check_q4_gptq_recovery(answer: Any, ppl: dict[str, float]) -> None:
    """ppl: the lab's measured {"fp32", "INT4 RTN g64", "INT4 GPTQ g64"} perplexities."""
    base, rtn, gptq = ppl["fp32"], ppl["INT4 RTN g64"], ppl["INT4 GPTQ g64"]
    if rtn <= base:
        raise AssertionError("INT4 RTN lost no perplexity in your measurement; recompute the table first")
    want = (rtn - gptq) / (rtn - base)
    check_answer(answer, want, "Q4: the fraction of INT4 RTN's (g64) perplexity loss that GPTQ recovers", unit="a fraction",
                 rel=1e-3, mistakes={1 - want: "that is the fraction GPTQ still loses, not what it recovers.",
                                     (rtn - gptq) / base: "divide by RTN's loss (rtn - fp32), not by the fp32 perplexity."})


def check_q5_gptq_hessian_bytes(answer: Any) -> None:
    c = TARGET_CONFIG
    per_layer = 2 * c.d_model ** 2 + (c.n_heads * c.head_dim) ** 2 + c.d_ff ** 2
    want = c.n_layers * per_layer * 4
    check_answer(answer, want, "Q5: float32 bytes of all GPTQ Hessians of the target model (one per distinct input)",
                 unit="bytes", mistakes={c.n_layers * 7 * c.d_model ** 2 * 4: "w_down reads d_ff features, not d_model.",
                                         c.n_layers * (4 * c.d_model ** 2 + 2 * c.d_ff ** 2) * 4:
                                             "wq, wk, wv share one input (one Hessian), and so do w_gate and w_up.",
                                         want // 4: "float32 is 4 bytes per entry."})
