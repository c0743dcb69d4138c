"""Test helpers for the load generator and router tests: fake replicas served on loopback in threads
(`serve_in_thread` is minigpt.serving.launch's, re-exported for the tests)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from minigpt.serving.fake_replica import create_fake_app
from minigpt.serving.launch import serve_in_thread


@contextlib.contextmanager
def fake_replicas(*names: str, **kwargs: float) -> Iterator[list[str]]:
    """Fake replicas named `names`, each in its own thread; yields their base URLs."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serve_in_thread(create_fake_app(n, **kwargs))) for n in names]
