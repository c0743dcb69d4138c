"""The speed checks: model steps (a deterministic proxy, CPU tier) and wall time on a GPU, relative to the reference."""

from __future__ import annotations

from typing import Any, Callable

import torch

from autograder.harness import quiet
from autograder.lab03.common import (GPU_SPEED_CHECK, SCHEDULER, SPEED_MIN_FRACTION, Pool, _fake_token, _request,
                                     failures_named, scheduler_on)
from autograder.lab03.packing import refuse_thin_pack
from autograder.lab03.scheduler import refuse_thin_wrapper
from autograder.lab03.stepping import run_steps
from autograder.checking.reference_guard import own_work
from minigpt.cache.block_manager import BlockManager
from minigpt.cache.paged import PagedKVCache
from minigpt.config import ModelConfig
from minigpt.engine.baselines import StaticBatchScheduler
from minigpt.engine.packed_batch import pack_chunks
from minigpt.engine.request import Request
from minigpt.engine.runner import ModelRunner
from minigpt.engine.scheduler import Scheduler, SchedulerConfig
from minigpt.engine.serving_loop import serve
from minigpt.model import GPT


def _skewed_requests(n: int = 24, seed: int = 0) -> list[tuple[int, Request]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        new = 48 if i % 8 == 0 else 4            # one long answer in eight
        out.append((i // 4, _request(i, int(torch.randint(4, 12, (1,), generator=g)), new, g)))
    return out


def _own_steps(scheduler: Any, arrivals: list[tuple[int, Request]]) -> int:
    """Model steps (schedule() calls) a scheduler of the judge's own (static batching, the reference) takes to serve
    `arrivals` with fake tokens."""
    pending, step = sorted(arrivals, key=lambda x: x[0]), 0
    ends_arrivals = hasattr(scheduler, "end_of_arrivals")
    while pending or scheduler.has_unfinished():
        while pending and pending[0][0] <= step:
            scheduler.add_request(pending.pop(0)[1])
        if not pending and ends_arrivals:
            scheduler.end_of_arrivals()
        out = scheduler.schedule()
        sampled = {c.seq_id: _fake_token(c.seq_id, len(c.seq.output_tokens)) for c in out.chunks if c.samples}
        scheduler.update(out, sampled, float(step))
        step += 1
        if step > 10_000:
            raise AssertionError("the workload did not finish in 10,000 steps")
    return step


def check_continuous_speedup(scheduler_cls: type) -> dict[str, float]:
    """Model steps (each one forward call) to serve a skewed workload (1 request in 8 wants 48 tokens, the rest 4):
    static batching (batches of 8) over continuous batching, the learner's scheduler against the reference. The
    learner's steps are the schedule() calls the judge made (`stepping.run_steps`), each step's work checked."""
    arrivals = _skewed_requests()
    pool = Pool(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), 400, 4)
    static = _own_steps(StaticBatchScheduler(BlockManager(400, 4), 8, max_model_len=96), arrivals)
    with quiet():
        ref = _own_steps(Scheduler(BlockManager(400, 4), pool.config, max_model_len=96), arrivals)
        refuse_thin_wrapper(scheduler_cls)
        with failures_named(f"{SCHEDULER}, the skewed workload"):
            learner = run_steps(scheduler_on(scheduler_cls, pool, 96), arrivals, pool, max_steps=10_000).steps
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
        refuse_thin_wrapper(scheduler_cls)
        if pack_fn is not None:
            own_work(pack_fn, pack_chunks, what="Exercise 1 (pack_chunks)")
            refuse_thin_pack(pack_fn)
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
    got = learner().outputs()
    want = reference().outputs()
    if got != want:
        raise AssertionError("on this device your scheduler's outputs differ from the reference's; pass the CPU checks first")
    with quiet():
        return check_speedup(learner, static, reference, what="continuous vs static batching, skewed workload",
                             check=GPU_SPEED_CHECK, repeats=repeats, warmup=1, device=device)
