"""Test helpers for the load generator and router tests: fake replicas served on loopback in threads."""

from __future__ import annotations

import contextlib
from typing import Iterator

from fastapi import FastAPI

from minigpt.serving.fake_replica import create_fake_app


@contextlib.contextmanager
def serve_in_thread(app: FastAPI) -> Iterator[str]:
    """Run `app` with uvicorn on 127.0.0.1, a free port, in a thread; yield its base URL; stop and join it.
    (Temporary: replaced by minigpt.serving.launch once the server branch lands.)"""
    import socket
    import threading
    import time

    import httpx
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextlib.contextmanager
def fake_replicas(*names: str, **kwargs: float) -> Iterator[list[str]]:
    """Fake replicas named `names`, each in its own thread; yields their base URLs."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serve_in_thread(create_fake_app(n, **kwargs))) for n in names]
