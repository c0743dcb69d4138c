"""Lab 02, exercise 4: the block manager against a hypothesis state machine with a shadow of the K/V pools."""

from __future__ import annotations

import contextlib
import functools
import random
from typing import Any, Callable

from autograder.harness import call_learner, quiet
from autograder.checking.drawn import fixed_example_source
from autograder.checking.reference_guard import ReferenceHandedIn, no_calls_into, own_work
from autograder.checking.wire import Callback, class_of, del_attribute, is_class, is_remote, vars_of
from minigpt.cache.block_manager import BlockManager as ReferenceBlockManager
from minigpt.cache.block_pool import BlockPool as ReferenceBlockPool
from minigpt.cache.block_pool import OutOfBlocks
from minigpt.cache.prefix_cache import hash_block as reference_hash_block

__all__ = ["make_state_machine", "check_block_manager", "run_state_machine", "manager_class", "fixed_example_source",
           "exercise_4_alone", "GRADED_EXAMPLES",
           "STEPS_PER_EXAMPLE", "MANAGER_WHAT", "MANAGER_METHODS"]

MANAGER_WHAT = "Exercise 4 (BlockManager)"
MANAGER_METHODS = ("add_sequence", "append_tokens", "fork", "free")

GRADED_EXAMPLES = 60        # state-machine examples in the graded check (seeded, about 10 s on 2 cores)
STEPS_PER_EXAMPLE = 30

_call = functools.partial(call_learner, passthrough=(OutOfBlocks,))


EARLIER_PIECES = ("pool_class", "hash_fn")      # the notebook's BlockManager: exercises 1 and 3


@contextlib.contextmanager
def exercise_4_alone(manager: type | Callable[[int, int, bool], Any]) -> Any:
    """Yield make_manager(num_blocks, block_size, prefix) for the learner's manager, graded on its own: given the
    notebook's class, its `pool_class` and `hash_fn` (the learner's exercises 1 and 3) are the package's BlockPool and
    hash_block for the duration, and the learner's are put back afterwards. A factory is used as it is."""
    if not is_class(manager):
        yield manager
        return
    own = vars_of(manager)
    saved = {name: own[name] for name in EARLIER_PIECES if name in own}
    # Judged, BlockPool arrives in the kernel as the package's class (by path); the hash as a wire.Callback, so the
    # kernel's manager calls back here for each hash (the judge's own hash_block, which the kernel cannot patch).
    manager.pool_class = ReferenceBlockPool
    manager.hash_fn = Callback(reference_hash_block) if is_remote(manager) else staticmethod(reference_hash_block)
    try:
        yield lambda num_blocks, block_size, prefix: manager(num_blocks, block_size, enable_prefix_caching=prefix)
    finally:
        for name in EARLIER_PIECES:
            if name in saved:
                setattr(manager, name, saved[name])
            else:
                del_attribute(manager, name)


def manager_class(make_manager: Callable[[int, int, bool], Any]) -> type:
    """The class of the learner's manager (built once, small), checked against the package's BlockManager."""
    manager = _call("make_manager(4, 2, True)", make_manager, 4, 2, True)
    own_work(class_of(manager), ReferenceBlockManager, what=MANAGER_WHAT, methods=MANAGER_METHODS,
             given=EARLIER_PIECES)
    return class_of(manager)


# ---------------------------------------------------------------------------------------------------
# The state machine
# ---------------------------------------------------------------------------------------------------

def make_state_machine(make_manager: Callable[[int, int, bool], Any],
                       hash_fn: Callable[[int | None, list[int]], int] = reference_hash_block,
                       watch: Callable[[], Any] = contextlib.nullcontext) -> type:
    """A hypothesis RuleBasedStateMachine over a manager built by make_manager(num_blocks, block_size, prefix)
    (autograder/lab02/paged_cache_machine.py: the shadow of the K/V pools and the invariants)."""
    from autograder.lab02.paged_cache_machine import machine_for

    return machine_for(make_manager, hash_fn, watch)


def check_block_manager(manager: type | Callable[[int, int, bool], Any],
                        hash_fn: Callable[[int | None, list[int]], int] = reference_hash_block, *,
                        max_examples: int = GRADED_EXAMPLES, seed: int = 0, shrink: bool = False) -> int:
    """Run the state machine for `max_examples` seeded examples; returns the number run. `manager`: the notebook's
    BlockManager class (graded alone: see exercise_4_alone) or a factory make_manager(num_blocks, block_size, prefix).
    On failure the AssertionError carries the failing sequence of steps (shrunk to a minimal one if `shrink`:
    slower). The package's BlockManager is refused (itself, a subclass inheriting the methods, a wrapper calling it)."""
    from autograder.lab02.paged_cache_machine import check_copy_on_write_at_exhaustion

    with exercise_4_alone(manager) as make_manager:
        manager_class(make_manager)
        watch = lambda: no_calls_into(ReferenceBlockManager, what=MANAGER_WHAT)      # noqa: E731
        run = run_state_machine(make_manager, hash_fn, max_examples=max_examples, seed=seed, shrink=shrink,
                                watch=watch)
        check_copy_on_write_at_exhaustion(make_manager, watch)
        return run


def run_state_machine(make_manager: Callable[[int, int, bool], Any],
                      hash_fn: Callable[[int | None, list[int]], int] = reference_hash_block, *,
                      max_examples: int = GRADED_EXAMPLES, seed: int = 0, shrink: bool = False,
                      watch: Callable[[], Any] = contextlib.nullcontext) -> int:
    """The state machine alone: the package's own tests run it on the package's BlockManager. `watch()`: a context
    around every call into the manager (the graded check refuses calls into the reference there, not during
    hypothesis's own work, which a profiler would slow down twofold). Returns the number of examples run."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    machine = make_state_machine(make_manager, hash_fn, watch)
    count = {"n": 0}

    class Counted(machine):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            count["n"] += 1

    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    cfg = settings(max_examples=max_examples, stateful_step_count=STEPS_PER_EXAMPLE, deadline=None, database=None,
                   derandomize=True, print_blob=False, report_multiple_bugs=False, phases=phases,
                   suppress_health_check=list(HealthCheck))
    try:
        with quiet(), fixed_example_source():
            random.seed(seed)
            run_state_machine_as_test(Counted, settings=cfg)
    except ReferenceHandedIn:
        raise                   # the refusal's own message, not a state-machine failure
    except AssertionError as err:
        steps = [line for note in getattr(err, "__notes__", []) for line in note.splitlines()
                 if line.startswith("state.") and not line.startswith("state.check_")]
        shown = "\n".join(steps[-25:])
        raise AssertionError(f"block manager state machine: {err}" + (f"\nSteps that led there:\n{shown}" if shown else "")) from None
    return count["n"]
