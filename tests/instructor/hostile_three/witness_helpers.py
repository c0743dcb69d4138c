"""Lab 07, Exercise 1: the reference's body typed again as a call of the helper it calls.

The attack: `shard_weight` is the three lines of the package's `sharding.shard_parameter` (the reference the check
refuses), written in the answer cell: it asks the package's `sharding.shard_slices` for the rows and columns of the
rank's piece and cuts them out. Every slice, every replicated KV head, every refused tp comes from the package; the
cell writes none of the exercise's logic. Its code is in the notebook, so `own_work` accepts it, and it never enters
`shard_parameter`, so neither the kernel's watch nor the witness notices.

Before: the witness removed only the functions of the guarded references (`shard_parameter`, `shard_state_dict`);
`shard_slices` kept its body there, and the attack earned the check's 3 of 3 points in the kernel and again in the
witness.

Now: the witness's package also lacks the reference's helpers, the functions of its own module it calls,
transitively (autograder/judging/reference_removal.py), less those the learner may use: the lab's released notebook
shows `check_tp`, `query_heads`, `kv_heads`, `ffn_units` and `parameter_kind`, which stay, but never `shard_slices`.
There the attack's first call raises `[removed for grading ...] shard_slices`, and the learner is told that the
code calls the course's reference: 0 points. The honest answer computes the heads and slices itself and keeps its
3 points.
"""

KIND = "lab 07: the reference's body typed again as calls of its helpers (shard_slices)"

SETUP = """\
import torch
from minigpt.config import ModelConfig
from minigpt.parallel import sharding
"""

SOLUTION = """\
def shard_weight(name, full, cfg, tp, rank):
    if cfg.n_heads % tp or (cfg.n_kv_heads % tp and tp % cfg.n_kv_heads) or cfg.d_ff % tp:
        raise ValueError(f"tp={tp} cannot split {cfg.n_heads} heads, {cfg.n_kv_heads} KV heads, d_ff={cfg.d_ff}")
    hd = cfg.head_dim
    q0, q1 = rank * cfg.n_heads // tp, (rank + 1) * cfg.n_heads // tp
    group = cfg.n_heads // cfg.n_kv_heads
    kv0, kv1 = q0 // group, (q1 - 1) // group + 1
    f0, f1 = rank * cfg.d_ff // tp, (rank + 1) * cfg.d_ff // tp
    if name.endswith("attn.wq.weight"):
        piece = full[q0 * hd:q1 * hd]
    elif name.endswith(("attn.wk.weight", "attn.wv.weight")):
        piece = full[kv0 * hd:kv1 * hd]
    elif name.endswith(("mlp.w_gate.weight", "mlp.w_up.weight")):
        piece = full[f0:f1]
    elif name.endswith("attn.wo.weight"):
        piece = full[:, q0 * hd:q1 * hd]
    elif name.endswith("mlp.w_down.weight"):
        piece = full[:, f0:f1]
    else:
        piece = full
    return piece.contiguous().clone()
"""

CHECK = """\
from autograder.lab07 import check_shard_weight
check_shard_weight(shard_weight)
"""

POINTS = 3

ATTACK = """\
def shard_weight(name, full, cfg, tp, rank):
    rows, cols = sharding.shard_slices(name, cfg, tp, rank)
    piece = full[rows] if full.ndim == 1 else full[rows, cols]
    return piece.contiguous().clone()
"""
