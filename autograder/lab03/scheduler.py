"""Exercise 2: the scheduler's invariants, driven with fake tokens (no model) on seeded workloads."""

from __future__ import annotations

from typing import Any, Callable, Hashable

import torch

from autograder.harness import call_learner, quiet
from autograder.lab03.common import _fake_token, _request, construct, learner_scheduling, own_scheduler
from minigpt.cache.block_manager import BlockManager
from minigpt.engine.request import Request, SequenceStatus
from minigpt.engine.scheduler import SchedulerConfig


def drive(scheduler: Any, arrivals: list[tuple[int, Request]], *, max_steps: int = 5000,
          on_step: Callable[[int, Any, Any], None] | None = None) -> dict[Hashable, Any]:
    """Run a scheduler with fake tokens (token i of a request is a fixed function of (id, i)); requests arrive at
    given step numbers. Checks the scheduler invariants after every step (budget, max_num_seqs, blocks, chunk
    positions, no chunk when chunked prefill is disabled, first-come-first-served admission, the newest preempted);
    returns {id: (arrival step, finish step)}."""
    sch = scheduler
    m, cfg = sch.manager, sch.config
    pending = sorted(arrivals, key=lambda x: x[0])
    queue_order: list[Hashable] = []          # request ids in the order they were added
    admitted: list[Hashable] = []             # request ids in the order of their first scheduled chunk
    arrived: dict[Hashable, int] = {}
    finished_at: dict[Hashable, int] = {}
    saved_outputs: dict[Hashable, list[int]] = {}
    seqs: dict[Hashable, Any] = {}
    step = 0
    while pending or sch.has_unfinished():
        if step > max_steps:
            raise AssertionError(f"not finished after {max_steps} steps: {len(sch.waiting)} waiting, "
                                 f"{len(sch.running)} running; does the scheduler make progress every step?")
        while pending and pending[0][0] <= step:
            _, req = pending.pop(0)
            seqs[req.request_id] = call_learner(f"add_request({req.request_id!r})", sch.add_request, req)
            arrived[req.request_id] = step
            queue_order.append(req.request_id)
        if not sch.has_unfinished():
            step += 1
            continue
        before = {sid: (s.num_computed, list(s.output_tokens)) for sid, s in seqs.items()}
        running_before = [s.seq_id for s in sch.running]
        out = call_learner(f"schedule() at step {step}", sch.schedule)
        where = f"step {step}"
        _check_order(out, running_before, queue_order, admitted, where)
        n_tok = sum(len(c.tokens) for c in out.chunks)
        if n_tok > cfg.max_num_batched_tokens:
            raise AssertionError(f"{where}: {n_tok} tokens scheduled, over the budget max_num_batched_tokens="
                                 f"{cfg.max_num_batched_tokens}. Cap each prefill chunk at the budget left.")
        if len(sch.running) > cfg.max_num_seqs or len(out.chunks) > cfg.max_num_seqs:
            raise AssertionError(f"{where}: {len(sch.running)} sequences running, over max_num_seqs={cfg.max_num_seqs}")
        if not out.chunks:
            raise AssertionError(f"{where}: nothing scheduled with {len(sch.waiting)} waiting and {len(sch.running)} "
                                 "running: the scheduler must make progress every step")
        ids = [c.seq_id for c in out.chunks]
        if len(set(ids)) != len(ids):
            raise AssertionError(f"{where}: a sequence appears twice in one step: {ids}")
        for seq in getattr(out, "preempted", []):
            saved_outputs[seq.seq_id] = before[seq.seq_id][1]
            if seq.seq_id in m.tables:
                raise AssertionError(f"{where}: preempted {seq.seq_id!r} still holds blocks")
        for c in out.chunks:
            seq = c.seq
            computed, output = before[c.seq_id]
            if seq.seq_id in saved_outputs and c.start == 0:
                if list(seq.output_tokens) != saved_outputs.pop(seq.seq_id):
                    raise AssertionError(f"{where}: preempted request {c.seq_id!r} resumed without the tokens it had "
                                         "generated: preemption must keep the output (prompt + output is recomputed)")
            if seq.status is not SequenceStatus.RUNNING:
                raise AssertionError(f"{where}: scheduled {c.seq_id!r} has status {seq.status}, expected running")
            expected_start = 0 if seq.num_preemptions and c.start == 0 else computed
            if c.start != expected_start:
                raise AssertionError(f"{where}: the chunk of {c.seq_id!r} starts at position {c.start}, but "
                                     f"{computed} of its tokens are already in the cache: chunks must continue where "
                                     "the previous one ended")
            if list(c.tokens) != seq.tokens[c.start:c.start + len(c.tokens)] or not c.tokens:
                raise AssertionError(f"{where}: the chunk of {c.seq_id!r} does not hold its tokens "
                                     f"{c.start}..{c.start + len(c.tokens) - 1}")
            if not cfg.enable_chunked_prefill and c.start + len(c.tokens) != seq.num_tokens:
                raise AssertionError(f"{where}: chunked prefill is disabled (enable_chunked_prefill=False), but "
                                     f"{c.seq_id!r} got {len(c.tokens)} of its {seq.num_tokens - c.start} remaining "
                                     "tokens: without chunking a prefill runs whole, or waits until the budget left "
                                     "holds it")
        _check_blocks(sch, where + " after schedule()")
        sampled = {c.seq_id: _fake_token(c.seq_id, len(c.seq.output_tokens)) for c in out.chunks
                   if c.start + len(c.tokens) == c.seq.num_tokens}
        for s in call_learner(f"update() at step {step}", sch.update, out, sampled, float(step)):
            finished_at[s.seq_id] = step
        _check_blocks(sch, where + " after update()")
        if on_step:
            on_step(step, sch, out)
        step += 1
    for sid, seq in seqs.items():
        want = [_fake_token(sid, i) for i in range(seq.request.max_new_tokens)]
        if list(seq.output_tokens) != want:
            raise AssertionError(f"request {sid!r}: output {list(seq.output_tokens)} should be {want}: tokens were lost "
                                 "or repeated (after a preemption?)")
        if sid not in finished_at:
            raise AssertionError(f"request {sid!r} never reported as finished by update()")
    return {sid: (arrived[sid], finished_at[sid]) for sid in seqs}


