"""Toolchain files agree with each other: pins, Makefile targets, CI entry point, nbgrader config, README."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _pins(lines):
    out = {}
    for line in lines:
        line = line.strip().lstrip("- ").strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==([^\s#]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_requirements_are_pinned():
    lines = [l.strip() for l in (REPO_ROOT / "requirements.txt").read_text().splitlines()]
    reqs = [l for l in lines if l and not l.startswith("#")]
    assert reqs and all("==" in l for l in reqs), f"unpinned requirement in {reqs}"
    names = _pins(reqs)
    for needed in ("torch", "nbgrader", "pytest", "pytest-timeout", "ipykernel", "jupyterlab"):
        assert needed in names


def test_environment_yml_has_the_same_pins():
    req = _pins((REPO_ROOT / "requirements.txt").read_text().splitlines())
    env = _pins((REPO_ROOT / "environment.yml").read_text().splitlines())
    assert env == req


def test_makefile_targets_and_ci():
    make = (REPO_ROOT / "Makefile").read_text()
    for target in ("lab", "test", "browser-deps", "release", "grade", "autograde", "feedback", "doctor",
                   "models", "data", "setup"):
        assert re.search(rf"^{re.escape(target)}:", make, re.M), f"no make target {target}"
    assert re.search(r"^test: .*browser-deps", make, re.M)
    assert re.search(r"^test: .*sandbox-deps", make, re.M) and re.search(r"^sandbox-deps:", make, re.M)
    ci = (REPO_ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1].strip() == "make test"
    assert (REPO_ROOT / ".ci" / "run").stat().st_mode & 0o111


def test_make_dry_run_is_fast_path_when_set_up():
    """With the stamp newer than requirements.txt/pyproject.toml, `make -n setup` has nothing to do."""
    stamp = REPO_ROOT / ".venv" / ".installed"
    if not stamp.exists():
        return
    newest = max((REPO_ROOT / f).stat().st_mtime for f in ("requirements.txt", "pyproject.toml"))
    if stamp.stat().st_mtime < newest:
        return
    out = subprocess.run(["make", "-n", "setup"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert "pip install" not in out.stdout


def test_nbgrader_config_maps_solutions_to_labs(tmp_path, monkeypatch):
    from traitlets.config import Config
    ns = {"get_config": lambda: cfg, "__file__": str(REPO_ROOT / "nbgrader_config.py")}
    cfg = Config()
    monkeypatch.delenv("COURSE_CELL_TIMEOUT", raising=False)
    exec(compile((REPO_ROOT / "nbgrader_config.py").read_text(), "nbgrader_config.py", "exec"), ns)
    cd = cfg.CourseDirectory
    assert (cd.source_directory, cd.release_directory) == ("solutions", "labs")
    assert cd.root == str(REPO_ROOT)
    assert cfg.Execute.timeout >= 300
    assert cfg.LimitOutput.max_lines > 0


def test_gitignore_keeps_instructor_files_out():
    ignored = (REPO_ROOT / ".gitignore").read_text().splitlines()
    for entry in ("/gradebook.db", "/submitted/", "/autograded/", "/feedback/", ".venv/"):
        assert entry in ignored


def test_readme_starts_with_the_two_commands():
    head = (REPO_ROOT / "README.md").read_text().splitlines()[:12]
    text = "\n".join(head)
    assert "make lab" in text and "make test" in text
    readme = (REPO_ROOT / "README.md").read_text()
    assert "## Start here" in readme and "## Labs" in readme
    assert readme.index("## Start here") < readme.index("## Labs") < readme.index("## Working on a lab")


def test_readme_links_pages_that_exist():
    """README speaks to learners; the rest lives in docs/ pages it links, each linking back."""
    import re

    readme = (REPO_ROOT / "README.md").read_text()
    pages = re.findall(r"\]\((docs/[\w-]+\.md)\)", readme)
    assert {"docs/instructors.md", "docs/gpu-tier.md", "docs/development.md", "docs/serving.md"} <= set(pages)
    for page in pages:
        assert "../README.md" in (REPO_ROOT / page).read_text(), page
    assert "## The mini-GPT package" in (REPO_ROOT / "docs" / "development.md").read_text()


def test_importing_nbformat_builds_no_parser():
    """Every nbgrader run (and its alembic, and each Jupyter server) imports nbformat, hence jsonschema; with
    rfc3987-syntax installed that import builds 38 Lark parsers, 2-3 s a process on the course's 2-core machine.
    `make setup` removes it (nothing the course runs checks the iri formats it serves): a dependency that brings it
    back shows here, by what was imported, not by a time."""
    import sys

    code = "import sys, nbformat, jsonschema; print(sorted(m for m in ('lark', 'rfc3987_syntax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", (f"importing nbformat imported {out}: `{sys.executable} -m pip uninstall rfc3987-syntax` "
                         "(make setup does; a conda environment made from environment.yml needs it too)")
