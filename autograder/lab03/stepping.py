"""The learner's scheduler driven by the judge one call at a time, and the judge's own record of what it did.

    run = JudgedRun(scheduler, Pool(config, num_blocks, block_size))
    run.add(request, step)                  # scheduler.add_request(request)
    view = run.schedule(step)               # scheduler.schedule(): its chunks checked against the record
    run.update(view, sampled, now)          # scheduler.update(...): the finished ones checked against the record
    ledger = run_steps(scheduler, arrivals, pool)      # the whole loop, fake tokens sampled (or `sample`)

Nothing the learner's process reports about itself decides a verdict: each step's batch is read from what the
schedule() call the judge made returned (chunks: start, tokens, slots; the preempted), and held against the judge's
own record (`Ledger`): each request's tokens (its prompt and the tokens the judge sampled for it), how many of them
the scheduler has put in the cache, the queue, the running batch, and the pool's blocks, which the judge assigns from
the slots it was given (a block belongs to one live sequence; a finished or preempted sequence's blocks are free
again). The scheduler's own BlockManager, sequences and counters are never read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from autograder.checking.wire import is_remote
from autograder.harness import call_learner
from autograder.lab03.common import Pool, _fake_token
from minigpt.cache.block_table import blocks_needed
from minigpt.engine.request import Request, Sequence, SequenceStatus
from minigpt.engine.scheduler import ScheduledChunk, SchedulerOutput

__all__ = ["Ledger", "StepView", "JudgedRun", "run_steps", "fake_tokens"]


@dataclass
class Ledger:
    """The judge's record of a run: its own Sequence per request (tokens, num_computed, num_preemptions), the queue
    (waiting ids, the front first), the running ids (oldest admitted first), each live sequence's blocks and the
    owner of each block in use."""

    seqs: dict[Hashable, Sequence] = field(default_factory=dict)
    queue: deque = field(default_factory=deque)
    running: list[Hashable] = field(default_factory=list)
    blocks: dict[Hashable, list[int]] = field(default_factory=dict)
    owner: dict[int, Hashable] = field(default_factory=dict)
    arrived: dict[Hashable, int] = field(default_factory=dict)
    finished_at: dict[Hashable, int] = field(default_factory=dict)
    steps: int = 0                      # schedule() calls made

    @property
    def unfinished(self) -> bool:
        return len(self.finished_at) < len(self.seqs)

    def times(self) -> dict[Hashable, tuple[int, int]]:
        """{id: (arrival step, finish step)} in arrival order."""
        return {sid: (self.arrived[sid], self.finished_at[sid]) for sid in self.seqs}


@dataclass
class StepView:
    """One step as the judge read it: `out` (what schedule() returned, handed back to update()), its chunks rebuilt
    on the judge's own sequences, the ids preempted, and the running ids and queue before the step (the queue after
    this step's preemptions, which its admissions draw from)."""

    step: int
    out: Any
    chunks: list[ScheduledChunk]
    preempted: list[Hashable]
    running_before: list[Hashable]
    queue_before: list[Hashable]

    @property
    def num_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)

    def as_dict(self) -> dict[str, Any]:
        """Plain data: {"chunks": [{"seq_id", "start", "tokens"}], "preempted": [ids]}."""
        return {"chunks": [{"seq_id": c.seq_id, "start": c.start, "tokens": list(c.tokens)} for c in self.chunks],
                "preempted": list(self.preempted)}


def _raise(err: BaseException) -> None:
    raise err


def _learner_call(what: str, fn: Callable[..., Any], *args: Any, context: Callable[[], str] | None = None) -> Any:
    """fn(*args), a failure reported as harness.call_learner reports it (`context()` added to its message). The runs
    are inside one quiet() already: call_learner's own quiet() around each of a run's thousands of calls would cost
    more than the step itself."""
    try:
        return fn(*args)
    except AssertionError:
        raise
    except Exception as err:        # noqa: BLE001  (call_learner names it)
        return call_learner(what, _raise, err, context=context() if context else "")


def _ints(x: Any) -> list[int] | None:
    """x as a list of ints if it is a list or tuple of ints (not bools), else None."""
    if not isinstance(x, (list, tuple)) or any(type(v) is not int for v in x):
        return None
    return list(x)


