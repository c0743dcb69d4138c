"""Checks for Lab 03, continuous batching.

Each check takes the learner's object, runs it on small seeded workloads and raises AssertionError
saying what is wrong (which step, which request, expected vs got, likely cause).

CPU tier (correctness):
    check_pack_chunks(pack_fn)                    packed (varlen) layout: positions continue across chunks
    check_scheduler(scheduler_cls)                seeded random workloads: budget, max_num_seqs, blocks == running,
                                                  chunk positions, preempted resume with their tokens, bounded
                                                  finish; no starvation; first come first served; no chunking when
                                                  chunked prefill is disabled; bad input rejected
    check_greedy_outputs(scheduler_cls, pack_fn)  every request's greedy output == generating it alone
    check_static_batching(static_fn)              static batching output == alone (padding never attended), run
                                                  in groups of batch_size (model calls counted)
    check_metrics(request_metrics_fn, goodput_fn) TTFT, TPOT, ITL, E2E, goodput on hand-made timelines
Speed (deterministic proxy): check_continuous_speedup(scheduler_cls): model steps of static batching over the
learner's continuous scheduler on a skewed workload, relative to the reference's, same run.
Every check refuses the package's reference handed in as the answer (reference_guard: the object itself, a subclass
inheriting `schedule`, a thin wrapper calling into it).
Interview questions: check_q1_continuous_vs_static, check_q2_compute_bound_batch, check_q3_kv_memory.
GPU tier (speed): check_continuous_speedup_gpu(scheduler_cls, pack_fn): wall time of static batching over the learner's
continuous batching on a GPU, relative to the reference, behind autograder.harness.require_gpu.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from typing import Any, Callable, Hashable

import torch

from autograder.harness import call_learner, check_answer, quiet
from autograder.reference_guard import no_calls_into, own_work
from minigpt.cache.block_manager import BlockManager
from minigpt.cache.paged import PagedKVCache
from minigpt.config import ModelConfig
from minigpt.engine.baselines import StaticBatchScheduler, static_generate
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.metrics import goodput, request_metrics
from minigpt.engine.packed_batch import pack_chunks
from minigpt.engine.prefix_scheduler import PrefixCachingScheduler
from minigpt.engine.request import Request, SequenceStatus
from minigpt.engine.runner import ModelRunner
from minigpt.engine.scheduler import Scheduler, SchedulerConfig
from minigpt.engine.serving_loop import serve
from minigpt.model import GPT
from minigpt.teaching.calculators import PRESETS, critical_batch_size, kv_cache_bytes
from minigpt.teaching.hardware import ACCELERATORS
from minigpt.timing import fixed_threads

__all__ = ["check_pack_chunks", "check_scheduler", "check_greedy_outputs", "check_static_batching", "check_metrics",
           "check_continuous_speedup", "check_q1_continuous_vs_static", "check_q2_compute_bound_batch",
           "check_q3_kv_memory", "check_continuous_speedup_gpu", "GPU_SPEED_CHECK", "SMALL_CONFIG", "NEAR_TIE", "SPEED_MIN_FRACTION", "drive"]

SMALL_CONFIG = ModelConfig(vocab_size=256, max_seq_len=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)
NEAR_TIE = 1e-3          # top-2 logit gap below which batched float sums may flip the greedy choice
# The learner's continuous scheduler must save at least this fraction of the reference's step reduction over
# static batching (a deterministic count: no timing noise). The reference needs about 2.6x fewer steps (145 vs 56) on
# the skewed workload below; a scheduler that only refills when the batch empties gets 1x.
SPEED_MIN_FRACTION = 0.8
# GPU tier: wall time, threshold calibrated per GPU class by `make calibrate` (autograder/calibrate.py) between the
# reference's ratio and that of a scheduler that refills only when the batch empties (static batching in disguise).
GPU_SPEED_CHECK = "lab03_continuous_speedup_gpu"


def _model(seed: int = 0, config: ModelConfig = SMALL_CONFIG, scale: float = 6.0) -> GPT:
    """A small random model whose matrices are scaled (x6 by default): at the usual init a random model repeats its
    last token whatever the context, so a wrong position or an attended padding token would go unnoticed."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(scale)
    return model


