"""Two pipeline schedules, simulated stage slot by stage slot (lab 07).

    run = simulate_pipeline(stages=4, micro_batches=4, steps=16, drain_every_step=False)
    run.idle_fraction(), run.steady_idle_fraction(), run.makespan

p stages, each taking one time unit per micro-batch. A micro-batch's step runs stage 0, 1, ..., p-1 in order.

* drain_every_step=True, the training / one-batch schedule: step s+1 of any micro-batch starts only when every
  micro-batch has left the last stage in step s (the pipeline drains). Each step takes m + p - 1 units, of which each
  stage is busy m: the bubble (p - 1) / (m + p - 1) is paid on every step.
* drain_every_step=False, the serving schedule: a micro-batch's next decode step enters stage 0 as soon as its token
  leaves the last stage, so the m micro-batches circulate through the ring of stages. With m >= p every stage has
  work in steady state (bubble 0, paid only at the very start and end of the run); with m < p each stage is busy
  m units of every p: idle 1 - m/p.

Every stage runs, in each time unit, the ready task of the earliest (step, micro-batch).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

__all__ = ["PipelineRun", "simulate_pipeline"]


@dataclass(frozen=True)
class PipelineRun:
    stages: int
    micro_batches: int
    steps: int
    drain_every_step: bool
    slots: tuple[tuple[int, int, int, int], ...]     # (stage, start time, micro-batch, step), one per busy unit
    makespan: int

    def idle_fraction(self, start: int = 0, end: int | None = None) -> float:
        """Idle share of the stage-time in [start, end): 1 - busy slots / (stages * (end - start))."""
        end = self.makespan if end is None else end
        if end <= start:
            raise ValueError(f"empty window [{start}, {end})")
        busy = sum(1 for _, t, _, _ in self.slots if start <= t < end)
        return 1 - busy / (self.stages * (end - start))

    def steady_idle_fraction(self) -> float:
        """Idle share in the middle half of the run, away from the first fill and the last drain."""
        quarter = self.makespan // 4
        return self.idle_fraction(quarter, self.makespan - quarter)


def simulate_pipeline(stages: int, micro_batches: int, steps: int, *, drain_every_step: bool) -> PipelineRun:
    """Run `steps` steps of `micro_batches` micro-batches through `stages` unit-time stages (see the module docstring)."""
    if stages < 1 or micro_batches < 1 or steps < 1:
        raise ValueError(f"stages, micro_batches and steps must be >= 1, got {stages}, {micro_batches}, {steps}")
    ready: list[list[tuple[int, int, int]]] = [[] for _ in range(stages)]      # per stage: (step, micro-batch, ready at)
    for mb in range(micro_batches):
        heapq.heappush(ready[0], (0, mb, 0))
    finished_in_step = [0] * steps
    slots: list[tuple[int, int, int, int]] = []
    t, remaining = 0, stages * micro_batches * steps
    while remaining:
        done: list[tuple[int, int, int]] = []               # (stage, micro-batch, step) finishing at t + 1
        for s in range(stages):
            waiting = [task for task in ready[s] if task[2] <= t]
            if waiting:
                task = min(waiting)
                ready[s].remove(task)
                heapq.heapify(ready[s])
                step, mb, _ = task
                slots.append((s, t, mb, step))
                done.append((s, mb, step))
        remaining -= len(done)
        t += 1
        for s, mb, step in done:
            if s + 1 < stages:
                heapq.heappush(ready[s + 1], (step, mb, t))
                continue
            finished_in_step[step] += 1
            if step + 1 == steps:
                continue
            if not drain_every_step:
                heapq.heappush(ready[0], (step + 1, mb, t))
            elif finished_in_step[step] == micro_batches:      # the whole step has drained: release the next one
                for other in range(micro_batches):
                    heapq.heappush(ready[0], (step + 1, other, t))
    return PipelineRun(stages, micro_batches, steps, drain_every_step, tuple(slots), t)
