"""Exercise 2: the scheduler's invariants, driven with fake tokens (no model) on seeded workloads."""

from __future__ import annotations

from typing import Any, Callable, Hashable

import torch

from autograder.harness import call_learner, quiet, within
from autograder.lab03.common import (_fake_token, _request, construct, learner_scheduling, manager_beside,
                                     own_scheduler)
from autograder.checking.wire import run_where
from minigpt.engine.request import Request, SequenceStatus
from minigpt.cache.block_table import blocks_needed
from minigpt.engine.scheduler import SchedulerConfig


def scheduler_view(sch: Any, seqs: list[Any] | None = None, out: Any = None, finished: Any = None, *,
                   all_outputs: bool = False) -> dict[str, Any]:
    """What the driver checks, read where the scheduler lives, as plain data (one request per look when the check
    runs in the judge and the scheduler in the learner's kernel; attribute by attribute it took ~100 per step).
    Always: has_unfinished(), the number waiting, the running ids, the ids holding blocks and the blocks they hold.
    `seqs`: sequences whose progress to report, in order: "computed" (num_computed of each) and "outputs" (the
    output tokens of the running ones, None for the others; of all with all_outputs); `out`: a SchedulerOutput whose
    chunks to describe ("status" is None when RUNNING; "output" only for a chunk starting at 0, maybe a resumed
    sequence's); `finished`: what update() returned, as ids."""
    m = sch.manager
    running = list(sch.running)
    view: dict[str, Any] = {
        "unfinished": bool(sch.has_unfinished()), "num_waiting": len(sch.waiting),
        "running": [s.seq_id for s in running], "holding": list(m.tables),
        "blocks_held": sum(len(m.table(sid).blocks) for sid in list(m.tables)), "num_used": m.pool.num_used}
    if seqs is not None:
        view["computed"] = [s.num_computed for s in seqs]
        view["outputs"] = [list(s.output_tokens) if all_outputs or s in running else None for s in seqs]
    if finished is not None:
        view["finished"] = [s.seq_id for s in finished]
    if out is not None:
        view["chunks"] = [{"seq_id": c.seq_id, "start": c.start, "tokens": list(c.tokens),
                           "status": None if c.seq.status is SequenceStatus.RUNNING else str(c.seq.status),
                           "held": list(c.seq.tokens[c.start:c.start + len(c.tokens)]), "num_tokens": c.seq.num_tokens,
                           "num_preemptions": c.seq.num_preemptions, "num_output": len(c.seq.output_tokens),
                           "output": list(c.seq.output_tokens) if c.start == 0 else None} for c in out.chunks]
        view["preempted"] = [s.seq_id for s in getattr(out, "preempted", [])]
        view["num_free"], view["block_size"] = m.pool.num_free, m.block_size
        view["head_remaining"] = sch.waiting[0].num_remaining if sch.waiting else None
    return view


