"""Exercises 2 and 3 on a model: greedy outputs of continuous batching and of static batching equal generating alone."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Callable, Iterator

import torch

from autograder.harness import call_learner, quiet
from autograder.checking.models import NEAR_TIE, SMALL_CONFIG, model_beside, scaled_model
from autograder.lab03.common import SCHEDULER, Pool, _rand_tokens, failures_named, scheduler_on
from autograder.lab03.packing import refuse_thin_pack
from autograder.lab03.scheduler import refuse_thin_wrapper
from autograder.lab03.stepping import Ledger, StepView, run_steps
from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.wire import Callback, is_remote
from minigpt.cache.block_table import BlockTable
from minigpt.cache.paged import PagedKVCache
from minigpt.engine.baselines import StaticBatchScheduler, static_generate
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.packed_batch import pack_chunks
from minigpt.engine.request import Request
from minigpt.engine.runner import ModelRunner
from minigpt.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from minigpt.model import GPT
from minigpt.tokenizer import EOT_ID
from minigpt.timing import fixed_threads


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


@contextlib.contextmanager
def _packing_with(pack_fn: Callable | None) -> Iterator[None]:
    """The judge's ModelRunner packs with `pack_fn` inside the block (the reference when None)."""
    import minigpt.engine.runner as runner_mod

    saved = runner_mod.pack_chunks
    runner_mod.pack_chunks = pack_fn or saved
    try:
        yield
    finally:
        runner_mod.pack_chunks = saved


def served_outputs(scheduler_cls: type, pack_fn: Callable | None, model: GPT, requests: list[Request],
                   num_blocks: int, budget: int, layout: str) -> Ledger:
    """Serve `requests` with a new scheduler_cls (4 sequences, `budget` tokens a step; its BlockManager of
    `num_blocks` blocks of 4 tokens built beside it) on the judge's own model and paged cache: the judge calls the
    scheduler step by step (`stepping.run_steps`), runs each step's chunks on its model (its cache's block tables are
    the blocks the judge assigned from the chunks' slots; `pack_fn` packs them, the reference when None) and samples
    greedily; the Ledger holds every request's output as the judge sampled it."""
    pool = Pool(SchedulerConfig(4, budget), num_blocks, 4)
    sch = scheduler_on(scheduler_cls, pool, SMALL_CONFIG.max_seq_len)
    cache = PagedKVCache.for_model(model, num_blocks, 4)
    runner = ModelRunner(model, cache, layout)

    def sample(view: StepView, ledger: Ledger) -> dict:
        for c in view.chunks:
            cache.manager.tables[c.seq_id] = BlockTable(4, list(ledger.blocks[c.seq_id]),
                                                        c.seq.tokens[:c.start + len(c.tokens)])
        step = SchedulerOutput(view.chunks)
        if pack_fn is None:
            return runner.execute(step)
        return call_learner(f"the model step at step {view.step} (packed by your pack_chunks)", runner.execute, step)

    with fixed_threads(1), quiet(), _packing_with(pack_fn):       # tiny matmuls: one thread is fastest on a busy machine
        return run_steps(sch, [(0, r) for r in requests], pool, sample=sample)


def check_greedy_outputs(scheduler_cls: type = Scheduler, pack_fn: Callable | None = None) -> None:
    """Serve seeded workloads (chunked prefill; a pool small enough to force preemption) with the learner's scheduler
    (and packing function) on a small random model: each greedy output the judge sampled must equal
    generate_kv_cache alone."""
    refuse_thin_wrapper(scheduler_cls)         # a cheap probe: profiling the model run would double its cost
    if pack_fn is not None:
        own_work(pack_fn, pack_chunks, what="Exercise 1 (pack_chunks)")
        refuse_thin_pack(pack_fn)
    model = scaled_model()
    g = torch.Generator().manual_seed(11)
    reqs = [Request(i, _rand_tokens(int(torch.randint(2, 40, (1,), generator=g)), g),
                    int(torch.randint(1, 24, (1,), generator=g)), arrival_time=0.0, stop_token_ids=())
            for i in range(10)]
    with fixed_threads(1):
        want = {r.request_id: generate_kv_cache(model, list(r.prompt), r.max_new_tokens, stop_token_ids=()).tokens
                for r in reqs}
    for num_blocks, budget, layout in [(64, 12, "packed"), (16, 16, "packed"), (16, 12, "padded")]:
        what = f"10 requests, {num_blocks} blocks of 4 tokens, budget {budget} tokens/step, {layout} layout"
        with failures_named(f"{SCHEDULER}, {what}"):
            ledger = served_outputs(scheduler_cls, pack_fn, model, reqs, num_blocks, budget, layout)
        for req in reqs:
            seq = ledger.seqs[req.request_id]
            bad = _first_real_divergence(model, req, list(seq.output_tokens), want[req.request_id])
            if bad:
                raise AssertionError(f"{what}: request {req.request_id} (prompt {len(req.prompt)} tokens, preempted "
                                     f"{seq.num_preemptions}x) differs from generating it alone at {bad}. Check "
                                     "chunk positions, that preemption keeps the output, and the KV slots.")