def _rand_tokens(n: int, g: torch.Generator, vocab: int = 255) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=g).tolist()


SCHEDULER = "Exercise 2 (the scheduler)"
# The reference's scheduling code: a learner's schedule() may use the helpers the exercise names (_reserve,
# _preempt, _blocks_for) but not the reference's schedule() or its admission (_admit), nor another scheduler's.
_SCHEDULING_CODE = (Scheduler.schedule, Scheduler._admit, PrefixCachingScheduler._admit, StaticBatchScheduler.schedule)


def own_scheduler(scheduler_cls: type) -> None:
    """Refuse the reference scheduler, or a subclass that inherits schedule() from it."""
    own_work(scheduler_cls, (Scheduler, PrefixCachingScheduler, StaticBatchScheduler), what=SCHEDULER,
             methods=("schedule",))


def learner_scheduling() -> Any:
    """A context in which entering the reference's scheduling code fails the check (super().schedule(), ...)."""
    return no_calls_into(*_SCHEDULING_CODE, what=SCHEDULER)


def _construct(scheduler_cls: type, manager: BlockManager, config: SchedulerConfig, max_model_len: int) -> Any:
    own_scheduler(scheduler_cls)
    try:
        return scheduler_cls(manager, config, max_model_len=max_model_len)
    except NotImplementedError:
        raise AssertionError("the scheduler is not implemented yet (NotImplementedError)") from None


# ---------------------------------------------------------------------------------------------------
# Packed layout
# ---------------------------------------------------------------------------------------------------

def check_pack_chunks(pack_fn: Callable) -> None:
    """pack_fn(chunks, manager) with chunks (seq_id, tokens, start, slots) -> PackedBatch fields equal the reference."""
    what_ex = "Exercise 1 (pack_chunks)"
    own_work(pack_fn, pack_chunks, what=what_ex)
    m = BlockManager(32, 4)
    g = torch.Generator().manual_seed(0)
    a_prompt, b_prompt = _rand_tokens(11, g), _rand_tokens(5, g)
    r1 = m.add_sequence("a", a_prompt[:6])                 # first chunk of a
    m.add_sequence("b", b_prompt)
    r2 = m.append_tokens("a", a_prompt[6:])                # second chunk: positions 6..10
    r3 = m.append_tokens("b", [7])                         # decode at position 5
    m.add_sequence("c", [3, 4])
    r4 = m.append_tokens("c", [9])
    cases = {
        "one sequence, first chunk": [("a", a_prompt[:6], 0, r1.slots)],
        "a second prefill chunk (start 6), a decode (start 5), a decode (start 2)":
            [("a", a_prompt[6:], 6, r2.slots), ("b", [7], 5, r3.slots), ("c", [9], 2, r4.slots)],
    }
    for what, chunks in cases.items():
        want = pack_chunks(chunks, m)
        with no_calls_into(pack_chunks, what=what_ex):
            got = call_learner(f"pack_chunks ({what})", pack_fn, chunks, m)
        for name in ("tokens", "positions", "slots", "cu_seqlens_q", "seq_lens"):
            w, x = getattr(want, name), getattr(got, name, None)
            if not isinstance(x, torch.Tensor) or x.shape != w.shape or not torch.equal(x.long().cpu(), w.long()):
                hint = {"positions": " Positions continue across chunks: a chunk starting at `start` covers "
                                     "start .. start + n - 1, not 0 .. n - 1.",
                        "cu_seqlens_q": " cu_seqlens_q is [0, n_0, n_0 + n_1, ...] (B + 1 entries).",
                        "seq_lens": " seq_lens[b] = start + n: the sequence's length in the cache after this step."
                        }.get(name, "")
                raise AssertionError(f"{what}: {name} should be {w.tolist()}, got "
                                     f"{x.tolist() if isinstance(x, torch.Tensor) else x!r}.{hint}")
        bt = getattr(got, "block_tables", None)
        for b, (seq_id, toks, start, _) in enumerate(chunks):
            need = math.ceil((start + len(toks)) / 4)
            if bt is None or bt[b, :need].tolist() != m.table(seq_id).blocks[:need]:
                raise AssertionError(f"{what}: block_tables row {b} should start with {m.table(seq_id).blocks}")


