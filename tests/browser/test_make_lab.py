"""`make lab`, the command learners run, really starts JupyterLab on the learner's workspace (a copy of labs/ made
on first use), as root and as a normal user.

Each case runs the Makefile's `lab` target (a temporary workspace, free loopback port, no browser, a temp token),
waits until the
server answers, checks that the course's settings turn off the "official Jupyter news?" prompt, opens a
lab notebook through the server in headless Chromium (no nbgrader instructor menus; its first cell runs, and the
kernel does not warn about plain-text TCP), and stops the server, leaving no process behind.
Running as root exercises the `--allow-root` the Makefile adds; the non-root case runs as `nobody`
(through setpriv) when the suite itself runs as root, as it does in containers and CI.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from browser_support import CHROMIUM, CHROMIUM_ARGS, require_chromium, free_port, stop_server, wait_until_up

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "01_kv_cache/01_kv_cache.ipynb"
NOBODY = 65534


def _as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("user", ["root", "non-root"])
def test_make_lab_serves_the_labs(user, tmp_path):
    if user == "root" and not _as_root():
        pytest.skip("the suite is not running as root, so `make lab` as root cannot be tried here")
    require_chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    prefix: list[str] = []
    if user == "non-root" and _as_root():
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: cannot drop to a normal user")
        prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        python = REPO_ROOT / ".venv" / "bin" / "python"
        if subprocess.run(prefix + ["bash", "-c", f"'{python}' -c pass"], capture_output=True).returncode != 0:
            pytest.skip(f"a normal user cannot run {python} on this machine (its interpreter lives in a folder "
                        "only root may enter), so `make lab` cannot be tried as one here")
        tmp_path.chmod(0o777)
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    port, token = free_port(), secrets.token_hex(16)
    lab_args = (f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} --ServerApp.port_retries=0 "
                f"--IdentityProvider.token={token} --LabApp.workspaces_dir={home}/workspaces "
                f"--LabApp.user_settings_dir={home}/settings")
    env = {**os.environ, "HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "IPYTHONDIR": str(home / "ipython"), "JUPYTER_PLATFORM_DIRS": "1"}
    env.pop("JUPYTER_TOKEN", None)
    log = tmp_path / "make_lab.log"
    workspace = tmp_path / "workspace"
    with open(log, "w") as out:
        proc = subprocess.Popen(prefix + ["make", "--no-print-directory", "lab", f"LAB_ARGS={lab_args}",
                                          f"WORKSPACE={workspace}"],
                                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, token, proc, log)
        settings = _get_json(f"{url}/lab/api/settings/@jupyterlab/apputils-extension:notification?token={token}")
        defaults = {k: v.get("default") for k, v in settings["schema"]["properties"].items()}
        assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False, (
            "the course environment must answer JupyterLab's news question (config/jupyterlab_overrides.json, "
            f"copied into the venv by `make setup`); got {defaults}")
        contents = _get_json(f"{url}/api/contents/{NOTEBOOK}?token={token}")
        assert contents["type"] == "notebook", "make lab must serve the workspace as the root folder"
        assert (workspace / NOTEBOOK).read_bytes() == (REPO_ROOT / "labs" / NOTEBOOK).read_bytes(), (
            "make lab must copy labs/ into the workspace on first use")
        assert (workspace / "START_HERE.md").read_text() == (REPO_ROOT / "docs" / "START_HERE.md").read_text(), (
            "make lab must put the learner's start page at the top of the workspace")
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(60_000)
                page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={token}&reset")
                page.locator(".jp-Notebook .jp-RenderedMarkdown h1", has_text="Lab 01").first.wait_for()
                page.wait_for_timeout(2000)            # the news prompt, where enabled, shows as a toast at start
                assert page.get_by_text("official Jupyter news").count() == 0, "JupyterLab asked about news"
                menus = page.locator(".lm-MenuBar-item").all_inner_texts()
                toolbar = page.locator(".jp-NotebookPanel-toolbar").first.inner_text()
                hidden = ("Nbgrader" not in menus and "Validate" not in toolbar
                          and page.locator("#nbgrader-create_assignemnt, #jp-mainmenu-nbgrader").count() == 0)
                assert hidden, ("make lab shows nbgrader's instructor tools (config/learner/labconfig): "
                                f"menus {menus}, toolbar {toolbar!r}")
                first = page.locator(".jp-CodeCell").first
                first.click()
                page.keyboard.press("Shift+Enter")     # the kernel answers over its encrypted channels
                prompt = first.locator(".jp-InputArea-prompt")
                deadline = time.monotonic() + 90
                while not any(ch.isdigit() for ch in prompt.inner_text()) and time.monotonic() < deadline:
                    time.sleep(0.5)
                assert any(ch.isdigit() for ch in prompt.inner_text()), "the first code cell did not run"
            finally:
                browser.close()
    finally:
        stop_server(proc, url, token)
    assert proc.returncode == 0, f"`make lab` exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
    assert "without encryption" not in log.read_text(), "a kernel warned that it talks over TCP in plain text"
    assert _port_closed(port), "the server still listens after shutdown"
    leftovers = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert not leftovers, f"processes left behind by `make lab`: {leftovers}"
