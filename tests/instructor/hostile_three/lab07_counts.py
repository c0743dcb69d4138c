"""Lab 07, Exercise 2: the ranks' logits and all-reduce counts forged in the kernel.

The attack: two classes that do no tensor-parallel work (each layer multiplies by its own slice and never calls a
collective), and, in the same cell, `autograder.lab07._on_ranks` replaced in the kernel's `sys.modules` by a function
that runs the whole one-process model on the check's inputs and reports, for every rank, those logits with exactly
two all-reduces a layer and the bytes they would carry.

Before: the check ran the ranks in the learner's kernel (`run_where(..., _on_ranks, ...)`, a course function looked
up in the kernel's own modules) and judged the results it was sent. The forged runner answered instead, with right
logits and right counts: 4 of 4 points, in the kernel and again in the witness (which replays the cell and removes
only the reference linears, which the forgery never calls).

Now: the judge drives every rank itself. It builds each rank's model around the learner's layers (handles to
objects in the kernel), calls them, and hands them its own communicator, whose `all_reduce` is a request the judge
answers and counts; no course function runs in the kernel. The patched `_on_ranks` is never called, the layers' own
outputs decide, and they are wrong (no all-reduce after the row-parallel layer): 0 points.
"""

KIND = "lab 07: tensor-parallel ranks' logits and collective counts forged in the kernel"

SETUP = """\
import torch
from torch import nn
from minigpt.parallel.comm import CountingComm
"""

SOLUTION = """\
class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features, out_local, comm):
        super().__init__()
        self.comm = comm
        self.weight = nn.Parameter(torch.empty(out_local, in_features).normal_(std=0.02))

    def forward(self, x):
        return x @ self.weight.t()


class RowParallelLinear(nn.Module):
    def __init__(self, in_local, out_features, comm):
        super().__init__()
        self.comm = comm
        self.weight = nn.Parameter(torch.empty(out_features, in_local).normal_(std=0.02))

    def forward(self, x):
        return self.comm.all_reduce(x @ self.weight.t())
"""

CHECK = """\
from autograder.lab07 import check_parallel_linears
check_parallel_linears(ColumnParallelLinear, RowParallelLinear)
"""

POINTS = 4

ATTACK = """\
import autograder.lab07 as _lab07
from minigpt.model import GPT


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features, out_local, comm):
        super().__init__()
        self.comm = comm
        self.weight = nn.Parameter(torch.zeros(out_local, in_features))

    def forward(self, x):
        return x @ self.weight.t()


class RowParallelLinear(nn.Module):
    def __init__(self, in_local, out_features, comm):
        super().__init__()
        self.comm = comm
        self.weight = nn.Parameter(torch.zeros(out_features, in_local))

    def forward(self, x):
        return x @ self.weight.t()          # no all-reduce: not tensor parallelism


def _forged_ranks(worker, tp, name, full_state, *rest, **options):
    cfg = _lab07.CONFIGS[name]
    whole = GPT(cfg).eval()
    whole.load_state_dict(full_state)
    with torch.no_grad():
        logits = whole(_lab07._tokens(cfg))
    calls = 2 * cfg.n_layers
    nbytes = calls * logits.shape[0] * logits.shape[1] * cfg.d_model * 4
    return [(logits.clone(), {"all_reduce": calls}, {"all_reduce": nbytes}) for _ in range(tp)]


_lab07._on_ranks = _forged_ranks
"""