# ---------------------------------------------------------------------------------------------------
# Scheduler invariants, driven without a model
# ---------------------------------------------------------------------------------------------------

def _fake_token(seq_id: Hashable, index: int) -> int:
    """A fixed function of (id, index), the same in every process (Python's hash() of a str is salted)."""
    return 2 + zlib.crc32(repr((seq_id, index)).encode()) % 50


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


def _request(rid: Hashable, prompt_len: int, new: int, g: torch.Generator) -> Request:
    return Request(rid, _rand_tokens(prompt_len, g), new, stop_token_ids=())


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
    sch = _construct(scheduler_cls, BlockManager(200, 4), cfg, 128)
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
    sch = _construct(scheduler_cls, BlockManager(8, 4), SchedulerConfig(2, 8), 40)
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
    sch = _construct(scheduler_cls, BlockManager(64, 4), cfg, 64)
    arrivals = [(0, _request(f"decode{i}", 2, 6, g)) for i in range(3)] + [(2, _request("prompt", 7, 2, g))]
    drive(sch, arrivals)


def check_scheduler(scheduler_cls: type, *, max_examples: int = 60) -> None:
    """Scheduler invariants (see `drive`) on `max_examples` seeded random workloads (the same in every process), a
    starvation case, a case with chunked prefill disabled, and bad input."""
    own_scheduler(scheduler_cls)
    seen = {"preempted": 0, "chunked": 0}

    def count(step: int, s: Any, out: Any) -> None:
        seen["preempted"] += len(getattr(out, "preempted", []))
        seen["chunked"] += any(c.start > 0 and len(c.tokens) > 1 for c in out.chunks)

    with quiet(), learner_scheduling():
        _bad_input(scheduler_cls)
        for example in range(max_examples):
            arrivals, reqs, cfg, num_blocks, block_size = _random_workload(example)
            if not arrivals:
                continue
            sch = _construct(scheduler_cls, BlockManager(num_blocks, block_size), cfg, 64)
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


# ---------------------------------------------------------------------------------------------------
# Greedy outputs equal generating alone
# ---------------------------------------------------------------------------------------------------

