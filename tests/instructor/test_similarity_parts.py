"""The similarity report's parts: the normal form hides what a copier changes and keeps what the code does; carried
code is named (and what a blob holds); fingerprints are the same in every process; the course's own notebooks carry
nothing."""

from __future__ import annotations

import base64
import os
import inspect
import marshal
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import nbformat
import pytest

from autograder.grading import carried, normal_form
from autograder.grading.fingerprints import K, W, fingerprints
from minigpt.engine.packed_batch import pack_chunks

PLAIN = '''def total(xs, scale):
    out = 0
    for x in xs:
        out += x * scale
    return out
'''

# The same code, as a copier hides it: renamed, annotated, commented, documented, a statement without effect after
# every statement, a constant `if`, a passing `try`, a dead local.
DISGUISED = '''def total(values: list[float], factor: float = None) -> float:
    """Sum of the scaled values."""
    acc: float = 0          # running sum
    pass
    if True:
        for v in values:
            try:
                acc = acc + v * factor
            except Exception:
                pass
            ...
    unused = 3
    None
    while False:
        acc = 1
    return acc
'''


def _texts(source: str) -> list[str]:
    return [t.text for t in normal_form.tokens(source)]


def test_normal_form_hides_names_formatting_and_statements_without_effect():
    assert _texts(DISGUISED) == _texts(PLAIN.replace("(xs, scale)", "(xs, scale=None)"))


@pytest.mark.parametrize("changed", [PLAIN.replace("x * scale", "x + scale"),
                                     PLAIN.replace("return out", "return -out"),
                                     PLAIN.replace("for x in xs:", "for x in sorted(xs):"),
                                     PLAIN.replace("out = 0", "out = 1")])
def test_normal_form_keeps_what_the_code_does(changed):
    assert _texts(changed) != _texts(PLAIN)


def test_imports_read_as_what_they_import_and_the_api_keeps_its_names():
    assert _texts("import numpy as xp\nxp.zeros(3)") == _texts("import numpy\nnumpy.zeros(3)")
    assert _texts("y = torch.zeros(3)") != _texts("y = torch.ones(3)")


def test_ipython_syntax_is_read_as_ipython_runs_it():
    assert _texts("%%time\ny = helper(1)\n")[-5:] == ["Assign", "V", "Call", "helper", "1"]
    assert ("y = helper(1)", 1) in carried.hidden_sources("%time y = helper(1)\n!ls\n")   # the magic's code: a string


def test_fingerprints_are_the_same_in_every_process_and_find_every_long_shared_run():
    tokens = normal_form.tokens(inspect.getsource(pack_chunks))
    here = sorted(fingerprints(tokens).hashes)
    code = ("import inspect; from autograder.grading import normal_form; from autograder.grading.fingerprints import "
            "fingerprints; from minigpt.engine.packed_batch import pack_chunks; "
            "print(sorted(fingerprints(normal_form.tokens(inspect.getsource(pack_chunks))).hashes))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"}, cwd=Path(__file__).parents[2])
    assert str(here) == there.stdout.strip()
    run = tokens[5:5 + K + W - 1]
    assert fingerprints(run).hashes & fingerprints(tokens).hashes


def _what(source: str) -> str:
    return "; ".join(c.what for c in carried.findings(source))


def _blob(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data)).decode()


@pytest.mark.parametrize("source, expected", [
    ("import marshal\nf = marshal.loads(b)", "import marshal"),
    ("from pickle import loads", "from pickle import loads"),
    ("exec(src)", "exec"),
    ("run = eval\nrun('1')", "eval"),
    ("code = compile(src, 'x', 'exec')", "compile"),
    ("m = __import__('mar' + 'shal')", "__import__"),
    ("import importlib\nm = importlib.import_module(name)", "import importlib"),
    ("import types as t\nf = t.FunctionType(code, globals())", "types.FunctionType"),
    ("from types import CodeType", "from types import CodeType"),
    ("g.__code__ = f.__code__", ".__code__"),
    ("c = getattr(f, '__code__')", "getattr(..., '__code__')"),
    ("import sys\nsys.modules['minigpt'] = fake", "sys.modules"),
    ("%run helper.py", "IPython magic %run"),
    ("!python helper.py", "a shell escape (!)"),
    ("get_ipython().run_cell(src)", "get_ipython().run_cell"),
    ("data = bytes.fromhex(h)", ".fromhex"),
])
def test_each_way_of_carrying_code_is_named(source, expected):
    assert expected in _what(source)


def test_a_blob_is_decoded_and_names_the_package_function_it_holds():
    code = marshal.dumps(pack_chunks.__code__)
    found = _what(f"BLOB = {_blob(code)!r}")
    assert "base64 -> zlib -> the bytecode of minigpt.engine.packed_batch.pack_chunks" in found
    assert "the bytecode of minigpt.engine.packed_batch.pack_chunks" in _what(f"BLOB = {code!r}")
    assert "the bytecode of minigpt.engine.packed_batch.pack_chunks" in _what(f"BLOB = {code.hex()!r}")
    pieces = _blob(code)
    split = " + ".join(repr(pieces[i:i + 40]) for i in range(0, len(pieces), 40))
    assert "the bytecode of minigpt.engine.packed_batch.pack_chunks" in _what(f"BLOB = {split}")
    assert "a pickle" in _what(f"P = {base64.b64encode(pickle.dumps({'a': list(range(40))})).decode()!r}")


def test_source_carried_in_a_string_is_read_as_code():
    source = inspect.getsource(pack_chunks)
    for cell in (f"SRC = {source!r}", f"SRC = {base64.b64encode(source.encode()).decode()!r}"):
        [(text, line)] = [(t, n) for t, n in carried.hidden_sources(cell) if "def pack_chunks" in t]
        assert text == source and line == 1
    assert "Python source" in _what(f"SRC = {_blob(source.encode())!r}")


def test_opaque_blobs_are_named_and_text_is_not():
    assert "an opaque blob of 600 characters" in _what(f"X = {'q' * 600!r}")
    prose = "The decode step's weights from a model's state dict, one tensor a layer. " * 20
    assert _what(f"X = {prose!r}\nY = 'attn_norm'\nZ = 'qkv'") == ""


def test_the_course_notebooks_carry_no_code(repo_root):
    """No false finding on the course's own cells: every code cell of every lab and solution notebook."""
    found = []
    for path in sorted((repo_root / "solutions").glob("*/*.ipynb")) + sorted((repo_root / "labs").glob("*/*.ipynb")):
        for n, cell in enumerate(nbformat.read(str(path), as_version=4).cells, 1):
            if cell.cell_type == "code":
                found += [f"{path.name} cell {n}: {c.what}" for c in carried.findings(cell.source)]
    assert not found, found
