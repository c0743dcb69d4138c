"""The package's reference handed in as an answer is refused: the object itself, a partial or bound method of it,
a subclass that inherits the asked-for methods, code from the package, and a thin wrapper that calls it."""

from __future__ import annotations

import functools

import pytest

from autograder.checking.reference_guard import ReferenceHandedIn, no_calls_into, own_work
from minigpt.cache.block_pool import BlockPool
from minigpt.costmodel import calculators
from minigpt.costmodel.calculators import PRESETS, kv_cache_bytes

SHAPE = PRESETS["Llama-3-8B"]


def learner_kv_cache_bytes(shape, context_len, batch, bytes_per_element=2):
    return 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * context_len * batch * bytes_per_element


def wrapper_kv_cache_bytes(shape, context_len, batch, bytes_per_element=2):
    return calculators.kv_cache_bytes(shape, context_len, batch, bytes_per_element)


class InheritingPool(BlockPool):
    pass


class OwnPool(BlockPool):
    def allocate(self, n: int = 1) -> list[int]:
        return [self._free.pop() for _ in range(n)] if hasattr(self, "_free") else []


class DelegatingPool(BlockPool):
    def allocate(self, n: int = 1) -> list[int]:
        return super().allocate(n)


def test_learner_code_passes():
    own_work(learner_kv_cache_bytes, kv_cache_bytes, what="Exercise 3")
    own_work(OwnPool, BlockPool, what="Exercise 1", methods=("allocate",))
    with no_calls_into(kv_cache_bytes, what="Exercise 3"):
        assert learner_kv_cache_bytes(SHAPE, 8192, 1) == 2**30


@pytest.mark.parametrize("answer", [kv_cache_bytes, functools.partial(kv_cache_bytes, bytes_per_element=2),
                                    staticmethod(kv_cache_bytes)], ids=["itself", "partial", "staticmethod"])
def test_the_reference_itself_is_refused(answer):
    with pytest.raises(ReferenceHandedIn, match="Exercise 3: this is the course's reference"):
        own_work(answer, kv_cache_bytes, what="Exercise 3")


def test_other_package_code_is_refused():
    with pytest.raises(ReferenceHandedIn, match="is defined in calculators.py, not in your notebook"):
        own_work(calculators.kv_bytes_per_token, kv_cache_bytes, what="Exercise 3")


def test_subclass_inheriting_the_asked_methods_is_refused():
    with pytest.raises(ReferenceHandedIn, match="inherits allocate from the course's reference"):
        own_work(InheritingPool, BlockPool, what="Exercise 1", methods=("allocate",))


def test_a_thin_wrapper_is_refused_when_run():
    own_work(wrapper_kv_cache_bytes, kv_cache_bytes, what="Exercise 3")      # looks like the learner's own...
    with pytest.raises(ReferenceHandedIn, match=r"calls the course's reference \(kv_cache_bytes\)"):
        with no_calls_into(kv_cache_bytes, what="Exercise 3"):
            wrapper_kv_cache_bytes(SHAPE, 8192, 1)                          # ...until it runs


def test_super_call_into_the_reference_class_is_refused():
    with pytest.raises(ReferenceHandedIn, match=r"BlockPool.allocate"):
        with no_calls_into(BlockPool, what="Exercise 1", allow=("BlockPool.__init__",)):
            DelegatingPool(8, 16).allocate(2)


def test_allowed_constructor_is_not_a_delegation():
    with no_calls_into(BlockPool, what="Exercise 1", allow=("BlockPool.__init__",)):
        OwnPool(8, 16)


def test_profiler_is_restored():
    import sys

    before = sys.getprofile()
    with pytest.raises(ReferenceHandedIn):
        with no_calls_into(kv_cache_bytes, what="x"):
            kv_cache_bytes(SHAPE, 1, 1)
    assert sys.getprofile() is before
