"""In a real Jupyter kernel, a learner's ordinary failures name the exercise, without the course's internals."""

from __future__ import annotations

import re

import nbformat
import pytest
from nbclient import NotebookClient


pytestmark = pytest.mark.slow

CELLS = {
    "setup": "from minigpt.teaching.calculators import PRESETS, ModelShape\nimport autograder",
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
    assert "from minigpt.teaching.calculators import kv_cache_bytes" in text


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
