"""Lab 04 interview questions."""

from __future__ import annotations

import math
from typing import Any


import minigpt.kernels  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before any kernel is built)
from autograder.harness import check_answer

# ---------------------------------------------------------------------------------------------------
# Interview questions
# ---------------------------------------------------------------------------------------------------

Q1_BLOCKS = ([2.0, 1.0], [4.0, 0.0])          # score blocks, in the order they are read
Q2_SHAPE = dict(batch=1, heads=32, seq_len=4096, head_dim=128, bytes_per_element=2)


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


def _flash_bytes(s: dict) -> int:
    return s["batch"] * s["heads"] * s["bytes_per_element"] * 4 * s["seq_len"] * s["head_dim"]


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


def check_q3_hbm_ratio(answer: Any) -> None:
    """naive / flash HBM bytes for Q2_SHAPE (flash: Q, K, V read once, O written once; LSE ignored)."""
    s = Q2_SHAPE
    want = _naive_bytes(s) / _flash_bytes(s)
    check_answer(answer, want, "Q3 (naive / flash HBM traffic)",
                 {_flash_bytes(s) / _naive_bytes(s): "inverted: naive over flash.",
                  s["seq_len"] / s["head_dim"]: "forgot the Q, K, V, O traffic naive attention also has (ratio = 1 + T / D)."},
                 unit="a ratio", rel=1e-3)
