"""Test cells run in the judge, not in the learner's kernel: what the kernel does to its own copy of the checks
earns nothing (autograder/judging/judge.py, observe.py, the StoppingExecute preprocessor)."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attacks import ATTACKS, SILENCE_EVERYTHING  # noqa: E402

from autograder.grading.preprocessors import StoppingExecute  # noqa: E402

ANSWER = "answer = {answer}"
TEST = ("from autograder.lab00 import check_q1_kv_gib\n"
        "check_q1_kv_gib(answer)\n"
        "verdict = 'passed'")
RIGHT = ANSWER.format(answer=11.71875)


def _test_cell(source: str, grade_id: str = "t1"):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": grade_id, "points": 1,
                                 "schema_version": 3}
    return cell


def _run(tmp_path, *cells, judged: bool = True, monkeypatch=None):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = list(cells)
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv("COURSE_JUDGE", "1" if judged else "0")
    StoppingExecute(timeout=120).preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    return nb


def _errors(cell) -> list[str]:
    return [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]


@pytest.mark.slow
def test_a_right_answer_passes_and_its_assignments_reach_the_kernel(tmp_path, monkeypatch):
    nb = _run(tmp_path, nbformat.v4.new_code_cell(RIGHT), _test_cell(TEST),
              nbformat.v4.new_code_cell("print(verdict)"), monkeypatch=monkeypatch)
    assert _errors(nb.cells[1]) == []
    assert nb.cells[1].metadata["nbgrader"]["grade_id"] == "t1"       # the test cell itself, not the serving cell
    assert [o.text for o in nb.cells[2].outputs] == ["passed\n"]


@pytest.mark.slow
def test_a_wrong_answer_fails_with_the_checks_message(tmp_path, monkeypatch):
    nb = _run(tmp_path, nbformat.v4.new_code_cell(ANSWER.format(answer=12.5)), _test_cell(TEST),
              monkeypatch=monkeypatch)
    assert _errors(nb.cells[1]) and "Q1" in _errors(nb.cells[1])[0]


@pytest.mark.slow
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_patching_the_kernel_earns_nothing(tmp_path, monkeypatch, attack):
    wrong = nbformat.v4.new_code_cell(ANSWER.format(answer=0.0))
    in_kernel = _run(tmp_path, nbformat.v4.new_code_cell(ATTACKS[attack]), wrong, _test_cell(TEST), judged=False,
                     monkeypatch=monkeypatch)
    assert _errors(in_kernel.cells[2]) == [], "the attack should win when the kernel runs its own test cells"
    judged = _run(tmp_path, nbformat.v4.new_code_cell(ATTACKS[attack]), wrong, _test_cell(TEST),
                  monkeypatch=monkeypatch)
    assert _errors(judged.cells[2]), f"{attack} won a judged test cell"


@pytest.mark.slow
def test_a_kernel_that_never_answers_fails_the_cell(tmp_path, monkeypatch):
    nb = _run(tmp_path, nbformat.v4.new_code_cell(SILENCE_EVERYTHING),
              nbformat.v4.new_code_cell(RIGHT), _test_cell(TEST),
              monkeypatch=monkeypatch)
    assert any("never answered" in e for e in _errors(nb.cells[2]))


def test_grader_names_in_a_test_cell_are_the_judges_own():
    """A notebook that rebinds `require_gpu` (to skip a GPU check) or `torch` cannot hand the judge its version."""
    import torch

    from autograder import harness
    from autograder.judging.judge import cell_names, grader_names

    source = ("from autograder.lab04 import FLASH_SPEED_CHECK, check_flash_speed\n"
              "if require_gpu('flash speed', calibrated=[FLASH_SPEED_CHECK]):\n"
              "    check_flash_speed(flash_forward, torch.float16)")
    loaded, _ = cell_names(source)
    assert loaded == {"require_gpu", "flash_forward", "torch"}
    assert grader_names(source, loaded) == {"require_gpu": harness.require_gpu, "torch": torch}


def test_a_judge_whose_kernel_is_killed_removes_its_socket_folder():
    """A JupyterLab kernel killed outright never runs its atexit: its judge sees the control channel close and
    removes its socket and folders itself, so nothing stays in /tmp."""
    import os
    import subprocess
    import time

    start = ("import os, sys\n"
             "from autograder.judging.judge import JudgeProcess\n"
             "from autograder.judging.socket_folder import socket_folder\n"
             "folder = socket_folder('judge-')\n"
             "JudgeProcess(folder, grading=False)\n"
             "print(folder, flush=True)\n"
             "os.kill(os.getpid(), 9)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_SANDBOX", "NBGRADER_EXECUTION")}
    out = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, timeout=120, env=env,
                         cwd=Path(__file__).resolve().parents[2])
    folder = out.stdout.strip()
    assert folder.startswith("/") and "judge-" in folder, out.stderr[-2000:]
    deadline = time.monotonic() + 30
    while os.path.exists(folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(folder), f"{folder} was left behind: {os.listdir(folder)}"