class FakeTokenRun:
    """A scheduler driven with fake tokens (token i of a request is a fixed function of (id, i)) where it lives: in the
    learner's kernel when the check runs in the judge, a stretch of steps per request (`advance`). Each step comes back
    as plain data (`scheduler_view` before, after schedule() and after update()); `drive` checks it in the judge.
    What the learner's code raises stops the run; `raise_error` raises it again for the judge."""

    def __init__(self, scheduler: Any, arrivals: list[tuple[int, Request]], max_steps: int) -> None:
        self.sch, self.max_steps = scheduler, max_steps
        self.pending = sorted(arrivals, key=lambda x: x[0])
        self.seqs: dict[Hashable, Any] = {}
        self.step = 0
        self.view = scheduler_view(scheduler)
        self.error: BaseException | None = None

    def advance(self, num_steps: int) -> dict[str, Any]:
        """Up to num_steps steps: {"records": one dict per step ("before", when requests were added in it; else the
        last step's "updated" is the view before it), "done": all finished, "error": the learner's code raised (in the
        last record's step), "view": the view after the last step (with every output once done)}."""
        records: list[dict[str, Any]] = []
        sch = self.sch
        try:
            while len(records) < num_steps and (self.pending or self.view["unfinished"]):
                rec: dict[str, Any] = {"step": self.step, "added": []}
                records.append(rec)
                if self.step > self.max_steps:
                    rec["stuck"] = True
                    break
                while self.pending and self.pending[0][0] <= self.step:
                    req = self.pending.pop(0)[1]
                    rec["added"].append(req.request_id)
                    self.seqs[req.request_id] = call_learner(f"add_request({req.request_id!r})", sch.add_request, req)
                if rec["added"]:          # else the view before this step is the last step's "updated"
                    rec["before"] = self.view = scheduler_view(sch, list(self.seqs.values()))
                self.step += 1
                if not self.view["unfinished"]:
                    continue
                out = call_learner(f"schedule() at step {rec['step']}", sch.schedule)
                rec["scheduled"] = scheduled = scheduler_view(sch, out=out)
                sampled = {c["seq_id"]: _fake_token(c["seq_id"], c["num_output"]) for c in scheduled["chunks"]
                           if c["start"] + len(c["tokens"]) == c["num_tokens"]}
                done = call_learner(f"update() at step {rec['step']}", sch.update, out, sampled, float(rec["step"]))
                rec["updated"] = self.view = scheduler_view(sch, list(self.seqs.values()), None, done)
        except Exception as err:       # noqa: BLE001  (the judge reports it after checking the steps before it)
            self.error = err
        done = self.error is None and not (self.pending or self.view["unfinished"])
        return {"records": records, "done": done, "error": self.error is not None,
                "view": scheduler_view(sch, list(self.seqs.values()), all_outputs=True) if done else self.view}

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error


STEPS_PER_ADVANCE = 64      # steps the kernel runs per advance(): a broken run wastes at most this many


def drive(scheduler: Any, arrivals: list[tuple[int, Request]], *, max_steps: int = 5000,
          on_step: Callable[[int, dict[str, Any]], None] | None = None) -> dict[Hashable, Any]:
    """Run a scheduler with fake tokens (`FakeTokenRun`); requests arrive at given step numbers. Checks the scheduler
    invariants after every step (budget, max_num_seqs, blocks, chunk positions, no chunk when chunked prefill is
    disabled, first-come-first-served admission, the newest preempted); returns {id: (arrival step, finish step)}.
    `on_step(step, view)` sees each step's view after schedule() (`scheduler_view`)."""
    cfg = scheduler.config
    run = run_where(scheduler, FakeTokenRun, scheduler, arrivals, max_steps)
    queue_order: list[Hashable] = []          # request ids in the order they were added
    admitted: list[Hashable] = []             # request ids in the order of their first scheduled chunk
    arrived: dict[Hashable, int] = {}
    finished_at: dict[Hashable, int] = {}
    saved_outputs: dict[Hashable, list[int]] = {}
    max_new: dict[Hashable, int] = {req.request_id: req.max_new_tokens for _, req in arrivals}
    view: dict[str, Any] = {"running": [], "computed": [], "outputs": []}       # before any request arrived
    while True:
        stretch = run.advance(STEPS_PER_ADVANCE)
        for rec in stretch["records"]:
            step, view = rec["step"], rec.get("before", view)
            if rec.get("stuck"):
                last = stretch["view"]
                raise AssertionError(f"not finished after {max_steps} steps: {last['num_waiting']} waiting, "
                                     f"{len(last['running'])} running; does the scheduler make progress every step?")
            for rid in rec["added"]:
                arrived[rid] = step
                queue_order.append(rid)
            if "scheduled" in rec:
                _check_step(rec["scheduled"], view, cfg, queue_order, admitted, saved_outputs, f"step {step}")
                if on_step:
                    on_step(step, rec["scheduled"])
            if "updated" in rec:
                view = rec["updated"]
                for sid in view["finished"]:
                    finished_at[sid] = step
                _check_blocks(view, f"step {step} after update()")
        if stretch["error"]:
            run.raise_error()
        if stretch["done"]:
            break
    for sid, output in zip(queue_order, stretch["view"]["outputs"]):
        want = [_fake_token(sid, i) for i in range(max_new[sid])]
        if output != want:
            raise AssertionError(f"request {sid!r}: output {output} should be {want}: tokens were lost "
                                 "or repeated (after a preemption?)")
        if sid not in finished_at:
            raise AssertionError(f"request {sid!r} never reported as finished by update()")
    return {sid: (arrived[sid], finished_at[sid]) for sid in queue_order}


