"""The engine loop (lab 03): requests arrive, the scheduler picks a step, a runner executes it, a clock ticks.

    result = serve(requests, scheduler, runner.execute, WallClock())

The loop is the same for a real model (`ModelRunner.execute`, `WallClock`) and for a simulated one
(`minigpt.costmodel.serving_simulator`: synthetic tokens and a clock whose step cost comes from the
roofline). A request that can never run is rejected at arrival (`result.rejected`, with the error);
the others are served. Each step is recorded for the Gantt chart, batch size and KV-pool use over time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, Protocol, Sequence

from minigpt.engine.request import Request
from minigpt.engine.request import Sequence as Seq
from minigpt.engine.scheduler import SchedulerOutput

__all__ = ["Clock", "WallClock", "StepRecord", "ServeResult", "serve"]


class Clock(Protocol):
    def now(self) -> float: ...
    def wait_until(self, t: float) -> None: ...
    def after_step(self, output: SchedulerOutput) -> None: ...


class WallClock:
    """Real elapsed seconds, except that idle time (nothing to run until the next arrival) is skipped
    instantly rather than slept: it counts in the timestamps but costs no wall time."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._skipped = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._start + self._skipped

    def wait_until(self, t: float) -> None:
        self._skipped += max(0.0, t - self.now())

    def after_step(self, output: SchedulerOutput) -> None:
        pass


@dataclass
class StepRecord:
    start: float
    end: float
    seq_ids: list[Hashable]
    num_tokens: int
    num_prefill_tokens: int
    blocks_used: int
    num_waiting: int


@dataclass
class ServeResult:
    sequences: list[Seq]                                  # served requests, in arrival order
    steps: list[StepRecord]
    rejected: list[tuple[Request, str]] = field(default_factory=list)
    num_blocks: int = 0

    @property
    def output_tokens(self) -> int:
        return sum(len(s.output_tokens) for s in self.sequences)

    @property
    def duration(self) -> float:
        """First arrival to last finish, seconds."""
        if not self.sequences:
            return 0.0
        return max(s.finish_time for s in self.sequences) - min(s.arrival_time for s in self.sequences)

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.duration if self.duration > 0 else 0.0

    def outputs(self) -> dict[Hashable, list[int]]:
        return {s.seq_id: list(s.output_tokens) for s in self.sequences}


def serve(requests: Sequence[Request], scheduler: object, execute: Callable[[SchedulerOutput], Mapping[Hashable, int]],
          clock: Clock | None = None, *, max_steps: int = 1_000_000) -> ServeResult:
    """Serve `requests` (each added when the clock reaches its arrival_time) until all finish."""
    clock = clock or WallClock()
    pending = sorted(requests, key=lambda r: r.arrival_time)
    sequences, steps, rejected = [], [], []
    i = 0
    manager = scheduler.manager
    for _ in range(max_steps):
        now = clock.now()
        while i < len(pending) and pending[i].arrival_time <= now:
            try:
                sequences.append(scheduler.add_request(pending[i]))
            except ValueError as err:               # this request can never run: reject it, serve the rest
                rejected.append((pending[i], str(err)))
            i += 1
        if i == len(pending) and hasattr(scheduler, "end_of_arrivals"):
            scheduler.end_of_arrivals()
        if not scheduler.has_unfinished() and i == len(pending):
            break
        output = scheduler.schedule() if scheduler.has_unfinished() else SchedulerOutput([])
        if not output.chunks:
            if i == len(pending):
                raise RuntimeError(f"the scheduler scheduled nothing with {len(scheduler.waiting)} waiting and "
                                   f"{len(scheduler.running)} running requests and no more arrivals: it is stuck")
            clock.wait_until(pending[i].arrival_time)
            continue
        start = clock.now()
        sampled = execute(output)
        clock.after_step(output)
        end = clock.now()
        scheduler.update(output, sampled, end)
        steps.append(StepRecord(start, end, [c.seq_id for c in output.chunks], output.num_batched_tokens,
                                sum(len(c.tokens) for c in output.chunks if c.is_prefill), manager.pool.num_used,
                                len(scheduler.waiting)))
    else:
        raise RuntimeError(f"serve stopped after max_steps={max_steps} steps with requests unfinished")
    return ServeResult(sequences, steps, rejected, manager.pool.num_blocks)
