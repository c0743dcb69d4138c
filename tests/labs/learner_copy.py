"""The package's reference, re-run from its source as if a learner had typed it into a notebook cell.

The checks refuse the reference object itself (autograder.checking.reference_guard), so a test that shows "a correct
answer passes" hands in a copy: the same source, compiled under a cell-like file name, in a copy of the
reference module's globals (so its imports resolve), and with no link to the package's function or class.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from typing import Any


def as_learner(obj: Any, *edits: tuple[str, str], **replace: Any) -> Any:
    """A copy of the function or class `obj` compiled from its source as notebook code. `edits`: (old, new) text
    edits made once each in the source (a plausible wrong implementation; the old text must be there). `replace`:
    module-level names to rebind in the copy's globals (e.g. LayerKVCache=<a learner copy>)."""
    source = textwrap.dedent(inspect.getsource(obj))
    for old, new in edits:
        assert old in source, f"edit not applicable: {old!r}"
        source = source.replace(old, new, 1)
    namespace = dict(vars(sys.modules[obj.__module__]))
    namespace.update(replace)
    namespace["__name__"] = "__main__"
    exec(compile(source, f"<learner cell: {obj.__qualname__}>", "exec"), namespace)
    return namespace[obj.__name__]
