"""A test cell whose checks refuse the reference is graded again in a witness whose package lacks it
(autograder/judging/witness.py, autograder/judging/reference_removal.py): what the kernel reports about its own code no longer
decides whether it called the reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.grading.preprocessors import StoppingExecute
from autograder.judging import reference_removal
from autograder.judging.reference_removal import MARKER, handed_over, package_without, removals, removed_name
from autograder.judging.witness import cells_needed

SLOT_TEST = "from autograder.lab02 import check_slot_mapping\ncheck_slot_mapping(slot_of)"
HASH_TEST = "from autograder.lab02 import check_block_hash\ncheck_block_hash(hash_block)"

HONEST = ("def slot_of(table, position, block_size):\n"
          "    index = position // block_size\n"
          "    if position < 0 or index >= len(table):\n"
          "        raise ValueError(f'position {position} is past the table')\n"
          "    return table[index] * block_size + position % block_size\n")

HONEST_HASH = ("def hash_block(parent, tokens):\n"
               "    return hash((parent, tuple(tokens)))\n")

# Each wins the cell when the kernel's own report decides (COURSE_WITNESS=0): the kernel's watch is switched off,
# or the reference runs as code the watch does not know.
FORGERIES = {
    "wrapper, kernel's watch switched off": (
        "from minigpt.cache.block_table import slot_of as _reference\n"
        "def slot_of(table, position, block_size):\n"
        "    return _reference(table, position, block_size)\n"
        "import autograder.judging.observe as _observe\n"
        "_observe.observed_call = lambda call, options: (call(), {})\n"),
    "reference's source read from disk and run": (
        "import pathlib, minigpt.cache.block_table as _module\n"
        "_copy = {}\n"
        "exec(pathlib.Path(_module.__file__).read_text(), _copy)\n"
        "def slot_of(table, position, block_size):\n"
        "    return _copy['slot_of'](table, position, block_size)\n"
        "import autograder.checking.reference_guard as _guard, contextlib\n"
        "_guard.no_calls_into = lambda *refs, **how: contextlib.nullcontext()\n"),
}


def _test_cell(source: str):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": "t1", "points": 1,
                                 "schema_version": 3}
    return cell


def _run(tmp_path, *cells, monkeypatch):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.from_dict(c) for c in cells]
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv("COURSE_JUDGE", "1")
    StoppingExecute(timeout=120).preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    return nb


def _errors(cell) -> list[str]:
    return [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]


# ----------------------------------------------------------------------------- the package without the reference

def test_removals_name_the_guarded_functions_less_the_allowed_ones():
    guards = [{"refs": ["minigpt.cache.block_pool:BlockPool"], "what": "Ex 1", "allow": ["BlockPool.__init__"]},
              {"refs": ["minigpt.cache.block_table:slot_of", "torch.nn.functional:softmax"], "what": "Ex 2"}]
    names = {qualname for _, qualname, _, _ in removals(guards)}
    assert {"BlockPool.allocate", "BlockPool.free", "slot_of"} <= names
    assert "BlockPool.__init__" not in names and "softmax" not in names      # allowed; not the course's


def test_the_copy_raises_in_the_removed_functions_only(tmp_path):
    shadow = package_without(removals([{"refs": ["minigpt.cache.block_table:slot_of"], "what": "Ex 2"}]), tmp_path)
    code = ("import minigpt.cache.block_table as m\n"
            "print(m.__file__)\n"
            "print(m.slot_mapping.__name__)\n"
            "m.slot_of([1], 0, 4)\n")
    run = subprocess.run([sys.executable, "-P", "-c", code], env={"PYTHONPATH": str(shadow), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert run.stdout.splitlines()[0].startswith(str(tmp_path))
    assert "RuntimeError" in run.stderr and MARKER in run.stderr
    assert "_reference" not in (shadow / "minigpt/cache/block_table.py").read_text()
    assert "table[index] * block_size" not in (shadow / "minigpt/cache/block_table.py").read_text()
    assert removed_name(run.stderr.strip().splitlines()[-1]) == "slot_of"


def test_a_removal_that_names_no_function_there_is_refused(tmp_path):
    with pytest.raises(ValueError):
        package_without([["minigpt/cache/block_table.py", "slot_of", 1]], tmp_path / "a")
    with pytest.raises(ValueError):
        package_without([["../../etc/passwd.py", "x", 1]], tmp_path / "b")


# ----------------------------------------------------------------------------- the reference's helpers go with it

SHARD = {"refs": ["minigpt.parallel.sharding:shard_parameter"], "what": "Exercise 1 (shard_weight)"}
SHARD_HELPERS = {"shard_slices", "check_tp", "parameter_kind", "query_heads", "kv_heads", "ffn_units", "vocab_rows",
                 "_heads_to_rows", "_as_slice"}


def _removed(guards: list[dict]) -> dict[str, dict | None]:
    return {qualname: helper for _, qualname, _, helper in removals(guards)}


def test_the_functions_of_its_module_a_reference_calls_go_with_it_transitively():
    removed = _removed([SHARD])
    assert removed["shard_parameter"] is None                       # the reference itself
    assert set(removed) == {"shard_parameter"} | SHARD_HELPERS      # shard_slices, and what shard_slices calls
    assert removed["shard_slices"]["reaches"] == sorted(SHARD_HELPERS - {"shard_slices"})
    assert removed["query_heads"]["reaches"] == ["check_tp"]
    # another module's functions stay: tp_kv_cache calls sharding.kv_heads, the KV cache classes and the config
    assert set(_removed([{"refs": ["minigpt.parallel.tp_model:tp_kv_cache"], "what": "Exercise 4"}])) == {"tp_kv_cache"}


def test_a_reference_the_course_offers_to_continue_with_stays_with_what_it_calls():
    """Lab 06: generate_speculative calls sampling_probs and verify_draft, Exercises 2 and 3's references (the
    exercise map's), which Exercise 4 may build on."""
    assert set(_removed([{"refs": ["minigpt.engine.speculative:generate_speculative"], "what": "Exercise 4"}])) == {
        "generate_speculative"}


