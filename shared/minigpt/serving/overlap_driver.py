"""The overlapped engine loop's operations, for a loop written elsewhere (lab 12, Exercise 5), with a record of the
order they were called in.

    driver = OverlapDriver(LLMEngine(model, EngineConfig(async_scheduling=True)))
    driver.engine.add_request(...)
    run_overlapped(driver)              # the loop (the reference below): schedule, launch, apply_ahead, land, ready
    driver.tokens                       # {request id: tokens handed out}; driver.log: [(operation, id), ...]

Each operation is one piece of `LLMEngine._step_overlapped` (`minigpt.engine.overlap` says why each exists):

    schedule() -> id | None     the scheduler's next step (None: nothing to run now)
    launch(id) -> step          its inputs made and its model call started on the model's thread; refused while the
                                step reads placeholder tokens (scheduled while another step was in flight: `ready` it
                                once that one has landed)
    apply_ahead(step)           the scheduler moved past a launched step (placeholders, budget-ended requests finished)
    land(step)                  wait for its logits, sample, resolve the placeholders, hand out its tokens; refused
                                before apply_ahead(step)
    ready(id) -> id | None      a step scheduled ahead made runnable (stopped requests dropped, real tokens in);
                                None when nothing is left in it

`overlapped_steps()` counts the steps that ran beside the scheduling of the next one (a `schedule` call between
their launch and their landing): what tells an overlapped loop from a serial one.
"""

from __future__ import annotations

import itertools
from typing import Hashable

from minigpt.engine.overlap import InFlight, apply_ahead, launch, ready
from minigpt.engine.request import PLACEHOLDER
from minigpt.engine.scheduler import SchedulerOutput
from minigpt.serving.engine import LLMEngine

__all__ = ["OverlapDriver", "run_overlapped"]


class OverlapDriver:
    """An engine with async_scheduling, driven one operation at a time (see the module docstring)."""

    def __init__(self, engine: LLMEngine) -> None:
        if not engine.config.async_scheduling:
            raise ValueError("OverlapDriver needs an engine made with EngineConfig(async_scheduling=True) (its model "
                             "thread runs the launched steps)")
        self.engine = engine
        self.log: list[tuple[str, int | None]] = []
        self.tokens: dict[Hashable, list[int]] = {}
        self._ids = itertools.count(1)
        self._scheduled: dict[int, tuple[SchedulerOutput, bool]] = {}     # id -> (output, must be readied)
        self._in_flight: dict[int, tuple[InFlight, bool]] = {}           # id -> (step, applied ahead)

    # --- queries ---------------------------------------------------------------------------------

    def has_unfinished(self) -> bool:
        """Whether any request still waits, runs, or has a step in flight."""
        return self.engine.scheduler.has_unfinished() or bool(self._in_flight)

    def overlapped_steps(self) -> int:
        """Steps during whose flight (between launch and land) the next step was scheduled."""
        count, open_steps = 0, {}
        for op, ident in self.log:
            if op == "launch":
                open_steps[ident] = False
            elif op == "schedule":
                for step in open_steps:
                    open_steps[step] = True
            elif op == "land":
                count += open_steps.pop(ident, False)
        return count

    def landed_steps(self) -> int:
        return sum(op == "land" for op, _ in self.log)

    # --- operations ------------------------------------------------------------------------------

    def schedule(self) -> int | None:
        if self._scheduled:
            raise ValueError(f"step(s) {sorted(self._scheduled)} are scheduled and not launched: launch (or ready) "
                             "them before scheduling again, or the same requests are scheduled twice")
        out = self.engine.scheduler.schedule()
        self.engine.num_preemptions += len(out.preempted)
        ident = next(self._ids) if out.chunks else None
        if ident is not None:
            self._scheduled[ident] = (out, bool(self._in_flight))
        self.log.append(("schedule", ident))
        return ident

    def launch(self, ident: int) -> int:
        out, needs_ready = self._take(self._scheduled, ident, "a scheduled step")
        if needs_ready or any(PLACEHOLDER in c.tokens for c in out.chunks):
            self._scheduled[ident] = (out, needs_ready)
            raise ValueError(f"step {ident} was scheduled while another step was in flight: its inputs may read "
                             "placeholder tokens and requests that have stopped since; ready() it once that step "
                             "has landed")
        step = launch(self.engine.runner, self.engine._model_thread, out)
        flight = next(self._ids)
        self._in_flight[flight] = (step, False)
        self.log.append(("launch", flight))
        return flight

    def apply_ahead(self, flight: int) -> None:
        step, applied = self._get(self._in_flight, flight, "a launched step")
        if applied:
            raise ValueError(f"step {flight} was already applied ahead")
        apply_ahead(self.engine.scheduler, step, self.engine.now())
        self._in_flight[flight] = (step, True)
        self.log.append(("apply_ahead", flight))

    def land(self, flight: int) -> None:
        step, applied = self._get(self._in_flight, flight, "a launched step")
        if not applied:
            raise ValueError(f"step {flight} lands before apply_ahead({flight}): the scheduler must be moved past a "
                             "launched step first (its sequences wait for placeholders that landing resolves)")
        del self._in_flight[flight]
        for output in self.engine._emit(*self.engine._land(step)):
            self.tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
        self.log.append(("land", flight))

    def ready(self, ident: int) -> int | None:
        out, _ = self._take(self._scheduled, ident, "a scheduled step")
        if self._in_flight:
            self._scheduled[ident] = (out, True)
            raise ValueError(f"step {ident} cannot be made ready while step(s) {sorted(self._in_flight)} are in "
                             "flight: their tokens are not known yet")
        following = ready(out)
        self.log.append(("ready", ident if following.chunks else None))
        if not following.chunks:
            return None
        self._scheduled[ident] = (following, False)
        return ident

    def _take(self, table: dict, ident: int, what: str) -> tuple:
        value = self._get(table, ident, what)
        del table[ident]
        return value

    @staticmethod
    def _get(table: dict, ident: int, what: str) -> tuple:
        if isinstance(ident, bool) or not isinstance(ident, int) or ident not in table:
            raise ValueError(f"{ident!r} is not {what} (or it was used already)")
        return table[ident]


def run_overlapped(driver: OverlapDriver) -> None:
    """The overlapped loop (the reference of lab 12's Exercise 5): launch a step, move the scheduler past it,
    schedule the next one while it runs, land it, make the next one ready and launch it; until nothing is left."""
    flight = None
    while driver.has_unfinished():
        if flight is None:                          # nothing in flight: the first step, or after an idle one
            flight = driver.launch(driver.schedule())
        driver.apply_ahead(flight)
        ahead = driver.schedule()                      # beside the step in flight
        driver.land(flight)
        ahead = driver.ready(ahead) if ahead is not None else None
        flight = driver.launch(ahead) if ahead is not None else None