def _check_order(out: Any, running_before: list[Hashable], queue_order: list[Hashable], admitted: list[Hashable],
                 where: str) -> None:
    """First come, first served: requests are first scheduled in the order they were added (never skipping the
    head of the queue); a preemption takes the newest running sequences (the end of `running`)."""
    preempted = [s.seq_id for s in getattr(out, "preempted", [])]
    if preempted and set(preempted) != set(running_before[len(running_before) - len(preempted):]):
        raise AssertionError(f"{where}: preempted {preempted} while {running_before} were running (oldest first): "
                             "preempt the NEWEST running sequence (running[-1]); evicting older ones lets a request "
                             "be preempted again and again, and starve")
    fresh = [c.seq_id for c in out.chunks if c.seq_id not in admitted]
    expected = queue_order[len(admitted):len(admitted) + len(fresh)]
    if set(fresh) != set(expected):
        raise AssertionError(f"{where}: first scheduled {fresh}, but the head of the queue is {expected} (requests in "
                             "arrival order): admit first come, first served, never skipping the head of the queue")
    admitted.extend(expected)


def _check_blocks(sch: Any, where: str) -> None:
    m = sch.manager
    running = {s.seq_id for s in sch.running}
    if set(m.tables) != running:
        extra = set(m.tables) - running
        raise AssertionError(f"{where}: sequences holding blocks {sorted(map(str, m.tables))} != running "
                             f"{sorted(map(str, running))}" + (f"; {sorted(map(str, extra))} finished or preempted "
                             "without freeing their blocks" if extra else ""))
    held = sum(len(m.table(s).blocks) for s in running)
    if m.pool.num_used != held:
        raise AssertionError(f"{where}: {m.pool.num_used} blocks in use but running sequences hold {held}")


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
    cfg = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=8)
    sch = construct(scheduler_cls, BlockManager(200, 4), cfg, 128, guard=False)
    reqs = {f"short{i}": _request(f"short{i}", 2, 6, g) for i in range(60)}
    reqs["long"] = _request("long", 30, 4, g)
    arrivals = [(i, reqs[f"short{i}"]) for i in range(60)]
    arrivals.insert(3, (3, reqs["long"]))
    times = drive(sch, arrivals)
    _bound_ok({"long": times["long"]}, reqs, "long prompt behind a stream of short requests")
    if times["long"][1] > 40:
        raise AssertionError(f"the 30-token prompt arriving at step 3 finished at step {times['long'][1]} while short "
                             "requests kept arriving: it was starved (later requests skipped it).")


def _bad_input(scheduler_cls: type) -> None:
    g = torch.Generator().manual_seed(6)
    sch = construct(scheduler_cls, BlockManager(8, 4), SchedulerConfig(2, 8), 40, guard=False)
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
    drive(sch, [(0, ok)])          # the engine still serves a good request


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
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, enable_chunked_prefill=False)
    sch = construct(scheduler_cls, BlockManager(64, 4), cfg, 64, guard=False)
    arrivals = [(0, _request(f"decode{i}", 2, 6, g)) for i in range(3)] + [(2, _request("prompt", 7, 2, g))]
    drive(sch, arrivals)


def check_scheduler(scheduler_cls: type, *, max_examples: int = 60) -> None:
    """The learner's scheduler (its own schedule(), not the reference's, inherited or called) keeps the invariants
    of `scheduler_invariants`."""
    own_scheduler(scheduler_cls)
    with learner_scheduling():
        scheduler_invariants(scheduler_cls, max_examples=max_examples)


def scheduler_invariants(scheduler_cls: type, *, max_examples: int = 60) -> None:
    """Scheduler invariants (see `drive`) on `max_examples` seeded random workloads (the same in every process), a
    starvation case, a case with chunked prefill disabled, and bad input. No refusal of the reference: the package's
    tests run it on the reference."""
    seen = {"preempted": 0, "chunked": 0}

    def count(step: int, s: Any, out: Any) -> None:
        seen["preempted"] += len(getattr(out, "preempted", []))
        seen["chunked"] += any(c.start > 0 and len(c.tokens) > 1 for c in out.chunks)

    with quiet():
        _bad_input(scheduler_cls)
        for example in range(max_examples):
            arrivals, reqs, cfg, num_blocks, block_size = _random_workload(example)
            if not arrivals:
                continue
            sch = construct(scheduler_cls, BlockManager(num_blocks, block_size), cfg, 64, guard=False)
            what = (f"workload {[(a, len(r.prompt), r.max_new_tokens) for a, r in arrivals]} (arrival step, prompt, "
                    f"new tokens), {num_blocks} blocks of {block_size}, max_num_seqs={cfg.max_num_seqs}, budget="
                    f"{cfg.max_num_batched_tokens}, chunked prefill {'on' if cfg.enable_chunked_prefill else 'off'}")
            try:
                times = drive(sch, arrivals, on_step=count)
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
    sch = construct(scheduler_cls, BlockManager(16, 4), SchedulerConfig(2, 6), 64, guard=False)
    with quiet(), learner_scheduling():
        drive(sch, [(0, _request("a", 9, 3, g)), (0, _request("b", 3, 4, g)), (1, _request("c", 2, 2, g))])
