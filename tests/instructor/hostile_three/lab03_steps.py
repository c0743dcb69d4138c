"""Lab 03, Exercise 2: the scheduler's steps forged in the kernel, its outputs computed another way.

The attack: a `MyScheduler` whose schedule() was never written (it raises NotImplementedError), and, in the same cell,
two course functions replaced in the kernel's `sys.modules`: `autograder.lab03.scheduler.FakeTokenRun` by a run
that reports, for any workload, that every request finished at once (no steps to look at), and
`autograder.lab03.outputs.serve_outputs` by a function that generates each request alone with lab 01's
`generate_kv_cache` and reports those tokens as what the scheduler served.

Before: the check ran the scheduler in the learner's kernel a stretch of steps at a time (`run_where(...,
FakeTokenRun, ...)` and `run_where(..., serve_outputs, ...)`, course functions looked up in the kernel's own modules)
and judged the steps and outputs it was sent. The forged run had no step to refuse and the forged outputs were the
right ones: 3 of 3 points, in the kernel and again in the witness (which replays the cell and removes only the
reference's scheduling code, which the forgery never calls).

Now: the judge drives the scheduler itself (autograder/lab03/stepping.py): it calls add_request(), schedule() and
update() one at a time, reads each step's batch from what schedule() returned, checks it against its own record of
every request (tokens, positions, the pool's blocks), runs the model on it in the judge and samples each token
there; no course function runs in the kernel. The patched functions are never called; the first schedule() raises
NotImplementedError: 0 points.
"""

KIND = "lab 03: the scheduler's steps and served outputs forged in the kernel"

SETUP = """\
import torch
from minigpt.cache.block_table import block_tables_tensor, blocks_needed
from minigpt.engine.packed_batch import PackedBatch
from minigpt.engine.request import SequenceStatus
from minigpt.engine.scheduler import Scheduler, SchedulerOutput


def pack_chunks(chunks, manager, device="cpu"):
    ids, tokens, positions, slots, cu, lens = [], [], [], [], [0], []
    for seq_id, toks, start, sl in chunks:
        ids.append(seq_id)
        tokens += list(toks)
        positions += range(start, start + len(toks))
        slots += list(sl)
        cu.append(cu[-1] + len(toks))
        lens.append(start + len(toks))
    return PackedBatch(ids, torch.tensor([tokens], device=device), torch.tensor([positions], device=device),
                       torch.tensor(slots, device=device), torch.tensor(cu, device=device),
                       torch.tensor(lens, device=device),
                       block_tables_tensor([manager.table(s).blocks for s in ids], device))
"""

SOLUTION = """\
class MyScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        chunks, preempted = {}, []
        for seq in sorted(self.running, key=lambda s: s.num_remaining > 1):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            n = min(seq.num_remaining, budget)
            while seq.status is SequenceStatus.RUNNING and self._blocks_for(seq, n) > self.manager.pool.num_free:
                victim = self.running[-1]
                if victim.seq_id in chunks:
                    budget += len(chunks.pop(victim.seq_id).tokens)
                self._preempt(victim)
                preempted.append(victim)
            if seq.status is SequenceStatus.RUNNING:
                chunks[seq.seq_id] = self._reserve(seq, n)
                budget -= n
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            n = seq.num_remaining
            if n > budget:
                if not self.config.enable_chunked_prefill:
                    break
                n = budget
            if blocks_needed(n, self.manager.block_size) > self.manager.pool.num_free:
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            chunks[seq.seq_id] = self._reserve(seq, n)
            budget -= n
        return SchedulerOutput(list(chunks.values()), preempted)
"""

CHECK = """\
from autograder.lab03 import check_greedy_outputs
check_greedy_outputs(MyScheduler, pack_chunks)
"""

POINTS = 3

ATTACK = """\
import autograder.lab03.outputs as _outputs
import autograder.lab03.scheduler as _steps
from minigpt.engine.cached_generation import generate_kv_cache


class MyScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        raise NotImplementedError           # never written


class _FinishedAtOnce:
    \"\"\"The course's FakeTokenRun as the kernel ran it: reports a run with no step, every request done.\"\"\"

    def __init__(self, scheduler, arrivals, max_steps):
        pass

    def advance(self, num_steps):
        return {"records": [], "done": True, "error": False, "view": {"outputs": []}}

    def raise_error(self):
        pass


def _served_alone(scheduler_cls, pack_fn, model, requests, num_blocks, budget, layout):
    return [(r.request_id, generate_kv_cache(model, list(r.prompt), r.max_new_tokens, stop_token_ids=()).tokens, 0)
            for r in requests]


_steps.FakeTokenRun = _FinishedAtOnce
_outputs.serve_outputs = _served_alone
"""
