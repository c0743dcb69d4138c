"""autograder.paths: each folder the course's modules need resolves to the right place, and nothing else anchors."""

import ast
import json
from pathlib import Path

import autograder
import minigpt.model
from autograder.checking import learner_errors, reference_guard, thresholds
from autograder import paths
from autograder.judging import sandbox

REPO_ROOT = Path(__file__).resolve().parents[2]      # tests/autograder/ -> the repository


def test_repo_root_is_the_repository():
    assert paths.REPO_ROOT == REPO_ROOT
    assert (paths.REPO_ROOT / "nbgrader_config.py").is_file() and (paths.REPO_ROOT / "solutions").is_dir()


def test_autograder_dir_is_the_imported_package():
    assert paths.AUTOGRADER_DIR == Path(autograder.__file__).resolve().parent == REPO_ROOT / "autograder"


def test_shared_dir_holds_the_imported_minigpt():
    assert paths.SHARED_DIR == REPO_ROOT / "shared"
    # (a submodule's file: under pytest, tests/minigpt/ can stand as a namespace portion for the bare name minigpt)
    assert Path(minigpt.model.__file__).resolve().parent == paths.SHARED_DIR / "minigpt"


def test_calibration_dir_holds_the_calibration_files():
    assert paths.CALIBRATION_DIR == REPO_ROOT / "autograder" / "calibration"
    assert any(paths.CALIBRATION_DIR.glob("*.cpu.json")), f"no calibration file in {paths.CALIBRATION_DIR}"
    assert thresholds.CALIBRATION_DIR == paths.CALIBRATION_DIR


def test_exercise_map_is_the_map_file():
    assert paths.EXERCISE_MAP == REPO_ROOT / "autograder" / "exercise_map.json"
    assert set(json.loads(paths.EXERCISE_MAP.read_text())) == {"checks", "learner"}


def test_sandbox_boot_is_the_script_the_sandbox_runs_first():
    assert paths.SANDBOX_BOOT.is_file() and "def main(" in paths.SANDBOX_BOOT.read_text()
    argv = sandbox.bwrap_argv(sandbox.SandboxPolicy(), ["python"], submission_dir=None, socket_dir="/tmp")
    assert str(paths.SANDBOX_BOOT) in argv


def test_trusted_folders_are_autograder_and_shared():
    """The security anchors accept the same two folders as before: autograder/ and shared/."""
    assert set(reference_guard._PACKAGE_ROOTS) == {REPO_ROOT / "autograder", REPO_ROOT / "shared"}
    assert sandbox.PACKAGE_ROOT == REPO_ROOT
    assert sandbox.default_package_dirs()[:2] == [str(REPO_ROOT / "shared"), str(REPO_ROOT / "autograder")]
    assert learner_errors._is_course(str(REPO_ROOT / "shared" / "minigpt" / "model.py"))
    assert not learner_errors._is_course(str(REPO_ROOT / "solutions" / "cell.py"))


def test_only_paths_reads_its_own_file():
    """A module that finds a folder from `__file__` breaks silently when it moves: it must ask autograder.paths."""
    anchored = [str(f.relative_to(REPO_ROOT)) for f in sorted(paths.AUTOGRADER_DIR.rglob("*.py"))
                if f != paths.AUTOGRADER_DIR / "paths.py"
                and any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(ast.parse(f.read_text())))]
    assert anchored == [], f"these modules find folders from __file__ instead of autograder.paths: {anchored}"


def test_a_stub_inside_a_triton_kernel_names_its_exercise():
    """Triton's interpreter raises InterpreterError from the kernel's NotImplementedError (issue 40: a lab 04 demo
    cell showed a bare `InterpreterError: NotImplementedError()`); the explanation looks through it."""
    from autograder.checking.learner_errors import explain

    def flash_fwd_kernel():                    # a learner's kernel stub (its name is in lab 04's exercise map)
        raise NotImplementedError()

    class InterpreterError(Exception):
        pass

    try:
        try:
            flash_fwd_kernel()
        except NotImplementedError as err:
            raise InterpreterError(repr(err)) from err
    except InterpreterError as err:
        lines = explain(type(err), err, err.__traceback__)
    assert lines and lines[0].startswith("This cell needs exercise") and "`flash_fwd_kernel`" in lines[0], lines


def test_a_passing_check_cell_says_so_the_same_way_in_every_lab():
    """issue 40: lab 00's checks were silent when they passed, the others printed "<name>: OK" in their own words."""
    from autograder.checking.learner_errors import passed_line

    assert passed_line("from autograder.lab03 import check_pack_chunks\ncheck_pack_chunks(pack_chunks)") == \
        "Exercise 1 passed."
    assert passed_line("from autograder.lab00 import check_q1_kv_gib; check_q1_kv_gib(q1_kv_gib)") == \
        "Question 1 passed."
    assert passed_line("print(1)") is None
    assert passed_line("from autograder.lab03 import check_pack_chunks\ntry:\n    check_pack_chunks(f)\n"
                       "except AssertionError as err:\n    print(err)") is None          # it may have failed