def _check_step(view: dict[str, Any], before_view: dict[str, Any], cfg: SchedulerConfig, queue_order: list[Hashable],
                admitted: list[Hashable], saved_outputs: dict[Hashable, list[int]], where: str) -> None:
    """The invariants of one step, from the views before it and after its schedule()."""
    chunks = view["chunks"]
    before = dict(zip(queue_order, zip(before_view["computed"], before_view["outputs"])))
    _check_order(view, before_view["running"], queue_order, admitted, where)
    n_tok = sum(len(c["tokens"]) for c in chunks)
    if n_tok > cfg.max_num_batched_tokens:
        raise AssertionError(f"{where}: {n_tok} tokens scheduled, over the budget max_num_batched_tokens="
                             f"{cfg.max_num_batched_tokens}. Cap each prefill chunk at the budget left.")
    if len(view["running"]) > cfg.max_num_seqs or len(chunks) > cfg.max_num_seqs:
        raise AssertionError(f"{where}: {len(view['running'])} sequences running, over max_num_seqs={cfg.max_num_seqs}")
    if not chunks:
        raise AssertionError(f"{where}: nothing scheduled with {view['num_waiting']} waiting and "
                             f"{len(view['running'])} running: the scheduler must make progress every step")
    ids = [c["seq_id"] for c in chunks]
    if len(set(ids)) != len(ids):
        raise AssertionError(f"{where}: a sequence appears twice in one step: {ids}")
    for sid in view["preempted"]:
        saved_outputs[sid] = before[sid][1]
        if sid in view["holding"]:
            raise AssertionError(f"{where}: preempted {sid!r} still holds blocks")
    for c in chunks:
        sid, start, tokens = c["seq_id"], c["start"], c["tokens"]
        computed, _ = before[sid]
        if sid in saved_outputs and start == 0:
            if c["output"] != saved_outputs.pop(sid):
                raise AssertionError(f"{where}: preempted request {sid!r} resumed without the tokens it had "
                                     "generated: preemption must keep the output (prompt + output is recomputed)")
        if c["status"] is not None:
            raise AssertionError(f"{where}: scheduled {sid!r} has status {c['status']}, expected running")
        expected_start = 0 if c["num_preemptions"] and start == 0 else computed
        if start != expected_start:
            raise AssertionError(f"{where}: the chunk of {sid!r} starts at position {start}, but "
                                 f"{computed} of its tokens are already in the cache: chunks must continue where "
                                 "the previous one ended")
        if tokens != c["held"] or not tokens:
            raise AssertionError(f"{where}: the chunk of {sid!r} does not hold its tokens "
                                 f"{start}..{start + len(tokens) - 1}")
        if not cfg.enable_chunked_prefill and start + len(tokens) != c["num_tokens"]:
            raise AssertionError(f"{where}: chunked prefill is disabled (enable_chunked_prefill=False), but "
                                 f"{sid!r} got {len(tokens)} of its {c['num_tokens'] - start} remaining "
                                 "tokens: without chunking a prefill runs whole, or waits until the budget left "
                                 "holds it")
    _check_blocks(view, where + " after schedule()")
    _check_work_conserving(view, cfg, n_tok, where)


