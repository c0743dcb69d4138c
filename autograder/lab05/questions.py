"""The interview questions: FP6 E3M2 (OCP MX) range from its bit layout, FP8 ranges, AWQ's recovery at 3 bits,
the memory of GPTQ's Hessians, a format for a stated workload."""

from __future__ import annotations

from typing import Any

import json

from autograder.harness import check_answer
from minigpt.config import TARGET_CONFIG
from minigpt.paths import data_dir
from minigpt.costmodel import calculators as calc
from minigpt.costmodel.hardware import ACCELERATORS


def check_q1_e3m2_max(answer: Any) -> None:
    """The largest finite OCP MX FP6 E3M2 value: bias 2^(3-1) - 1 = 3, no infinity or NaN, so the top exponent
    field (111) and the all-ones mantissa (11) are ordinary numbers: 1.75 * 2^(7 - 3) = 28."""
    check_answer(answer, 28.0, "Q1: the largest finite value of FP6 E3M2 (OCP MX v1.0)", unit="a plain number",
                 mistakes={14.0: "14 reserves the top exponent field for infinity and NaN as IEEE formats (and E5M2) "
                                 "do; the MX FP6 formats have no special encodings, so exponent field 111 holds numbers.",
                           24.0: "24 keeps one NaN pattern at the top as float8_e4m3fn does (S.111.11); FP6 E3M2 has "
                                 "none, so the mantissa 11 is usable there too.",
                           224.0: "that forgets the bias: the largest exponent is 7 - 3 = 4, not 7.",
                           16.0: "that is 2^4 alone: the all-ones mantissa adds 1/2 + 1/4, a significand of 1.75.",
                           7.5: "7.5 is E2M3's maximum (bias 1); the question asks about E3M2 (bias 3).",
                           12.0: "12 reserves the top exponent (IEEE-style) and drops a mantissa bit; neither applies."})


def check_q2_e3m2_smallest_subnormal(answer: Any) -> None:
    """The smallest positive FP6 E3M2 value: a subnormal (exponent field 000, mantissa 01), 2^(1 - 3) * 2^-2."""
    check_answer(answer, 2.0 ** -4, "Q2: the smallest positive value (a subnormal) of FP6 E3M2 (OCP MX v1.0)",
                 unit="a plain number",
                 mistakes={2.0 ** -2: "2^-2 is the smallest normal (exponent field 001, 2^(1 - 3)); below it the "
                                      "subnormals (field 000) step by 2^(1 - bias) / 2^mantissa_bits.",
                           2.0 ** -5: "subnormals use the exponent 1 - bias, the same as the smallest normals, not "
                                      "0 - bias: 2^(1 - 3) * 0.01b.",
                           2.0 ** -3: "2^-3 is 2^(0 - bias) with no mantissa: a subnormal is 2^(1 - bias) * m / 4 "
                                      "with the smallest nonzero mantissa m = 1.",
                           2.0 ** -1: "that forgets the bias: 2^(1 - 0) * 2^-2."})


def check_q3_range_ratio(answer: Any) -> None:
    check_answer(answer, (57344.0 / 2.0 ** -14) / (448.0 / 2.0 ** -6),
                 "Q3: E5M2's dynamic range (max / smallest normal) divided by E4M3's", unit="a ratio",
                 mistakes={57344.0 / 448.0: "that compares only the maxima; the range is max / smallest normal."})


def _sweep() -> dict[tuple[int, int | None, str], dict]:
    """The lab's measured sweep (data/lab05_quality_table.json), keyed (bits, group_size, method)."""
    table = json.loads((data_dir() / "lab05_quality_table.json").read_text())
    return {(r["weight_bits"], r["group_size"], r["method"]): r for r in table["sweep"]} | {
        ("fp32",): next(r for r in table["rows"] if r["name"] == "fp32")}


