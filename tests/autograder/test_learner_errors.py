"""In a real Jupyter kernel, a learner's ordinary failures name the exercise, without the course's internals."""

from __future__ import annotations

import re

import nbformat
import pytest
from nbclient import NotebookClient


pytestmark = pytest.mark.slow

CELLS = {
    "setup": "from minigpt.costmodel.calculators import PRESETS, ModelShape\nimport autograder",
    "stub": "def kv_cache_bytes(shape, context_len, batch, bytes_per_element=2):\n    raise NotImplementedError()",
    "check_stub": "from autograder.lab00 import check_kv_cache_bytes; check_kv_cache_bytes(kv_cache_bytes)",
    "demo_stub": "kv_cache_bytes(PRESETS['Llama-3-8B'], 8192, 1, 2)",
    "answer_stub": "# YOUR CODE HERE\nraise NotImplementedError()",
    "check_unanswered": "from autograder.lab00 import check_q1_kv_gib; check_q1_kv_gib(q1_kv_gib)",
    "wrong": "def count_parameters(shape):\n    return shape.n_layers",
    "check_wrong": "from autograder.lab00 import check_count_parameters; check_count_parameters(count_parameters)",
    "buggy": "def count_parameters(shape):\n    return shape.no_such_field",
    "check_buggy": "from autograder.lab00 import check_count_parameters; check_count_parameters(count_parameters)",
    "demo_figure": "%matplotlib inline\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\n"
                   "ax.set_title(str(kv_cache_bytes(PRESETS['Llama-3-8B'], 8192, 1, 2)))\nplt.show()",
    "plain": "1 / 0",
    "undefined": "print(new_ids)",
    # a lab whose checks are a package (autograder/lab06/rollback.py), and the answer_qN naming of labs 01-09
    "wrong_in_package": "def truncate_cache(cache, length):\n    cache[0].length = length",
    "check_wrong_in_package": "from autograder.lab06 import check_truncate_cache; check_truncate_cache(truncate_cache)",
    "check_unanswered_answer_q": "from autograder.lab03 import check_q3_attention_crossover; check_q3_attention_crossover(answer_q3)",
    # a check whose message already names its exercise (lab 10's): the label once
    "wrong_labelled": "import torch\ndef mask_by_scan(dfa, state, vocab):\n    return torch.ones(len(vocab.texts), dtype=torch.bool)",
    "check_wrong_labelled": "from autograder.lab10 import check_mask_by_scan; check_mask_by_scan(mask_by_scan)",
}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS.values()]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=300, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path_factory.mktemp("nb"))}}).execute()
    out = {}
    for name, cell in zip(CELLS, nb.cells):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(errors[0].traceback)) if errors else ""
        out[name] = (errors[0].ename, text) if errors else None
    out["_images"] = {name for name, cell in zip(CELLS, nb.cells)
                      if any("image/png" in o.get("data", {}) for o in cell.outputs)}
    return out


def test_stub_in_a_check_cell_names_the_exercise(outputs):
    ename, text = outputs["check_stub"]
    assert ename == "NotImplementedError"
    assert text.startswith("Exercise 3 is not implemented yet: `kv_cache_bytes` still raises NotImplementedError")
    assert "autograder/lab00.py" not in text and "File " not in text


def test_stub_in_a_demo_cell_says_which_exercise_and_how_to_go_on(outputs):
    _, text = outputs["demo_stub"]
    assert text.startswith("This cell needs exercise 3: `kv_cache_bytes` is not implemented yet.")
    assert "from minigpt.costmodel.calculators import kv_cache_bytes" in text


def test_a_demo_figure_stopped_by_a_stub_is_not_shown_half_drawn(outputs):
    assert outputs["demo_figure"][1].startswith("This cell needs exercise 3")
    assert "demo_figure" not in outputs["_images"]


def test_answer_cell_and_unanswered_question(outputs):
    assert outputs["answer_stub"][1].startswith("This answer is not given yet")
    ename, text = outputs["check_unanswered"]
    assert ename == "NameError" and text.startswith("Question 1 is not answered yet: give `q1_kv_gib` a value")


def test_wrong_answer_shows_the_check_line_and_the_diagnosis_only(outputs):
    ename, text = outputs["check_wrong"]
    assert ename == "AssertionError"
    assert "Cell In[8], line 1" in text and "check_count_parameters(count_parameters)" in text
    assert "AssertionError: Exercise 2 (check_count_parameters):" in text.splitlines()[-1]
    assert "lab00.py" not in text and "harness.py" not in text


def test_learner_bug_shows_their_own_frame(outputs):
    ename, text = outputs["check_buggy"]
    assert ename == "AttributeError"
    assert "Cell In[9], line 2, in count_parameters" in text and "return shape.no_such_field" in text
    assert text.splitlines()[-1].startswith("AttributeError: Exercise 2 (check_count_parameters):")
    assert "lab00.py" not in text


def test_errors_outside_the_course_keep_ipythons_traceback(outputs):
    ename, text = outputs["plain"]
    assert ename == "ZeroDivisionError" and "1 / 0" in text and "Traceback" in text, text


def test_passing_cells_print_no_error(outputs):
    assert outputs["setup"] is None and outputs["stub"] is None


