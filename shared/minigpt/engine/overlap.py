"""Overlap scheduling (lab 12): schedule step N+1 while step N runs, so that the model never waits for the CPU.

    serial                                         overlapped
    schedule N | run N | sample, update N |        schedule N | run N ........ | sample, resolve N | run N+1 ...
                                 schedule N+1 | run N+1                 | apply N ahead, schedule N+1 |

A step's sampled tokens are known only when it lands, and step N+1's decodes read them. So, once step N is
launched (`launch`: its inputs made here, its model call on the model's thread), the scheduler's state is
moved on as if it had landed (`apply_ahead`): each sequence that samples gets a PLACEHOLDER token, and a
sequence that reaches its token budget finishes at once (its length is known without the value). Step N+1 is
scheduled on that state, the placeholders as its decode inputs. When step N lands: sample, `resolve` (each
placeholder replaced by its token, the block it completes hashed; stop tokens and strings decide now), and
`ready` drops from step N+1 the sequences that stopped or were aborted and puts the real tokens in its inputs.
Then step N+1 is launched (`launch_ready`: its inputs were made while step N ran, and only their tokens change,
unless a sequence left it), and step N's outputs are handed out while it runs.

What stays true (tested in tests/minigpt/test_overlap.py): the model's steps run one after another on one thread,
so a block freed early (a finished sequence) is written by a later owner only after the step in flight has
finished with it; a block holding a placeholder is never hashed for the prefix cache until its token is known,
and never at all when its sequence stops there (its K/V is never computed); sampling sees a sequence's output
without its placeholder, as in the serial loop. With the same batches, every token is the serial loop's; the
batches differ only when a stop token frees room one step later than the serial loop would see it, so the
tokens are the serial loop's bit for bit in batch-invariant mode (`engine.batch_invariant`) and to rounding
otherwise.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Hashable, Mapping, Sequence

import torch
from torch import Tensor

from minigpt.engine.request import SequenceStatus
from minigpt.engine.runner import ModelRunner, PreparedStep
from minigpt.engine.scheduler import Scheduler, SchedulerOutput

__all__ = ["step_timeline", "InFlight", "ModelThread", "launch", "apply_ahead", "resolve", "ready", "launch_ready"]


def step_timeline(model_s: Sequence[float], cpu_s: Sequence[float], *, overlapped: bool,
                  handoff_s: float = 0.0) -> list[tuple[float, float]]:
    """(start, end) of each model step, in seconds from 0, for steps whose model call takes model_s[i] and whose
    CPU work (scheduling, inputs) before it can launch takes cpu_s[i]; `handoff_s` the cost of handing a launched
    step to the model's thread and its result back (overlapped only).

    serial:      start_0 = cpu_0;  start_i = end_(i-1) + cpu_i
    overlapped:  start_0 = cpu_0 + handoff;  start_i = max(end_(i-1), start_(i-1) + cpu_i) + handoff
                 (step i's CPU work starts once step i-1 is launched, and runs beside it)
    end_i = start_i + model_i. The time between tokens is end_i - end_(i-1): cpu_i + model_i serially,
    max(model_(i-1), cpu_i) + handoff + model_i - model_(i-1) overlapped."""
    if len(model_s) != len(cpu_s):
        raise ValueError(f"model_s has {len(model_s)} steps and cpu_s {len(cpu_s)}: one of each per step")
    if any(t < 0 for t in (*model_s, *cpu_s, handoff_s)):
        raise ValueError("times must be >= 0 seconds")
    out: list[tuple[float, float]] = []
    for i, (m, c) in enumerate(zip(model_s, cpu_s)):
        if not out:
            start = c + (handoff_s if overlapped else 0.0)
        elif overlapped:
            start = max(out[-1][1], out[-1][0] + c) + handoff_s
        else:
            start = out[-1][1] + c
        out.append((start, start + m))
    return out


class ModelThread:
    """One worker thread that runs the model's steps in the order they are launched (torch releases the GIL
    inside its kernels, so the scheduling thread runs meanwhile), with the torch thread count of the thread that
    made it (a new thread starts with OpenMP's default, every core, whatever torch.set_num_threads said)."""

    def __init__(self) -> None:
        threads = torch.get_num_threads()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-step",
                                        initializer=torch.set_num_threads, initargs=(threads,))

    def submit(self, fn, *args) -> Future:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@dataclass
