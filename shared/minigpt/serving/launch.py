"""Running a server for checks, tests, notebooks and replicas (lab 08), always on loopback, always stopped.

    with serve_in_thread(app) as base_url:            # uvicorn in a background THREAD, free port
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="none")
    with serve_subprocess(["--checkpoint", "draft"]) as base_url:   # `python -m minigpt.serving ...` as a CHILD
        ...

Both wait until GET /health answers before yielding, and on exit stop the server and wait for it
(thread joined / child process exited, killed if it does not stop in time). Both serve with read deadlines
(`http_timeouts.guarded_h11`): a client that stalls mid-request is disconnected.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import httpx
import uvicorn

from minigpt.serving.http_timeouts import HEADER_TIMEOUT_S, KEEP_ALIVE_TIMEOUT_S, READ_TIMEOUT_S, guarded_h11

__all__ = ["free_port", "wait_healthy", "serve_in_thread", "serve_subprocess", "uvicorn_config", "ServerURL",
           "ServerStartError"]

LOOPBACK = "127.0.0.1"


class ServerURL(str):
    """The base URL ("http://127.0.0.1:PORT") of a server started by `serve_subprocess`; `.process` is the child."""

    process: subprocess.Popen


class ServerStartError(RuntimeError):
    """The server did not answer /health in time (the message carries what it printed)."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` now (bind port 0 and let the OS choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_healthy(base_url: str, timeout: float, alive: callable = lambda: True) -> bool:
    """Poll GET {base_url}/health until it answers 200 (True), `alive()` turns False or time runs out (False)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline and alive():
            try:
                if client.get(base_url + "/health").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    return False


def uvicorn_config(app: object, host: str, port: int, *, log_level: str = "warning",
                   header_timeout_s: float = HEADER_TIMEOUT_S, read_timeout_s: float = READ_TIMEOUT_S,
                   keep_alive_timeout_s: int = KEEP_ALIVE_TIMEOUT_S) -> uvicorn.Config:
    """How the course serves an app: h11 with read deadlines, an idle keep-alive connection closed after
    `keep_alive_timeout_s`, no access log."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", access_log=False,
                          http=guarded_h11(header_timeout_s, read_timeout_s), timeout_keep_alive=keep_alive_timeout_s)


@contextmanager
def serve_in_thread(app: object, *, host: str = LOOPBACK, port: int | None = None, timeout: float = 30.0,
                    log_level: str = "warning", header_timeout_s: float = HEADER_TIMEOUT_S,
                    read_timeout_s: float = READ_TIMEOUT_S) -> Iterator[str]:
    """Run `app` with uvicorn in a background thread; yields "http://127.0.0.1:PORT"; stops and joins it on exit."""
    port = port or free_port(host)
    config = uvicorn_config(app, host, port, log_level=log_level, header_timeout_s=header_timeout_s,
                            read_timeout_s=read_timeout_s)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None           # signals belong to the main thread's program
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    base_url = f"http://{host}:{port}"
    try:
        if not wait_healthy(base_url, timeout, thread.is_alive):
            raise ServerStartError(f"the server thread did not answer {base_url}/health within {timeout} s")
        yield base_url
    finally:
        server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(5)


@contextmanager
def serve_subprocess(args: Sequence[str] = (), *, host: str = LOOPBACK, port: int | None = None,
                     timeout: float = 120.0, env: dict[str, str] | None = None,
                     module: str = "minigpt.serving") -> Iterator[ServerURL]:
    """Start `python -m MODULE --host HOST --port PORT *args` as a child process (any server module taking
    --host/--port and answering GET /health); yields its base URL (a str; `.process` is the child).
    On exit: terminate, then kill if it has not exited after 10 s. A child that dies or never answers
    /health raises ServerStartError with the end of its stderr."""
    port = port or free_port(host)
    cmd = [sys.executable, "-m", module, "--host", host, "--port", str(port), *args]
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, **(env or {})})
        base_url = f"http://{host}:{port}"
        try:
            if not wait_healthy(base_url, timeout, lambda: child.poll() is None):
                err.seek(0)
                tail = err.read().decode(errors="replace")[-3000:]
                code = child.poll()
                what = f"exited with code {code} before answering" if code is not None else \
                    f"did not answer {base_url}/health within {timeout} s"
                raise ServerStartError(f"`{' '.join(cmd)}` {what}; its stderr:\n{tail}")
            url = ServerURL(base_url)
            url.process = child
            yield url
        finally:
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(10)