def test_what_the_guard_allows_stays_with_what_it_calls():
    pool = {"refs": ["minigpt.cache.block_pool:BlockPool"], "what": "Exercise 1"}
    assert "check_block_size" in _removed([pool])                  # only the class's methods call it
    assert "check_block_size" not in _removed([{**pool, "allow": ["BlockPool.__init__"]}])    # __init__ calls it


def test_what_a_module_runs_on_import_stays():
    from minigpt.costmodel import parallel_cost

    on_import = reference_removal._run_on_import({parallel_cost.tp_allreduce_bytes_per_token.__code__})
    assert parallel_cost.pcie_bandwidth.__code__ in on_import       # INTERCONNECTS is built with it


def test_the_helpers_the_lab_hands_over_stay_and_the_others_go(tmp_path):
    """The released notebook of the refusing check's lab names what the learner may use: lab 07's shows check_tp,
    query_heads, kv_heads, ffn_units and parameter_kind (and what they call), never shard_slices."""
    removed = removals([{**SHARD, "lab": "07"}])
    kept = {qualname for _, qualname in handed_over(removed)}
    assert kept == {"check_tp", "query_heads", "kv_heads", "ffn_units", "parameter_kind"}
    assert handed_over(removals([SHARD])) == set()                  # a guard without a lab hands nothing over
    lab = tmp_path / "07_tensor_parallel"
    lab.mkdir()
    (lab / "07_tensor_parallel.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["Use `sharding.shard_slices(name, cfg, tp, rank)`; shard_parameter"]},
        {"cell_type": "code", "source": ["print(sharding.vocab_rows)"]}]}))
    assert {q for _, q in handed_over(removed, labs_dir=tmp_path)} == SHARD_HELPERS    # shard_slices reaches them all
    assert handed_over(removed, labs_dir=tmp_path / "none") == set()


def test_the_guards_name_the_lab_of_the_check():
    from autograder import lab07
    from autograder.checking import reference_guard
    from tests.labs.notebook_solutions import solution_cells

    ns = solution_cells("07_tensor_parallel", "ex1_code",
                        preamble="import torch\nfrom minigpt.config import ModelConfig")
    reference_guard.guarded()
    lab07.check_shard_weight(ns["shard_weight"])
    assert {guard["lab"] for guard in reference_guard.guarded()} == {"07"}


