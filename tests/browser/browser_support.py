"""Helpers shared by the browser tests (imported by conftest.py and the test modules): Chromium's
location and flags, a free loopback port, starting and stopping a JupyterLab server, writing a notebook,
opening it and running it until its widget shows, and driving widgets (sliders, Run All, dialogs)."""

from __future__ import annotations

import json
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


def require_chromium() -> None:
    """Skip (or, in CI, fail) when Chromium is missing: CI must run the browser tests; a learner's `make test`
    without root or sudo could not install it and runs everything else."""
    import pytest

    if Path(CHROMIUM).exists():
        return
    message = (f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium with apt as root or with sudo "
               "(or set $CHROMIUM)")
    if os.environ.get("CI") or os.environ.get("REQUIRE_BROWSER"):
        pytest.fail(message + "; CI requires the browser tests", pytrace=False)
    pytest.skip(message)


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


def wait_for_change(get, before, timeout_s: float = 60) -> object:
    """Poll get() until it differs from `before` (or the time is up); return the last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = get()
        if now != before:
            return now
        time.sleep(0.25)
    return get()


def move_slider(page, widget, label: str, presses: int = 1, key: str = "ArrowRight") -> None:
    """Focus the noUiSlider handle of the slider labelled `label` inside `widget` and press an arrow key."""
    slider = widget.locator(".widget-slider").filter(has=page.locator(".widget-label", has_text=label)).first
    slider.locator(".noUi-handle").first.focus()
    for _ in range(presses):
        page.keyboard.press(key)


def accept_dialogs(page) -> None:
    """Accept any modal JupyterLab dialog (e.g. the kernel selector shown while a session starts)."""
    dialog = page.locator(".jp-Dialog")
    for _ in range(3):
        if not dialog.count() or not dialog.first.is_visible():
            return
        print("JupyterLab dialog:", dialog.first.inner_text()[:200].replace("\n", " | "))
        dialog.first.locator(".jp-Dialog-button.jp-mod-accept").first.click()
        time.sleep(0.5)


def run_all(page, attempts: int = 4) -> None:
    """Run > Run All Cells ("runmenu:run-all" in JupyterLab 4); retried, since a click made while the
    kernel session is still connecting can be dropped. Done once the first code cell has started ([*] or [1]);
    a markdown cell's prompt stays empty, so only code cells' prompts are read."""
    first_prompt = page.locator(".jp-CodeCell .jp-InputArea-prompt").first
    for _ in range(attempts):
        page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').first.wait_for(timeout=60_000)
        accept_dialogs(page)
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').first.click()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if (first_prompt.text_content() or "").strip() not in ("[ ]:", ""):     # drawn or not (long notebooks)
                return
            time.sleep(0.25)
    raise AssertionError("JupyterLab did not start running the cells")


def write_notebook(path: Path, cells: list[str]) -> None:
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": src} for i, src in enumerate(cells)]}
    path.write_text(json.dumps(nb, indent=1))


def truncated_labels(page) -> list[str]:
    """Texts of widget labels and readouts drawn narrower than their text (cut short with an ellipsis)."""
    return page.evaluate("""() => [...document.querySelectorAll('.widget-label, .widget-readout, .widget-dropdown > label')]
        .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
        .map(e => e.textContent.trim())""")


def assert_labels_whole(page, what: str) -> None:
    cut = truncated_labels(page)
    assert not cut, f"{what}: widget labels cut short (widen the widget's description_width): {cut}"


def open_widget_notebook(page, server: LabServer, name: str, cells: list[str], *, readout: str, images: int = 0,
                         what: str, attempts: int = 3):
    """Write a notebook of `cells` into the server's folder, open it, Run All, and wait until a widget
    readout containing `readout` (and `images` widget images) is shown. Retried, since a Run All made
    while the kernel session is still connecting can be dropped. On failure a screenshot is saved and named."""
    write_notebook(server.root / name, cells)
    page.goto(server.lab_url(name))
    page.locator(".jp-Notebook").first.wait_for()
    for _ in range(attempts):
        run_all(page)
        try:
            page.locator(".widget-html-content", has_text=readout).first.wait_for(timeout=90_000)
            if images:
                page.locator(".widget-image").nth(images - 1).wait_for(timeout=90_000)
        except Exception:
            continue
        assert_labels_whole(page, what)
        return page
    shot = server.root.parent / f"failure_{Path(name).stem}.png"
    page.screenshot(path=str(shot))
    raise AssertionError(f"{what} did not render; screenshot: {shot}, server log: {server.root.parent / 'server.log'}")