def test_exercise_map_is_current(repo_root):
    """In a fresh process: finding each reference imports every minigpt module, which must not depend on what
    other tests of this worker imported or changed."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "autograder", "exercise-map", "--check"], cwd=repo_root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_name_a_failed_cell_should_have_defined(outputs):
    ename, text = outputs["undefined"]
    assert ename == "NameError" and text.startswith("NameError: `new_ids` is not defined yet: a cell above defines it")


def test_a_package_labs_failing_check_names_its_exercise(outputs):
    ename, text = outputs["check_wrong_in_package"]
    assert ename == "AssertionError"
    last = text.splitlines()[-1]
    assert last.startswith("AssertionError: Exercise 1 (check_truncate_cache): after truncate_cache"), text
    assert "rollback.py" not in text and "harness.py" not in text


def test_an_unanswered_answer_q_names_the_question(outputs):
    ename, text = outputs["check_unanswered_answer_q"]
    assert ename == "NameError" and text.startswith("Question 3 is not answered yet: give `answer_q3` a value"), text


def test_every_package_check_of_the_map_has_a_lab():
    """Each check the exercise map names is found in a module _lab_of gives that lab: a package lab's checks live in
    autograder/labNN/<file>.py, whose own name says nothing."""
    import importlib
    import inspect

    from autograder.checking.learner_errors import _lab_of, exercise_map

    for key in exercise_map()["checks"]:
        lab, name = key.split(":", 1)
        module = importlib.import_module(f"autograder.lab{lab}")
        fn = getattr(module, name, None)
        if fn is None or not callable(fn):
            continue                       # a check the notebook imports from elsewhere (none today)
        assert _lab_of(inspect.getsourcefile(inspect.unwrap(fn))) == lab, key


def test_a_message_that_names_its_exercise_is_not_labelled_twice(outputs):
    """Issue 60, item 4: `Exercise 1 (check_mask_by_scan): Exercise 1 (mask_by_scan)` said the label twice."""
    ename, text = outputs["check_wrong_labelled"]
    last = text.splitlines()[-1]
    assert ename == "AssertionError" and last.startswith("AssertionError: Exercise 1 (mask_by_scan)"), last
    assert last.count("Exercise 1") == 1 and "AssertionError: AssertionError" not in text


def test_a_judged_verdict_says_its_error_name_once():
    """A verdict from the judge (autograder/judging/interactive.py) is raised as a class named after the check's
    error: its message is the check's, not "AssertionError: AssertionError: ..." under nbgrader or Run All."""
    from autograder.judging.interactive import CheckFailed

    named = type("AssertionError", (CheckFailed,), {"__module__": "builtins"})
    err = named("AssertionError", "Exercise 2 (slot_of): position 4 is outside")
    assert str(err) == "Exercise 2 (slot_of): position 4 is outside" and type(err).__name__ == "AssertionError"


def test_a_stub_whose_check_names_its_exercise_is_labelled_once():
    """Issue 60, item 4: a stub under lab 10's check read "Exercise 1 is not implemented yet: Exercise 1
    (mask_by_scan)" (the check's own message names the exercise, and the stub's frame is not in the traceback)."""
    from autograder.checking.learner_errors import explain
    from autograder.lab10 import check_mask_by_scan

    def mask_by_scan(dfa, state, vocab):
        raise NotImplementedError()

    with pytest.raises(AssertionError) as info:
        check_mask_by_scan(mask_by_scan)
    lines = explain(info.type, info.value, info.tb)
    assert lines[-1].startswith("Exercise 1 is not implemented yet: mask_by_scan."), lines
    assert lines[-1].count("Exercise 1") == 1, lines


@pytest.mark.parametrize("message, said", [
    # the check's message names no exercise: the label and the check's name, once
    ("count_parameters(...): expected 8, got 7", "Exercise 2 (check_x): count_parameters(...): expected 8, got 7"),
    # it opens with the exercise's label already (lab 10's), or with any exercise's (a speed check of Exercise 2)
    ("Exercise 2 (mask_by_trie), state 0: wrong mask", "Exercise 2 (mask_by_trie), state 0: wrong mask"),
    ("Exercise 1 (the scheduler), three requests: no add_request()", "Exercise 1 (the scheduler), three requests: "
                                                                      "no add_request()"),
    # its label elsewhere in it, a label spelled from the grade id with a hyphen, the check's name first
    ("needs a GPU: Exercise 2 (the kernel); none here", "needs a GPU: Exercise 2 (the kernel); none here"),
    ("check_x needs a CUDA GPU", "Exercise 2: check_x needs a CUDA GPU"),
    # Exercise 12 is not Exercise 2 (so is labelled), and an error's name is said once
    ("see Exercise 12 first", "Exercise 2 (check_x): see Exercise 12 first"),
    ("AssertionError: AssertionError: Exercise 2 (slot_of): off by one", "Exercise 2 (slot_of): off by one"),
    ("pool raised ValueError: ValueError: no blocks", "Exercise 2 (check_x): pool raised ValueError: no blocks"),
])
def test_a_failed_checks_message_names_its_exercise_and_its_error_once(message, said):
    from autograder.checking.learner_errors import _labelled, _said_once

    assert _labelled(_said_once("AssertionError", message), "Exercise 2", "check_x") == said


def test_a_question_and_a_named_check_are_not_labelled_twice():
    from autograder.checking.learner_errors import _labelled

    assert _labelled("Q2 (sequences that fit) [answer in sequences]: answer with a finite int", "Question 2",
                     "check_q2") == "Q2 (sequences that fit) [answer in sequences]: answer with a finite int"
    assert (_labelled("the target-calls check (generate_speculative), k=4: wrong", "the target calls check",
                      "check_target_calls") == "the target-calls check (generate_speculative), k=4: wrong")
