"""Seeded examples drawn by hypothesis, for checks that claim generality (sizes, dtypes, layouts, tiles, magnitudes).

    cases = drawn_examples(attention_case(), 6)     # the same 6 examples in every process, on every machine

A check runs its fixed cases first, then these: hypothesis picks the combinations (and tries its simplest values,
the edges, first), the check runs each one itself and says which one failed, so a failure names a case a learner
can rerun. Nothing is shrunk and no example database is written.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Iterator

__all__ = ["drawn_examples", "fixed_example_source"]


@contextlib.contextmanager
def fixed_example_source() -> Iterator[None]:
    """Hypothesis with derandomize=True still mixes into its examples the constants it finds in the source of every
    loaded local module (hypothesis.internal.conjecture.providers, 6.1xx), so a notebook kernel and a script draw
    different examples. Inside this block it draws from its fixed global constants only; the Python `random`
    state is seeded and restored."""
    from hypothesis.internal.conjecture import providers

    empty = providers.Constants()
    saved_get, saved_state = providers._get_local_constants, random.getstate()
    providers.CONSTANTS_CACHE.cache.clear()
    providers._get_local_constants = lambda: empty
    random.seed(0)
    try:
        yield
    finally:
        providers._get_local_constants = saved_get
        providers.CONSTANTS_CACHE.cache.clear()
        random.setstate(saved_state)


def drawn_examples(strategy: Any, count: int) -> list[Any]:
    """`count` examples of a hypothesis strategy (fewer when it has fewer distinct values), the same list in every
    process: derandomized, no database, no local constants, no shrinking."""
    from hypothesis import HealthCheck, Phase, given, settings

    examples: list[Any] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(strategy)
    def collect(example: Any) -> None:
        if example not in examples:
            examples.append(example)

    with fixed_example_source():
        collect()
    return examples[:count]