def _first_real_divergence(model: GPT, req: Request, got: list[int], want: list[int]) -> str | None:
    """None if got == want up to a near-tie; else a description of the first real divergence."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            ids = torch.tensor([list(req.prompt) + want[:i]])
            with torch.inference_mode():
                top = model(ids)[0, -1].float().topk(2).values
            if (top[0] - top[1]).item() < NEAR_TIE:
                return None
            return f"token {i}: got {a}, alone it is {b} (top-2 logit gap {(top[0] - top[1]).item():.3g}, not a near-tie)"
    if len(got) != len(want):
        return f"{len(got)} tokens, alone it makes {len(want)}"
    return None


def check_greedy_outputs(scheduler_cls: type = Scheduler, pack_fn: Callable | None = None) -> None:
    """Serve seeded workloads (chunked prefill; a pool small enough to force preemption) with the learner's scheduler
    (and packing function) on a small random model: each greedy output must equal generate_kv_cache alone."""
    import minigpt.engine.runner as runner_mod

    own_scheduler(scheduler_cls)
    if pack_fn is not None:
        own_work(pack_fn, pack_chunks, what="Exercise 1 (pack_chunks)")
    model = _model()
    g = torch.Generator().manual_seed(11)
    reqs = [Request(i, _rand_tokens(int(torch.randint(2, 40, (1,), generator=g)), g),
                    int(torch.randint(1, 24, (1,), generator=g)), arrival_time=0.0, stop_token_ids=())
            for i in range(10)]
    with fixed_threads(1):
        want = {r.request_id: generate_kv_cache(model, list(r.prompt), r.max_new_tokens, stop_token_ids=()).tokens
                for r in reqs}
    saved = runner_mod.pack_chunks
    if pack_fn is not None:
        runner_mod.pack_chunks = pack_fn
    try:
        with fixed_threads(1):         # tiny matmuls: one thread is fastest and robust on a busy machine
            for num_blocks, budget, layout in [(64, 12, "packed"), (16, 16, "packed"), (16, 12, "padded")]:
                what = f"10 requests, {num_blocks} blocks of 4 tokens, budget {budget} tokens/step, {layout} layout"
                cache = PagedKVCache.for_model(model, num_blocks, 4)
                sch = _construct(scheduler_cls, cache.manager, SchedulerConfig(4, budget), SMALL_CONFIG.max_seq_len)
                with quiet(), learner_scheduling(), no_calls_into(pack_chunks, what="Exercise 1 (pack_chunks)"):
                    res = call_learner(what, serve, reqs, sch, ModelRunner(model, cache, layout).execute)
                for seq in res.sequences:
                    bad = _first_real_divergence(model, seq.request, list(seq.output_tokens), want[seq.seq_id])
                    if bad:
                        raise AssertionError(f"{what}: request {seq.seq_id} (prompt {len(seq.prompt)} tokens, preempted "
                                             f"{seq.num_preemptions}x) differs from generating it alone at {bad}. Check "
                                             "chunk positions, that preemption keeps the output, and the KV slots.")
    finally:
        runner_mod.pack_chunks = saved


# ---------------------------------------------------------------------------------------------------
# Static batching baseline
# ---------------------------------------------------------------------------------------------------

def check_static_batching(static_fn: Callable) -> None:
    """static_fn(model, prompts, max_new_tokens, batch_size) -> list of token lists (stop tokens disabled): each must
    equal generate_kv_cache on that prompt alone; prompts of very different lengths share a batch. The method: the
    model runs each group of batch_size prompts together (at most batch_size rows per call, 9 + 7 calls for groups
    whose longest answers are 9 and 7 tokens), not one prompt at a time."""
    what = "Exercise 3 (static batching)"
    own_work(static_fn, static_generate, what=what)
    model = _model(1)
    g = torch.Generator().manual_seed(12)
    prompts = [_rand_tokens(n, g) for n in (3, 17, 9, 30, 5)]
    new = [6, 2, 9, 4, 7]
    rows: list[int] = []
    hook = model.tok_emb.register_forward_pre_hook(lambda module, args: rows.append(int(args[0].shape[0])))
    try:
        with fixed_threads(1), no_calls_into(static_generate, StaticBatchScheduler, what=what):
            got = call_learner("static batching", static_fn, model, prompts, new, 3)
    finally:
        hook.remove()
    if not isinstance(got, (list, tuple)) or len(got) != len(prompts):
        raise AssertionError(f"static batching should return {len(prompts)} token lists, got {got!r:.200}")
    for i, (p, n) in enumerate(zip(prompts, new)):
        want = generate_kv_cache(model, p, n, stop_token_ids=()).tokens
        bad = _first_real_divergence(model, Request(i, p, n), list(got[i]), want)
        if bad:
            raise AssertionError(f"prompt {i} ({len(p)} tokens, batched with prompts of {[len(q) for q in prompts]} "
                                 f"tokens): {bad}. Padding must never be attended to (or written to the cache).")
    if max(rows, default=0) > 3 or max(rows, default=0) < 2 or len(rows) != 9 + 7:
        raise AssertionError(f"the model ran {len(rows)} times with batches of {sorted(set(rows))} rows; static batching "
                             "in groups of 3 runs each group together until its longest answer ends: 9 + 7 = 16 calls "
                             "with up to 3 rows (one prefill and the decode steps). Generating each prompt alone "
                             "(or all at once) is not static batching.")


# ---------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------

class _Timeline:
    def __init__(self, rid: str, arrival: float, times: list[float], finish: float | None = None) -> None:
        self.seq_id, self.arrival_time, self.token_times = rid, arrival, times
        self.first_token_time, self.finish_time = times[0], finish if finish is not None else times[-1]


def check_metrics(request_metrics_fn: Callable, goodput_fn: Callable) -> None:
    """TTFT, TPOT, ITLs, E2E (to the finish time, which may come after the last token) and goodput on hand-made
    timelines; goodput of no requests is 0."""
    what = "Exercise 4 (metrics)"
    own_work(request_metrics_fn, request_metrics, what=what)
    own_work(goodput_fn, goodput, what=what)
    with no_calls_into(request_metrics, goodput, what=what):
        _metrics_cases(request_metrics_fn, goodput_fn)


def _metrics_cases(request_metrics_fn: Callable, goodput_fn: Callable) -> None:
    a = _Timeline("a", 1.0, [1.5, 1.6, 1.8, 2.1])
    b = _Timeline("b", 0.0, [0.2])
    c = _Timeline("c", 0.5, [3.5, 3.55, 3.6], finish=3.7)
    got = call_learner("request_metrics", request_metrics_fn, a)
    for name, want in {"ttft": 0.5, "tpot": 0.2, "e2e": 1.1, "num_output_tokens": 4}.items():
        val = getattr(got, name, None)
        if not isinstance(val, (int, float)) or not math.isclose(val, want, rel_tol=1e-9, abs_tol=1e-12):
            hint = {"tpot": " TPOT = (last token time - first token time) / (n - 1): the first token is TTFT's.",
                    "ttft": " TTFT counts from the ARRIVAL (queueing included)."}.get(name, "")
            raise AssertionError(f"tokens at 1.5, 1.6, 1.8, 2.1 s for a request arriving at 1.0 s: {name} should be "
                                 f"{want}, got {val!r}.{hint}")
    itls = [round(x, 9) for x in getattr(got, "itls", ())]
    if itls != [0.1, 0.2, 0.3]:
        raise AssertionError(f"inter-token latencies should be [0.1, 0.2, 0.3], got {list(getattr(got, 'itls', ()))}")
    one = call_learner("request_metrics", request_metrics_fn, b)
    if getattr(one, "tpot", None) != 0.0:
        raise AssertionError(f"a one-token output has TPOT 0 (no gap between tokens), got {getattr(one, 'tpot', None)!r}")
    late = call_learner("request_metrics", request_metrics_fn, c)
    if not isinstance(getattr(late, "e2e", None), (int, float)) or not math.isclose(late.e2e, 3.2, rel_tol=1e-9):
        raise AssertionError(f"a request arriving at 0.5 s whose last token comes at 3.6 s and that finishes at 3.7 s "
                             f"has E2E 3.2 s, got {getattr(late, 'e2e', None)!r}: E2E runs from the arrival to the "
                             "FINISH time (seq.finish_time), not to the last token")
    ms = [got, one, late]        # TTFT 0.5 / 0.2 / 3.0, TPOT 0.2 / 0 / 0.05
    for (ttft, tpot), want in {(1.0, 0.1): 1 / 3, (0.5, 0.25): 2 / 3, (5.0, 0.3): 1.0, (0.1, 1.0): 0.0}.items():
        val = call_learner("goodput", goodput_fn, ms, ttft, tpot)
        if not isinstance(val, (int, float)) or not math.isclose(val, want, rel_tol=1e-9):
            raise AssertionError(f"goodput with TTFT <= {ttft} s and TPOT <= {tpot} s over requests with (TTFT, TPOT) = "
                                 f"(0.5, 0.2), (0.2, 0), (3.0, 0.05) should be {want:.4g}, got {val!r}: a request counts "
                                 "only if it meets BOTH limits (<=), as a share of all requests")
    empty = call_learner("goodput of no requests", goodput_fn, [], 1.0, 1.0)
    if empty != 0:
        raise AssertionError(f"goodput of an empty list of requests should be 0, got {empty!r}")


# ---------------------------------------------------------------------------------------------------
# Speed: a deterministic proxy (model steps), relative to the reference
# ---------------------------------------------------------------------------------------------------

def _skewed_requests(n: int = 24, seed: int = 0) -> list[tuple[int, Request]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        new = 48 if i % 8 == 0 else 4            # one long answer in eight
        out.append((i // 4, _request(i, int(torch.randint(4, 12, (1,), generator=g)), new, g)))
    return out


def _steps(make: Callable[[BlockManager], Any], arrivals: list) -> int:
    sch = make(BlockManager(400, 4))
    pending, step = sorted(arrivals, key=lambda x: x[0]), 0
    while pending or sch.has_unfinished():
        while pending and pending[0][0] <= step:
            sch.add_request(pending.pop(0)[1])
        if len(pending) == 0 and hasattr(sch, "end_of_arrivals"):
            sch.end_of_arrivals()
        out = sch.schedule()
        sampled = {c.seq_id: _fake_token(c.seq_id, len(c.seq.output_tokens)) for c in out.chunks
                   if c.start + len(c.tokens) == c.seq.num_tokens}
        sch.update(out, sampled, float(step))
        step += 1
        if step > 10_000:
            raise AssertionError("the workload did not finish in 10,000 steps")
    return step


def check_continuous_speedup(scheduler_cls: type) -> dict[str, float]:
    """Model steps (each one forward call) to serve a skewed workload (1 request in 8 wants 48 tokens, the rest 4):
    static batching (batches of 8) over continuous batching, the learner's scheduler against the reference."""
    arrivals = _skewed_requests()
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64)
    static = _steps(lambda m: StaticBatchScheduler(m, 8, max_model_len=96), arrivals)
    with quiet():
        ref = _steps(lambda m: Scheduler(m, cfg, max_model_len=96), arrivals)
        with learner_scheduling():
            learner = call_learner("the skewed workload", _steps, lambda m: _construct(scheduler_cls, m, cfg, 96),
                                   arrivals)
    ref_ratio, ratio = static / ref, static / learner
    if ratio < SPEED_MIN_FRACTION * ref_ratio:
        raise AssertionError(f"static batching needs {static} steps, your scheduler {learner} ({ratio:.2f}x fewer), the "
                             f"reference {ref} ({ref_ratio:.2f}x fewer); at least {SPEED_MIN_FRACTION:.0%} of the "
                             "reference's gain is needed: refill the batch every step, as soon as a sequence finishes")
    return {"static_steps": static, "steps": learner, "reference_steps": ref, "ratio": ratio, "reference_ratio": ref_ratio}


