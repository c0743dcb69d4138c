"""autograder.grading.notebooks: normalization is stable, strips run state, keeps content."""

from __future__ import annotations

import json

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from autograder.grading import notebooks


def _executed_notebook():
    code = new_code_cell("x = 1\nprint(x)", execution_count=7,
                         outputs=[new_output("stream", name="stdout", text="1\n")],
                         metadata={"execution": {"iopub.status.busy": "2026-01-01"}, "scrolled": True,
                                   "nbgrader": {"grade": False, "solution": True, "locked": False,
                                                "grade_id": "a", "schema_version": 3}})
    return new_notebook(cells=[new_markdown_cell("# Title"), code],
                        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                  "widgets": {"state": {}}})


def test_normalize_strips_outputs_counts_and_run_metadata():
    nb = notebooks.normalize(_executed_notebook())
    code = nb.cells[1]
    assert code.outputs == [] and code.execution_count is None
    assert "execution" not in code.metadata and "scrolled" not in code.metadata
    assert code.metadata.nbgrader.grade_id == "a"          # nbgrader metadata is kept
    assert "widgets" not in nb.metadata and nb.metadata.kernelspec.name == "python3"
    assert code.source == "x = 1\nprint(x)"


def test_dumps_is_indent_1_sorted_and_idempotent(tmp_path):
    text = notebooks.dumps(_executed_notebook())
    assert text.endswith("}\n")
    assert text.startswith('{\n "cells": [\n')
    data = json.loads(text)
    assert list(data) == sorted(data)
    p = tmp_path / "n.ipynb"
    p.write_text(text)
    assert notebooks.is_normalized(p)
    assert notebooks.normalize_file(p) is False
    assert notebooks.dumps(nbformat.read(str(p), as_version=4)) == text


def test_normalize_file_rewrites_executed_notebook(tmp_path):
    p = tmp_path / "n.ipynb"
    nbformat.write(_executed_notebook(), str(p))
    assert not notebooks.is_normalized(p)
    assert notebooks.normalize_file(p) is True
    assert notebooks.is_normalized(p)
    nb = nbformat.read(str(p), as_version=4)
    nbformat.validate(nb)
    assert nb.cells[1].outputs == []


def test_find_notebooks_skips_checkpoints(tmp_path):
    (tmp_path / "solutions" / "a" / ".ipynb_checkpoints").mkdir(parents=True)
    nbformat.write(_executed_notebook(), str(tmp_path / "solutions" / "a" / "a.ipynb"))
    nbformat.write(_executed_notebook(), str(tmp_path / "solutions" / "a" / ".ipynb_checkpoints" / "a-checkpoint.ipynb"))
    assert notebooks.find_notebooks(tmp_path) == [tmp_path / "solutions" / "a" / "a.ipynb"]


def test_cli_normalize_check(tmp_path, capsys):
    from autograder.cli import main

    p = tmp_path / "n.ipynb"
    nbformat.write(_executed_notebook(), str(p))
    assert main(["normalize", "--check", str(p)]) == 1
    assert "not normalized" in capsys.readouterr().out
    assert main(["normalize", str(p)]) == 0
    assert main(["normalize", "--check", str(p)]) == 0


def test_course_kernel_reports_what_notebooks_store(repo_root):
    """The stored kernelspec and language_info are what the course kernel reports, so JupyterLab opens a notebook
    without marking it changed."""
    import re

    import jupyter_client

    from autograder.grading.notebooks import COURSE_KERNELSPEC, COURSE_LANGUAGE_INFO

    assert f'--display-name "{COURSE_KERNELSPEC["display_name"]}"' in (repo_root / "Makefile").read_text()
    assert f'--name {COURSE_KERNELSPEC["name"]}' in (repo_root / "Makefile").read_text()
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        info = kc.kernel_info(reply=True, timeout=60)["content"]["language_info"]
        # make setup's kernel config: inline figures rendered for high-density screens (config/ipython_kernel_config.py)
        reply = kc.execute_interactive("from matplotlib_inline.backend_inline import InlineBackend; "
                                       "assert InlineBackend.instance().figure_formats == {'retina'}", timeout=60)
        assert reply["content"]["status"] == "ok", "the course kernel does not render inline figures as retina PNGs"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    without_version = {k: v for k, v in info.items() if k != "version"}
    assert without_version == {k: v for k, v in COURSE_LANGUAGE_INFO.items() if k != "version"}, (
        f"the course kernel reports {info}; update COURSE_LANGUAGE_INFO")
    # The patch version is the course machine's (3.11.7); another 3.11.x only shows as a changed version field.
    assert re.match(r"3\.11\.", info["version"]), "environment.yml pins python=3.11"
