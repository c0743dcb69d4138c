"""The grader's sockets bind however deep TMPDIR is (autograder/judging/socket_folder.py): a judge started with a
TMPDIR like pytest's under xdist (`/tmp/pytest-of-root/pytest-72/popen-gw0/...`) once died before its first word,
failing every judged cell of a class."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from autograder.judging import socket_folder
from autograder.judging.judge import JudgeProcess


@pytest.fixture
def deep_tmpdir(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 60) / "popen-gw0" / "hostile-three-lab06_foreseen_prompts0" / "tmp"
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    return deep


def test_a_deep_tmpdir_sends_the_sockets_to_tmp_where_they_bind(deep_tmpdir):
    folder = Path(socket_folder.socket_folder("kernel-"))
    try:
        assert folder.parent == Path(socket_folder.FALLBACK)
        judge_dir = Path(tempfile.mkdtemp(prefix="judge-", dir=folder))
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(judge_dir / "judge.sock"))
    finally:
        shutil.rmtree(folder)


def test_a_short_tmpdir_keeps_them(tmp_path, monkeypatch):
    short = Path(tempfile.mkdtemp(prefix="s-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    try:
        folder = Path(socket_folder.socket_folder("kernel-"))
        assert folder.parent == short
        folder.rmdir()
    finally:
        short.rmdir()


def test_a_judge_given_a_socket_path_too_long_says_so(deep_tmpdir):
    too_deep = deep_tmpdir / ("x" * 40)
    too_deep.mkdir()
    with pytest.raises(RuntimeError, match="longer than a Unix socket allows"):
        JudgeProcess(str(too_deep))


def test_a_judge_starts_under_a_deep_tmpdir(deep_tmpdir):
    folder = socket_folder.socket_folder("judge-")
    try:
        judge = JudgeProcess(folder, cwd=os.getcwd(), grading=False)
        assert judge.proc.poll() is None and socket_folder.fits(judge.path)
        judge.close()
    finally:
        shutil.rmtree(folder)