def _check_work_conserving(view: dict[str, Any], cfg: SchedulerConfig, n_tok: int, where: str) -> None:
    """No budget left idle that the policy would spend: a running sequence goes without a chunk only when the budget
    is used up (a preempted victim's chunk gives its tokens back), and without a preemption the head of the queue
    is admitted when a seat, budget and the blocks of its first chunk are there."""
    left = cfg.max_num_batched_tokens - n_tok
    idle = [sid for sid in view["running"] if sid not in {c["seq_id"] for c in view["chunks"]}]
    if idle and left > 0:
        raise AssertionError(f"{where}: running {idle} got no tokens while {left} of the budget "
                             f"max_num_batched_tokens={cfg.max_num_batched_tokens} were left: every running sequence "
                             "gets a chunk while budget is left (a preempted victim's chunk gives its tokens back "
                             "to the budget)")
    head = view["head_remaining"]
    if view["preempted"] or head is None or left <= 0 or len(view["running"]) >= cfg.max_num_seqs:
        return
    if head > left and not cfg.enable_chunked_prefill:
        return
    need = blocks_needed(min(head, left), view["block_size"])
    if within(need, view["num_free"]):
        raise AssertionError(f"{where}: the head of the queue (its first chunk: {min(head, left)} tokens, {need} "
                             f"blocks) was not admitted although {len(view['running'])} of max_num_seqs="
                             f"{cfg.max_num_seqs} run, {left} tokens of budget and {view['num_free']} blocks were "
                             "free: admit while a seat, budget and the blocks of the first chunk are there (a chunk "
                             "that fills its blocks exactly fits)")


def _check_order(view: dict[str, Any], running_before: list[Hashable], queue_order: list[Hashable],
                 admitted: list[Hashable], where: str) -> None:
    """First come, first served: requests are first scheduled in the order they were added (never skipping the
    head of the queue); a preemption takes the newest running sequences (the end of `running`)."""
    preempted = view["preempted"]
    if preempted and set(preempted) != set(running_before[len(running_before) - len(preempted):]):
        raise AssertionError(f"{where}: preempted {preempted} while {running_before} were running (oldest first): "
                             "preempt the NEWEST running sequence (running[-1]); evicting older ones lets a request "
                             "be preempted again and again, and starve")
    fresh = [c["seq_id"] for c in view["chunks"] if c["seq_id"] not in admitted]
    expected = queue_order[len(admitted):len(admitted) + len(fresh)]
    if set(fresh) != set(expected):
        raise AssertionError(f"{where}: first scheduled {fresh}, but the head of the queue is {expected} (requests in "
                             "arrival order): admit first come, first served, never skipping the head of the queue")
    admitted.extend(expected)


def _check_blocks(view: dict[str, Any], where: str) -> None:
    holding, running = set(view["holding"]), set(view["running"])
    if holding != running:
        extra = holding - running
        raise AssertionError(f"{where}: sequences holding blocks {sorted(map(str, holding))} != running "
                             f"{sorted(map(str, running))}" + (f"; {sorted(map(str, extra))} finished or preempted "
                             "without freeing their blocks" if extra else ""))
    held = view["blocks_held"]          # the running sequences' blocks (they are the ones holding blocks)
    if view["num_used"] != held:
        raise AssertionError(f"{where}: {view['num_used']} blocks in use but running sequences hold {held}")


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
    sch = construct(scheduler_cls, manager_beside(scheduler_cls, 200, 4), cfg, 128, guard=False)
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
    sch = construct(scheduler_cls, manager_beside(scheduler_cls, 8, 4), SchedulerConfig(2, 8), 40, guard=False)
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
    sch = construct(scheduler_cls, manager_beside(scheduler_cls, 64, 4), cfg, 64, guard=False)
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

    def count(step: int, view: dict[str, Any]) -> None:
        seen["preempted"] += len(view["preempted"])
        seen["chunked"] += any(c["start"] > 0 and len(c["tokens"]) > 1 for c in view["chunks"])

    with quiet():
        _bad_input(scheduler_cls)
        for example in range(max_examples):
            arrivals, reqs, cfg, num_blocks, block_size = _random_workload(example)
            if not arrivals:
                continue
            sch = construct(scheduler_cls, manager_beside(scheduler_cls, num_blocks, block_size), cfg, 64, guard=False)
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
    sch = construct(scheduler_cls, manager_beside(scheduler_cls, 16, 4), SchedulerConfig(2, 6), 64, guard=False)
    with quiet(), learner_scheduling():
        drive(sch, [(0, _request("a", 9, 3, g)), (0, _request("b", 3, 4, g)), (1, _request("c", 2, 2, g))])