class InFlight:
    """A launched step: what was scheduled, which sequences it samples (decided at launch: a placeholder later
    changes a chunk's `samples`), and its logits to come."""

    output: SchedulerOutput
    samples: set[Hashable]
    logits: Future = field(repr=False)

    def wait(self) -> Tensor:
        return self.logits.result()


def launch(runner: ModelRunner, thread: ModelThread, output: SchedulerOutput,
           prepared: PreparedStep | None = None) -> InFlight:
    """Start step N's model call on the model's thread, its inputs made here (they read the block manager, which
    the next schedule changes), or made ahead (`prepared`, its tokens put right by `runner.refresh_tokens`)."""
    samples = {c.seq_id for c in output.chunks if c.samples}
    prepared = runner.prepare(output.chunks) if prepared is None else prepared
    return InFlight(output, samples, thread.submit(runner.compute, prepared))


def apply_ahead(scheduler: Scheduler, step: InFlight, now: float) -> None:
    """Move the scheduler past a launched step before its tokens are known: chunks computed, a PLACEHOLDER for
    each sampled token, and the sequences whose budget that token ends finished (blocks freed) now."""
    for chunk in step.output.chunks:
        seq = chunk.seq
        if seq.status is not SequenceStatus.RUNNING:        # aborted since the launch
            continue
        seq.num_computed = chunk.start + len(chunk.tokens)
        if chunk.seq_id in step.samples and seq.append_placeholder() == "length":
            scheduler._finish(seq, "length", now)


def resolve(scheduler: Scheduler, step: InFlight, sampled: Mapping[Hashable, int], now: float) -> None:
    """Step N landed: each placeholder becomes its sampled token. A sequence that stops on it (stop token or
    string) finishes now; one that goes on has the token put into its block table, where the next step reserved
    it (and the block it completes hashed)."""
    manager = scheduler.manager
    for chunk in step.output.chunks:
        seq = chunk.seq
        if chunk.seq_id not in sampled or not seq.pending:           # aborted, or its sampling failed
            continue
        index = seq.num_tokens - 1
        reason = seq.resolve_placeholder(sampled[chunk.seq_id], now)
        if seq.is_finished:                                          # finished ahead: its budget; say why
            seq.finish_reason = reason or seq.finish_reason
            continue
        if reason is not None:
            if seq in scheduler.waiting:                             # preempted by the schedule made ahead
                scheduler.waiting.remove(seq)
            scheduler._finish(seq, reason, now)
            continue
        table = manager.tables.get(chunk.seq_id)
        if table is not None and index < table.num_tokens and table.token_ids[index] < 0:
            manager.resolve_token(chunk.seq_id, index, seq.output_tokens[-1])


def ready(output: SchedulerOutput) -> SchedulerOutput:
    """The step scheduled ahead, made runnable: without the sequences that have stopped or were aborted since,
    and with each chunk's tokens read again (its placeholder now the real token)."""
    chunks = [c for c in output.chunks if c.seq.status is SequenceStatus.RUNNING]
    for c in chunks:
        c.tokens = c.seq.token_slice(c.start, c.start + len(c.tokens))
    return SchedulerOutput(chunks, output.preempted)


def launch_ready(runner: ModelRunner, thread: ModelThread, ahead: SchedulerOutput,
                 prepared: PreparedStep | None) -> InFlight | None:
    """Launch the step scheduled ahead once step N has been resolved (`ready`): with the inputs made ahead, their
    placeholders replaced, when no sequence left it; made again otherwise. None when nothing is left to run."""
    following = ready(ahead)
    if prepared is not None and len(following.chunks) != len(ahead.chunks):
        runner.cache.give_back_host_ops(prepared.host_ops)     # that step is dropped, not the copies it was to run
    if not following.chunks:
        return None
    if prepared is not None and len(following.chunks) == len(ahead.chunks):
        runner.refresh_tokens(prepared, following.chunks)
        return launch(runner, thread, following, prepared)
    return launch(runner, thread, following)
