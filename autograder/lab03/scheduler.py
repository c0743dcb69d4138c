"""Exercise 2: the scheduler's invariants, driven by the judge with fake tokens (no model) on seeded workloads."""

from __future__ import annotations

from typing import Any, Callable, Hashable

import torch

from autograder.harness import quiet
from autograder.lab03.common import (SCHEDULER, Pool, _request, failures_named, learner_scheduling, own_scheduler,
                                     scheduler_on)
from autograder.lab03.stepping import JudgedRun, Ledger, StepView, run_steps
from minigpt.engine.request import Request
from minigpt.cache.block_table import blocks_needed
from minigpt.engine.scheduler import SchedulerConfig


def drive(scheduler: Any, arrivals: list[tuple[int, Request]], pool: Pool | None = None, *, max_steps: int = 5000,
          on_step: Callable[[int, dict[str, Any]], None] | None = None) -> Ledger:
    """Run a scheduler with fake tokens (`stepping.run_steps`: the judge calls it step by step and holds every step
    against its own record); requests arrive at given step numbers. Checks the policy after every step (first come,
    first served admission, the newest preempted, no budget left idle, no chunk when chunked prefill is disabled)
    besides what every run checks (budget, max_num_seqs, chunk positions and tokens, slots in blocks of its own,
    finished when done). `pool`: what the check built the scheduler with (`Pool.of` reads a scheduler of the judge's
    own). `on_step(step, view)` sees each step's chunks and preempted ids (`StepView.as_dict`)."""
    def check(view: StepView, run: JudgedRun) -> None:
        _check_policy(view, run)
        if on_step:
            on_step(view.step, view.as_dict())

    return run_steps(scheduler, arrivals, pool or Pool.of(scheduler), check=check, max_steps=max_steps)


def _check_policy(view: StepView, run: JudgedRun) -> None:
    """The policy's invariants of one step, on the judge's ledger after the step's schedule()."""
    cfg, where = run.pool.config, f"step {view.step}"
    _check_order(view, where)
    if not cfg.enable_chunked_prefill:
        for c in view.chunks:
            if c.start + len(c.tokens) != c.seq.num_tokens:
                raise AssertionError(f"{where}: chunked prefill is disabled (enable_chunked_prefill=False), but "
                                     f"{c.seq_id!r} got {len(c.tokens)} of its {c.seq.num_tokens - c.start} remaining "
                                     "tokens: without chunking a prefill runs whole, or waits until the budget left "
                                     "holds it")
    _check_work_conserving(view, run, where)


def _check_work_conserving(view: StepView, run: JudgedRun, where: str) -> None:
    """No budget left idle that the policy would spend: a running sequence goes without a chunk only when the budget
    is used up (a preempted victim's chunk gives its tokens back), and without a preemption the head of the queue
    is admitted when a seat, budget and the blocks of its first chunk are there (the judge's count of free blocks:
    the pool less the blocks of the running sequences)."""
    cfg, led = run.pool.config, run.ledger
    left = cfg.max_num_batched_tokens - view.num_tokens
    scheduled = {c.seq_id for c in view.chunks}
    idle = [sid for sid in led.running if sid not in scheduled]
    if idle and left > 0:
        raise AssertionError(f"{where}: running {idle} got no tokens while {left} of the budget "
                             f"max_num_batched_tokens={cfg.max_num_batched_tokens} were left: every running sequence "
                             "gets a chunk while budget is left (a preempted victim's chunk gives its tokens back "
                             "to the budget)")
    if view.preempted or not led.queue or left <= 0 or len(led.running) >= cfg.max_num_seqs:
        return
    head = led.seqs[led.queue[0]].num_tokens            # a waiting sequence has nothing in the cache
    if head > left and not cfg.enable_chunked_prefill:
        return
    need = blocks_needed(min(head, left), run.pool.block_size)
    if need <= run.num_free:
        raise AssertionError(f"{where}: the head of the queue (its first chunk: {min(head, left)} tokens, {need} "
                             f"blocks) was not admitted although {len(led.running)} of max_num_seqs="
                             f"{cfg.max_num_seqs} run, {left} tokens of budget and {run.num_free} blocks were "
                             "free: admit while a seat, budget and the blocks of the first chunk are there (a chunk "
                             "that fills its blocks exactly fits; a finished or preempted sequence's blocks are "
                             "free again only if the scheduler freed them)")