def check_q4_low_bit_recovery(answer: Any) -> None:
    """The fraction of INT3 per-channel RTN's perplexity loss (against fp32) that AWQ recovers, from the shipped table."""
    sweep = _sweep()
    base, rtn, awq = sweep[("fp32",)], sweep[(3, None, "RTN")], sweep[(3, None, "AWQ")]
    loss = rtn["perplexity"] - base["perplexity"]
    want = (rtn["perplexity"] - awq["perplexity"]) / loss
    check_answer(answer, want, "Q4: the fraction of INT3 per-channel RTN's perplexity loss that AWQ recovers",
                 unit="a fraction", rel=1e-3,
                 mistakes={1 - want: "that is the fraction AWQ still loses, not what it recovers.",
                           (rtn["perplexity"] - awq["perplexity"]) / base["perplexity"]:
                               "divide by RTN's loss (RTN - fp32), not by the fp32 perplexity.",
                           1 - awq["kl"] / rtn["kl"]: "that is the share of the KL divergence AWQ removes (printed in "
                                                      "section 9); the question asks about perplexity.",
                           (rtn["perplexity"] - sweep[(3, None, "GPTQ act-order")]["perplexity"]) / loss:
                               "that is GPTQ's (act-order) recovery; the question asks about AWQ."})


Q6_OPTIONS = {1: "bf16 weights", 2: "INT8 weight-only (W8A16), round-to-nearest", 3: "W8A8 with SmoothQuant",
              4: "INT4 W4A16 with groups of 128, round-to-nearest", 5: "INT4 W4A16 with groups of 128, GPTQ or AWQ",
              6: "INT3 with one scale per channel, GPTQ"}


def check_q6_production_choice(answer: Any) -> None:
    """Llama-3-70B at batch 8 x 8,192 tokens (bf16 cache) on one 80 GB H100 at 90% use: the option that fits and
    loses least. Only the 4-bit options leave room for the cache; of those, the calibrated one loses least."""
    shape, gpu = calc.get_preset("Llama-3-70B"), ACCELERATORS["H100-SXM"]
    kv = calc.kv_cache_bytes(shape, 8192, batch=8)
    budget = 0.9 * gpu.memory_bytes
    w8 = calc.weight_bytes(shape, 1)
    gb = lambda n: f"{n / 1e9:.1f} GB"
    check_answer(answer, 5, "Q6: the weight format for Llama-3-70B, 8 x 8,192-token requests, one 80 GB H100",
                 unit="an option number 1-6",
                 mistakes={1: f"bf16 weights alone take {gb(calc.weight_bytes(shape, 2))}, more than the whole GPU.",
                           2: f"8-bit weights take {gb(w8)}; with the {gb(kv)} bf16 cache that is {gb(w8 + kv)}, over "
                              f"the {gb(budget)} usable.",
                           3: f"W8A8 stores 8-bit weights ({gb(w8)}) and does not fit next to the {gb(kv)} cache; it "
                              "speeds up compute-bound prefill, it does not shrink weights below one byte.",
                           4: "it fits, but GPTQ or AWQ store the same bytes and run the same kernel; their calibration "
                              "is an offline cost paid once, and they lose less where rounding hurts (section 9).",
                           6: "it fits with room to spare, but with 4 bits fitting there is no reason to pay the larger "
                              "loss of 3 bits (section 9's sweep)."})


def check_q5_gptq_hessian_bytes(answer: Any) -> None:
    c = TARGET_CONFIG
    per_layer = 2 * c.d_model ** 2 + (c.n_heads * c.head_dim) ** 2 + c.d_ff ** 2
    want = c.n_layers * per_layer * 4
    check_answer(answer, want, "Q5: float32 bytes of all GPTQ Hessians of the target model (one per distinct input)",
                 unit="bytes", mistakes={c.n_layers * 7 * c.d_model ** 2 * 4: "w_down reads d_ff features, not d_model.",
                                         c.n_layers * (4 * c.d_model ** 2 + 2 * c.d_ff ** 2) * 4:
                                             "wq, wk, wv share one input (one Hessian), and so do w_gate and w_up.",
                                         want // 4: "float32 is 4 bytes per entry."})
