"""Library calls that would do an exercise for the learner, refused where the exercise is to write it.

A check names the operators (aten's, by name) whose use is not the work; a test cell whose checks refused some is
graded again in a witness (autograder/judging/witness.py) where those operators raise, whatever path reaches them
(`F.scaled_dot_product_attention`, `torch.ops.aten...`, a module that calls them):

    refuse_library(FUSED_ATTENTION, what="Exercise 2 (tiled_attention)")

The witness installs the refusal through the dispatcher before any learner code runs, from an object no Python
code can reach afterwards (autograder/judging/op_refusal.py).
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["FUSED_ATTENTION", "refuse_library", "refused"]

# torch's fused attention on a CPU: the public op, its CPU kernels and its math fallback.
FUSED_ATTENTION = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                   "_scaled_dot_product_attention_math", "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_flash_attention", "_scaled_dot_product_fused_attention_overrideable")

_REFUSED: list[dict] = []


def refuse_library(ops: Iterable[str], *, what: str) -> None:
    """Record that this check refuses the aten operators `ops` (the judge sends them to the witness)."""
    _REFUSED.append({"ops": list(ops), "what": what})


def refused() -> list[dict]:
    """Every refusal recorded since the last call (and forget them)."""
    out = [dict(r) for r in _REFUSED]
    _REFUSED.clear()
    return out
