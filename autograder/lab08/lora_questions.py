"""Lab 08, interview questions: serve 100 LoRA adapters on one base."""

from __future__ import annotations

from typing import Any

from autograder.harness import check_answer
from minigpt.serving.lora_bench import adapter_bytes
from minigpt.costmodel.calculators import PRESETS, weight_bytes


Q_PRESET, Q_RANK = "Llama-3-8B", 16          # the interview questions' model and adapter rank (bf16)


# ---------------------------------------------------------------------------------------------------
# Interview question: serve 100 LoRA adapters on one base
# ---------------------------------------------------------------------------------------------------

def check_q1_adapter_mib(answer: Any) -> None:
    """Llama-3-8B, one LoRA adapter of rank 16 on all seven projections of every layer, bf16: its size in MiB."""
    shape = PRESETS[Q_PRESET]
    want = adapter_bytes(shape, Q_RANK) / 2**20
    d, q, ff, L = shape.d_model, shape.n_heads * shape.head_dim, shape.d_ff, shape.n_layers
    only_a = L * Q_RANK * (5 * d + q + ff) * 2 / 2**20       # A is r x d_in: d_in is d for wq wk wv w_gate w_up, q for wo, ff for w_down
    mha = L * Q_RANK * (4 * (d + q) + 3 * (d + ff)) * 2 / 2**20
    check_answer(answer, want, "Q1 (one rank-16 adapter of Llama-3-8B, bf16)",
                 {want * 2: "that is float32 (4 bytes); adapters are served in bf16 (2 bytes).",
                  want * 2**20 / 1e6: "MiB is 2**20 bytes, not 1e6.",
                  want / L: "that is one layer; the adapter covers all 32.",
                  only_a: "that counts A (r x d_in) only; each projection has B (d_out x r) too.",
                  mha: "wk and wv are GQA projections: d_model -> n_kv_heads * head_dim = 1024, not 4096."},
                 unit="MiB", rel=0.01,
                 hint="Per projection r * (d_in + d_out) parameters: wq, wo d->d; wk, wv d->1024 (8 KV heads of 128); "
                      "gate, up d->14336; down 14336->d. Times layers, times 2 bytes.")


def check_q2_hundred_adapters_share(answer: Any) -> None:
    """100 such adapters kept in GPU memory next to the bf16 base weights: what percentage of the base's weight bytes?"""
    shape = PRESETS[Q_PRESET]
    want = 100 * 100 * adapter_bytes(shape, Q_RANK) / weight_bytes(shape, 2)
    check_answer(answer, want, "Q2 (100 adapters as a share of the base weights)",
                 {want / 100: "give a percentage (x 100), not a fraction.",
                  want / 2: "count 100 adapters of BOTH factors, A and B, at 2 bytes each, against bf16 base weights."},
                 unit="percent of the base model's weight bytes", rel=0.01,
                 hint="100 * adapter bytes / calculators.weight_bytes(shape, 2), as a percentage.")


Q5_ROWS, Q5_ADAPTERS = 32, 4        # a decode step of 32 sequences (one token row each) over 4 adapters


def check_q5_gather_mib(answer: Any) -> None:
    """Llama-3-8B, rank-16 adapters in bf16, one decode step of 32 sequences over 4 adapters: the MiB of adapter
    factors that exercise 4's gather (A[idx], B[idx]: one copy per ROW) writes in one step, over all seven
    projections of every layer. A kernel that reads each adapter in place (Punica's SGMV, S-LoRA's) reads the 4
    distinct adapters once: 8 times less here."""
    one = adapter_bytes(PRESETS[Q_PRESET], Q_RANK) / 2**20
    want = Q5_ROWS * one
    check_answer(answer, want, "Q5 (adapter bytes the gather copies in one decode step)",
                 {Q5_ADAPTERS * one: "that is the 4 distinct adapters, what a kernel reading them in place touches; "
                                     "A[adapter_idx] makes one copy of the factors for every ROW of the batch.",
                  one: "that is one adapter; the gather copies one per row, 32 rows.",
                  2 * want: "bf16 factors are 2 bytes each, not 4."},
                 unit="MiB", rel=0.01,
                 hint="A[adapter_idx] has shape (rows, r, d_in): one copy of the row's factors per row. Per row: one "
                      "adapter's bytes (question Q3).")