def check_continuous_speedup_gpu(scheduler_cls: type, pack_fn: Callable | None = None, *,
                                 device: str = "cuda", repeats: int = 3, config: ModelConfig | None = None,
                                 allow_reference: bool = False) -> dict[str, float]:
    """Wall time to serve the skewed workload of `check_continuous_speedup` with the target model's shape (random
    weights) on a GPU: static batching (padded) over the learner's continuous batching (packed), relative to the
    reference scheduler and packing, timed interleaved (harness.check_speedup). `device="cpu"` and a small `config`
    run the same code on the CPU (for tests); grading uses the GPU and the target shape. `allow_reference=True` (for
    `make calibrate` and gpu-check, which time the reference and slow variants built on it) lifts the refusal of
    the package's reference."""
    import minigpt.engine.runner as runner_mod
    from autograder.harness import check_speedup
    from minigpt.config import TARGET_CONFIG

    if device == "cuda" and not torch.cuda.is_available():
        raise AssertionError("check_continuous_speedup_gpu needs a CUDA GPU; gate it with autograder.harness.require_gpu")
    if not allow_reference:
        own_scheduler(scheduler_cls)
        if pack_fn is not None:
            own_work(pack_fn, pack_chunks, what="Exercise 1 (pack_chunks)")
    torch.manual_seed(0)
    model = GPT(config or TARGET_CONFIG).to(device).eval()
    reqs = [r for _, r in _skewed_requests()]
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64)

    def serving(make: Callable[[BlockManager], Any], layout: str, pack: Callable | None) -> Callable[[], Any]:
        def go() -> Any:
            cache = PagedKVCache.for_model(model, 400, 4)
            saved = runner_mod.pack_chunks
            runner_mod.pack_chunks = pack or saved
            try:
                return serve(reqs, make(cache.manager), ModelRunner(model, cache, layout).execute)
            finally:
                runner_mod.pack_chunks = saved
        return go

    static = serving(lambda m: StaticBatchScheduler(m, 8, max_model_len=96), "padded", None)
    learner = serving(lambda m: scheduler_cls(m, cfg, max_model_len=96), "packed", pack_fn)
    reference = serving(lambda m: Scheduler(m, cfg, max_model_len=96), "packed", None)
    guard = contextlib.nullcontext() if allow_reference else \
        no_calls_into(*_SCHEDULING_CODE, pack_chunks, what="Exercises 1 and 2 (pack_chunks, the scheduler)")
    with guard:
        got = learner().outputs()
    want = reference().outputs()
    if got != want:
        raise AssertionError("on this device your scheduler's outputs differ from the reference's; pass the CPU checks first")
    with quiet():
        return check_speedup(learner, static, reference, what="continuous vs static batching, skewed workload",
                             check=GPU_SPEED_CHECK, repeats=repeats, warmup=1, device=device)