class JudgedRun:
    """Calls into the learner's scheduler (a wire.Remote when judged: each call one request) and keeps the Ledger."""

    def __init__(self, scheduler: Any, pool: Pool) -> None:
        self.pool = pool
        self.ledger = Ledger()
        self._add = self._method(scheduler, "add_request")
        self._schedule = self._method(scheduler, "schedule")
        self._update = self._method(scheduler, "update")
        self._known: dict[int, tuple[Any, Hashable]] = {}     # id(a sequence object of the scheduler's) -> (it, id)

    @staticmethod
    def _method(scheduler: Any, name: str) -> Any:
        try:
            return getattr(scheduler, name)
        except AttributeError:
            raise AssertionError(f"the scheduler has no {name}() method") from None

    @property
    def num_free(self) -> int:
        return self.pool.num_blocks - len(self.ledger.owner)

    # --- the three calls ----------------------------------------------------------------------------

    def add(self, request: Request, step: int) -> None:
        """add_request(request); the Sequence it returns (the package's API) stands for the request from now on."""
        seq = _learner_call(f"add_request({request.request_id!r})", self._add, request)
        if (is_remote(seq) or isinstance(seq, Sequence)) and id(seq) not in self._known:
            self._known[id(seq)] = (seq, request.request_id)
        led = self.ledger
        led.seqs[request.request_id] = Sequence(request)
        led.queue.append(request.request_id)
        led.arrived[request.request_id] = step

    def schedule(self, step: int) -> StepView:
        """schedule(), its preemptions and chunks applied to the ledger after checking that each is possible."""
        where, led, cfg = f"step {step}", self.ledger, self.pool.config
        out = _learner_call(f"schedule() at step {step}", self._schedule)
        led.steps += 1
        if not isinstance(out, SchedulerOutput) or not isinstance(out.chunks, (list, tuple)) or \
                not isinstance(out.preempted, (list, tuple)):
            raise AssertionError(f"{where}: schedule() returned {type(out).__name__}, expected a SchedulerOutput "
                                 "(a list of ScheduledChunk and a list of the preempted sequences)")
        running_before = list(led.running)
        preempted = [self._id_of(seq, where) for seq in out.preempted]
        for sid in preempted:
            self._preempt(sid, where)
        queue_before = list(led.queue)
        chunks: list[ScheduledChunk] = []
        for raw in out.chunks:
            chunks.append(self._chunk(raw, preempted, {c.seq_id for c in chunks}, where))
        n_tok = sum(len(c.tokens) for c in chunks)
        if n_tok > cfg.max_num_batched_tokens:
            raise AssertionError(f"{where}: {n_tok} tokens scheduled, over the budget max_num_batched_tokens="
                                 f"{cfg.max_num_batched_tokens}. Cap each prefill chunk at the budget left.")
        if len(led.running) > cfg.max_num_seqs:
            raise AssertionError(f"{where}: {len(led.running)} sequences running, over max_num_seqs={cfg.max_num_seqs}")
        if not chunks:
            raise AssertionError(f"{where}: nothing scheduled with {len(led.queue)} waiting and {len(led.running)} "
                                 f"running: the scheduler must make progress every step{self._leak_hint()}")
        return StepView(step, out, chunks, preempted, running_before, queue_before)

    def update(self, view: StepView, sampled: dict[Hashable, int], now: float) -> None:
        """update(out, sampled, now): the sequences it returns must be exactly those that reached max_new_tokens."""
        where, led = f"step {view.step}", self.ledger
        finished = _learner_call(f"update() at step {view.step}", self._update, view.out, sampled, now,
                                 context=lambda: self._resumed_short(view))
        if not isinstance(finished, (list, tuple)):
            raise AssertionError(f"{where}: update() returned {type(finished).__name__}, expected the list of the "
                                 "sequences finished in this step")
        reported = {self._id_of(seq, where) for seq in finished}
        done = set()
        for c in view.chunks:
            seq = c.seq
            seq.num_computed = c.start + len(c.tokens)
            if c.seq_id in sampled and seq.append_token(sampled[c.seq_id], now) is not None:
                done.add(c.seq_id)
        missing, early = sorted(done - reported, key=str), sorted(reported - done, key=str)
        if missing:
            sid = missing[0]
            raise AssertionError(f"{where}: request {sid!r} has all its {led.seqs[sid].request.max_new_tokens} tokens, "
                                 "but update() did not return it as finished (finish it and free its blocks)")
        if early:
            sid = early[0]
            raise AssertionError(f"{where}: update() returned {sid!r} as finished with "
                                 f"{len(led.seqs[sid].output_tokens)} of its {led.seqs[sid].request.max_new_tokens} "
                                 "tokens")
        for sid in done:
            led.running.remove(sid)
            self._free(sid)
            led.seqs[sid].status = SequenceStatus.FINISHED
            led.finished_at[sid] = view.step

    def _leak_hint(self) -> str:
        """Why a scheduler may find no block for the head of the queue where the judge counts enough free."""
        led, cfg = self.ledger, self.pool.config
        if not led.queue:
            return ""
        first = min(led.seqs[led.queue[0]].num_tokens, cfg.max_num_batched_tokens)
        if blocks_needed(first, self.pool.block_size) > self.num_free:
            return ""
        return (f" ({self.num_free} of the {self.pool.num_blocks} blocks are free, enough for the head of the queue: "
                "are the blocks of finished and preempted sequences freed?)")

    # --- the judge's checks of one chunk ------------------------------------------------------------

    @staticmethod
    def _resumed_short(view: StepView) -> str:
        """A hint for an update() that fails: a resumed sequence whose chunk ends where its prompt ends, although
        it had generated tokens (a scheduler that lost them thinks the chunk reached the end)."""
        for c in view.chunks:
            seq = c.seq
            if seq.num_preemptions and seq.output_tokens and c.start + len(c.tokens) == len(seq.prompt):
                return (f"{c.seq_id!r} was preempted and resumed without the tokens it had generated: its chunk ends "
                        f"at the end of its prompt, before its {len(seq.output_tokens)} output tokens; preemption "
                        "must keep the output (prompt + output is recomputed)")
        return ""

    def _id_of(self, seq: Any, where: str) -> Hashable:
        """The request a sequence object of the scheduler's stands for: the one add_request returned it for, else
        its seq_id (asked once per object)."""
        known = self._known.get(id(seq))
        if known is not None:
            return known[1]
        try:
            sid = seq.seq_id
        except Exception as err:       # noqa: BLE001  (an object that is not a sequence)
            raise AssertionError(f"{where}: a chunk or preempted entry holds {type(seq).__name__}, not the request's "
                                 f"Sequence (reading its seq_id raised {type(err).__name__})") from None
        try:
            added = sid in self.ledger.seqs
        except TypeError:              # unhashable
            added = False
        if not added:
            raise AssertionError(f"{where}: a sequence with seq_id {sid!r:.80}, which is no request that was added")
        self._known[id(seq)] = (seq, sid)
        return sid

    def _preempt(self, sid: Hashable, where: str) -> None:
        led = self.ledger
        if sid not in led.running:
            raise AssertionError(f"{where}: preempted {sid!r}, which was not running")
        led.running.remove(sid)
        self._free(sid)
        seq = led.seqs[sid]
        seq.num_computed = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.PREEMPTED
        led.queue.appendleft(sid)

    def _chunk(self, raw: Any, preempted: list[Hashable], seen: set[Hashable], where: str) -> ScheduledChunk:
        """The judge's own ScheduledChunk for one the scheduler returned, after checking its sequence, position,
        tokens and slots; an admitted sequence joins the running batch."""
        led = self.ledger
        if not isinstance(raw, ScheduledChunk):
            raise AssertionError(f"{where}: schedule() returned a {type(raw).__name__} among its chunks, expected "
                                 "ScheduledChunk")
        sid = self._id_of(raw.seq, where)
        start, tokens, slots = raw.start, _ints(raw.tokens), _ints(raw.slots)
        if sid in seen:
            raise AssertionError(f"{where}: a sequence appears twice in one step: {sid!r}")
        if sid in preempted:
            raise AssertionError(f"{where}: {sid!r} is both preempted and scheduled in this step")
        if sid in led.finished_at:
            raise AssertionError(f"{where}: scheduled {sid!r}, which has finished")
        if sid not in led.running:
            led.queue.remove(sid)             # admitted (whether it was the head: the policy's check)
            led.running.append(sid)
            led.seqs[sid].status = SequenceStatus.RUNNING
        seq = led.seqs[sid]
        if type(start) is not int or start != seq.num_computed:
            raise AssertionError(f"{where}: the chunk of {sid!r} starts at position {start!r}, but {seq.num_computed} "
                                 "of its tokens are in the cache: chunks must continue where the previous one ended "
                                 "(at 0 after a preemption)")
        if not tokens or tokens != seq.tokens[start:start + len(tokens)]:
            if seq.num_preemptions and start == 0 and tokens and tokens[:len(seq.prompt)] == list(seq.prompt):
                raise AssertionError(f"{where}: preempted request {sid!r} resumed without the tokens it had "
                                     "generated: preemption must keep the output (prompt + output is recomputed)")
            raise AssertionError(f"{where}: the chunk of {sid!r} does not hold its tokens {start}.."
                                 f"{start + max(len(tokens or []), 1) - 1} (prompt + output so far)")
        if slots is None or len(slots) != len(tokens):
            raise AssertionError(f"{where}: the chunk of {sid!r} has {len(tokens)} tokens but slots {raw.slots!r:.80}: "
                                 "one slot (an int) per token")
        for position, slot in zip(range(start, start + len(tokens)), slots):
            self._place(sid, position, slot, where)
        return ScheduledChunk(seq, start, tokens, slots)

    def _place(self, sid: Hashable, position: int, slot: int, where: str) -> None:
        """Check that `slot` holds `position` of sid: in its block for that position, or in a free block that
        becomes its next one."""
        bs, led = self.pool.block_size, self.ledger
        if not 0 <= slot < self.pool.num_blocks * bs:
            raise AssertionError(f"{where}: position {position} of {sid!r} goes to slot {slot}, outside the pool of "
                                 f"{self.pool.num_blocks} blocks of {bs}")
        block, offset = divmod(slot, bs)
        if offset != position % bs:
            raise AssertionError(f"{where}: position {position} of {sid!r} goes to slot {slot} (offset {offset} in "
                                 f"block {block}), but its offset in its block is position % block_size = "
                                 f"{position % bs}")
        table = led.blocks.setdefault(sid, [])
        index = position // bs
        if index < len(table):
            if table[index] != block:
                raise AssertionError(f"{where}: position {position} of {sid!r} goes to block {block}, but its "
                                     f"logical block {index} is block {table[index]}")
            return
        if block in led.owner:
            raise AssertionError(f"{where}: block {block} is given to {sid!r} while {led.owner[block]!r} holds it "
                                 "(a block is free again only when its sequence finishes or is preempted)")
        table.append(block)
        led.owner[block] = sid

    def _free(self, sid: Hashable) -> None:
        for block in self.ledger.blocks.pop(sid, []):
            del self.ledger.owner[block]


