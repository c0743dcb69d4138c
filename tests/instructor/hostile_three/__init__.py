"""The hostile class, part three (issue 55): one attack of each kind an outside review used to earn points the work
did not earn, each a module of this package graded as a one-exercise assignment by the real `autograde`
(tests/instructor/test_hostile_class_three.py).

Each module defines KIND, SETUP (a locked cell before the answer; may be empty), SOLUTION (an honest answer),
CHECK (the test cell, as in the lab), POINTS, and ATTACK (the hostile answer), and says in its docstring what the
attack did, what it earned before and why it earns nothing now.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

FIELDS = ("KIND", "SETUP", "SOLUTION", "CHECK", "POINTS", "ATTACK")


def kinds() -> dict[str, ModuleType]:
    """{module stem: module} of every attack kind in this package."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        missing = [name for name in FIELDS if not hasattr(module, name)]
        if missing:
            raise AttributeError(f"{module.__name__} lacks {', '.join(missing)}")
        found[info.name] = module
    return found