# ---------------------------------------------------------------------------------------------------
# Interview questions
# ---------------------------------------------------------------------------------------------------

def check_q1_continuous_vs_static(answer: Any) -> None:
    """Batches of 8; 7 answers of 16 tokens and 1 of 256 in every group of 8; a decode step costs the same for 1..8
    sequences; an endless queue. Output tokens/s of continuous over static batching (decode only)?"""
    lengths = [16] * 7 + [256]
    static_per_step = sum(lengths) / max(lengths)          # all 8 slots held until the longest ends
    continuous_per_step = 8                                  # every slot refilled at once
    check_answer(answer, continuous_per_step / static_per_step, "Q1 (continuous / static tokens per second)",
                 {max(lengths) / min(lengths): "that is longest / shortest; static batching still produces the short "
                  "answers, it only leaves their slots empty afterwards.",
                  8.0: "static batching is not 1 token per step: all 8 sequences decode together until they end.",
                  sum(lengths) / 8 / 16: "compare steps per batch, not the mean length over the shortest."},
                 unit="ratio", rel=0.01,
                 hint="Static: one batch takes max(length) steps and yields sum(length) tokens. Continuous: 8 tokens "
                      "every step. The ratio is max / mean of the lengths.")


def _q2_numbers() -> tuple[int, float]:
    shape, gpu = PRESETS["Llama-3-8B"], ACCELERATORS["H100-SXM"]
    batch = critical_batch_size(shape, 256, gpu.peak("bf16"), gpu.memory_bandwidth)
    return batch, kv_cache_bytes(shape, 256, batch, 2) / 2**30


