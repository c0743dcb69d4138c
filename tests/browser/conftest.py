"""Fixtures for browser tests: a throwaway JupyterLab server on loopback and headless Chromium.

The server runs from this venv on 127.0.0.1 with a random free port and a random token, with its
config, data, runtime and workspace folders in a temp directory, serving only a temp folder. It is
shut down (REST call, then SIGTERM, then SIGKILL to its own process group) whatever the test does.
Chromium is Debian's (/usr/bin/chromium, or $CHROMIUM) driven by playwright; without it the tests skip.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-extensions", "--disable-sync", "--disable-default-apps", "--no-first-run",
                 "--disable-component-update", "--metrics-recording-only", "--mute-audio"]
SERVER_START_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LabServer:
    url: str          # http://127.0.0.1:PORT
    token: str
    root: Path        # the folder it serves

    def lab_url(self, notebook: str) -> str:
        return f"{self.url}/lab/tree/{notebook}?token={self.token}&reset"


def _wait_until_up(url: str, token: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer within {SERVER_START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen, url: str, token: str) -> None:
    try:
        req = urllib.request.Request(f"{url}/api/shutdown", method="POST", headers={"Authorization": f"token {token}"})
        urllib.request.urlopen(req, timeout=5).close()
        proc.wait(timeout=15)
    except Exception:
        pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)           # the group we created with start_new_session
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory) -> Iterator[LabServer]:
    tmp = tmp_path_factory.mktemp("jupyterlab")
    root = tmp / "notebooks"
    root.mkdir()
    env = {**os.environ,
           "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_DATA_DIR": str(tmp / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTER_PLATFORM_DIRS": "1",
           "IPYTHONDIR": str(tmp / "ipython"), "PYTHONUNBUFFERED": "1"}
    env.pop("JUPYTER_TOKEN", None)
    port, token = free_port(), secrets.token_hex(16)
    log = tmp / "server.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           f"--LabApp.workspaces_dir={tmp / 'workspaces'}", f"--LabApp.user_settings_dir={tmp / 'settings'}",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--ServerApp.open_browser=False"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")              # containers and CI often run as root
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, token, proc, log)
        yield LabServer(url, token, root)
    finally:
        _stop(proc, url, token)


@pytest.fixture(scope="module")
def chromium_page(lab_server):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set $CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="session")
def write_notebook():
    """write_notebook(path, [source, ...]): a minimal nbformat-4 notebook with those code cells."""
    return _write_notebook


def _write_notebook(path: Path, cells: list[str]) -> None:
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": src} for i, src in enumerate(cells)]}
    path.write_text(json.dumps(nb, indent=1))
