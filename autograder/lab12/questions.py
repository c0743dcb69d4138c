"""Lab 12's interview questions: each answer needs the lab's reasoning applied to a case the notebook does not run;
each likely mistake is diagnosed, the expected value never shown."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer
from minigpt.costmodel.calculators import ModelShape, weight_bytes
from minigpt.costmodel.hardware import ACCELERATORS

# Llama-3.2-1B's published shape (config.json: 16 layers, hidden 2048, 32 heads, 8 KV heads of 64, MLP 8192,
# vocabulary 128,256, tied embeddings)
LLAMA_32_1B = ModelShape("Llama-3.2-1B", n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, head_dim=64, d_ff=8192,
                         vocab_size=128_256, tie_embeddings=True)
Q1 = dict(cpu_ms=0.9, handoff_ms=0.05)
Q2_BUCKETS = (1, 2, 4, 8, 16, 32)
Q3 = dict(tile=8)


def _q1(*, cpu_ms: float = Q1["cpu_ms"], handoff_ms: float = Q1["handoff_ms"], bytes_per_element: float = 2,
        overlapped_ms: str = "max") -> float:
    """Serial over overlapped time between tokens: (m + c) / (max(m, c) + h), m the step at the bandwidth roofline."""
    m = weight_bytes(LLAMA_32_1B, bytes_per_element) / ACCELERATORS["H100-SXM"].memory_bandwidth * 1e3
    overlapped = {"max": max(m, cpu_ms), "model": m, "sum": m + cpu_ms}[overlapped_ms] + handoff_ms
    return (m + cpu_ms) / overlapped


def check_q1_overlap_on_h100(answer: Any) -> None:
    """Llama-3.2-1B in bf16 decoding one request on an H100 SXM, each step at the memory roofline (the weights read
    once); the engine's CPU work per step 0.9 ms; an overlapped launch pays a 0.05 ms hand-off: serial time between
    tokens over overlapped (Exercise 1's model)."""
    check_answer(answer, _q1(), "Q1 (serial over overlapped time between tokens, Llama-3.2-1B on an H100)",
                 [(_q1(handoff_ms=0.0), "the overlapped launch still pays the 0.05 ms hand-off."),
                  (_q1(overlapped_ms="model"), "here the CPU's 0.9 ms outlasts the model's step: overlapped, a step "
                                                "cannot launch before its CPU work is done, whichever is longer sets "
                                                "the pace."),
                  (_q1(bytes_per_element=4), "bf16 is 2 bytes a parameter."),
                  (1 / _q1(), "the question asks serial / overlapped (above 1: overlap is faster).")],
                 unit="x", rel=2e-3,
                 hint="m = weight bytes / bandwidth; serial = m + c; overlapped = max(m, c) + h; answer = serial / "
                      "overlapped.")


def _q2(*, over: str = "computed", buckets: tuple[int, ...] = Q2_BUCKETS) -> float:
    sizes = range(1, 33)
    padded = [min(b for b in buckets if b >= n) for n in sizes]
    waste = sum(p - n for p, n in zip(padded, sizes))
    return waste / (sum(padded) if over == "computed" else sum(sizes))


def check_q2_bucket_padding(answer: Any) -> None:
    """Decode batch sizes uniform over 1..32, steps compiled for buckets 1, 2, 4, 8, 16, 32: the share of the rows
    the compiled steps compute that are padding."""
    check_answer(answer, _q2(), "Q2 (share of computed rows that are padding, buckets 1..32)",
                 [(_q2(over="real"), "the share is of the rows COMPUTED (real + padding), not of the real ones."),
                  (_q2(buckets=(1, 2, 4, 8, 16, 24, 32)), "the buckets are the powers of two only."),
                  (1 - _q2(), "that is the share of useful rows; the question asks for the padding.")],
                 unit="fraction", rel=2e-3,
                 hint="For each batch size n in 1..32, its bucket b(n) is the smallest >= n; padding share = "
                      "sum(b(n) - n) / sum(b(n)).")


def _q3(*, tile: int = Q3["tile"], bytes_per_element: float = 2) -> float:
    return 2 * tile / bytes_per_element


def check_q3_padded_intensity(answer: Any) -> None:
    """A batch-invariant matmul pads a batch-1 decode to tiles of 8 rows; on an H100 in bf16: the arithmetic
    intensity (FLOP per weight byte read) of the padded weight matmuls (whether the padding costs time there follows
    from it against the ridge point)."""
    check_answer(answer, _q3(), "Q3 (FLOP per weight byte of a tile-8 padded decode matmul, bf16)",
                 [(_q3(tile=1), "the 7 padding rows are computed too: 8 rows multiply each weight."),
                  (_q3(bytes_per_element=1), "a bf16 weight is 2 bytes."),
                  (float(Q3["tile"]) / 2, "a multiply-add is 2 FLOPs."),
                  (ACCELERATORS["H100-SXM"].ridge_point("bf16"), "that is the H100's ridge point, the intensity "
                                                                  "where compute and memory take as long; the "
                                                                  "question asks the matmul's own.")],
                 unit="FLOP/byte", rel=1e-3,
                 hint="Each weight element is read once (2 bytes) and used in 8 multiply-adds (2 FLOPs each).")
