"""Lab 04 interview questions."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import torch

import minigpt.kernels  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before any kernel is built)
from autograder.harness import check_answer

# ---------------------------------------------------------------------------------------------------
# Interview questions
# ---------------------------------------------------------------------------------------------------

Q1_BLOCKS = ([2.0, 1.0], [4.0, 0.0])          # score blocks, in the order they are read
Q2_SHAPE = dict(batch=1, heads=32, seq_len=4096, head_dim=128, bytes_per_element=2)
Q3_MEMORY = dict(seq_len=16384, head_dim=64, block_k=256)   # the notebook's CPU measurement, one T further


def check_q1_online_state(answer: Any) -> None:
    """Running denominator l after both blocks of Q1_BLOCKS (relative to the running max)."""
    b1, b2 = Q1_BLOCKS
    m1 = max(b1)
    l1 = sum(math.exp(x - m1) for x in b1)
    m2 = max(m1, max(b2))
    l2 = l1 * math.exp(m1 - m2) + sum(math.exp(x - m2) for x in b2)
    no_rescale = l1 + sum(math.exp(x - m2) for x in b2)
    absolute = sum(math.exp(x) for x in b1 + b2)
    check_answer(answer, l2, "Q1 (running denominator l after both blocks)",
                 {no_rescale: "the first block's l was not multiplied by exp(m_old - m_new) when the max grew.",
                  absolute: "that is sum exp(x) without subtracting the running max.",
                  math.log(l2) + m2: "that is the log-sum-exp m + log(l), not l."},
                 unit="a plain number (l, relative to the running max)", rel=1e-4)


def _naive_bytes(s: dict) -> int:
    return s["batch"] * s["heads"] * s["bytes_per_element"] * (4 * s["seq_len"] * s["head_dim"] + 4 * s["seq_len"] ** 2)


def check_q2_naive_hbm_bytes(answer: Any) -> None:
    """HBM bytes of three-kernel naive attention (write S, read S, write P, read P, plus Q, K, V, O) for Q2_SHAPE."""
    s = Q2_SHAPE
    want = _naive_bytes(s)
    bhe = s["batch"] * s["heads"] * s["bytes_per_element"]
    T, D = s["seq_len"], s["head_dim"]
    check_answer(answer, want, "Q2 (HBM bytes, naive attention)",
                 {bhe * (4 * T * D + 2 * T * T): "counted the (T x T) matrix twice; S is written and read, then P "
                                                 "is written and read: 4 T^2 elements per head.",
                  bhe * 4 * T * T: "left out reading Q, K, V and writing O (4 T D elements per head).",
                  want // s["bytes_per_element"]: "that is elements, not bytes (fp16: 2 bytes each).",
                  want * 2: "fp16 is 2 bytes per element, not 4."},
                 unit="bytes", hint="Per head: (4 T D + 4 T^2) elements of 2 bytes.")


@lru_cache(maxsize=8)
def peak_bytes_naive_and_tiled(seq_len: int, device: str = "meta") -> tuple[int, int]:
    """Peak bytes held at once by naive attention and by the package's tiled attention (key tiles of
    Q3_MEMORY["block_k"]) on one (batch, head) of head_dim Q3_MEMORY["head_dim"], fp32, causal: the measurement of
    the notebook's section 3. On the meta device every tensor is allocated and nothing is computed."""
    from minigpt.attention import naive_attention
    from minigpt.kernels.tiled_attention import tiled_attention_forward
    from minigpt.teaching.peak_memory import peak_bytes

    q, k, v = (torch.empty(1, 1, seq_len, Q3_MEMORY["head_dim"], device=device) for _ in range(3))
    return (peak_bytes(naive_attention, q, k, v),
            peak_bytes(tiled_attention_forward, q, k, v, causal=True, block_k=Q3_MEMORY["block_k"]))


def check_q3_peak_ratio(answer: Any) -> None:
    """Prediction: naive attention's peak bytes over the tiled attention's at T = Q3_MEMORY["seq_len"], checked
    against the measurement (peak_bytes_naive_and_tiled on the meta device), within 10%."""
    naive, tiled = peak_bytes_naive_and_tiled(Q3_MEMORY["seq_len"])
    at_4096 = peak_bytes_naive_and_tiled(4096)
    ratio_4096 = at_4096[0] / at_4096[1]
    check_answer(answer, naive / tiled, f"Q3 (naive / tiled peak bytes at T = {Q3_MEMORY['seq_len']})",
                 {ratio_4096: "that is the ratio at T = 4096: it does not stay constant as T grows.",
                  ratio_4096 * 16: "the tiled attention's peak is not constant in T: it holds (T x block_k) score "
                                   "tiles and (T x D) accumulators, so it doubles with T.",
                  ratio_4096 * 2: "two doublings of T from 4096 to 16384, not one."},
                 unit="a ratio (naive bytes / tiled bytes)", rel=0.1,
                 hint="How does each peak grow per doubling of T in the table of section 3? The ratio grows by "
                      "their quotient at every doubling.")
