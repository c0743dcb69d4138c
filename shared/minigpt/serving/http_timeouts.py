"""Read timeouts for the HTTP server (lab 08): a client that stalls mid-request must not hold a connection forever.

uvicorn's h11 protocol closes an idle keep-alive connection (`timeout_keep_alive`), but a connection that sent half
a request head, or a head and half its body, or nothing at all, stays open for as long as the client likes (a
slowloris attack needs only a few bytes a minute per connection). `guarded_h11(header_timeout_s, read_timeout_s)`
is uvicorn's H11Protocol with two deadlines, checked only while the server waits for the client:

* header timeout: a request's head (request line and headers) must be complete within `header_timeout_s` of the
  connection opening or the previous response ending;
* read timeout: while the head or a body is still incomplete, at most `read_timeout_s` between two reads.

A connection past a deadline gets "408 Request Timeout" if it had started a request, and is closed. A request the
app is working on (generating, streaming) has no deadline: the client owes nothing then.

    config = uvicorn.Config(app, http=guarded_h11(30.0, 30.0), timeout_keep_alive=5)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["guarded_h11", "HEADER_TIMEOUT_S", "READ_TIMEOUT_S", "KEEP_ALIVE_TIMEOUT_S"]

HEADER_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 30.0
KEEP_ALIVE_TIMEOUT_S = 5
TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class _GuardedH11(H11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S
    read_timeout_s = READ_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:      # type: ignore[override]
        super().connection_made(transport)
        self._head_started = self._last_read = time.monotonic()
        self._received_since_response = False
        self._guard: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        self._received_since_response = True
        super().data_received(data)
        self._arm()

    def on_response_complete(self) -> None:
        self._head_started = self._last_read = time.monotonic()
        self._received_since_response = False
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # --- the guard ---------------------------------------------------------------------------------

    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _deadline(self) -> float | None:
        """When the connection must be closed if nothing changes; None while the app, not the client, is due."""
        if self._waiting_for_head():
            return min(self._head_started + self.header_timeout_s, self._last_read + self.read_timeout_s)
        if self.cycle.more_body and not self.flow.read_paused:
            return self._last_read + self.read_timeout_s
        return None

    def _arm(self) -> None:
        self._disarm()
        deadline = self._deadline()
        if deadline is not None and not self.transport.is_closing():
            self._guard = self.loop.call_later(max(0.0, deadline - time.monotonic()), self._expire)

    def _disarm(self) -> None:
        guard = getattr(self, "_guard", None)
        if guard is not None:
            guard.cancel()
            self._guard = None

    def _expire(self) -> None:
        self._guard = None
        deadline = self._deadline()
        if self.transport.is_closing() or deadline is None:
            return
        if time.monotonic() < deadline:
            self._arm()
            return
        if self._waiting_for_head() and self._received_since_response:
            self.transport.write(TIMEOUT_RESPONSE)       # a request was started: say why it ends
        self.transport.close()


def guarded_h11(header_timeout_s: float = HEADER_TIMEOUT_S, read_timeout_s: float = READ_TIMEOUT_S) -> Any:
    """uvicorn's h11 protocol class with these deadlines (pass it as uvicorn.Config(http=...))."""
    for name, value in (("header_timeout_s", header_timeout_s), ("read_timeout_s", read_timeout_s)):
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return type("GuardedH11Protocol", (_GuardedH11,), {"header_timeout_s": float(header_timeout_s),
                                                         "read_timeout_s": float(read_timeout_s)})
