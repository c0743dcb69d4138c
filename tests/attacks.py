"""The four ways a notebook can patch its own grading from inside the kernel (issue 20), as cells to insert.

Each is a code cell a learner could add to a submission. When test cells ran in the learner's kernel, each won
points for unanswered exercises (lab 00: 32 of 32 CPU points for the first two, 28 for the fourth); with test
cells run by the judge (autograder/judge.py) none of them earns anything.
"""

from __future__ import annotations

import nbformat

NO_OP_CHECKS = """\
import importlib, pkgutil, autograder
for info in pkgutil.iter_modules(autograder.__path__, 'autograder.'):
    if info.name.startswith('autograder.lab'):
        module = importlib.import_module(info.name)
        for name in dir(module):
            if name.startswith('check_'):
                setattr(module, name, lambda *args, **kwargs: {})
"""

FAKE_MODULES = """\
import sys, types
class _Anything(types.ModuleType):
    def __getattr__(self, name):
        return (lambda *args, **kwargs: {}) if not name.isupper() else ()
for lab in range(10):
    for name in (f'autograder.lab{lab:02d}',):
        sys.modules[name] = _Anything(name)
"""

INPUT_TRANSFORMER = """\
def _skip_tests(lines):
    text = ''.join(lines)
    return ['pass\\n'] if ('check_' in text or 'autograder' in text) else lines
get_ipython().input_transformers_cleanup.append(_skip_tests)
"""

PATCHED_HARNESS = """\
import autograder.harness as _h
_h.check_answer = lambda *args, **kwargs: None
"""

ATTACKS = {"no-op checks": NO_OP_CHECKS, "fake check modules": FAKE_MODULES,
           "input transformer": INPUT_TRANSFORMER, "patched harness": PATCHED_HARNESS}


def with_attacks(notebook_path, dest, attacks=tuple(ATTACKS)) -> None:
    """Copy a notebook, adding the chosen attacks as plain code cells before its first cell."""
    nb = nbformat.read(str(notebook_path), as_version=4)
    cells = [nbformat.v4.new_code_cell(ATTACKS[a]) for a in attacks]
    nb.cells = cells + nb.cells
    nbformat.write(nb, str(dest))