def _check_order(view: StepView, where: str) -> None:
    """First come, first served: sequences are admitted from the head of the queue (arrival order, the preempted
    back at its front), never skipping it; a preemption takes the newest running sequences (the end of `running`)."""
    preempted, running = view.preempted, view.running_before
    if preempted and set(preempted) != set(running[len(running) - len(preempted):]):
        raise AssertionError(f"{where}: preempted {preempted} while {running} were running (oldest first): "
                             "preempt the NEWEST running sequence (running[-1]); evicting older ones lets a request "
                             "be preempted again and again, and starve")
    fresh = [c.seq_id for c in view.chunks if c.seq_id not in running]
    expected = view.queue_before[:len(fresh)]
    if set(fresh) != set(expected):
        raise AssertionError(f"{where}: first scheduled {fresh}, but the head of the queue is {expected} (requests in "
                             "arrival order, a preempted one back at the front): admit first come, first served, "
                             "never skipping the head of the queue")


def _bound_ok(times: dict, reqs: dict[Hashable, Request], what: str) -> None:
    """Request i finishes within sum over requests that arrived no later (itself included) of prompt + max_new steps."""
    for sid, (arr, fin) in times.items():
        work = sum(len(reqs[o].prompt) + reqs[o].max_new_tokens for o, (a2, _) in times.items() if a2 <= arr)
        if fin - arr > work:
            raise AssertionError(f"{what}: request {sid!r} (arrived at step {arr}) finished at step {fin}, later than "
                                 f"the bound of {work} steps: it was starved. Admit waiting requests first come, first "
                                 "served (never let later ones skip the head of the queue) and preempt the newest.")


def _starvation_case(scheduler_cls: type) -> None:
    """A long prompt waits behind busy decodes while short requests keep arriving."""
    g = torch.Generator().manual_seed(5)
    pool = Pool(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=8), 200, 4)
    sch = scheduler_on(scheduler_cls, pool, 128)
    reqs = {f"short{i}": _request(f"short{i}", 2, 6, g) for i in range(60)}
    reqs["long"] = _request("long", 30, 4, g)
    arrivals = [(i, reqs[f"short{i}"]) for i in range(60)]
    arrivals.insert(3, (3, reqs["long"]))
    times = drive(sch, arrivals, pool).times()
    _bound_ok({"long": times["long"]}, reqs, "long prompt behind a stream of short requests")
    if times["long"][1] > 40:
        raise AssertionError(f"the 30-token prompt arriving at step 3 finished at step {times['long'][1]} while short "
                             "requests kept arriving: it was starved (later requests skipped it).")


def _bad_input(scheduler_cls: type) -> None:
    g = torch.Generator().manual_seed(6)
    pool = Pool(SchedulerConfig(2, 8), 8, 4)
    sch = scheduler_on(scheduler_cls, pool, 40)
    ok = _request("ok", 5, 3, g)
    for what, req in {"longer than the context": _request("ctx", 39, 5, g),
                      "longer than the whole pool": _request("pool", 33, 2, g)}.items():
        try:
            sch.add_request(req)
        except ValueError:
            continue
        except Exception as err:
            raise AssertionError(f"a prompt {what}: expected ValueError, got {type(err).__name__}: {err}") from None
        raise AssertionError(f"a prompt {what} was accepted; reject it at admission with a ValueError")
    try:
        sch.abort("no-such-id")
    except ValueError:
        pass
    except Exception as err:
        raise AssertionError(f"abort of an unknown id: expected ValueError, got {type(err).__name__}") from None
    else:
        raise AssertionError("abort('no-such-id') did not raise; unknown ids need a clear ValueError")
    drive(sch, [(0, ok)], pool)          # the engine still serves a good request


