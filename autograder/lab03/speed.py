"""The speed checks: model steps (a deterministic proxy, CPU tier) and wall time on a GPU, relative to the reference."""

from __future__ import annotations

from typing import Any, Callable

import torch

from autograder.harness import call_learner, quiet
from autograder.lab03.common import (GPU_SPEED_CHECK, SPEED_MIN_FRACTION, _fake_token, _request, construct,
                                     manager_beside)
from autograder.lab03.packing import refuse_thin_pack
from autograder.lab03.scheduler import refuse_thin_wrapper, scheduler_view
from autograder.checking.reference_guard import own_work
from autograder.checking.wire import run_where
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


def _steps(make: Callable[[BlockManager], Any], arrivals: list, side: Any = None) -> int:
    """Steps to serve `arrivals` with fake tokens: make(manager) builds the scheduler; its manager is built beside
    `side` (the learner's class: in the kernel when judged), and each step is read back in one `scheduler_view`."""
    sch = make(manager_beside(side, 400, 4) if side is not None else BlockManager(400, 4))
    ends_arrivals = hasattr(sch, "end_of_arrivals")
    pending, step = sorted(arrivals, key=lambda x: x[0]), 0
    unfinished = False
    while pending or unfinished:
        while pending and pending[0][0] <= step:
            sch.add_request(pending.pop(0)[1])
        if len(pending) == 0 and ends_arrivals:
            sch.end_of_arrivals()
        out = sch.schedule()
        chunks = run_where(sch, scheduler_view, sch, out=out)["chunks"]
        sampled = {c["seq_id"]: _fake_token(c["seq_id"], c["num_output"]) for c in chunks
                   if c["start"] + len(c["tokens"]) == c["num_tokens"]}
        sch.update(out, sampled, float(step))
        unfinished = run_where(sch, scheduler_view, sch)["unfinished"]
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
        refuse_thin_wrapper(scheduler_cls)
        learner = call_learner("the skewed workload", _steps, lambda m: construct(scheduler_cls, m, cfg, 96), arrivals,
                               scheduler_cls)
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