def _ends_early(model: GPT, prompt: list[int]) -> GPT:
    """`model` with the end-of-text row of its tied embedding set to 1.05x that of the token it picks first after
    `prompt`: wherever that token would win, end-of-text wins instead (its logit is larger by 5%), so an answer
    that stops at end-of-text (stop tokens left on) ends early where one that ignores it goes on."""
    first = generate_kv_cache(model, prompt, 1, stop_token_ids=()).tokens[0]
    with torch.no_grad():
        model.tok_emb.weight[EOT_ID] = 1.05 * model.tok_emb.weight[first]
    return model


def check_static_batching(static_fn: Callable) -> None:
    """static_fn(model, prompts, max_new_tokens, batch_size) -> list of token lists (stop tokens disabled): each must
    equal generate_kv_cache on that prompt alone; prompts of very different lengths share a batch. The method: the
    model runs each group of batch_size prompts together (at most batch_size rows per call, as many calls as the
    group's longest answer has tokens), not one prompt at a time. Three cases: 5 prompts in groups of 3 (9 + 7
    calls), 4 in groups of 3 (the last group of one; 3 + 5 calls, the next group's longer answer not the first
    group's), 2 in groups of 1."""
    what = "Exercise 3 (static batching)"
    own_work(static_fn, static_generate, what=what)
    g = torch.Generator().manual_seed(12)
    cases = [([_rand_tokens(n, g) for n in (3, 17, 9, 30, 5)], [6, 2, 9, 4, 7], 3, [9, 7]),
             ([_rand_tokens(n, g) for n in (4, 11, 6, 8)], [2, 3, 1, 5], 3, [3, 5]),
             ([_rand_tokens(n, g) for n in (7, 2)], [1, 2], 1, [1, 2])]
    model = _ends_early(scaled_model(1, replace(SMALL_CONFIG, vocab_size=EOT_ID + 1)), cases[0][0][2])
    learner_model = model_beside(static_fn, model)      # in the learner's kernel when judged (a copy)
    for prompts, new, batch_size, calls in cases:
        _static_case(static_fn, model, learner_model, prompts, new, batch_size, calls)


def _static_case(static_fn: Callable, model: GPT, learner_model: Any, prompts: list[list[int]], new: list[int],
                 batch_size: int, calls: list[int]) -> None:
    what = "Exercise 3 (static batching)"
    rows: list[int] = []
    # counts rows where the model runs (when judged, the kernel calls this judge-side hook: one request per call;
    # the kernel's copy swaps its attention per batch, which the judge's own model cannot let learner code do)
    def count_rows(module: Any, args: tuple) -> None:
        rows.append(int(args[0].shape[0]))

    hook = learner_model.tok_emb.register_forward_pre_hook(Callback(count_rows) if is_remote(learner_model)
                                                           else count_rows)
    sizes = [len(p) for p in prompts]
    try:
        with fixed_threads(1), no_calls_into(static_generate, StaticBatchScheduler, what=what):
            got = call_learner(f"static batching ({len(prompts)} prompts in groups of {batch_size})", static_fn,
                               learner_model, prompts, new, batch_size)
    finally:
        hook.remove()
    if not isinstance(got, (list, tuple)) or len(got) != len(prompts):
        raise AssertionError(f"{what}: {len(prompts)} prompts in groups of {batch_size} should give {len(prompts)} "
                             f"token lists, got {got!r:.200}: every group, the last one too, however short")
    for i, (p, n) in enumerate(zip(prompts, new)):
        want = generate_kv_cache(model, p, n, stop_token_ids=()).tokens
        bad = _first_real_divergence(model, Request(i, p, n), list(got[i]), want)
        if bad:
            why = ("Stop tokens are off here (pass stop_token_ids=()): every answer has exactly its max_new_tokens."
                   if len(got[i]) < n else "Padding must never be attended to (or written to the cache).")
            raise AssertionError(f"prompt {i} ({len(p)} tokens, batched with prompts of {sizes} tokens): {bad}. {why}")
    if max(rows, default=0) > batch_size or max(rows, default=0) < min(batch_size, 2) or len(rows) != sum(calls):
        raise AssertionError(f"{len(prompts)} prompts in groups of {batch_size} (answers of {new} tokens): the model "
                             f"ran {len(rows)} times with batches of {sorted(set(rows))} rows; static batching runs each "
                             f"group together until its own longest answer ends: {' + '.join(map(str, calls))} = "
                             f"{sum(calls)} calls with up to {batch_size} rows (one prefill and the decode steps). "
                             "Generating each prompt alone (or all at once) is not static batching.")