def _random_workload(seed: int) -> tuple[list[tuple[int, Request]], dict, SchedulerConfig, int, int]:
    """One seeded random workload: up to 10 requests (arrival step 0..12, prompt 1..24, 1..12 new tokens) on a pool of
    4..16 blocks of 2 or 4 tokens, 1..4 sequences and a budget of max_num_seqs + 0..12 tokens; one in four with
    chunked prefill disabled (requests whose prefill cannot fit the budget left out)."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))      # noqa: E731
    num_blocks, block_size, max_seqs = draw(4, 16), (2, 4)[draw(0, 1)], draw(1, 4)
    budget = max_seqs + draw(0, 12)
    chunked = seed % 4 != 3
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked)
    capacity = num_blocks * block_size
    reqs, arrivals = {}, []
    for i in range(draw(1, 10)):
        arr, p, n = draw(0, 12), draw(1, 24), draw(1, 12)
        p = max(1, min(p, capacity - n))             # fits the pool on its own
        if p + n - 1 > capacity or (not chunked and p + n - 1 > budget):
            continue
        reqs[i] = _request(i, p, n, g)
        arrivals.append((arr, reqs[i]))
    return arrivals, reqs, cfg, num_blocks, block_size


def _chunking_disabled_case(scheduler_cls: type) -> None:
    """Three requests decode (3 tokens a step of a budget of 8) when a 7-token prompt arrives: without chunked
    prefill it must wait for a step with 7 tokens of budget left, not run in pieces."""
    g = torch.Generator().manual_seed(7)
    pool = Pool(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, enable_chunked_prefill=False), 64, 4)
    sch = scheduler_on(scheduler_cls, pool, 64)
    arrivals = [(0, _request(f"decode{i}", 2, 6, g)) for i in range(3)] + [(2, _request("prompt", 7, 2, g))]
    drive(sch, arrivals, pool)


def check_scheduler(scheduler_cls: type, *, max_examples: int = 60) -> None:
    """The learner's scheduler (its own schedule(), not the reference's, inherited or called) keeps the invariants
    of `scheduler_invariants`."""
    own_scheduler(scheduler_cls)
    with failures_named(SCHEDULER), learner_scheduling():
        scheduler_invariants(scheduler_cls, max_examples=max_examples)


def scheduler_invariants(scheduler_cls: type, *, max_examples: int = 60) -> None:
    """Scheduler invariants (see `drive`) on `max_examples` seeded random workloads (the same in every process), a
    starvation case, a case with chunked prefill disabled, and bad input. No refusal of the reference: the package's
    tests run it on the reference."""
    seen = {"preempted": 0, "chunked": 0}

    def count(step: int, view: dict[str, Any]) -> None:
        seen["preempted"] += len(view["preempted"])
        seen["chunked"] += any(c["start"] > 0 and len(c["tokens"]) > 1 for c in view["chunks"])

    with quiet():
        _bad_input(scheduler_cls)
        for example in range(max_examples):
            arrivals, reqs, cfg, num_blocks, block_size = _random_workload(example)
            if not arrivals:
                continue
            pool = Pool(cfg, num_blocks, block_size)
            sch = scheduler_on(scheduler_cls, pool, 64)
            what = (f"workload {[(a, len(r.prompt), r.max_new_tokens) for a, r in arrivals]} (arrival step, prompt, "
                    f"new tokens), {num_blocks} blocks of {block_size}, max_num_seqs={cfg.max_num_seqs}, budget="
                    f"{cfg.max_num_batched_tokens}, chunked prefill {'on' if cfg.enable_chunked_prefill else 'off'}")
            try:
                times = drive(sch, arrivals, pool, on_step=count).times()
                _bound_ok(times, reqs, "random workload")
            except AssertionError as err:
                raise AssertionError(f"{what}: {err}") from None
        _starvation_case(scheduler_cls)
        _chunking_disabled_case(scheduler_cls)
    if not seen["preempted"]:
        raise AssertionError("no workload triggered a preemption, although small pools ran out of blocks: when a "
                             "running sequence needs a block and none is free, preempt the newest running sequence")
    if not seen["chunked"]:
        raise AssertionError("no prompt was ever split into chunks: with chunked prefill a prompt longer than the "
                             "budget left must run over several steps")


def refuse_thin_wrapper(scheduler_cls: type) -> None:
    """A cheap probe before a costly run (a model, a long workload): three requests driven with fake tokens while
    entering the reference's scheduling code fails, so a schedule() that only calls super().schedule() is refused
    without profiling the whole run."""
    own_scheduler(scheduler_cls)
    g = torch.Generator().manual_seed(9)
    pool = Pool(SchedulerConfig(2, 6), 16, 4)
    sch = scheduler_on(scheduler_cls, pool, 64)
    with failures_named(f"{SCHEDULER}, three requests with fake tokens"), quiet(), learner_scheduling():
        drive(sch, [(0, _request("a", 9, 3, g)), (0, _request("b", 3, 4, g)), (1, _request("c", 2, 2, g))], pool)