def fake_tokens(view: StepView, ledger: Ledger) -> dict[Hashable, int]:
    """The next token of each chunk that reaches its sequence's end: a fixed function of (id, index)."""
    return {c.seq_id: _fake_token(c.seq_id, len(c.seq.output_tokens)) for c in view.chunks if c.samples}


def run_steps(scheduler: Any, arrivals: list[tuple[int, Request]], pool: Pool, *,
              sample: Callable[[StepView, Ledger], dict[Hashable, int]] = fake_tokens,
              check: Callable[[StepView, JudgedRun], None] | None = None, max_steps: int = 5000) -> Ledger:
    """Serve `arrivals` ((step, request): added at that step) with the learner's scheduler until every request has
    all its tokens: each step schedule(), `check(view, run)` (a policy's invariants), `sample(view, ledger)` (the
    tokens of the chunks that reach their sequence's end: fake ones, or a model's) and update(). Returns the judge's
    Ledger."""
    run = JudgedRun(scheduler, pool)
    pending = sorted(arrivals, key=lambda a: a[0])
    step = 0
    while pending or run.ledger.unfinished:
        if step > max_steps:
            led = run.ledger
            raise AssertionError(f"not finished after {max_steps} steps: {len(led.queue)} waiting, "
                                 f"{len(led.running)} running; does the scheduler make progress every step?")
        while pending and pending[0][0] <= step:
            run.add(pending.pop(0)[1], step)
        if run.ledger.unfinished:
            view = run.schedule(step)
            if check is not None:
                check(view, run)
            run.update(view, sample(view, run.ledger), float(step))
        step += 1
    return run.ledger
