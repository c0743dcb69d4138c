"""Read deadlines of the lab 08 server (minigpt.serving.http_timeouts): a client that sends nothing, half a request
head or half a body is disconnected within the (here short) timeout; a slow request the app is working on is not.
Raw sockets on loopback against a fake replica (no model)."""

from __future__ import annotations

import socket
import time

import pytest

from minigpt.serving.fake_replica import create_fake_app
from minigpt.serving.http_timeouts import guarded_h11
from minigpt.serving.launch import serve_in_thread

TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def address():
    app = create_fake_app("fake", prefill_delay=3 * TIMEOUT_S)      # every completion takes longer than the timeout
    with serve_in_thread(app, header_timeout_s=TIMEOUT_S, read_timeout_s=TIMEOUT_S) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def closed_after(address, payload: bytes, limit_s: float = 5.0) -> tuple[float, bytes]:
    """Send `payload`, then wait: (seconds until the server closed the connection, what it sent)."""
    with socket.create_connection(address, timeout=limit_s) as s:
        start = time.monotonic()
        s.sendall(payload)
        received = b""
        while chunk := s.recv(4096):
            received += chunk
        return time.monotonic() - start, received


@pytest.mark.parametrize("payload", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le",
                                     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo"])
def test_a_stalled_client_is_disconnected_within_the_timeout(address, payload):
    took, received = closed_after(address, payload)
    assert TIMEOUT_S * 0.8 <= took < TIMEOUT_S + 2.0, f"closed after {took:.2f} s, the timeout is {TIMEOUT_S} s"
    if payload.startswith(b"POST") and b"\r\n\r\n" not in payload:
        assert received.startswith(b"HTTP/1.1 408"), received


def test_a_slowloris_trickling_its_head_is_cut_by_the_header_deadline(address):
    with socket.create_connection(address, timeout=5) as s:
        start = time.monotonic()
        try:
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                s.sendall(bytes([byte]))
                time.sleep(TIMEOUT_S / 4)                 # every read resets the read deadline, not the head's
        except OSError:
            pass
        assert time.monotonic() - start < TIMEOUT_S + 2.0, "a head trickled byte by byte was never cut"


def test_a_whole_request_is_answered(address):
    took, received = closed_after(address, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 200"), received


def test_a_request_the_app_works_on_longer_than_the_timeout_is_answered(address):
    body = b'{"model": "fake", "prompt": "Hi", "max_tokens": 2}'
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    took, received = closed_after(address, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert took >= 3 * TIMEOUT_S and received.startswith(b"HTTP/1.1 200"), (took, received[:200])


def test_timeouts_must_be_positive():
    with pytest.raises(ValueError):
        guarded_h11(0, 1)