def check_q2_compute_bound_batch(answer: Any) -> None:
    """Llama-3-8B, bf16, H100 SXM, every sequence at context 256: smallest batch at which a decode step is
    compute-bound (weights read once per step, each sequence's K/V read, attention FLOPs included)."""
    batch, _ = _q2_numbers()
    gpu = ACCELERATORS["H100-SXM"]
    check_answer(answer, batch, "Q2 (batch size where decode turns compute-bound)",
                 {round(gpu.ridge_point("bf16")): "that is the ridge point with the weights alone; each sequence also "
                  "reads its K/V cache, which lowers the intensity, so a larger batch is needed.",
                  math.ceil(gpu.ridge_point("bf16")): "that is the ridge point with the weights alone; add the K/V reads."},
                 unit="sequences",
                 hint="intensity(B) = B*f / (W + B*k) with f = decode FLOPs per sequence, k = its KV bytes, W = weight "
                      "bytes; find the smallest B with intensity >= peak / bandwidth (calculators.critical_batch_size).")


def check_q3_kv_memory(answer: Any) -> None:
    """The KV cache that batch needs at context 256, in GiB (bf16)."""
    _, gib = _q2_numbers()
    check_answer(answer, gib, "Q3 (KV memory of that batch)", {gib * 2**30 / 1e9: "GiB is 2**30 bytes, not 1e9.",
                                                                gib / 2: "K and V: two tensors per layer."},
                 unit="GiB", rel=0.01, hint="kv_cache_bytes(shape, 256, batch) / 2**30.")
