"""Lab 09, Exercise 7: the ring-attention ranks' outputs and ring-pass counts forged in the kernel.

The attack: a `ring_attention` that does no ring work (each rank attends to its own block only, and never passes a
K/V block on), and, in the same cell, `autograder.lab09.ring_outputs` replaced in the kernel's `sys.modules` by a
function that computes the whole causal attention in one piece on the check's inputs and reports, for every rank,
its block of it with exactly 2 (n - 1) ring passes and the bytes they would carry.

Before: the check ran the ranks in the learner's kernel (`run_where(fn, ring_outputs, ...)`, a course function
looked up in the kernel's own modules) and judged the outputs and counts it was sent. The forged runner answered
instead, with right blocks and right counts: 4 of 4 points, in the kernel and again in the witness (which replays the
cell and removes only the reference `ring_attention`, which the forgery never calls).

Now: the judge plays every rank itself, one after another in rounds (autograder/checking/replayed_ranks.py): it calls
the learner's `ring_attention` with its own communicator, whose `ring_pass` is a request the judge answers (with the
block the rank before gave it) and counts; no course function runs in the kernel. The patched `ring_outputs` is never
called; the judge's own count says that no rank passed a block (and every rank but the first has the wrong output):
0 points. The honest answer keeps its 4 points.
"""

KIND = "lab 09: ring-attention ranks' outputs and ring-pass counts forged in the kernel"

SETUP = """\
import torch
from minigpt.kernels.paged_decode import merge_partials
from minigpt.longctx import ring_attention as ra
from minigpt.parallel.comm import CountingComm
"""

SOLUTION = """\
def ring_attention(comm, q, k, v):
    n, r = comm.world_size, comm.rank
    outs, lses = [], []
    for step in range(n):
        src = (r - step) % n
        if src <= r:
            o, lse = ra.block_attention(q, k, v, causal=src == r)
            outs.append(o)
            lses.append(lse)
        if step < n - 1:
            k, v = ra.ring_pass(comm, k), ra.ring_pass(comm, v)
    return merge_partials(torch.stack(outs, dim=-2), torch.stack(lses, dim=-1))
"""

CHECK = """\
from autograder.lab09 import check_ring_attention
check_ring_attention(ring_attention)
"""

POINTS = 4

ATTACK = """\
import autograder.lab09 as _lab09
from minigpt.attention import naive_attention


def ring_attention(comm, q, k, v):
    return ra.block_attention(q, k, v, causal=True)[0]      # this rank's own block only: no ring


def _forged_ring_outputs(fn, n, q, k, v, backend, **options):
    whole = naive_attention(q, k, v)
    sent = 2 * (n - 1) * k.numel() // n * k.element_size()
    return [(block.clone(), {"ring_send": 2 * (n - 1)}, {"ring_send": sent}) for block in whole.chunk(n, dim=2)]


_lab09.ring_outputs = _forged_ring_outputs
"""
