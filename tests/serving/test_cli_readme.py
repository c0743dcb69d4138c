"""`python -m minigpt.serving` as a child process (started, answering, stopped) and docs/serving.md's client example."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import httpx
import pytest

from minigpt.serving.launch import ServerStartError, serve_subprocess

SERVING_PAGE = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def readme_example() -> str:
    section = SERVING_PAGE.read_text().split("## Serving (lab 08)", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_subprocess_server_runs_the_readme_example_and_stops():
    # The draft checkpoint under the page's model name keeps the test fast; `make serve` serves the target.
    with serve_subprocess(["--checkpoint", "draft", "--served-model-name", "target", "--num-blocks", "64"]) as url:
        assert httpx.get(url + "/health").status_code == 200
        code = readme_example().replace("http://127.0.0.1:8000", url)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs/serving.md", "exec"), {})
        assert "CompletionUsage(completion_tokens=32" in out.getvalue()
        child = url.process
    assert child.poll() is not None                         # the child exited
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=2)


def test_a_child_that_cannot_start_reports_its_stderr(tmp_path, monkeypatch):
    """A child that dies at once: ServerStartError with its exit code and stderr (a stand-in interpreter keeps
    this fast; the real CLI's argument errors take the same path)."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"cannot serve: $*\" >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr("minigpt.serving.launch.sys.executable", str(fake))
    with pytest.raises(ServerStartError, match=r"(?s)exited with code 3.*cannot serve: -m minigpt.serving --host 127.0.0.1"):
        with serve_subprocess(["--engine", "bogus"], timeout=30):
            pass
