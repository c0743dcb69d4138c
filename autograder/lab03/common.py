"""What the lab 03 checks share (the small model is autograder.checking.models's): seeded tokens and requests, the driver's fake tokens, the
refusal of the reference scheduler (own_scheduler, learner_scheduling, construct), the scheduler's own BlockManager
(manager_beside) and messages that name the exercise (failures_named)."""

from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass
from typing import Any, Hashable, Iterator

import torch

from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.checking.wire import is_remote, run_where
from minigpt.cache.block_manager import BlockManager
from minigpt.engine.baselines import StaticBatchScheduler
from minigpt.engine.prefix_scheduler import PrefixCachingScheduler
from minigpt.engine.request import Request
from minigpt.engine.scheduler import Scheduler, SchedulerConfig

# The learner's continuous scheduler must save at least this fraction of the reference's step reduction over
# static batching (a deterministic count: no timing noise). The reference needs about 2.6x fewer steps (145 vs 56) on
# the skewed workload below; a scheduler that only refills when the batch empties gets 1x.
SPEED_MIN_FRACTION = 0.8
# GPU tier: wall time, threshold calibrated per GPU class by `make calibrate` (autograder/gpu_tier/calibrate.py) between the
# reference's ratio and that of a scheduler that refills only when the batch empties (static batching in disguise).
GPU_SPEED_CHECK = "lab03_continuous_speedup_gpu"


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


def construct(scheduler_cls: type, manager: BlockManager, config: SchedulerConfig, max_model_len: int, *,
              guard: bool = True) -> Any:
    """scheduler_cls(manager, config, max_model_len=...), refusing the reference first (unless guard=False)."""
    if guard:
        own_scheduler(scheduler_cls)
    try:
        return scheduler_cls(manager, config, max_model_len=max_model_len)
    except NotImplementedError:
        raise AssertionError("the scheduler is not implemented yet (NotImplementedError)") from None


@contextlib.contextmanager
def failures_named(what: str) -> Iterator[None]:
    """A plain AssertionError of the block comes out prefixed with `what` (a refusal of the reference, a subclass,
    unchanged)."""
    try:
        yield
    except AssertionError as err:
        if type(err) is not AssertionError or str(err).startswith(what):
            raise
        raise AssertionError(f"{what}: {err}") from None


@dataclass(frozen=True)
class Pool:
    """What a check built the scheduler with: its config and its BlockManager's size."""

    config: SchedulerConfig
    num_blocks: int
    block_size: int

    @classmethod
    def of(cls, scheduler: Any) -> "Pool":
        """Read from a scheduler of the judge's own (the package's tests); a learner's scheduler does not say."""
        if is_remote(scheduler):
            raise TypeError("a learner's scheduler does not tell the judge its pool: pass the Pool the check built")
        return cls(scheduler.config, scheduler.manager.pool.num_blocks, scheduler.manager.block_size)


def scheduler_on(scheduler_cls: type, pool: Pool, max_model_len: int) -> Any:
    """A new scheduler_cls on a BlockManager of its own of the pool's size (`manager_beside`); the check has refused
    the reference already."""
    manager = manager_beside(scheduler_cls, pool.num_blocks, pool.block_size)
    return construct(scheduler_cls, manager, pool.config, max_model_len, guard=False)


def manager_beside(scheduler_cls: Any, num_blocks: int, block_size: int) -> BlockManager:
    """The scheduler's own BlockManager, built where `scheduler_cls` lives (in the learner's kernel when judged: a
    manager of the judge's would make every block operation a round trip). Its working memory, never evidence: the
    judge reads no state of it, and checks the slots each step returns against blocks it assigns itself
    (`stepping.JudgedRun`)."""
    return run_where(scheduler_cls, BlockManager, num_blocks, block_size)


def _fake_token(seq_id: Hashable, index: int) -> int:
    """A fixed function of (id, index), the same in every process (Python's hash() of a str is salted)."""
    return 2 + zlib.crc32(repr((seq_id, index)).encode()) % 50


def _request(rid: Hashable, prompt_len: int, new: int, g: torch.Generator) -> Request:
    return Request(rid, _rand_tokens(prompt_len, g), new, stop_token_ids=())