def test_a_removed_helper_says_so(tmp_path):
    shadow = package_without(removals([SHARD]), tmp_path)
    code = "from minigpt.parallel import sharding\nsharding.shard_slices('tok_emb.weight', None, 1, 0)\n"
    run = subprocess.run([sys.executable, "-P", "-c", code], env={"PYTHONPATH": str(shadow), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert removed_name(run.stderr.strip().splitlines()[-1]) == "shard_slices, a helper of the reference"
    source = (shadow / "minigpt/parallel/sharding.py").read_text()
    assert "_heads_to_rows(query_heads" not in source and "def local_linear_shape" in source


# ----------------------------------------------------------------------------- which cells are replayed

def test_only_the_cells_that_define_what_the_check_reads_are_replayed():
    cells = ["import torch\nBLOCK = 4",                     # 0: read by the answer
             "table = [3, 1]\nprint(table)",                 # 1: not needed
             "def helper(p):\n    return p // BLOCK",         # 2: read by the answer
             "for _ in range(10**9): pass",                   # 3: a measurement: not needed
             "def slot_of(t, p, b):\n    return t[helper(p)] * b",   # 4: the answer
             "slot_of([1], 0, 4)"]                            # 5: a demo: not needed
    assert cells_needed(cells, ["slot_of"]) == [0, 2, 4]
    assert cells_needed(cells, ["nothing"]) == []
    assert cells_needed(["from math import *", "x = floor(2.5)", "not python ("], ["x"]) == [0, 1]


# ----------------------------------------------------------------------------- graded end to end

@pytest.mark.slow
def test_an_honest_answer_passes_in_the_witness(tmp_path, monkeypatch):
    """... in each of two test cells whose checks refuse different references, and one witness process serves both:
    it imports torch once and forks a witness per test cell, each with its own copy of the package."""
    from autograder.judging import witness

    started, forked = [], []
    init, start = witness.WitnessProcess.__init__, witness.WitnessProcess.start
    monkeypatch.setattr(witness.WitnessProcess, "__init__", lambda self, *a: (started.append(a), init(self, *a))[1])
    monkeypatch.setattr(witness.WitnessProcess, "start",
                        lambda self, request, cells: (forked.append(request["removals"]), start(self, request, cells))[1])
    hash_test = _test_cell(HASH_TEST)
    hash_test.metadata["nbgrader"]["grade_id"] = "t2"
    nb = _run(tmp_path, nbformat.v4.new_code_cell("import math\nprint('hello')"),
              nbformat.v4.new_code_cell(HONEST + HONEST_HASH), _test_cell(SLOT_TEST), hash_test, monkeypatch=monkeypatch)
    assert _errors(nb.cells[2]) == [] and _errors(nb.cells[3]) == []
    assert len(forked) == 2 and forked[0] != forked[1], forked
    assert len(started) == 1, f"{len(started)} witness processes started for one notebook"


@pytest.mark.slow
@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_forged_report_earns_nothing(tmp_path, monkeypatch, forgery):
    cells = (nbformat.v4.new_code_cell(FORGERIES[forgery]), _test_cell(SLOT_TEST))
    monkeypatch.setenv("COURSE_WITNESS", "0")
    trusting = _run(tmp_path, *cells, monkeypatch=monkeypatch)
    assert _errors(trusting.cells[1]) == [], "the forgery should win where the kernel's report decides"
    monkeypatch.setenv("COURSE_WITNESS", "1")
    witnessed = _run(tmp_path, *cells, monkeypatch=monkeypatch)
    errors = _errors(witnessed.cells[1])
    assert errors and errors[0].startswith("ReferenceHandedIn") and "Exercise 2 (slot_of)" in errors[0], errors


@pytest.mark.slow
def test_the_witness_leaves_nothing_behind(tmp_path, monkeypatch):
    """Its temporary folders are gone afterwards. A private temporary folder, not /tmp: another process's witness
    (a parallel test worker) would come and go there while this one runs."""
    import tempfile

    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setenv("COURSE_WITNESS", "1")
    _run(tmp_path, nbformat.v4.new_code_cell(HONEST), _test_cell(SLOT_TEST), monkeypatch=monkeypatch)
    assert not list(private.glob("witness-*"))


@pytest.mark.slow
def test_the_references_body_typed_as_calls_of_its_helpers_earns_nothing(tmp_path, monkeypatch):
    """Lab 07, Exercise 1 answered by sharding.shard_slices, the helper shard_parameter calls (the hostile class's
    witness_helpers): it wins the cell where the kernel's report decides (as it did where the witness took out only
    the reference's own functions), and loses it in the witness; the honest answer keeps it."""
    from tests.instructor.hostile_three import witness_helpers as kind

    def graded(answer: str) -> list[str]:
        nb = _run(tmp_path, nbformat.v4.new_code_cell(kind.SETUP), nbformat.v4.new_code_cell(answer),
                  _test_cell(kind.CHECK), monkeypatch=monkeypatch)
        return _errors(nb.cells[2])

    monkeypatch.setenv("COURSE_WITNESS", "0")
    assert graded(kind.ATTACK) == []
    monkeypatch.setenv("COURSE_WITNESS", "1")
    errors = graded(kind.ATTACK)
    assert errors and errors[0].startswith("ReferenceHandedIn") and "shard_slices" in errors[0], errors
    assert graded(kind.SOLUTION) == []


# Replayed in the first test cell's witness, whose copy still has hash_block (it lacks only slot_of), this cell leaves
# hash_block's source wherever the next witness might look; replayed in the second's, it runs what it finds.
RELAY = (HONEST +
         "import contextlib, ctypes, os, pathlib, signal, socket, subprocess, sys, time\n"
         "import minigpt.cache.prefix_cache as _module\n"
         "import autograder.checking.reference_guard as _guard\n"
         "_source = pathlib.Path(_module.__file__).read_text()\n"
         "_places = ['/tmp/stash.py', '/dev/shm/stash.py', os.path.expanduser('~/stash.py'), 'stash.py']\n"
         "if 'def hash_block' in _source and 'RuntimeError' not in _source.split('def hash_block')[1][:400]:\n"
         "    for _place in _places:\n"
         "        with contextlib.suppress(OSError):\n"
         "            pathlib.Path(_place).write_text(_source)\n"
         "    subprocess.Popen([sys.executable, '-c', 'import socket, sys, time\\n'\n"
         "                      's = socket.socket(socket.AF_UNIX); s.bind(\"\\\\0stash\"); s.listen(1)\\n'\n"
         "                      'while True:\\n    c, _ = s.accept(); c.sendall(sys.argv[1].encode()); c.close()',\n"
         "                      _source], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
         "    time.sleep(1)\n"
         "else:\n"
         "    for _place in _places:\n"
         "        with contextlib.suppress(OSError):\n"
         "            _source = pathlib.Path(_place).read_text()\n"
         "            break\n"
         "    with contextlib.suppress(OSError):\n"
         "        _s = socket.socket(socket.AF_UNIX); _s.connect('\\0stash'); _source = _s.recv(1 << 20).decode()\n"
         "_copy = {}\n"
         "exec(_source, _copy)\n"
         "def hash_block(parent, tokens):\n"
         "    return _copy['hash_block'](parent, tokens)\n"
         "_guard.no_calls_into = lambda *refs, **how: contextlib.nullcontext()\n")


@pytest.mark.slow
@pytest.mark.skipif(__import__("autograder.judging.sandbox", fromlist=["probe"]).probe() is not None,
                    reason="no grading sandbox here")
def test_one_witness_hands_the_next_nothing(tmp_path, monkeypatch):
    """Witnesses are forks of one process per notebook (autograder/judging/witness.py): the first, whose copy of
    the package still holds hash_block, leaves its source in /tmp, /dev/shm, the home and work folders and with a
    process serving it; the second, forked from the same process, whose copy lacks it, finds none of them, and the
    cell is the reference's."""
    from autograder.judging import sandbox, witness

    started = []
    init = witness.WitnessProcess.__init__
    monkeypatch.setattr(witness.WitnessProcess, "__init__", lambda self, *a: (started.append(a), init(self, *a))[1])
    monkeypatch.setenv(sandbox.ENV_VAR, sandbox.SandboxPolicy().to_env())
    hash_test = _test_cell(HASH_TEST)
    hash_test.metadata["nbgrader"]["grade_id"] = "t2"
    cells = (nbformat.v4.new_code_cell(RELAY), _test_cell(SLOT_TEST), hash_test)
    monkeypatch.setenv("COURSE_WITNESS", "0")
    trusting = _run(tmp_path, *cells, monkeypatch=monkeypatch)
    assert _errors(trusting.cells[1]) == [] and _errors(trusting.cells[2]) == [], \
        "the relayed source should win where the kernel's report decides"
    monkeypatch.setenv("COURSE_WITNESS", "1")
    witnessed = _run(tmp_path, *cells, monkeypatch=monkeypatch)
    assert _errors(witnessed.cells[1]) == []
    errors = _errors(witnessed.cells[2])
    assert errors and errors[0].startswith("ReferenceHandedIn") and "hash_block" in errors[0], errors
    assert len(started) == 1, "the second witness came from a fresh process, not a fork of the first's"
