"""Fixtures for browser tests: a throwaway JupyterLab server on loopback (one for the whole session,
each test module opening its own notebook) and headless Chromium.

The server runs from this venv on 127.0.0.1 with a random free port and a random token, with its
config, data, runtime and workspace folders in a temp directory, serving only a temp folder, with the learner's
settings `make lab` uses (config/learner/). It is
shut down (REST call, then SIGTERM, then SIGKILL to its own process group) whatever the test does.
Chromium is Debian's (/usr/bin/chromium, or $CHROMIUM) driven by playwright; without it the tests skip.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from browser_support import CHROMIUM, CHROMIUM_ARGS, require_chromium, LabServer, free_port, stop_server, wait_until_up

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory) -> Iterator[LabServer]:
    tmp = tmp_path_factory.mktemp("jupyterlab")
    root = tmp / "notebooks"
    root.mkdir()
    env = {**os.environ,
           "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_DATA_DIR": str(tmp / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTER_PLATFORM_DIRS": "1",
           "IPYTHONDIR": str(tmp / "ipython"), "PYTHONUNBUFFERED": "1",
           "JUPYTER_CONFIG_PATH": str(REPO_ROOT / "config" / "learner")}     # the settings `make lab` uses
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
        wait_until_up(url, token, proc, log)
        yield LabServer(url, token, root)
    finally:
        stop_server(proc, url, token)


@pytest.fixture(scope="module")
def chromium_page(lab_server):
    require_chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()
