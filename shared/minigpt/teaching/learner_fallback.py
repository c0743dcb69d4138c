"""Let a demo cell run before the learner's exercise does: use theirs once it works, the package's meanwhile.

    kv_bytes = yours_or_reference(kv_cache_bytes, ref.kv_cache_bytes, "Exercise 3", shape, 1, 1, 2)

The graded checks still grade the learner's function; this only keeps a notebook's demos (and Run All) going.
"""

from __future__ import annotations

from typing import Any, Callable


def yours_or_reference(yours: Callable[..., Any], reference: Callable[..., Any], exercise: str,
                       *probe: Any) -> Callable[..., Any]:
    """`yours` if `yours(*probe)` runs, else `reference` and a one-line note naming `exercise`.

    Only a stub's NotImplementedError falls back; any other error in the learner's code is raised as is,
    so a bug shows where it is.
    """
    try:
        yours(*probe)
    except NotImplementedError:
        print(f"{exercise} is not done yet: this cell uses the package's reference meanwhile.")
        return reference
    return yours
