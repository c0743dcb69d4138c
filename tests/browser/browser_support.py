"""Helpers shared by the browser tests (imported by conftest.py and the test modules): Chromium's
location and flags, a free loopback port, waiting for a JupyterLab server and stopping it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

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


def wait_until_up(url: str, token: str, proc: subprocess.Popen, log: Path) -> None:
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


def stop_server(proc: subprocess.Popen, url: str, token: str) -> None:
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
