"""Lab 03's contracts (continuous batching), for the differential tests of autograder/mutation/equivalence.py.

* ex1 pack_chunks: one step's chunks (sequence, tokens, start, slots) of up to 5 sequences in any order, their
  prompts of 1..12 tokens in blocks of 1..4 (a chunk is the prompt's tail from a drawn start: a whole prompt, a
  later prefill chunk or a decode), tokens as a list or a tuple, no chunk at all; the device "cpu", "meta" or left
  to its default. The whole PackedBatch is compared, field by field (dtypes, shapes, devices, values).
* ex3 static_generate: 0 to 7 prompts of 1..12 tokens with budgets of 1..5 tokens in groups of 1..4 (the last group
  short or full), on a small seeded model; the token lists are compared.

* ex2 MyScheduler: the scheduler's real use, as the serving loop and the engine drive it (minigpt.engine.serving_loop,
  minigpt.serving.engine): requests arrive between steps (some that can never run, rejected by add_request), each
  step is schedule(), the tokens sampled for the chunks that reach their sequence's end (stop tokens included, so
  sequences finish early), update(); requests are aborted between steps, and a step's chunk may fail (the engine
  drops it from the output it hands to update() and aborts its request after). Drawn: max_num_seqs, a token budget
  from max_num_seqs up (SchedulerConfig's smallest), chunked prefill on and off, pools of 1 block and more, block
  sizes 1..4, the context length, and workloads of up to 10 requests. The trace is everything observable at every
  step: add_request's and abort's results, each chunk (sequence, start, tokens, slots, copies) in output order, the
  preempted, the finished, the waiting queue and the running list in order, every sequence's status, progress,
  output, preemptions and times, and the block manager's pool and tables.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised


def _attempt(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as err:                        # noqa: BLE001
        return Raised(type(err).__name__)


@st.composite
def _workload(draw: Any) -> dict:
    max_seqs = draw(st.integers(1, 5))
    num_blocks, block_size = draw(st.integers(1, 16)), draw(st.integers(1, 4))
    capacity = num_blocks * block_size
    chunked = draw(st.booleans())
    budget = max_seqs + draw(st.one_of(st.just(0), st.integers(0, 4), st.integers(0, 20)))

    @st.composite
    def request(draw: Any) -> tuple:
        arrival = draw(st.integers(0, 12))
        if draw(st.integers(0, 9)) == 0:               # now and then one that can never run: rejected
            return arrival, draw(st.integers(1, 40)), draw(st.integers(1, 16)), draw(st.booleans())
        new = draw(st.integers(1, max(1, min(16, capacity, 16 if chunked else budget))))
        fits = max(1, min(24, capacity + 1 - new, budget + 1 - new if not chunked else 24))
        return arrival, draw(st.integers(1, fits)), new, draw(st.booleans())

    requests = draw(st.lists(request(), max_size=10))
    ids = st.integers(0, max(len(requests), 1))
    return dict(
        max_seqs=max_seqs, budget=budget, chunked=chunked, num_blocks=num_blocks, block_size=block_size,
        max_model_len=draw(st.one_of(st.just(64), st.just(64), st.integers(2, 64))),
        requests=requests,
        aborts=draw(st.lists(st.tuples(st.integers(0, 20), ids), max_size=3)),
        failures=draw(st.lists(st.tuples(st.integers(0, 20), ids), max_size=3)),
        salt=draw(st.integers(0, 3)),
    )


@st.composite
def _pack_input(draw: Any) -> dict:
    lens = draw(st.lists(st.integers(1, 12), max_size=5))
    chunks = []
    for i, n in enumerate(lens):
        start = draw(st.integers(0, n - 1))
        tokens = draw(st.lists(st.integers(0, 50), min_size=n - start, max_size=n - start))
        chunks.append((f"s{i}", draw(st.sampled_from([list, tuple]))(tokens), start))
    return dict(block_size=draw(st.integers(1, 4)), lens=lens, chunks=draw(st.permutations(chunks)),
                device=draw(st.sampled_from([None, "cpu", "meta"])))


def _pack(pack_fn: Any, w: dict) -> Any:
    """pack_fn on w's chunks, their slots those of a BlockManager holding the prompts."""
    from minigpt.cache.block_manager import BlockManager

    m = BlockManager(sum(-(-n // w["block_size"]) for n in w["lens"]) + 1, w["block_size"])
    slots = {f"s{i}": m.add_sequence(f"s{i}", list(range(n))).slots for i, n in enumerate(w["lens"])}
    chunks = [(sid, tokens, start, list(slots[sid][start:])) for sid, tokens, start in w["chunks"]]
    device = () if w["device"] is None else (w["device"],)
    return _attempt(pack_fn, chunks, m, *device)


def _pack_corners(ns: dict) -> list:
    return [dict(block_size=4, lens=[11, 6, 3], chunks=[("s0", list(range(5)), 6), ("s1", [7], 5), ("s2", [9], 2)],
                 device=None),
            dict(block_size=1, lens=[], chunks=[], device="meta"),
            dict(block_size=3, lens=[1], chunks=[("s0", (4,), 0)], device="meta")]


@st.composite
def _static_input(draw: Any) -> dict:
    n = draw(st.integers(0, 7))
    return dict(lens=draw(st.lists(st.integers(1, 12), min_size=n, max_size=n)),
                budgets=draw(st.lists(st.integers(1, 5), min_size=n, max_size=n)),
                batch_size=draw(st.integers(1, 4)), seed=draw(st.integers(0, 3)),
                ending=draw(st.one_of(st.none(), st.integers(0, max(n - 1, 0)))))


@functools.cache
def _ending_prompt() -> tuple[list[int], Any]:
    """A prompt, and a small model that answers it with end-of-text at once (the check's `_ends_early`)."""
    from dataclasses import replace

    import torch

    from autograder.checking.models import SMALL_CONFIG, scaled_model
    from autograder.lab03.outputs import _ends_early
    from minigpt.tokenizer import EOT_ID

    prompt = torch.randint(0, 200, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    return prompt, _ends_early(scaled_model(1, replace(SMALL_CONFIG, vocab_size=EOT_ID + 1)), prompt)


def _static(static_fn: Any, w: dict) -> Any:
    """(the token lists, the rows of every model call): the answers and the method (groups run together)."""
    import torch

    ending, model = _ending_prompt()
    g = torch.Generator().manual_seed(w["seed"])
    prompts = [torch.randint(0, 200, (n,), generator=g).tolist() for n in w["lens"]]
    if w["ending"] is not None and prompts:
        prompts[w["ending"]] = list(ending)            # a prompt whose answer would stop at end-of-text
    rows: list[int] = []
    hook = model.tok_emb.register_forward_pre_hook(lambda module, args: rows.append(int(args[0].shape[0])))
    try:
        got = _attempt(static_fn, model, prompts, list(w["budgets"]), w["batch_size"])
    finally:
        hook.remove()
    return ([list(map(int, tokens)) for tokens in got] if isinstance(got, list) else got), rows


def _static_corners(ns: dict) -> list:
    return [dict(lens=[3, 17, 9, 30, 5], budgets=[5, 2, 4, 3, 5], batch_size=3, seed=0, ending=2),
            dict(lens=[4, 11, 6, 8], budgets=[2, 3, 1, 5], batch_size=3, seed=1, ending=None),
            dict(lens=[7, 2], budgets=[1, 2], batch_size=1, seed=2, ending=1),
            dict(lens=[], budgets=[], batch_size=2, seed=0, ending=None)]


def _token(seq_id: Any, index: int, salt: int) -> int:
    """A sampled token: a fixed function of (sequence, index); 0 is the stop token of requests that have one."""
    return zlib.crc32(repr((seq_id, index, salt)).encode()) % 7


def _state(sch: Any) -> tuple:
    m = sch.manager
    seqs = {sid: (s.status.value, s.num_computed, list(s.output_tokens), s.num_preemptions, s.finish_reason,
                  s.first_token_time, list(s.token_times), s.finish_time) for sid, s in sch.sequences.items()}
    return ([s.seq_id for s in sch.waiting], [s.seq_id for s in sch.running], seqs, list(m.pool.ref_counts),
            list(m.pool.free_blocks()), {sid: (list(t.blocks), list(t.token_ids)) for sid, t in m.tables.items()})


def _chunk(c: Any) -> tuple:
    return (c.seq_id, c.start, list(c.tokens), list(c.slots), [tuple(x) for x in c.copies])


def _serve(scheduler_cls: Any, w: dict) -> list:
    """The trace of serving workload w (see the module docstring); whatever raised ends it, recorded by its type."""
    trace: list = []
    try:
        _serve_into(trace, scheduler_cls, w)
    except Exception as err:                        # noqa: BLE001  (a mutant's output that breaks the driver)
        trace.append(("raised", Raised(type(err).__name__)))
    return trace


def _serve_into(trace: list, scheduler_cls: Any, w: dict, max_steps: int = 600) -> None:
    from minigpt.cache.block_manager import BlockManager
    from minigpt.engine.request import Request
    from minigpt.engine.scheduler import SchedulerConfig, SchedulerOutput

    cfg = SchedulerConfig(w["max_seqs"], w["budget"], w["chunked"])
    sch = scheduler_cls(BlockManager(w["num_blocks"], w["block_size"]), cfg, max_model_len=w["max_model_len"])
    pending = sorted(enumerate(w["requests"]), key=lambda r: r[1][0])
    step = 0
    while pending or sch.has_unfinished():
        if step > max_steps:
            trace.append("no end")
            break
        events: list = []
        while pending and pending[0][1][0] <= step:
            rid, (arrival, prompt_len, new, stops) = pending.pop(0)
            prompt = [1 + (rid * 7 + i) % 5 for i in range(prompt_len)]
            req = Request(rid, prompt, new, arrival_time=float(arrival), stop_token_ids=(0,) if stops else ())
            got = _attempt(sch.add_request, req)
            events.append(("add", rid, got.seq_id if hasattr(got, "seq_id") else got))
        for when, rid in w["aborts"]:
            if when == step:
                events.append(("abort", rid, _attempt(sch.abort, rid)))
        out = _attempt(sch.schedule)
        if not isinstance(out, SchedulerOutput):
            trace.append((step, events, "schedule() gave", out))
            break
        failed = {c.seq_id for c in out.chunks for when, rid in w["failures"] if when == step and c.seq_id == rid}
        kept = [c for c in out.chunks if c.seq_id not in failed]
        sampled = {c.seq_id: _token(c.seq_id, len(c.seq.output_tokens), w["salt"]) for c in kept if c.samples}
        finished = _attempt(sch.update, SchedulerOutput(kept, out.preempted), sampled, float(step))
        finished = [s.seq_id for s in finished] if isinstance(finished, list) else finished
        aborted = [(rid, _attempt(sch.abort, rid)) for rid in sorted(failed)]
        trace.append((step, events, [_chunk(c) for c in out.chunks], [s.seq_id for s in out.preempted], finished,
                      aborted, _state(sch)))
        step += 1


def _check_workloads(ns: dict) -> list:
    """The check's seeded random workloads (autograder/lab03/scheduler.py), in this contract's terms."""
    from autograder.lab03.scheduler import _random_workload

    corners = []
    for seed in range(0, 40, 3):
        arrivals, _, cfg, num_blocks, block_size = _random_workload(seed)
        corners.append(dict(max_seqs=cfg.max_num_seqs, budget=cfg.max_num_batched_tokens,
                            chunked=cfg.enable_chunked_prefill, num_blocks=num_blocks, block_size=block_size,
                            max_model_len=64,
                            requests=[(a, len(r.prompt), r.max_new_tokens, False) for a, r in arrivals],
                            aborts=[], failures=[], salt=0))
    base = dict(aborts=[], failures=[], salt=0, max_model_len=64)
    corners += [
        # the starvation case: a long prompt behind a stream of short requests
        dict(base, max_seqs=6, budget=8, chunked=True, num_blocks=200, block_size=4,
             requests=[(i, 2, 6, False) for i in range(3)] + [(3, 30, 4, False)]
             + [(i, 2, 6, False) for i in range(3, 12)]),
        # chunked prefill disabled: a prompt waits for a step with room for all of it
        dict(base, max_seqs=4, budget=8, chunked=False, num_blocks=64, block_size=4,
             requests=[(0, 2, 6, False)] * 3 + [(2, 7, 2, False)]),
        # a budget of max_num_seqs (the smallest), a pool of one block, blocks that fit exactly
        dict(base, max_seqs=2, budget=2, chunked=True, num_blocks=1, block_size=4,
             requests=[(0, 3, 2, False), (0, 2, 3, False), (1, 1, 4, False)]),
        dict(base, max_seqs=3, budget=5, chunked=True, num_blocks=4, block_size=2,
             requests=[(0, 4, 5, True), (0, 6, 3, False), (1, 2, 6, False), (2, 5, 2, True)],
             aborts=[(3, 1)], failures=[(2, 2)]),
        # preemptions: a small pool, long outputs
        dict(base, max_seqs=4, budget=6, chunked=True, num_blocks=6, block_size=2,
             requests=[(0, 3, 8, False), (0, 2, 9, False), (0, 5, 7, False), (1, 4, 8, False)]),
    ]
    return corners


CONTRACTS = {
    "ex1_code": Contract("pack_chunks", lambda ns: _pack_input(), run=_pack, corners=_pack_corners, examples=200),
    "ex3_code": Contract("static_generate", lambda ns: _static_input(), run=_static, corners=_static_corners,
                         examples=60),
    "ex2_code": Contract("MyScheduler", lambda ns: _workload(), run=_serve, corners=_check_workloads, examples=300),
}
