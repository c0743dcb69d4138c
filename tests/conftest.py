"""Generic fixtures shared by the whole suite (topic-specific ones live in each folder's conftest)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# torch.compile's caches (inductor's generated code, dynamo's and AOT autograd's, even for the "eager" backend) go to
# /tmp/torchinductor_<user> unless told: here into a folder of this process, removed at its end (lab 12's Run All and
# its tests compile). Set before torch._inductor is imported; the notebooks' kernels inherit it.
_INDUCTOR_CACHE = tempfile.mkdtemp(prefix="course-inductor-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE

# Before anything imports triton: on a machine without a GPU, minigpt.kernels sets TRITON_INTERPRET=1, which
# triton reads when its language module is built. A test that imported triton first would leave the interpreter
# unable to call triton.language's own jit functions (tl.cdiv) in every later test of that worker.
import minigpt.kernels  # noqa: E402,F401

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE_COURSE = REPO_ROOT / "tests" / "fixtures" / "course"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (holds nbgrader_config.py, solutions/, labs/)."""
    return REPO_ROOT


@pytest.fixture
def fixture_course(tmp_path: Path) -> Path:
    """A private copy of the tiny fixture course (tests/fixtures/course) plus the course's nbgrader config."""
    dest = tmp_path / "course"
    shutil.copytree(FIXTURE_COURSE, dest)
    shutil.copy(REPO_ROOT / "nbgrader_config.py", dest / "nbgrader_config.py")
    return dest


@pytest.fixture
def fast_cells() -> dict[str, str]:
    """Extra environment for nbgrader runs of the fixture course: a 5 s cell timeout."""
    from autograder.grading.nbgrader_runs import nbgrader_env

    return nbgrader_env({"COURSE_CELL_TIMEOUT": "5"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Notebook grading first: the labs' notebook classes are the longest tests, and pytest-xdist hands out work in
    collection order, so starting them first keeps both workers busy to the end (the short tests fill the gaps)."""
    items.sort(key=lambda item: Path(str(item.fspath)).name != "test_notebooks.py")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """@pytest.mark.calibrated("lab04_flash_speed", ...): on a GPU whose class has no calibrated threshold for those
    checks, skip with the reason (the check would say "uncalibrated ...; run `make calibrate`")."""
    marker = item.get_closest_marker("calibrated")
    if marker is None:
        return
    import torch

    if not torch.cuda.is_available():
        return                                     # the test's own skipif says "needs a GPU"
    from autograder.checking.thresholds import status
    from minigpt.timing import device_class

    whys = [why for check in marker.args for fraction, why in [status(check, device_class("cuda"))] if fraction is None]
    if whys:
        pytest.skip("; ".join(whys))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove this process's torch.compile cache (see _INDUCTOR_CACHE)."""
    shutil.rmtree(_INDUCTOR_CACHE, ignore_errors=True)
